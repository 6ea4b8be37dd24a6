//! Package lifecycles as scenarios: failures and retries, config changes, upgrades,
//! uninstalls, dependencies, serial packages, deletion.

use crate::world;

use nodewright_api::agent::RunStage;
use nodewright_api::keys;
use nodewright_api::node_state::{Stage, State};
use nodewright_api::result::{Blame, StageResult};
use nodewright_api::v1alpha1::Status;
use nodewright_planner::{Action, JobPhase, Work};
use serde_json::json;
use world::{World, condition, failed, plain_pkg, spec, stages_on};

#[test]
fn a_terminal_failure_parks_the_stage_names_the_grant_and_a_new_generation_rearms_it() {
    let mut w = World::new(1);
    w.add_cr("tune", spec(json!({"packages": {"tuning": plain_pkg()}})));
    w.step();
    let denied = "sysctl.set(\"vm.swappiness\") denied: add \"vm.swappiness\" to spec.packages.tuning.capabilities.sysctl";
    w.finish_jobs(|_| Some(failed(Blame::Denied, denied, true)));
    for _ in 0..5 {
        w.step();
    }
    let e = &w.state("tune", "node-0")["tuning|1.0.0"];
    assert_eq!(
        (e.stage, e.state, e.attempts),
        (Stage::Apply, State::Erroring, 4)
    );
    assert_eq!(w.node_status("tune", "node-0"), Some(Status::Erroring));
    let (_, reason, msg) = condition(&w, "tune", "Ready");
    assert_eq!(reason, "Erroring");
    assert!(msg.contains("capabilities.sysctl"), "{msg}");
    assert_eq!(
        stages_on(&w, "node-0"),
        ["tuning:apply"],
        "parked: no new attempt"
    );
    let kept: Vec<String> = w.kept_failures().iter().map(|j| j.name.clone()).collect();
    assert_eq!(
        kept.len(),
        1,
        "the failed Job is kept for its logs: {:?}",
        w.snap.jobs
    );
    assert_eq!(
        w.events("StageFailed").len(),
        1,
        "recorded once, however long it is kept"
    );
    w.edit("tune", |s| {
        s.packages.get_mut("tuning").unwrap().capabilities.sysctl = vec!["vm.swappiness".into()]
    });
    // Re-armed (this pass), the kept Job goes (the next) before the stage runs again under
    // its name.
    let mut acted = w.step();
    acted.extend(w.step());
    assert!(
        acted.iter().any(
            |a| matches!(a, Action::DeleteJob { name, running: false, .. } if *name == kept[0])
        ),
        "{acted:?}"
    );
    assert!(
        !acted.iter().any(|a| matches!(a, Action::CreateJob(_))),
        "{acted:?}"
    );
    assert_eq!(
        w.state("tune", "node-0")["tuning|1.0.0"].state,
        State::InProgress,
        "the old failure is not recorded again"
    );
    w.run(("none", 0), 20);
    assert_eq!(
        stages_on(&w, "node-0"),
        ["tuning:apply", "tuning:apply", "tuning:config"]
    );
    assert_eq!(w.node_status("tune", "node-0"), Some(Status::Complete));
}

#[test]
fn failures_without_genuine_evidence_rerun_the_stage_and_in_flight_attempts_show() {
    let mut w = World::new(1);
    w.add_cr("tune", spec(json!({"packages": {"tuning": plain_pkg()}})));
    w.step();
    w.finish_jobs(|_| {
        Some(JobPhase::Active {
            failed: 2,
            last: Some(Box::new(StageResult::failed(
                RunStage::Apply,
                "tuning",
                Blame::Package,
                "exit 1",
            ))),
        })
    });
    w.step();
    let e = &w.state("tune", "node-0")["tuning|1.0.0"];
    assert_eq!(
        (e.state, e.attempts),
        (State::InProgress, 2),
        "a retried attempt is visible but does not park"
    );
    w.finish_jobs(|_| {
        Some(JobPhase::Failed {
            genuine: false,
            attempts: 0,
            reason: "BackoffLimitExceeded".into(),
            last: None,
        })
    });
    w.run(("none", 0), 20);
    assert_eq!(
        stages_on(&w, "node-0"),
        ["tuning:apply", "tuning:apply", "tuning:config"],
        "disrupted-only Job: silently re-run"
    );
}

