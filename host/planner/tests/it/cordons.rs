//! Cordons and drains as scenarios: shared and external cordons, barriers, PDB refusals,
//! drain timeouts and drain options, Karpenter's annotations.

use crate::world;

use nodewright_api::keys;
use nodewright_api::node_state::Stage;
use nodewright_api::v1alpha1::Status;
use nodewright_planner::{Action, JobPhase, ObservedJob, Work};
use serde_json::json;
use world::{World, condition, evicted, ok, reboot_pkg, spec, stages_on};

#[test]
fn karpenter_annotations_cover_the_disruption_and_only_ours_are_removed() {
    let mut w = World::new(2);
    w.node_mut("node-1")
        .annotations
        .insert(keys::KARPENTER_DO_NOT_DISRUPT.into(), "true".into());
    w.add_cr("gpu", spec(json!({"packages": {"driver": reboot_pkg()}})));
    let mut seen_during_interrupt = false;
    for _ in 0..40 {
        w.step();
        if w.snap
            .jobs
            .iter()
            .any(|j| matches!(j.work, Work::Interrupt { .. }))
        {
            let a = &w.node("node-0").annotations;
            seen_during_interrupt = a.contains_key(keys::KARPENTER_DO_NOT_DISRUPT)
                && a.contains_key(keys::KARPENTER_DO_NOT_REPAIR);
        }
        w.succeed_all(("reboot", 1));
    }
    assert!(seen_during_interrupt);
    assert!(
        !w.node("node-0")
            .annotations
            .contains_key(keys::KARPENTER_DO_NOT_DISRUPT)
    );
    assert!(
        !w.node("node-0")
            .annotations
            .contains_key(keys::KARPENTER_OWNED)
    );
    let n1 = &w.node("node-1").annotations;
    assert!(
        n1.contains_key(keys::KARPENTER_DO_NOT_DISRUPT),
        "an annotation someone else set stays"
    );
    assert!(
        !n1.contains_key(keys::KARPENTER_DO_NOT_REPAIR),
        "the one we added is gone"
    );
}

#[test]
fn an_external_cordon_is_kept_and_drained_under_in_the_same_pass() {
    let mut w = World::new(1);
    w.node_mut("node-0").unschedulable = true;
    w.add_pod("node-0", "web", &[], Some("ReplicaSet"));
    w.add_cr("gpu", spec(json!({"packages": {"driver": reboot_pkg()}})));
    w.step(); // plan job
    w.succeed_all(("reboot", 1));
    w.step(); // records the plan; the node is already cordoned, so it drains in this pass
    assert_eq!(
        evicted(&w).len(),
        1,
        "already cordoned: the drain starts at once"
    );
    assert_eq!(
        w.node("node-0")
            .annotations
            .get(&keys::cordon("gpu"))
            .map(String::as_str),
        Some("external")
    );
    w.run(("reboot", 1), 40);
    assert!(
        w.node("node-0").unschedulable,
        "a cordon nodewright did not make is never released"
    );
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Complete));
}

