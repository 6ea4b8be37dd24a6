//! The planner's forecast against the rollout it foretells: the same world run forward on a
//! copy, node for node — and the world itself left as it was.

use std::collections::BTreeSet;

use nodewright_api::keys;
use nodewright_api::node_state::Stage;
use nodewright_api::v1alpha1::InterruptType;
use nodewright_planner::forecast::{Assume, Forecast, forecast, report};
use nodewright_planner::{JobPhase, ObservedJob, Work};
use serde_json::json;

use crate::world::*;

/// Every Job succeeds; a plan stage reports `plan_says` — what `World::succeed_all` does.
fn succeed(plan_says: (&'static str, u32)) -> impl Fn(&ObservedJob) -> JobPhase {
    move |j| {
        JobPhase::Succeeded(Some(Box::new(match &j.work {
            Work::Package {
                stage: Stage::Plan, ..
            } => ok(plan_says.0, plan_says.1),
            _ => ok("none", 1),
        })))
    }
}

fn foretell(w: &World, outcome: &dyn Fn(&ObservedJob) -> JobPhase, pdb: &[&str]) -> Forecast {
    let assume = Assume {
        outcome,
        runs_for: None,
        evicts_for: None,
        pdb_blocked: pdb.iter().map(|p| p.to_string()).collect(),
        step_seconds: 2,
        max_passes: 300,
        enough: None,
    };
    forecast(&w.snap, w.now, &assume)
}

/// Node annotations, cordons and taints: what a forecast must leave as it found them.
fn marks(w: &World) -> Vec<(String, String, bool, usize)> {
    w.snap
        .nodes
        .iter()
        .map(|n| {
            let a = serde_json::to_string(&n.annotations).unwrap();
            (n.name.clone(), a, n.unschedulable, n.taints.len())
        })
        .collect()
}

/// The forecast for `nodes` is what the world then did to them, pass for pass.
fn matches_the_rollout(f: &Forecast, w: &World, nodes: &[&str]) {
    for &node in nodes {
        let told = f.nodes.get(node).cloned().unwrap_or_default();
        let done = stages_on(w, node);
        let stages: Vec<&String> = done
            .iter()
            .filter(|s| !s.starts_with("interrupt:"))
            .collect();
        let told_stages: Vec<&String> = told.stages.iter().collect();
        assert_eq!(told_stages, stages, "{node}: stages");
        let reboots = done
            .iter()
            .filter(|s| s.starts_with("interrupt:reboot"))
            .count();
        let told_reboots = told
            .interrupts
            .iter()
            .filter(|k| **k == InterruptType::Reboot)
            .count();
        assert_eq!(told_reboots, reboots, "{node}: reboots");
        assert_eq!(
            told.cordoned,
            !cordoned_passes(w, node).is_empty(),
            "{node}: cordon"
        );
        let first = w
            .created()
            .iter()
            .find(|(_, _, n)| *n == node)
            .map(|(pass, _, _)| *pass);
        assert_eq!(told.first_work, first, "{node}: the pass its work starts");
        for cr in &w.snap.nodewrights {
            assert_eq!(
                told.status.get(&cr.name).copied(),
                w.node_status(&cr.name, node),
                "{node}: {}'s status at the end",
                cr.name
            );
        }
    }
}

#[test]
fn a_forecast_is_the_rollout_it_foretells_node_for_node() {
    let mut w = World::new(3);
    w.node_mut("node-2")
        .taints
        .push(k8s_openapi::api::core::v1::Taint {
            key: "dedicated".into(),
            value: Some("db".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        });
    w.add_pod("node-0", "web-0", &[("app", "web")], Some("ReplicaSet/web"));
    w.add_pod("node-1", "web-1", &[("app", "web")], Some("ReplicaSet/web"));
    w.add_cr(
        "driver",
        spec(json!({
            "interruptionBudget": {"count": 1},
            "packages": {"driver": reboot_pkg(), "tuning": plain_pkg()},
        })),
    );
    let outcome = succeed(("reboot", 1));
    let before = marks(&w);
    let f = foretell(&w, &outcome, &[]);
    assert_eq!(marks(&w), before, "the forecast wrote nothing to the world");
    assert!(f.settled, "{f:?}");
    for node in ["node-0", "node-1"] {
        let n = &f.nodes[node];
        assert!(
            n.cordoned && n.interrupts == [InterruptType::Reboot],
            "{node}: {n:?}"
        );
    }
    assert_eq!(f.nodes["node-0"].evicted, ["default/web-0"]);
    assert!(
        f.nodes
            .get("node-2")
            .is_none_or(|n| n.stages.is_empty() && !n.cordoned)
    );

    let rep = report(&f, "driver", &|_| true);
    assert_eq!(
        rep.summary.to_string(),
        "3 nodes: 2 change (2 reboot), 0 converged, 1 blocked; 2 pods evicted; 2 batches",
        "without durations the forecast says nothing of time"
    );
    let text = rep.to_string();
    assert!(
        text.contains("2 × cordon and drain, driver:plan ")
            && text.contains("driver:post-interrupt, reboot → complete: node-0, node-1\n")
            && text.contains("1 × nothing runs (blocked): node-2"),
        "{text}"
    );
    assert_eq!(
        rep.blockers,
        ["Blocked (NodesBlocked): node-2 (untolerated taints: dedicated)"],
        "the taint that holds node-2 is named"
    );
    assert!(
        text.contains("  held by Blocked (NodesBlocked): node-2"),
        "{text}"
    );
    assert_eq!(rep.nodes[0].batch, Some(1));
    assert_eq!(
        rep.nodes[1].batch,
        Some(2),
        "a budget of one: one node at a time"
    );

    w.run(("reboot", 1), 300);
    matches_the_rollout(&f, &w, &["node-0", "node-1", "node-2"]);

    // A node that joins later: only it has work to do; the converged ones have none.
    let passes = w.passes;
    w.add_node("node-3", &[]);
    w.add_pod("node-3", "web-3", &[("app", "web")], Some("ReplicaSet/web"));
    let f = foretell(&w, &outcome, &[]);
    assert!(f.settled);
    for node in ["node-0", "node-1"] {
        assert!(
            f.nodes
                .get(node)
                .is_none_or(|n| n.stages.is_empty() && !n.cordoned),
            "{node} is converged: {:?}",
            f.nodes.get(node)
        );
    }
    let n3 = &f.nodes["node-3"];
    assert!(n3.cordoned && n3.evicted == ["default/web-3"], "{n3:?}");
    let rep = report(&f, "driver", &|_| true);
    assert_eq!(
        (
            rep.summary.change,
            rep.summary.converged,
            rep.summary.blocked
        ),
        (1, 2, 1),
        "{rep}"
    );
    w.run(("reboot", 1), 300);
    let rollout: Vec<_> = stages_on(&w, "node-3");
    assert_eq!(
        n3.stages.len() + n3.interrupts.len(),
        rollout.len(),
        "{rollout:?}"
    );
    assert_eq!(
        n3.first_work.map(|p| p + passes),
        w.created()
            .iter()
            .find(|(_, _, n)| *n == "node-3")
            .map(|(p, _, _)| *p),
        "node-3's work starts when the forecast said"
    );
}

#[test]
fn a_pod_a_budget_protects_is_foretold_as_refused_and_its_node_not_interrupted() {
    let mut w = World::new(1);
    w.add_pod("node-0", "db", &[("app", "db")], Some("StatefulSet/db"));
    w.add_cr(
        "driver",
        spec(json!({"packages": {"driver": reboot_pkg()}})),
    );
    let outcome = succeed(("reboot", 1));
    let f = foretell(&w, &outcome, &["default/db"]);
    assert!(
        f.settled && f.passes < 50,
        "a rollout the budget holds ends the forecast: {} passes",
        f.passes
    );
    assert_eq!(report(&f, "driver", &|_| true).summary.unfinished, 1);
    let n = &f.nodes["node-0"];
    assert_eq!(n.refused, ["default/db"]);
    assert!(n.evicted.is_empty() && n.interrupts.is_empty(), "{n:?}");
    assert!(n.cordoned, "cordoned, then held by the budget");
    // What the world does with the same budget.
    w.pdb_protected = BTreeSet::from(["default/db".to_string()]);
    for _ in 0..f.passes.min(60) {
        w.step();
        w.succeed_all(("reboot", 1));
    }
    assert!(
        stages_on(&w, "node-0")
            .iter()
            .all(|s| !s.starts_with("interrupt:"))
    );
    assert!(w.snap.refusals.contains_key("default/db"));
    assert!(
        w.node("node-0")
            .annotations
            .keys()
            .any(|k| k.starts_with(keys::GROUP)),
        "the rollout is under way on the node"
    );
}

/// With how long each Job runs, the forecast's clock follows the Jobs: a node stays cordoned
/// at least through its apply and its reboot, a budget of one starts the next node only
/// once the first is uncordoned, and the rollout takes at least both nodes' work.
#[test]
fn a_forecast_with_durations_says_how_long_the_rollout_and_each_cordon_take() {
    let mut w = World::new(2);
    w.add_cr(
        "driver",
        spec(json!({"interruptionBudget": {"count": 1}, "packages": {"driver": reboot_pkg()}})),
    );
    w.add_pod("node-0", "web-0", &[("app", "web")], Some("ReplicaSet/web"));
    let outcome = succeed(("reboot", 1));
    let runs_for = |j: &ObservedJob| match &j.work {
        Work::Package {
            stage: Stage::Apply,
            ..
        } => 600,
        Work::Interrupt { .. } => 300,
        _ => 20,
    };
    let assume = Assume {
        outcome: &outcome,
        runs_for: Some(&runs_for),
        evicts_for: None,
        pdb_blocked: Default::default(),
        step_seconds: 2,
        max_passes: 300,
        enough: None,
    };
    let f = forecast(&w.snap, w.now, &assume);
    assert!(f.settled, "{f:?}");
    let (a, b) = (&f.nodes["node-0"], &f.nodes["node-1"]);
    let held = |n: &nodewright_planner::forecast::NodeForecast| {
        n.uncordoned_at.unwrap() - n.cordoned_at.unwrap()
    };
    assert!(held(a) >= 900 && held(b) >= 900, "{a:?} {b:?}");
    assert!(
        b.cordoned_at.unwrap() >= a.uncordoned_at.unwrap(),
        "one node at a time"
    );
    assert!(f.ends_at - f.starts_at >= held(a) + held(b));
    let summary = report(&f, "driver", &|_| true).summary;
    assert_eq!(summary.takes_seconds, Some(f.ends_at - f.starts_at));
    let (mean, max) = (
        summary.cordoned_mean_seconds.unwrap(),
        summary.cordoned_max_seconds.unwrap(),
    );
    assert!(mean >= 900 && max >= mean, "{summary:?}");
    let text = summary.to_string();
    assert!(text.contains("; about ") && text.contains("min"), "{text}");
    // A pod that takes two minutes to leave holds its node's drain that long: node-0 stays
    // cordoned two minutes longer, and the rollout (one node at a time) ends that much later
    // (less the one 2 s pass an instant eviction also waits for).
    let slow = forecast(
        &w.snap,
        w.now,
        &Assume {
            evicts_for: Some(120),
            ..assume.clone()
        },
    );
    assert!(slow.settled, "{slow:?}");
    let (a2, b2) = (&slow.nodes["node-0"], &slow.nodes["node-1"]);
    assert_eq!(a2.evicted, ["default/web-0"]);
    assert!(held(a2) >= held(a) + 118, "{a2:?} against {a:?}");
    assert!(held(b2) < held(a2), "node-1 has no pod to wait for");
    assert!(
        slow.ends_at - slow.starts_at >= f.ends_at - f.starts_at + 118,
        "{} against {}",
        slow.ends_at - slow.starts_at,
        f.ends_at - f.starts_at
    );
    // Nothing runs in the forecast's place: the world's own nodes were not touched.
    assert!(
        w.snap
            .nodes
            .iter()
            .all(|n| n.annotations.is_empty() && !n.unschedulable)
    );
    w.step();
    assert!(
        !w.created().is_empty(),
        "the world itself starts from the beginning"
    );
}

/// Each node's plan answers steer its forecast: a node whose plan finds nothing to do is
/// neither cordoned nor rebooted, one that needs a reboot is. Every plan asked is listed
/// (the preview runs those), and so is the `apply` a package without an interrupt starts
/// with (the preview plans it for the report); the answers are kept with each node.
#[test]
fn plan_answers_per_node_steer_the_forecast_and_every_plan_is_listed() {
    let mut w = World::new(2);
    w.add_cr(
        "driver",
        spec(json!({"packages": {"driver": reboot_pkg(), "tuning": plain_pkg()}})),
    );
    let outcome = |j: &ObservedJob| match &j.work {
        Work::Package {
            stage: Stage::Plan, ..
        } if j.node == "node-0" => JobPhase::Succeeded(Some(Box::new(ok("none", 0)))),
        Work::Package {
            stage: Stage::Plan, ..
        } => JobPhase::Succeeded(Some(Box::new(ok("reboot", 2)))),
        _ => JobPhase::Succeeded(Some(Box::new(ok("none", 1)))),
    };
    let f = foretell(&w, &outcome, &[]);
    assert!(f.settled, "{f:?}");
    let (calm, busy) = (&f.nodes["node-0"], &f.nodes["node-1"]);
    assert!(!calm.cordoned && calm.interrupts.is_empty(), "{calm:?}");
    assert!(!calm.stages.iter().any(|s| s == "driver:apply"), "{calm:?}");
    assert!(
        busy.cordoned && busy.interrupts == [InterruptType::Reboot],
        "{busy:?}"
    );
    assert!(calm.plans["driver"].converged && !busy.plans["driver"].converged);
    assert_eq!(busy.plans["driver"].change_count, 2);
    assert_eq!(busy.plans["driver"].interrupt, "reboot");
    let asked = |asks: &[nodewright_planner::JobRequest]| {
        let mut a: Vec<(String, String, &'static str)> = asks
            .iter()
            .map(|r| {
                let s = r.stage().unwrap();
                (r.node.clone(), s.package.clone(), s.stage.as_str())
            })
            .collect();
        a.sort();
        a
    };
    let plan = |n: &str, p: &str, s: &'static str| (n.to_string(), p.to_string(), s);
    assert_eq!(
        asked(&f.plan_asks),
        [
            plan("node-0", "driver", "plan"),
            plan("node-1", "driver", "plan")
        ]
    );
    assert_eq!(
        asked(&f.unplanned),
        [
            plan("node-0", "tuning", "apply"),
            plan("node-1", "tuning", "apply")
        ]
    );
}

/// Each node's compartment and batch in the forecast: the batch the rollout then puts it in.
#[test]
fn each_node_is_foretold_in_the_compartment_and_batch_the_rollout_puts_it_in() {
    let mut w = World::new(0);
    staged(
        &mut w,
        &["canary", "production", "production", "production", ""],
    );
    w.add_cr(
        "rollout",
        spec(json!({"deploymentPolicy": "staged", "packages": {"tuning": plain_pkg()}})),
    );
    let f = foretell(&w, &succeed(("none", 1)), &[]);
    assert!(f.settled, "{f:?}");

    // The rollout itself, its batches read from the status after every pass.
    let mut seen: std::collections::BTreeMap<String, (String, i32)> = Default::default();
    for _ in 0..60 {
        w.step();
        for (name, c) in &w.cr("rollout").status.compartment_statuses {
            let batch = c.batch_state.as_ref().map_or(1, |b| b.current_batch);
            for node in &c.batch_nodes {
                seen.entry(node.clone()).or_insert((name.clone(), batch));
            }
        }
        w.succeed_all(("none", 1));
    }
    assert_eq!(seen.len(), 5, "every node joined a batch: {seen:?}");
    let told: std::collections::BTreeMap<String, (String, i32)> = f
        .nodes
        .iter()
        .filter_map(|(n, nf)| {
            let p = nf.placed.get("rollout")?;
            Some((n.clone(), (p.compartment.clone(), p.batch)))
        })
        .collect();
    assert_eq!(told, seen, "compartment and batch, node for node");
    assert_eq!(seen["w0"].0, "canary");
    assert_eq!(seen["w4"].0, "__default__");
    let production: BTreeSet<i32> = ["w1", "w2", "w3"].iter().map(|n| seen[*n].1).collect();
    assert!(
        production.len() > 1,
        "linear growth from one: production runs in more than one batch: {seen:?}"
    );

    let rep = report(&f, "rollout", &|_| true);
    let line = |n: &str| rep.nodes.iter().find(|l| l.name == n).unwrap();
    assert_eq!(line("w0").compartment.as_deref(), Some("canary"));
    assert_eq!(line("w0").batch, Some(seen["w0"].1));
    assert_eq!(
        rep.summary.batches,
        seen.values().collect::<BTreeSet<_>>().len(),
        "each compartment's batches counted apart"
    );
}