#[test]
fn a_config_change_reruns_config_and_only_the_matching_config_interrupt() {
    let mut w = World::new(1);
    w.add_cr(
        "k",
        spec(json!({"packages": {"kubelet": {
            "version": "1.0.0", "plugin": "r.example/kubelet:1", "interrupt": {"type": "reboot"},
            "configMap": {"maxPods": "110", "motd": "hi"},
            "configInterrupts": {"maxPods": {"type": "service", "services": ["kubelet.service"]}}
        }}})),
    );
    w.run(("reboot", 1), 40);
    let installs = stages_on(&w, "node-0");
    assert!(installs.contains(&"interrupt:reboot:kubelet".to_string()));
    // A key without a config interrupt: config only, no cordon, no interrupt.
    w.edit("k", |s| {
        s.packages
            .get_mut("kubelet")
            .unwrap()
            .config_map
            .insert("motd".into(), "bye".into());
    });
    w.run(("reboot", 1), 40);
    assert_eq!(
        stages_on(&w, "node-0")[installs.len()..],
        ["kubelet:config"]
    );
    assert_eq!(
        w.state("k", "node-0")["kubelet|1.0.0"].changed_keys,
        ["motd"]
    );
    // A key with one: config, then that service restart — not the package's reboot.
    let so_far = stages_on(&w, "node-0").len();
    w.edit("k", |s| {
        s.packages
            .get_mut("kubelet")
            .unwrap()
            .config_map
            .insert("maxPods".into(), "250".into());
    });
    w.run(("reboot", 1), 40);
    assert_eq!(
        stages_on(&w, "node-0")[so_far..],
        [
            "kubelet:config",
            "interrupt:service:kubelet",
            "kubelet:post-interrupt"
        ]
    );
    assert_eq!(w.node_status("k", "node-0"), Some(Status::Complete));
}