#[test]
fn two_nodewrights_share_a_cordon_and_the_node_stays_cordoned_until_both_finish() {
    let mut w = World::new(1);
    w.add_cr("a", spec(json!({"packages": {"driver": reboot_pkg()}})));
    let plan_says = |j: &ObservedJob| match &j.work {
        Work::Package {
            stage: Stage::Plan, ..
        } => ok("reboot", 1),
        _ => ok("none", 1),
    };
    // `a` cordons the node and its apply stays in flight.
    let mut steps = 0;
    while !w.snap.jobs.iter().any(|j| {
        j.cr == "a"
            && matches!(
                &j.work,
                Work::Package {
                    stage: Stage::Apply,
                    ..
                }
            )
    }) {
        w.step();
        w.finish_jobs(|j| {
            (!matches!(
                &j.work,
                Work::Package {
                    stage: Stage::Apply,
                    ..
                }
            ))
            .then(|| JobPhase::Succeeded(Some(Box::new(plan_says(j)))))
        });
        steps += 1;
        assert!(steps < 30, "a never reached apply");
    }
    assert!(
        w.node("node-0").unschedulable
            && w.node("node-0")
                .annotations
                .contains_key(&keys::cordon("a"))
    );
    // `b` runs before `a` (lower priority value) and takes the node meanwhile.
    w.add_cr("b", spec(json!({"priority": 100, "packages": {"fw": {"version": "1.0.0", "plugin": "r.example/fw:1", "interrupt": {"type": "service", "services": ["fw.service"]}}}})));
    let mut both_marked = false;
    for _ in 0..40 {
        w.step();
        let ann = &w.node("node-0").annotations;
        both_marked |= ann.contains_key(&keys::cordon("a")) && ann.contains_key(&keys::cordon("b"));
        w.finish_jobs(|j| (j.cr == "b").then(|| JobPhase::Succeeded(Some(Box::new(plan_says(j))))));
        if w.node_status("b", "node-0") == Some(Status::Complete) {
            break;
        }
    }
    assert!(both_marked, "both held a cordon mark at once");
    assert_eq!(w.node_status("b", "node-0"), Some(Status::Complete));
    let n = w.node("node-0");
    assert!(
        n.unschedulable
            && n.annotations.contains_key(&keys::cordon("a"))
            && !n.annotations.contains_key(&keys::cordon("b")),
        "b released only its own mark"
    );
    w.run(("reboot", 1), 40);
    assert_eq!(w.node_status("a", "node-0"), Some(Status::Complete));
    assert!(
        !w.node("node-0").unschedulable,
        "uncordoned once both finished"
    );
}

#[test]
fn a_cordon_held_by_another_nodewright_is_not_released_by_the_first_to_finish() {
    let mut w = World::new(1);
    w.add_cr("a", spec(json!({"packages": {"driver": reboot_pkg()}})));
    w.node_mut("node-0").unschedulable = true;
    w.node_mut("node-0")
        .annotations
        .insert(keys::cordon("other"), "true".into());
    w.run(("reboot", 1), 40);
    assert_eq!(w.node_status("a", "node-0"), Some(Status::Complete));
    assert!(w.node("node-0").unschedulable, "other still holds it");
    assert_eq!(
        w.node("node-0")
            .annotations
            .get(&keys::cordon("other"))
            .map(String::as_str),
        Some("true")
    );
    assert!(
        !w.node("node-0")
            .annotations
            .contains_key(&keys::cordon("a"))
    );
}

#[test]
fn a_cordon_lifted_mid_work_is_taken_back() {
    let mut w = World::new(1);
    w.add_cr("gpu", spec(json!({"packages": {"driver": reboot_pkg()}})));
    for _ in 0..4 {
        w.step();
        w.succeed_all(("reboot", 1));
    }
    assert!(w.node("node-0").unschedulable);
    w.node_mut("node-0").unschedulable = false; // someone ran kubectl uncordon
    w.step();
    assert!(w.node("node-0").unschedulable, "re-cordoned");
}

#[test]
fn pods_matching_pod_non_interrupt_labels_hold_the_drain_until_they_end() {
    let mut w = World::new(1);
    w.add_pod("node-0", "training", &[("job", "train")], Some("Job"));
    w.add_pod("node-0", "web", &[], Some("ReplicaSet"));
    w.add_cr("gpu", spec(json!({"podNonInterruptLabels": {"matchLabels": {"job": "train"}}, "packages": {"driver": reboot_pkg()}})));
    for _ in 0..10 {
        w.step();
        w.succeed_all(("reboot", 1));
    }
    assert!(
        evicted(&w).is_empty(),
        "nothing is evicted while the protected pod runs"
    );
    assert!(w.node("node-0").unschedulable, "cordoned meanwhile");
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Blocked));
    let (on, reason, msg) = condition(&w, "gpu", "Blocked");
    assert_eq!(
        (on.as_str(), reason.as_str()),
        ("True", "NonInterruptPodsRunning")
    );
    assert!(msg.contains("default/training"), "{msg}");
    w.snap.pods.retain(|p| p.name != "training");
    w.run(("reboot", 1), 40);
    assert_eq!(
        evicted(&w)
            .iter()
            .map(|(_, p)| p.as_str())
            .collect::<Vec<_>>(),
        ["web"]
    );
    assert_eq!(condition(&w, "gpu", "Blocked").0, "False");
}

