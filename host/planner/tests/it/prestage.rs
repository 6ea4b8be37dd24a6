//! Payloads staged before the cordon (`spec.prestage`): what a node does first, when it
//! may be cordoned, and what a node that cannot stage does.

use crate::world;

use nodewright_api::keys;
use nodewright_api::node_state::Staged;
use nodewright_api::result::{Blame, StageResult};
use nodewright_api::v1alpha1::Status;
use nodewright_planner::{Action, JobPhase, ObservedJob, Work};
use serde_json::json;
use world::{World, plain_pkg, reboot_pkg, spec, stages_on};

const MIB: u64 = 1 << 20;

/// The pass at which `node` was first cordoned.
fn cordoned_at(w: &World, node: &str) -> Option<usize> {
    w.history.iter().find_map(|(i, a)| {
        matches!(a, Action::PatchNode(p) if p.node == node && p.unschedulable == Some(true))
            .then_some(*i)
    })
}

/// Every staged mark written on `node`, with its pass, in order.
fn staged_marks(w: &World, cr: &str, node: &str) -> Vec<(usize, Staged)> {
    w.history
        .iter()
        .filter_map(|(i, a)| match a {
            Action::PatchNode(p) if p.node == node => p
                .annotations
                .get(&keys::staged(cr))
                .cloned()
                .flatten()
                .map(|v| (*i, v.parse().expect("a staged mark"))),
            _ => None,
        })
        .collect()
}

/// The pass at which `node` first recorded its staged payloads, and what it recorded.
fn staged_at(w: &World, cr: &str, node: &str) -> Option<(usize, Staged)> {
    staged_marks(w, cr, node).into_iter().next()
}

fn is_prestage(j: &ObservedJob) -> bool {
    matches!(j.work, Work::Prestage { .. })
}

/// A GPU driver with a 300 MiB payload, rebooting, one node at a time.
fn driver_rollout(nodes: usize, prestage: Option<&str>) -> World {
    let mut w = World::new(nodes);
    let mut s = json!({"interruptionBudget": {"count": 1}, "packages": {"driver": reboot_pkg(), "tuning": plain_pkg()}});
    if let Some(p) = prestage {
        s["prestage"] = json!(p);
    }
    w.add_cr("gpu", spec(s));
    w.with_payloads("gpu", &[("driver", 300 * MIB)]);
    w
}

#[test]
fn a_node_stages_its_payloads_before_anything_of_the_rollout_and_is_cordoned_after() {
    let mut w = driver_rollout(2, None);
    w.run(("reboot", 1), 80);
    for n in ["node-0", "node-1"] {
        let stages = stages_on(&w, n);
        assert_eq!(stages[0], "prestage", "{n}: {stages:?}");
        assert_eq!(
            stages.iter().filter(|s| *s == "prestage").count(),
            1,
            "{n} stages once: {stages:?}"
        );
        let (staged, mark) = staged_at(&w, "gpu", n).expect("a staged mark");
        assert_eq!(mark.bytes, 300 * MIB, "{n}");
        let cordoned = cordoned_at(&w, n).expect("the reboot needs a cordon");
        assert!(
            staged <= cordoned,
            "{n}: staged at pass {staged}, cordoned at {cordoned}"
        );
        assert_eq!(w.node_status("gpu", n), Some(Status::Complete));
    }
    // The first Job of the rollout on node-0 is its prestage, and nothing else was asked of
    // the node while it ran.
    let first = w.created();
    let (pass, work, node) = &first[0];
    assert!(
        matches!(work, Work::Prestage { .. }) && *node == "node-0",
        "{first:?}"
    );
    assert!(
        first
            .iter()
            .filter(|(p, _, n)| p == pass && *n == "node-0")
            .count()
            == 1,
        "only the prestage started in its pass: {first:?}"
    );
    assert_eq!(w.events("Staged").len(), 2, "{:?}", w.events("Staged"));
}