#[test]
fn a_version_upgrade_runs_upgrade_then_config_and_drops_the_old_entry() {
    let mut w = World::new(1);
    w.add_cr("tune", spec(json!({"packages": {"tuning": plain_pkg()}})));
    w.run(("none", 0), 20);
    w.edit("tune", |s| {
        s.packages.get_mut("tuning").unwrap().version = "1.1.0".into()
    });
    w.run(("none", 0), 20);
    assert_eq!(
        stages_on(&w, "node-0")[2..],
        ["tuning:upgrade", "tuning:config"]
    );
    let st = w.state("tune", "node-0");
    assert_eq!(st.keys().collect::<Vec<_>>(), ["tuning|1.1.0"]);
    let requests: Vec<_> = w
        .history
        .iter()
        .filter_map(|(_, a)| {
            if let Action::CreateJob(r) = a {
                Some(r.stage()?.previous_version.clone())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        requests[2],
        Some("1.0.0".into()),
        "the upgrade knows where it comes from"
    );
}

/// Mirrors NodeWright's `downgrade-enabled-false-preserves-state`, and the bug found on
/// the test cluster beside it: 1.1.0 installed, downgraded to 1.0.0 (installed fresh, the
/// 1.1.0 entry kept as NodeWright keeps it), then upgraded back to 1.1.0 — the kept entry is
/// older news than the 1.0.0 install, so the host runs the upgrade again instead of the
/// status claiming a version the host no longer has.
#[test]
fn an_upgrade_after_a_downgrade_runs_again() {
    let mut w = World::new(1);
    let mut pkg = plain_pkg();
    pkg["version"] = json!("1.1.0");
    w.add_cr("tune", spec(json!({"packages": {"tuning": pkg}})));
    w.run(("none", 0), 20);
    let set = |w: &mut World, v: &str| {
        w.edit("tune", |s| {
            s.packages.get_mut("tuning").unwrap().version = v.into()
        })
    };
    set(&mut w, "1.0.0");
    w.run(("none", 0), 20);
    let installed = stages_on(&w, "node-0").len();
    let st = w.state("tune", "node-0");
    assert_eq!(
        st.keys().collect::<Vec<_>>(),
        ["tuning|1.0.0", "tuning|1.1.0"],
        "the downgrade keeps the newer entry beside the new one"
    );
    set(&mut w, "1.1.0");
    w.run(("none", 0), 20);
    assert_eq!(
        stages_on(&w, "node-0")[installed..],
        ["tuning:upgrade", "tuning:config"],
        "back to 1.1.0 runs the upgrade from 1.0.0"
    );
    let st = w.state("tune", "node-0");
    assert_eq!(st.keys().collect::<Vec<_>>(), ["tuning|1.1.0"]);
    assert_eq!(
        st["tuning|1.1.0"].previous_version.as_deref(),
        Some("1.0.0")
    );
    assert_eq!(w.node_status("tune", "node-0"), Some(Status::Complete));
}

#[test]
fn explicit_uninstall_runs_uninstall_and_its_interrupt_then_removes_the_entry() {
    let mut w = World::new(1);
    w.add_cr("gpu", spec(json!({"packages": {"driver": {"version": "1.0.0", "plugin": "r.example/driver:1", "interrupt": {"type": "reboot"}, "uninstall": {"enabled": true}}}})));
    w.run(("reboot", 1), 40);
    let n = stages_on(&w, "node-0").len();
    w.edit("gpu", |s| {
        s.packages
            .get_mut("driver")
            .unwrap()
            .uninstall
            .as_mut()
            .unwrap()
            .apply = true
    });
    w.run(("reboot", 1), 40);
    assert_eq!(
        stages_on(&w, "node-0")[n..],
        ["driver:uninstall", "interrupt:reboot:driver"]
    );
    assert!(w.state("gpu", "node-0").is_empty());
    assert_eq!(
        w.node_status("gpu", "node-0"),
        Some(Status::Complete),
        "absent with apply still set = done"
    );
    assert!(!w.node("node-0").unschedulable);
}

#[test]
fn cancelling_an_uninstall_in_progress_reinstalls() {
    let mut w = World::new(1);
    w.add_cr("t", spec(json!({"packages": {"tuning": {"version": "1.0.0", "plugin": "r.example/t:1", "uninstall": {"enabled": true}}}})));
    w.run(("none", 0), 20);
    w.edit("t", |s| {
        s.packages
            .get_mut("tuning")
            .unwrap()
            .uninstall
            .as_mut()
            .unwrap()
            .apply = true
    });
    w.step();
    assert_eq!(
        w.state("t", "node-0")["tuning|1.0.0"].stage,
        Stage::Uninstall
    );
    w.edit("t", |s| {
        s.packages
            .get_mut("tuning")
            .unwrap()
            .uninstall
            .as_mut()
            .unwrap()
            .apply = false
    });
    w.run(("none", 0), 20);
    let e = &w.state("t", "node-0")["tuning|1.0.0"];
    assert_eq!((e.stage, e.state), (Stage::Config, State::Complete));
    assert!(
        stages_on(&w, "node-0")
            .ends_with(&["tuning:apply".to_string(), "tuning:config".to_string()])
    );
}

#[test]
fn depends_on_orders_packages_on_a_node() {
    let mut w = World::new(1);
    w.add_cr(
        "s",
        spec(json!({"packages": {
            "a": {"version": "1.0.0", "plugin": "r.example/a:1"},
            "b": {"version": "1.0.0", "plugin": "r.example/b:1"},
            "c": {"version": "1.0.0", "plugin": "r.example/c:1", "dependsOn": {"a": "1.0.0", "b": "1.0.0"}}
        }})),
    );
    w.run(("none", 0), 30);
    let created = w.created();
    let first_c = created
        .iter()
        .find(|(_, work, _)| matches!(work, Work::Package { package, .. } if package == "c"))
        .unwrap()
        .0;
    let last_ab = created
        .iter()
        .filter(|(_, work, _)| matches!(work, Work::Package { package, .. } if package != "c"))
        .map(|(i, _, _)| *i)
        .max()
        .unwrap();
    assert!(first_c > last_ab, "c starts after a and b are complete");
    assert_eq!(
        created.iter().filter(|(i, _, _)| *i == 1).count(),
        2,
        "a and b start together"
    );
}

#[test]
fn serial_runs_one_package_per_node_at_a_time() {
    let mut w = World::new(2);
    w.add_cr("s", spec(json!({"serial": true, "packages": {"a": {"version": "1.0.0", "plugin": "r.example/a:1"}, "b": {"version": "1.0.0", "plugin": "r.example/b:1"}}})));
    let acted = w.step();
    let jobs: Vec<_> = acted
        .iter()
        .filter_map(|a| {
            if let Action::CreateJob(r) = a {
                Some((r.node.clone(), r.work()))
            } else {
                None
            }
        })
        .collect();
    assert_eq!(jobs.len(), 2, "one per node, both nodes");
    assert!(
        jobs.iter()
            .all(|(_, w)| matches!(w, Work::Package { package, .. } if package == "a"))
    );
}

#[test]
fn deleting_the_nodewright_uninstalls_releases_and_drops_the_finalizer() {
    let mut w = World::new(1);
    w.add_cr("gpu", spec(json!({"packages": {
        "driver": {"version": "1.0.0", "plugin": "r.example/driver:1", "uninstall": {"enabled": true}},
        "keep": {"version": "1.0.0", "plugin": "r.example/keep:1"}
    }})));
    w.run(("none", 0), 30);
    assert!(w.cr("gpu").has_finalizer);
    w.cr_mut("gpu").deleting = true;
    w.run(("none", 0), 30);
    assert!(w.snap.nodewrights.is_empty(), "finalizer removed");
    assert!(stages_on(&w, "node-0").contains(&"driver:uninstall".to_string()));
    let st = w.state("gpu", "node-0");
    assert_eq!(
        st.keys().collect::<Vec<_>>(),
        ["keep|1.0.0"],
        "packages without uninstall stay recorded as 'files may remain'"
    );
    assert!(
        !w.node("node-0")
            .annotations
            .contains_key(&keys::node_status("gpu"))
    );
}

/// A package removed from the spec while its apply runs: the Job is stopped, and its entry
/// stays as the record that its files may remain — not as a stage running for ever.
#[test]
fn a_package_removed_mid_apply_is_stopped_and_its_entry_no_longer_reads_running() {
    let mut w = World::new(1);
    w.add_cr(
        "t",
        spec(json!({"packages": {
            "keep": {"version": "1.0.0", "plugin": "r.example/keep:1"},
            "gone": {"version": "1.0.0", "plugin": "r.example/gone:1"}
        }})),
    );
    for _ in 0..10 {
        w.step();
        let applying = w.snap.jobs.iter().any(|j| {
            j.running()
                && matches!(&j.work, Work::Package { package, stage: Stage::Apply, .. } if package == "gone")
        });
        if applying {
            break;
        }
        w.succeed_all(("none", 1));
    }
    assert_eq!(
        (
            w.state("t", "node-0")["gone|1.0.0"].stage,
            w.state("t", "node-0")["gone|1.0.0"].state
        ),
        (Stage::Apply, State::InProgress)
    );
    w.edit("t", |s| {
        s.packages.remove("gone");
    });
    let acted = w.step();
    assert!(
        acted
            .iter()
            .any(|a| matches!(a, Action::DeleteJob { running: true, .. })),
        "the apply is stopped: {acted:?}"
    );
    w.run(("none", 0), 20);
    let e = &w.state("t", "node-0")["gone|1.0.0"];
    assert_eq!((e.stage, e.state), (Stage::Apply, State::Unknown));
    assert!(
        e.message.contains("left the spec during apply"),
        "{}",
        e.message
    );
    assert_eq!(w.cr("t").status.status, Some(Status::Complete));
}

/// Mirrors NodeWright's `delete-blocked-when-paused` and `delete-blocked-when-disabled`: a
/// pause or disable holds a deletion's uninstalls (and so the finalizer), says so, and
/// lifting it lets them run; with nothing to uninstall the deletion is not held.
#[test]
fn a_paused_or_disabled_deletion_with_uninstalls_pending_waits_and_says_how_to_go_on() {
    for (flag, reason, verb) in [
        ("paused", "PausedWithPendingUninstall", "resume"),
        ("disabled", "DisabledWithPendingUninstall", "enable"),
    ] {
        let mut w = World::new(2);
        w.add_cr("gpu", spec(json!({"packages": {
            "driver": {"version": "1.0.0", "plugin": "r.example/driver:1", "uninstall": {"enabled": true}},
            "keep": {"version": "1.0.0", "plugin": "r.example/keep:1"}
        }})));
        w.run(("none", 0), 30);
        let set = |w: &mut World, on: bool| match flag {
            "paused" => w.cr_mut("gpu").paused = on,
            _ => w.cr_mut("gpu").disabled = on,
        };
        set(&mut w, true);
        w.cr_mut("gpu").deleting = true;
        w.run(("none", 0), 10);
        assert!(
            !w.snap.nodewrights.is_empty(),
            "{flag}: the finalizer stays"
        );
        assert!(
            !stages_on(&w, "node-0").contains(&"driver:uninstall".to_string()),
            "{flag}: no uninstall starts"
        );
        let (on, why, message) = condition(&w, "gpu", "DeletionBlocked");
        assert_eq!((on.as_str(), why.as_str()), ("True", reason), "{flag}");
        assert!(
            message.contains("node-0: driver")
                && message.contains("node-1: driver")
                && message.contains(&format!("nodewright {verb} gpu")),
            "{flag}: {message}"
        );
        let events = w.events("DeletionBlocked");
        assert_eq!(
            events.len(),
            1,
            "{flag}: one warning, not one a pass: {events:?}"
        );

        set(&mut w, false);
        w.step();
        assert_eq!(condition(&w, "gpu", "DeletionBlocked").0, "False", "{flag}");
        w.run(("none", 0), 30);
        assert!(
            w.snap.nodewrights.is_empty(),
            "{flag}: lifted, the deletion finishes"
        );
        assert!(stages_on(&w, "node-1").contains(&"driver:uninstall".to_string()));
    }
    // Nothing to uninstall: a paused NodeWright is deleted at once.
    let mut w = World::new(1);
    w.add_cr(
        "t",
        spec(json!({"packages": {"keep": {"version": "1.0.0", "plugin": "r.example/keep:1"}}})),
    );
    w.run(("none", 0), 30);
    w.cr_mut("t").paused = true;
    w.cr_mut("t").deleting = true;
    w.run(("none", 0), 5);
    assert!(w.snap.nodewrights.is_empty());
    assert!(w.events("DeletionBlocked").is_empty());
}

#[test]
fn deleting_uninstalls_a_package_whose_install_failed() {
    let mut w = World::new(1);
    w.add_cr("gpu", spec(json!({"packages": {"driver": {"version": "1.0.0", "plugin": "r.example/driver:1", "uninstall": {"enabled": true}}}})));
    w.step();
    w.finish_jobs(|_| Some(failed(Blame::Package, "modprobe failed", true)));
    w.step();
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Erroring));
    w.cr_mut("gpu").deleting = true;
    w.run(("none", 0), 30);
    assert!(w.snap.nodewrights.is_empty(), "the deletion finishes");
    assert!(stages_on(&w, "node-0").contains(&"driver:uninstall".to_string()));
}