#[test]
fn a_pdb_refusal_is_a_throttled_wait_with_the_apiservers_message() {
    let mut w = World::new(1);
    w.add_pod("node-0", "db", &[], Some("StatefulSet"));
    w.pdb_protected.insert("default/db".into());
    w.add_cr("gpu", spec(json!({"packages": {"driver": reboot_pkg()}})));
    for _ in 0..8 {
        w.step();
        w.succeed_all(("reboot", 1));
    }
    let attempts = evicted(&w).len();
    assert!(attempts >= 1);
    let (on, reason, msg) = condition(&w, "gpu", "DrainBlocked");
    assert_eq!(
        (on.as_str(), reason.as_str()),
        ("True", "PodDisruptionBudget")
    );
    assert!(msg.contains("disruption budget"), "{msg}");
    assert!(
        w.node("node-0")
            .annotations
            .contains_key(&keys::drain_blocked("gpu"))
    );
    // 8 passes are 16 s: the refused eviction is not retried inside the 30 s window.
    assert_eq!(attempts, 1, "throttled");
    w.now += 30;
    w.pdb_protected.clear();
    w.run(("reboot", 1), 40);
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Complete));
    assert_eq!(condition(&w, "gpu", "DrainBlocked").0, "False");
}

/// A blocked drain whose pod goes away by other means (deleted, not evicted) is drained at
/// the next pass: its blocked mark is taken off then, before the disruptive stage starts.
#[test]
fn a_blocked_drain_emptied_from_outside_clears_its_blocked_mark() {
    let mut w = World::new(1);
    w.add_pod("node-0", "db", &[], Some("StatefulSet"));
    w.pdb_protected.insert("default/db".into());
    w.add_cr("gpu", spec(json!({"packages": {"driver": reboot_pkg()}})));
    let blocked = |w: &World| {
        w.node("node-0")
            .annotations
            .contains_key(&keys::drain_blocked("gpu"))
    };
    for _ in 0..8 {
        w.step();
        w.succeed_all(("reboot", 1));
    }
    assert!(blocked(&w), "the budget blocks the drain");
    w.snap.pods.retain(|p| p.name != "db");
    w.step();
    let applying = w.snap.jobs.iter().any(|j| {
        matches!(
            j.work,
            Work::Package {
                stage: Stage::Apply,
                ..
            }
        )
    });
    assert!(applying, "nothing left to drain: the apply starts");
    assert!(!blocked(&w), "drained: no longer blocked");
    assert_eq!(condition(&w, "gpu", "DrainBlocked").0, "False");
}

#[test]
fn a_drain_timeout_marks_the_node_erroring_and_leaves_it_cordoned() {
    let mut w = World::new(1);
    w.add_pod("node-0", "db", &[], Some("StatefulSet"));
    w.pdb_protected.insert("default/db".into());
    w.add_cr(
        "gpu",
        spec(json!({"drainConfig": {"timeout": "20s"}, "packages": {"driver": reboot_pkg()}})),
    );
    for _ in 0..30 {
        w.step();
        w.succeed_all(("reboot", 1));
    }
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Erroring));
    assert_eq!(w.cr("gpu").status.status, Some(Status::Erroring));
    assert!(w.node("node-0").unschedulable);
    assert!(condition(&w, "gpu", "Ready").2.contains("drain timed out"));
    assert!(!w.events("DrainTimeout").is_empty());
    let evictions = evicted(&w).len();
    w.now += 100;
    w.step();
    assert_eq!(
        evicted(&w).len(),
        evictions,
        "no evictions after the timeout"
    );
    assert!(!stages_on(&w, "node-0").iter().any(|s| s == "driver:apply"));
}

