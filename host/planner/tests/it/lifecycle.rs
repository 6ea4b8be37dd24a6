//! Everyday changes in the middle of a rollout: a version bump under a DeploymentPolicy,
//! deleting the NodeWright, a node leaving the selector. None of them may strand a node:
//! every targeted node ends complete or erroring, and a node the CR lets go of keeps
//! nothing of it.

use crate::world;

use nodewright_api::keys;
use nodewright_api::node_state::Stage;
use nodewright_api::v1alpha1::Status;
use nodewright_planner::{Action, JobPhase, Work};
use serde_json::json;
use world::{World, ok, policy, spec};

fn reboot_pkg(version: &str) -> serde_json::Value {
    json!({"version": version, "plugin": "r.example/driver:1", "interrupt": {"type": "reboot"}})
}

fn complete(w: &World, cr: &str) -> Vec<String> {
    w.snap
        .nodes
        .iter()
        .filter(|n| w.node_status(cr, &n.name) == Some(Status::Complete))
        .map(|n| n.name.clone())
        .collect()
}

fn at_work(w: &World) -> Vec<String> {
    let mut nodes: Vec<String> = w
        .snap
        .jobs
        .iter()
        .filter(|j| j.running())
        .map(|j| j.node.clone())
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// Nothing of `cr` on `node`: no per-CR annotation, no Karpenter mark of ours, no Job.
fn holds_nothing(w: &World, cr: &str, node: &str) -> Result<(), String> {
    let n = w.node(node);
    for key in nodewright_api::node_state::keys(cr) {
        if n.annotations.contains_key(&key) {
            return Err(format!("{node} still carries {key}"));
        }
    }
    for key in [
        keys::KARPENTER_DO_NOT_DISRUPT,
        keys::KARPENTER_DO_NOT_REPAIR,
        keys::KARPENTER_OWNED,
    ] {
        if n.annotations.contains_key(key) {
            return Err(format!("{node} still carries {key}"));
        }
    }
    if w.snap.jobs.iter().any(|j| j.cr == cr && j.node == node) {
        return Err(format!("{node} still runs a Job of {cr}"));
    }
    Ok(())
}

/// Passes until `until` holds, every Job finishing (plans report a reboot).
fn drive(w: &mut World, max: usize, until: impl Fn(&World) -> bool) {
    for _ in 0..max {
        if until(w) {
            return;
        }
        w.step();
        if until(w) {
            return;
        }
        w.succeed_all(("reboot", 1));
    }
    panic!("condition not reached in {max} passes");
}

#[test]
fn a_version_bump_mid_rollout_under_a_policy_reaches_every_node() {
    let mut w = World::new(6);
    w.snap.policies.insert(
        "pairs".into(),
        policy(json!({"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}})),
    );
    w.add_cr(
        "drivers",
        spec(json!({"deploymentPolicy": "pairs", "packages": {"driver": reboot_pkg("1.0.0")}})),
    );
    // Two nodes done, two at work, two not started.
    drive(&mut w, 60, |w| {
        complete(w, "drivers").len() == 2 && at_work(w).len() == 2
    });
    let touched: Vec<String> = complete(&w, "drivers")
        .into_iter()
        .chain(at_work(&w))
        .collect();
    w.edit("drivers", |s| {
        s.packages.get_mut("driver").unwrap().version = "2.0.0".into()
    });
    w.run(("reboot", 1), 200);
    for n in &w.snap.nodes {
        assert_eq!(
            w.node_status("drivers", &n.name),
            Some(Status::Complete),
            "{} stranded",
            n.name
        );
        let st = w.state("drivers", &n.name);
        assert!(
            st.contains_key("driver|2.0.0"),
            "{} is not on the new version: {st:?}",
            n.name
        );
        assert!(!n.unschedulable);
    }
    let untouched: Vec<&str> = w
        .snap
        .nodes
        .iter()
        .map(|n| n.name.as_str())
        .filter(|n| !touched.iter().any(|t| t == n))
        .collect();
    assert_eq!(untouched.len(), 2);
    let comp = &w.cr("drivers").status.compartment_statuses["__default__"];
    let state = comp.batch_state.as_ref().unwrap();
    assert!(
        state.completed_nodes + state.failed_nodes <= comp.matched,
        "counters {state:?} for {} nodes",
        comp.matched
    );
    assert_eq!(w.cr("drivers").status.status, Some(Status::Complete));
}

#[test]
fn deleting_a_nodewright_stops_its_jobs_before_releasing_nodes_and_the_finalizer() {
    let mut w = World::new(2);
    w.add_cr("drivers", spec(json!({"interruptionBudget": {"count": 2}, "packages": {"driver": reboot_pkg("1.0.0")}})));
    // Both nodes cordoned with a running apply.
    drive(&mut w, 30, |w| {
        w.snap
            .jobs
            .iter()
            .filter(|j| {
                matches!(
                    &j.work,
                    Work::Package {
                        stage: Stage::Apply,
                        ..
                    }
                ) && j.running()
            })
            .count()
            == 2
    });
    assert!(w.node("node-0").unschedulable && w.node("node-1").unschedulable);
    w.cr_mut("drivers").deleting = true;
    let acted = w.step();
    let stops: Vec<&Action> = acted
        .iter()
        .filter(|a| matches!(a, Action::DeleteJob { running: true, .. }))
        .collect();
    assert_eq!(stops.len(), 2, "both running Jobs are stopped: {acted:?}");
    assert!(
        !acted
            .iter()
            .any(|a| matches!(a, Action::RemoveFinalizer { .. })),
        "the finalizer waits for the Jobs"
    );
    assert!(
        w.node("node-0").unschedulable && w.node("node-1").unschedulable,
        "cordons are kept while the Jobs stop"
    );
    // Stopping Jobs are not deleted twice and still hold everything.
    let again = w.step();
    assert!(
        !again
            .iter()
            .any(|a| matches!(a, Action::DeleteJob { .. } | Action::RemoveFinalizer { .. })),
        "{again:?}"
    );
    assert!(w.node("node-0").unschedulable);
    // Their pods are gone: the cordons go, then the finalizer, in one pass.
    w.finish_jobs(|_| None);
    w.step();
    assert!(
        w.snap.nodewrights.is_empty(),
        "the finalizer is removed once nothing runs"
    );
    for n in ["node-0", "node-1"] {
        assert!(!w.node(n).unschedulable, "{n} released");
        let marks = holds_nothing(&w, "drivers", n);
        // Deletion keeps a state that still lists packages (NodeWright's record of what is
        // installed); everything else goes.
        assert!(
            marks.as_ref().is_ok()
                || marks
                    .as_ref()
                    .is_err_and(|m| m.contains(&keys::node_state("drivers"))),
            "{marks:?}"
        );
    }
}

#[test]
fn a_node_leaving_the_selector_mid_apply_is_stopped_and_released() {
    let mut w = World::new(0);
    w.add_node("gpu-0", &[("pool", "gpu")]);
    w.add_node("gpu-1", &[("pool", "gpu")]);
    w.add_cr("drivers", spec(json!({"nodeSelectors": {"matchLabels": {"pool": "gpu"}}, "interruptionBudget": {"count": 1}, "packages": {"driver": reboot_pkg("1.0.0")}})));
    drive(&mut w, 30, |w| {
        w.snap.jobs.iter().any(|j| {
            j.node == "gpu-0"
                && matches!(
                    &j.work,
                    Work::Package {
                        stage: Stage::Apply,
                        ..
                    }
                )
                && j.running()
        })
    });
    assert!(w.node("gpu-0").unschedulable);
    assert_eq!(
        w.node("gpu-1")
            .annotations
            .get(&keys::node_status("drivers"))
            .map(String::as_str),
        Some("waiting")
    );
    // Both leave the pool: gpu-0 mid-apply, gpu-1 before it started.
    w.node_mut("gpu-0").labels.remove("pool");
    w.node_mut("gpu-1").labels.remove("pool");
    let acted = w.step();
    assert!(
        acted
            .iter()
            .any(|a| matches!(a, Action::DeleteJob { node, running: true, .. } if node == "gpu-0")),
        "{acted:?}"
    );
    assert!(
        w.node("gpu-0").unschedulable,
        "still cordoned while its Job stops"
    );
    assert_eq!(
        holds_nothing(&w, "drivers", "gpu-1"),
        Ok(()),
        "a waiting node is released at once"
    );
    w.finish_jobs(|_| Some(JobPhase::Succeeded(Some(Box::new(ok("none", 1))))));
    w.step();
    assert!(!w.node("gpu-0").unschedulable);
    assert_eq!(holds_nothing(&w, "drivers", "gpu-0"), Ok(()));
    assert!(!w.events("Released").is_empty());
    // Nothing more happens to them, and the CR is complete on the nodes it targets (none).
    let quiet = w.step();
    assert!(
        quiet
            .iter()
            .all(|a| matches!(a, Action::Event(_) | Action::SetStatus { .. })),
        "{quiet:?}"
    );
}