#[test]
fn with_batch_a_node_stages_only_once_it_is_picked_and_with_all_every_node_stages_at_once() {
    let mut batch = driver_rollout(3, Some("batch"));
    batch.step();
    let staging: Vec<&str> = batch.created().into_iter().map(|(_, _, n)| n).collect();
    assert_eq!(staging, ["node-0"], "one node per batch");

    let mut all = driver_rollout(3, Some("all"));
    all.step();
    let mut staging: Vec<&str> = all
        .created()
        .into_iter()
        .filter(|(_, w, _)| matches!(w, Work::Prestage { .. }))
        .map(|(_, _, n)| n)
        .collect();
    staging.sort();
    assert_eq!(staging, ["node-0", "node-1", "node-2"]);
    // The nodes outside the batch stage and wait: no cordon, no plan, status waiting.
    all.succeed_all(("reboot", 1));
    for _ in 0..4 {
        all.step();
        all.succeed_all(("reboot", 1));
    }
    for n in ["node-1", "node-2"] {
        assert!(staged_at(&all, "gpu", n).is_some(), "{n} staged ahead");
        assert_eq!(stages_on(&all, n), ["prestage"], "{n} waits for its batch");
        assert_eq!(cordoned_at(&all, n), None);
    }
    // Then the whole rollout completes without staging anything twice.
    all.run(("reboot", 1), 80);
    for n in ["node-0", "node-1", "node-2"] {
        let stages = stages_on(&all, n);
        assert_eq!(
            stages.iter().filter(|s| *s == "prestage").count(),
            1,
            "{n}: {stages:?}"
        );
        assert_eq!(all.node_status("gpu", n), Some(Status::Complete));
    }
}

#[test]
fn with_none_nothing_is_staged_ahead_and_without_payloads_there_is_nothing_to_stage() {
    let mut w = driver_rollout(1, Some("none"));
    w.run(("reboot", 1), 40);
    assert!(!stages_on(&w, "node-0").contains(&"prestage".to_string()));
    assert_eq!(staged_at(&w, "gpu", "node-0"), None);
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Complete));

    let mut w = World::new(1);
    w.add_cr("gpu", spec(json!({"packages": {"driver": reboot_pkg()}})));
    w.run(("reboot", 1), 40);
    assert_eq!(stages_on(&w, "node-0")[0], "driver:plan");
}

#[test]
fn a_deleted_rollout_uninstalls_without_staging_anything_again() {
    let mut w = World::new(1);
    w.add_cr("gpu", spec(json!({"packages": {"driver": {"version": "1.0.0", "plugin": "r.example/driver:1", "interrupt": {"type": "reboot"}, "uninstall": {"enabled": true}}}})));
    w.with_payloads("gpu", &[("driver", 300 * MIB)]);
    w.run(("reboot", 1), 40);
    // A reset on the node forgets what it staged; the deletion still stages nothing.
    w.node_mut("node-0")
        .annotations
        .remove(&keys::staged("gpu"));
    let before = stages_on(&w, "node-0").len();
    w.cr_mut("gpu").deleting = true;
    w.run(("reboot", 1), 40);
    assert!(w.snap.nodewrights.is_empty(), "finalizer removed");
    let after = &stages_on(&w, "node-0")[before..];
    assert!(after.contains(&"driver:uninstall".to_string()), "{after:?}");
    assert!(!after.contains(&"prestage".to_string()), "{after:?}");
}

#[test]
fn a_node_whose_payloads_cannot_be_staged_reads_erroring_and_is_never_cordoned() {
    let mut w = driver_rollout(2, None);
    let no_room = StageResult::failed(
        None,
        "payloads",
        Blame::Host,
        "payload firmware (300.0 MiB) of r.example/driver@sha256:00… needs 300.0 MiB; 120.0 MiB free",
    );
    // An attempt fails while the Job retries: erroring, naming it.
    w.step();
    w.finish_jobs(|_| {
        Some(JobPhase::Active {
            failed: 1,
            last: Some(Box::new(no_room.clone())),
        })
    });
    w.step();
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Erroring));
    // Its last attempt fails too: still erroring, the Job kept for its logs, a warning; the
    // node counts as failed for its batch (as a failed stage does), so the rollout moves on.
    let kept = w.snap.jobs[0].name.clone();
    for j in w.snap.jobs.iter_mut().filter(|j| is_prestage(j)) {
        j.phase = JobPhase::Failed {
            genuine: true,
            attempts: 2,
            reason: "BackoffLimitExceeded".into(),
            last: Some(Box::new(no_room.clone())),
        };
    }
    for _ in 0..6 {
        w.step();
    }
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Erroring));
    assert_eq!(cordoned_at(&w, "node-0"), None, "never cordoned");
    assert_eq!(
        stages_on(&w, "node-0"),
        ["prestage"],
        "nothing else started"
    );
    assert!(
        w.snap.jobs.iter().any(|j| j.name == kept),
        "the failed Job is kept"
    );
    assert_eq!(
        stages_on(&w, "node-1"),
        ["prestage"],
        "the next batch began"
    );
    let warnings = w.events("PrestageFailed");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("120.0 MiB free") && warnings[0].contains("node-0"),
        "{warnings:?}"
    );
    // Once its TTL ends the Job, the node stages again and goes on.
    w.snap.jobs.retain(|j| j.name != kept);
    w.run(("reboot", 1), 80);
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Complete));
    assert_eq!(
        stages_on(&w, "node-0")
            .iter()
            .filter(|s| *s == "prestage")
            .count(),
        2
    );
}

