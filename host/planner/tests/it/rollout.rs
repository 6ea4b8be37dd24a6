//! Rollout control as scenarios: budgets and compartments, policies, plugin readiness,
//! priorities and sequencing, pause and disable, blocked and tainted nodes, node order.

use crate::world;

use nodewright_api::keys;
use nodewright_api::result::Blame;
use nodewright_api::v1alpha1::Status;
use nodewright_planner::{Action, JobPhase, PluginCheck, Work};
use serde_json::json;
use world::{World, condition, failed, ok, plain_pkg, policy, reboot_pkg, spec, staged, stages_on};

#[test]
fn compartment_progress_is_counted_after_the_pass_that_completes_nodes() {
    let mut w = World::new(3);
    w.add_cr("tune", spec(json!({"packages": {"tuning": plain_pkg()}})));
    for _ in 0..20 {
        w.step();
        if w.cr("tune").status.status == Some(Status::Complete) {
            // The very status that first says complete counts every node in its compartment.
            let c = &w.cr("tune").status.compartment_statuses["__default__"];
            assert_eq!((c.completed, c.matched, c.progress_percent), (3, 3, 100));
            return;
        }
        w.succeed_all(("none", 0));
    }
    panic!("never complete");
}

#[test]
fn the_interruption_budget_caps_nodes_at_work() {
    let mut w = World::new(5);
    w.add_cr(
        "gpu",
        spec(json!({"interruptionBudget": {"count": 2}, "packages": {"driver": reboot_pkg()}})),
    );
    for _ in 0..80 {
        w.step();
        let busy: std::collections::BTreeSet<&str> =
            w.snap.jobs.iter().map(|j| j.node.as_str()).collect();
        let cordoned = w.snap.nodes.iter().filter(|n| n.unschedulable).count();
        assert!(
            busy.len() <= 2 && cordoned <= 2,
            "budget exceeded: {busy:?}, {cordoned} cordoned"
        );
        w.succeed_all(("reboot", 1));
    }
    assert!(
        w.snap
            .nodes
            .iter()
            .all(|n| w.node_status("gpu", &n.name) == Some(Status::Complete))
    );
    let cs = &w.cr("gpu").status.compartment_statuses["__default__"];
    assert_eq!((cs.matched, cs.ceiling, cs.completed), (5, 2, 5));
}

#[test]
fn seed_002_canary_stops_on_failure_while_production_and_default_continue() {
    let mut w = World::new(0);
    staged(
        &mut w,
        &[
            "canary",
            "canary",
            "production",
            "production",
            "production",
            "",
        ],
    );
    w.add_cr(
        "rollout",
        spec(json!({"deploymentPolicy": "staged", "packages": {"tuning": plain_pkg()}})),
    );
    let mut production_batches = Vec::new();
    for _ in 0..40 {
        w.step();
        let p = w
            .snap
            .jobs
            .iter()
            .filter(|j| j.node == "w2" || j.node == "w3" || j.node == "w4")
            .map(|j| j.node.clone())
            .collect::<std::collections::BTreeSet<_>>();
        if !p.is_empty() {
            production_batches.push(p.len());
        }
        w.finish_jobs(|j| {
            Some(if j.node == "w0" || j.node == "w1" {
                failed(Blame::Package, "fail marker present", true)
            } else {
                JobPhase::Succeeded(Some(Box::new(ok("none", 1))))
            })
        });
    }
    let cs = &w.cr("rollout").status.compartment_statuses;
    let canary = cs["canary"].batch_state.as_ref().unwrap();
    assert!(canary.should_stop, "{canary:?}");
    assert_eq!(canary.failed_nodes, 1);
    assert_eq!(w.node_status("rollout", "w0"), Some(Status::Erroring));
    assert_eq!(
        w.node_status("rollout", "w1"),
        Some(Status::Waiting),
        "the second canary node never starts"
    );
    assert!(stages_on(&w, "w1").is_empty());
    for n in ["w2", "w3", "w4", "w5"] {
        assert_eq!(w.node_status("rollout", n), Some(Status::Complete), "{n}");
    }
    assert_eq!(
        production_batches.iter().max(),
        Some(&2),
        "production grows 1 then 2: {production_batches:?}"
    );
    assert_eq!(cs["__default__"].matched, 1);
}

#[test]
fn a_missing_policy_blocks_the_rollout_before_any_node_is_touched() {
    let mut w = World::new(1);
    w.add_cr(
        "r",
        spec(json!({"deploymentPolicy": "nope", "packages": {"tuning": plain_pkg()}})),
    );
    let acted = w.step();
    assert!(!acted.iter().any(|a| matches!(a, Action::CreateJob(_))));
    assert_eq!(w.cr("r").status.status, Some(Status::Blocked));
    assert_eq!(condition(&w, "r", "Blocked").1, "DeploymentPolicyNotFound");
}