#[test]
fn drain_config_decides_which_pods_go_and_how() {
    let mut w = World::new(1);
    w.add_pod("node-0", "ds", &[], Some("DaemonSet"));
    w.add_pod("node-0", "bare", &[], None);
    w.add_pod("node-0", "cache", &[], Some("ReplicaSet"));
    w.snap
        .pods
        .iter_mut()
        .find(|p| p.name == "cache")
        .unwrap()
        .empty_dir = true;
    w.add_cr("gpu", spec(json!({"packages": {"driver": reboot_pkg()}})));
    for _ in 0..6 {
        w.step();
        w.succeed_all(("reboot", 1));
    }
    assert!(
        evicted(&w).is_empty(),
        "an unmanaged pod and an emptyDir pod block by default; DaemonSet pods stay"
    );
    let msg = condition(&w, "gpu", "DrainBlocked").2;
    assert!(
        msg.contains("drainConfig.force") && msg.contains("drainConfig.deleteEmptyDirData"),
        "{msg}"
    );
    w.edit("gpu", |s| {
        s.drain_config = Some(
            serde_json::from_value(
                json!({"force": true, "deleteEmptyDirData": true, "disableEviction": true}),
            )
            .unwrap(),
        )
    });
    w.step();
    let deletes: Vec<(String, bool)> = w
        .history
        .iter()
        .filter_map(|(_, a)| {
            if let Action::Evict { pod, delete, .. } = a {
                Some((pod.clone(), *delete))
            } else {
                None
            }
        })
        .collect();
    assert_eq!(deletes, [("bare".into(), true), ("cache".into(), true)]);
    assert!(w.snap.pods.iter().any(|p| p.name == "ds"));
}

/// Passes until every node but `except` is complete (at most `max`); how many it took.
fn passes_until_others_complete(w: &mut World, except: &str, max: usize) -> usize {
    let others: Vec<String> = w
        .snap
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .filter(|n| n != except)
        .collect();
    for pass in 1..=max {
        w.step();
        w.succeed_all(("reboot", 1));
        if others
            .iter()
            .all(|n| w.node_status("gpu", n) == Some(Status::Complete))
        {
            return pass;
        }
    }
    panic!("the other nodes did not complete in {max} passes");
}

#[test]
fn a_node_whose_drain_a_pdb_blocks_delays_no_other_node_and_its_evictions_stay_throttled() {
    let one_batch = || {
        spec(json!({"interruptionBudget": {"percent": 100}, "packages": {"driver": reboot_pkg()}}))
    };
    let mut free = World::new(5);
    free.add_cr("gpu", one_batch());
    let baseline = passes_until_others_complete(&mut free, "node-0", 60);

    let mut w = World::new(5);
    w.add_pod("node-0", "db", &[], Some("StatefulSet"));
    w.pdb_protected.insert("default/db".into());
    w.add_cr("gpu", one_batch());
    let blocked = passes_until_others_complete(&mut w, "node-0", 60);
    assert_eq!(
        blocked, baseline,
        "the others finish in the same passes whether or not node-0's drain is blocked"
    );
    assert_ne!(w.node_status("gpu", "node-0"), Some(Status::Complete));

    // Five simulated minutes more of node-0 blocked: one eviction request per 30 s window
    // at most, however many passes run (two seconds apart here).
    let start = w.now;
    for _ in 0..150 {
        w.step();
        w.succeed_all(("reboot", 1));
    }
    let minutes = (w.now - start) as f64 / 60.0;
    let attempts = evicted(&w).len();
    assert!(
        attempts as f64 <= minutes * 2.0 + 2.0,
        "{attempts} evictions in {minutes:.1} minutes"
    );
    assert!(attempts >= 5, "it keeps retrying: {attempts}");
}