#[test]
fn a_new_pin_is_staged_again_before_the_next_cordon_and_a_stale_staging_is_let_go() {
    let mut w = driver_rollout(1, None);
    w.run(("reboot", 1), 40);
    let (_, first) = staged_at(&w, "gpu", "node-0").unwrap();
    // A new version with a new plugin digest: a new payload set.
    w.edit("gpu", |s| {
        let d = s.packages.get_mut("driver").unwrap();
        d.version = "2.0.0".into();
    });
    let pin = format!("r.example/driver@sha256:{}", "1".repeat(64));
    if let nodewright_planner::PluginCheck::Ready(r) = &mut w.cr_mut("gpu").plugins {
        r.pinned.insert("driver".into(), pin.parse().unwrap());
    }
    let before = w.history.len();
    w.step();
    let created: Vec<_> = w.created();
    let after: Vec<_> = created
        .iter()
        .filter(|(p, _, _)| *p == w.passes)
        .map(|(_, work, _)| work.clone())
        .collect();
    assert!(
        matches!(after.as_slice(), [Work::Prestage { set }] if *set != first.set),
        "{after:?}"
    );
    assert!(w.history.len() > before);
    // Another edit while it stages: the staging of the old set is stopped, the new one
    // started in its place.
    let pin = format!("r.example/driver@sha256:{}", "2".repeat(64));
    w.edit("gpu", |_| {});
    if let nodewright_planner::PluginCheck::Ready(r) = &mut w.cr_mut("gpu").plugins {
        r.pinned.insert("driver".into(), pin.parse().unwrap());
    }
    let acted = w.step();
    assert!(
        acted
            .iter()
            .any(|a| matches!(a, Action::DeleteJob { running: true, .. })),
        "{acted:?}"
    );
    w.finish_jobs(|_| None); // its pods are gone
    w.run(("reboot", 1), 60);
    let (_, last) = staged_marks(&w, "gpu", "node-0")
        .pop()
        .expect("a staged mark");
    assert_ne!(last.set, first.set);
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Complete));
    assert_eq!(
        w.node("node-0").annotations.get(&keys::staged("gpu")),
        Some(&last.to_string())
    );
}

/// The prestage Job tells the node's cache what else to keep when it collects garbage:
/// every NodeWright's pinned plugins that select the node, and every plugin a
/// package's state on the node recorded (its uninstall runs that version) — never what the
/// Job stages itself, and nothing of a NodeWright that selects other nodes.
#[test]
fn the_prestage_job_names_what_the_node_cache_must_keep_beside_it() {
    use nodewright_api::node_state::{NodeState, PackageStatus, Stage, state_key};
    let mut w = driver_rollout(1, None);
    w.add_cr(
        "kernel",
        spec(json!({"packages": {"kmod": {"version": "2.0.0", "plugin": "r.example/kmod:2"}}})),
    );
    w.add_cr(
        "elsewhere",
        spec(json!({"nodeSelectors": {"matchLabels": {"pool": "cpu"}},
                    "packages": {"other": {"version": "1.0.0", "plugin": "r.example/other:1"}}})),
    );
    // The node ran kmod 1.0.0 from an older pin, still installed.
    let old = format!("r.example/kmod@sha256:{}", "1".repeat(64));
    let mut state = NodeState::new();
    let mut e = PackageStatus::new("kmod", "1.0.0", Stage::Config, 1);
    e.digest = Some(old.parse().unwrap());
    state.insert(state_key("kmod", "1.0.0"), e);
    w.snap.nodes[0].annotations.insert(
        keys::node_state("kernel"),
        serde_json::to_string(&state).unwrap(),
    );
    let actions = w.step();
    let call = actions
        .iter()
        .find_map(|a| match a {
            Action::CreateJob(r) if r.cr == "gpu" => match &r.ask {
                nodewright_planner::Ask::Prestage { call, .. } => Some(call.clone()),
                _ => None,
            },
            _ => None,
        })
        .expect("gpu's prestage Job");
    let keep: Vec<&str> = call.keep.iter().map(|p| p.as_str()).collect();
    let zeros = "0".repeat(64);
    assert_eq!(
        keep,
        [
            format!("r.example/kmod@sha256:{zeros}"),
            old.clone(),
            format!("r.example/tuning@sha256:{zeros}"),
        ]
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>(),
        "the other NodeWright's pin, the recorded one and gpu's plugin without payloads — not the one the Job stages, nothing of a NodeWright selecting other nodes"
    );
    assert!(call.plugins.iter().all(|p| !call.keep.contains(p)));
}