#[test]
fn unready_plugins_block_before_any_node_is_touched_and_name_the_grant() {
    let mut w = World::new(1);
    w.add_cr("r", spec(json!({"packages": {"tuning": plain_pkg()}})));
    w.cr_mut("r").plugins = PluginCheck::NotReady {
        reason: "GrantMissing".into(),
        message: "tuning imports sysctl: add spec.packages.tuning.capabilities.sysctl".into(),
    };
    let acted = w.step();
    assert!(
        !acted
            .iter()
            .any(|a| matches!(a, Action::CreateJob(_) | Action::PatchNode(_))),
        "{acted:?}"
    );
    let (on, reason, msg) = condition(&w, "r", "PluginsReady");
    assert_eq!((on.as_str(), reason.as_str()), ("False", "GrantMissing"));
    assert!(msg.contains("capabilities.sysctl"));
}

#[test]
fn priority_and_sequencing_gate_later_nodewrights() {
    let mut w = World::new(2);
    w.add_cr("first", spec(json!({"priority": 1, "packages": {"a": {"version": "1.0.0", "plugin": "r.example/a:1"}}})));
    w.add_cr("second", spec(json!({"priority": 2, "packages": {"b": {"version": "1.0.0", "plugin": "r.example/b:1"}}})));
    w.add_cr("after-all", spec(json!({"priority": 3, "packages": {"c": {"version": "1.0.0", "plugin": "r.example/c:1"}}})));
    w.cr_mut("second").spec.sequencing = Some(nodewright_api::v1alpha1::Sequencing::All);
    let acted = w.step();
    let crs: std::collections::BTreeSet<String> = acted
        .iter()
        .filter_map(|a| {
            if let Action::CreateJob(r) = a {
                Some(r.cr.clone())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(crs.into_iter().collect::<Vec<_>>(), ["first"]);
    assert_eq!(w.node_status("second", "node-0"), Some(Status::Waiting));
    // node-0 finishes `first`; node-1's `first` is held: `second` may start on node-0 only,
    // and `after-all` waits for `second` everywhere.
    w.finish_jobs(|j| {
        (j.node == "node-0").then(|| JobPhase::Succeeded(Some(Box::new(ok("none", 1)))))
    });
    for _ in 0..3 {
        w.step();
        w.finish_jobs(|j| {
            (j.node == "node-0").then(|| JobPhase::Succeeded(Some(Box::new(ok("none", 1)))))
        });
    }
    assert!(w.created().iter().any(|(_, work, n)| *n == "node-0"
        && matches!(work, Work::Package { package, .. } if package == "b")));
    assert!(!w.created().iter().any(|(_, work, n)| *n == "node-1"
        && matches!(work, Work::Package { package, .. } if package == "b")));
    assert!(
        !w.created()
            .iter()
            .any(|(_, work, _)| matches!(work, Work::Package { package, .. } if package == "c")),
        "sequencing: all holds every node"
    );
    w.run(("none", 0), 30);
    assert_eq!(w.node_status("after-all", "node-1"), Some(Status::Complete));
}

#[test]
fn pause_stops_new_work_and_disable_skips_the_nodewright() {
    let mut w = World::new(1);
    w.add_cr(
        "p",
        spec(json!({"packages": {"a": {"version": "1.0.0", "plugin": "r.example/a:1"}}})),
    );
    w.cr_mut("p").paused = true;
    w.add_cr("later", spec(json!({"priority": 300, "packages": {"b": {"version": "1.0.0", "plugin": "r.example/b:1"}}})));
    let acted = w.step();
    assert!(
        !acted.iter().any(|a| matches!(a, Action::CreateJob(_))),
        "pause holds this CR and the ones after it"
    );
    assert_eq!(w.cr("p").status.status, Some(Status::Paused));
    w.cr_mut("p").paused = false;
    w.cr_mut("p").disabled = true;
    w.run(("none", 0), 20);
    assert_eq!(w.cr("p").status.status, Some(Status::Disabled));
    assert_eq!(
        w.node_status("later", "node-0"),
        Some(Status::Complete),
        "a disabled CR does not hold others"
    );
}

#[test]
fn ignored_and_untolerated_nodes_are_blocked() {
    let mut w = World::new(3);
    w.node_mut("node-0")
        .labels
        .insert(keys::IGNORE.into(), "true".into());
    w.node_mut("node-1")
        .taints
        .push(k8s_openapi::api::core::v1::Taint {
            key: "dedicated".into(),
            value: Some("db".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        });
    w.add_cr("t", spec(json!({"packages": {"tuning": plain_pkg()}})));
    w.run(("none", 0), 20);
    assert_eq!(w.node_status("t", "node-0"), Some(Status::Blocked));
    assert_eq!(w.node_status("t", "node-1"), Some(Status::Blocked));
    assert_eq!(w.node_status("t", "node-2"), Some(Status::Complete));
    assert!(condition(&w, "t", "Blocked").2.contains("dedicated"));
}

#[test]
fn runtime_required_taints_new_nodes_and_lifts_the_taint_when_complete() {
    let mut w = World::new(1);
    w.add_cr("rt", spec(json!({"runtimeRequired": true, "autoTaintNewNodes": true, "packages": {"tuning": plain_pkg()}})));
    let first = w.step();
    let tainted = first.iter().any(|a| matches!(a, Action::PatchNode(p) if p.add_taints.iter().any(|t| t.key == keys::RUNTIME_REQUIRED_TAINT_KEY)));
    assert!(tainted, "a never-touched node is tainted");
    let requests: Vec<_> = first
        .iter()
        .filter_map(|a| {
            if let Action::CreateJob(r) = a {
                Some(r)
            } else {
                None
            }
        })
        .collect();
    assert!(
        requests[0]
            .tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some(keys::RUNTIME_REQUIRED_TAINT_KEY))
    );
    w.run(("none", 0), 20);
    assert!(
        !w.node("node-0")
            .taints
            .iter()
            .any(|t| t.key == keys::RUNTIME_REQUIRED_TAINT_KEY),
        "lifted once complete"
    );
    w.step();
    assert!(
        !w.node("node-0")
            .taints
            .iter()
            .any(|t| t.key == keys::RUNTIME_REQUIRED_TAINT_KEY),
        "and not re-added"
    );
}

#[test]
fn a_node_at_work_that_goes_not_ready_while_rebooting_keeps_its_place() {
    let mut w = World::new(2);
    w.add_cr(
        "gpu",
        spec(json!({"interruptionBudget": {"count": 1}, "packages": {"driver": reboot_pkg()}})),
    );
    for _ in 0..6 {
        w.step();
        w.succeed_all(("reboot", 1));
    }
    let member = w.cr("gpu").status.compartment_statuses["__default__"].batch_nodes[0].clone();
    let other = if member == "node-0" {
        "node-1"
    } else {
        "node-0"
    };
    let not_ready = k8s_openapi::api::core::v1::Taint {
        key: "node.kubernetes.io/not-ready".into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    };
    w.node_mut(&member).taints.push(not_ready.clone());
    w.node_mut(other).taints.push(not_ready);
    w.step();
    assert_eq!(
        w.cr("gpu").status.compartment_statuses["__default__"].batch_nodes,
        std::slice::from_ref(&member),
        "the member keeps its slot"
    );
    assert_eq!(
        w.node_status("gpu", other),
        Some(Status::Blocked),
        "a not-ready node outside the batch is not started"
    );
}

#[test]
fn a_stopped_compartment_stays_stopped_across_a_new_generation() {
    let mut w = World::new(2);
    w.snap.policies.insert("one".into(), policy(json!({"default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1, "safetyLimit": 100}}}})));
    w.add_cr(
        "flaky",
        spec(json!({"deploymentPolicy": "one", "packages": {"tuning": plain_pkg()}})),
    );
    let stopped = |w: &World| {
        w.cr("flaky")
            .status
            .compartment_statuses
            .get("__default__")
            .and_then(|c| c.batch_state.as_ref())
            .is_some_and(|b| b.should_stop)
    };
    for _ in 0..20 {
        w.step();
        w.finish_jobs(|_| Some(failed(Blame::Package, "broken", true)));
        if stopped(&w) {
            break;
        }
    }
    assert!(
        stopped(&w),
        "the first batch's failure stops the compartment"
    );
    // A spec edit: a new generation whose plugins are checked again before the planner may
    // use them (one pass pending), then ready.
    let cr = w
        .snap
        .nodewrights
        .iter_mut()
        .find(|c| c.name == "flaky")
        .unwrap();
    cr.generation += 1;
    let ready = std::mem::replace(&mut cr.plugins, PluginCheck::Pending);
    w.step();
    assert!(
        stopped(&w),
        "held while the plugins are checked, the batch state carries over"
    );
    w.snap
        .nodewrights
        .iter_mut()
        .find(|c| c.name == "flaky")
        .unwrap()
        .plugins = ready;
    w.run(("none", 0), 20);
    assert!(stopped(&w), "only a policy reset restarts it");
    assert_eq!(
        w.snap
            .nodes
            .iter()
            .filter(|n| w.state("flaky", &n.name).is_empty())
            .count(),
        1,
        "the second node never started"
    );
}

#[test]
fn package_jobs_carry_the_nodes_place_in_the_rollout_order() {
    let mut w = World::new(4);
    w.add_cr(
        "tune",
        spec(json!({"interruptionBudget": {"count": 2}, "packages": {"tuning": plain_pkg()}})),
    );
    w.run(("none", 0), 40);
    let mut orders: std::collections::BTreeMap<String, std::collections::BTreeSet<Option<u32>>> =
        Default::default();
    for (_, a) in &w.history {
        if let Action::CreateJob(r) = a {
            orders
                .entry(r.node.clone())
                .or_default()
                .insert(r.stage().and_then(|s| s.node_order));
        }
    }
    // Two batches of two: the first batch's nodes are 0 and 1, the second's 2 and 3; a node
    // keeps its place through its stages.
    let flat: Vec<(String, Vec<Option<u32>>)> = orders
        .into_iter()
        .map(|(n, o)| (n, o.into_iter().collect()))
        .collect();
    assert_eq!(
        flat,
        [
            ("node-0", [Some(0)]),
            ("node-1", [Some(1)]),
            ("node-2", [Some(2)]),
            ("node-3", [Some(3)])
        ]
        .map(|(n, o)| (n.to_string(), o.to_vec()))
        .to_vec()
    );
}
