//! Property tests over random fleets and random Job outcomes: the rollout's invariants
//! hold at every pass, and every run ends with each node complete or erroring.

mod world;

use std::collections::{BTreeMap, BTreeSet};

use nodewright_api::keys;
use nodewright_api::v1alpha1::{Stage, Status, state_key};
use nodewright_planner::packages::effective;
use nodewright_planner::{Action, JobPhase, Work};
use proptest::prelude::*;
use serde_json::json;
use world::{World, ok, policy, spec};

#[derive(Clone, Debug)]
struct Fleet {
    nodes: Vec<(bool, u8, bool)>, // (tier a, pods, externally cordoned)
    packages: Vec<(u8, bool)>,    // (interrupt: 0 none, 1 service, 2 reboot; depends on the previous)
    budget: u8,
    with_policy: bool,
    canary_batch: u8,
    outcomes: Vec<u8>,
}

fn fleet() -> impl Strategy<Value = Fleet> {
    (
        prop::collection::vec((any::<bool>(), 0u8..3, prop::bool::weighted(0.15)), 1..12),
        prop::collection::vec((0u8..3, any::<bool>()), 1..4),
        1u8..4,
        any::<bool>(),
        1u8..3,
        prop::collection::vec(any::<u8>(), 64),
    )
        .prop_map(|(nodes, packages, budget, with_policy, canary_batch, outcomes)| Fleet { nodes, packages, budget, with_policy, canary_batch, outcomes })
}

fn build(f: &Fleet) -> World {
    let mut w = World::new(0);
    for (i, (tier_a, pods, cordoned)) in f.nodes.iter().enumerate() {
        let name = format!("n{i}");
        w.add_node(&name, &[("tier", if *tier_a { "a" } else { "b" })]);
        w.node_mut(&name).unschedulable = *cordoned;
        for p in 0..*pods {
            w.add_pod(&name, &format!("{name}-pod{p}"), &[], Some("ReplicaSet"));
        }
    }
    let mut packages = serde_json::Map::new();
    for (i, (interrupt, depends)) in f.packages.iter().enumerate() {
        let mut p = json!({"version": "1.0.0", "plugin": format!("r.example/p{i}:1"), "configMap": {"k": "v"}});
        match interrupt {
            1 => p["interrupt"] = json!({"type": "service", "services": [format!("s{i}.service")]}),
            2 => p["interrupt"] = json!({"type": "reboot"}),
            _ => {}
        }
        if *depends && i > 0 {
            p["dependsOn"] = json!({format!("p{}", i - 1): "1.0.0"});
        }
        packages.insert(format!("p{i}"), p);
    }
    let mut s = json!({"packages": packages});
    if f.with_policy {
        w.snap.policies.insert(
            "pol".into(),
            policy(json!({
                "default": {"budget": {"count": f.budget}},
                "compartments": [{"name": "a", "selector": {"matchLabels": {"tier": "a"}}, "budget": {"count": 3},
                                  "strategy": {"fixed": {"initialBatch": f.canary_batch}}}]
            })),
        );
        s["deploymentPolicy"] = json!("pol");
    } else {
        s["interruptionBudget"] = json!({"count": f.budget});
    }
    w.add_cr("cr", spec(s));
    w
}

/// The most nodes each node's compartment may have at work at once, from the fleet alone.
fn limits(f: &Fleet) -> BTreeMap<String, (String, usize)> {
    f.nodes
        .iter()
        .enumerate()
        .map(|(i, (tier_a, _, _))| {
            let c = match (f.with_policy, tier_a) {
                (true, true) => ("a".to_string(), f.canary_batch as usize),
                _ => ("default".to_string(), f.budget as usize),
            };
            (format!("n{i}"), c)
        })
        .collect()
}

fn check_pass(w: &World, f: &Fleet, acted: &[Action], external: &BTreeSet<String>, interrupts: &mut BTreeMap<(String, i64, String), u32>) -> Result<(), TestCaseError> {
    let cr = w.cr("cr");
    // 1. Nodes at work per compartment never exceed its batch size.
    let mut at_work: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (node, (comp, _)) in limits(f) {
        let busy = w.snap.jobs.iter().any(|j| j.node == node && matches!(j.phase, JobPhase::Active { .. }));
        let ours = w.node(&node).annotations.contains_key(&keys::cordon("cr"));
        let settled = matches!(w.node_status("cr", &node), Some(Status::Erroring | Status::Complete));
        if busy || (ours && !settled) {
            at_work.entry(comp).or_default().insert(node);
        }
    }
    for (comp, nodes) in &at_work {
        let limit = limits(f).values().find(|(c, _)| c == comp).map(|(_, l)| *l).unwrap_or(0);
        prop_assert!(nodes.len() <= limit, "compartment {comp}: {} nodes at work, limit {limit}: {nodes:?}", nodes.len());
    }
    for a in acted {
        let Action::CreateJob(req) = a else { continue };
        let node = w.node(&req.node);
        match &req.work {
            // 2. Disruptive stages of an interrupting package run only cordoned and drained.
            Work::Package { package, version, stage: Stage::Apply | Stage::Config | Stage::Upgrade | Stage::Uninstall } => {
                let p = &cr.spec.packages[package];
                let st = w.state("cr", &req.node);
                if !effective(p, st.get(&state_key(package, version))).is_empty() {
                    prop_assert!(node.unschedulable, "{} of {package} on uncordoned {}", req.name, req.node);
                    prop_assert!(!w.snap.pods.iter().any(|p| p.node == req.node), "{} of {package} on undrained {}", req.name, req.node);
                }
            }
            // 3. A merged interrupt runs at most once per node, generation and owner (a disrupted
            //    attempt is re-created; a finished one never), and alone.
            Work::Interrupt { owner, .. } => {
                let done = interrupts.get(&(req.node.clone(), req.generation, owner.clone())).copied().unwrap_or(0);
                prop_assert_eq!(done, 0, "second interrupt on {} for {} after one succeeded", req.node, owner);
                let others = w.snap.jobs.iter().filter(|j| j.node == req.node && j.name != req.name && matches!(j.work, Work::Package { .. }) && matches!(j.phase, JobPhase::Active { .. })).count();
                prop_assert_eq!(others, 0, "interrupt on {} while package Jobs run", req.node);
                prop_assert!(node.unschedulable, "interrupt on uncordoned {}", req.node);
            }
            Work::Package { .. } => {}
        }
    }
    // 4. A cordon nodewright did not make is never released.
    for n in external {
        prop_assert!(w.node(n).unschedulable, "external cordon on {n} released");
    }
    Ok(())
}

fn outcome(f: &Fleet, pass: usize, i: usize, work: &Work) -> Option<JobPhase> {
    let r = f.outcomes[(pass * 7 + i * 13) % f.outcomes.len()];
    Some(match r % 20 {
        0 => JobPhase::Failed { genuine: true, attempts: 4, reason: "BackoffLimitExceeded".into(), last: None },
        1 => JobPhase::Failed { genuine: false, attempts: 0, reason: "BackoffLimitExceeded".into(), last: None },
        2 | 3 => return None, // still running
        _ => JobPhase::Succeeded(Some(match work {
            Work::Package { stage: Stage::Plan, .. } => match r % 3 {
                0 => ok("none", 0),
                1 => ok("reboot", 1),
                _ => ok("none", 2),
            },
            _ => ok("none", 1),
        })),
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn rollouts_keep_their_invariants_and_terminate(f in fleet()) {
        let mut w = build(&f);
        let external: BTreeSet<String> = w.snap.nodes.iter().filter(|n| n.unschedulable).map(|n| n.name.clone()).collect();
        let mut interrupts = BTreeMap::new();
        let mut quiet = false;
        for pass in 0..400 {
            let acted = w.step();
            check_pass(&w, &f, &acted, &external, &mut interrupts)?;
            if acted.iter().all(|a| matches!(a, Action::Event(_))) && w.snap.jobs.is_empty() {
                quiet = true;
                break;
            }
            let mut i = 0;
            let mut succeeded = Vec::new();
            w.finish_jobs(|j| {
                i += 1;
                let o = outcome(&f, pass, i, &j.work);
                if let (Work::Interrupt { owner, .. }, Some(JobPhase::Succeeded(_))) = (&j.work, &o) {
                    succeeded.push((j.node.clone(), j.generation, owner.clone()));
                }
                o
            });
            for k in succeeded {
                *interrupts.entry(k).or_default() += 1;
            }
        }
        prop_assert!(quiet, "no convergence: jobs {:?}", w.snap.jobs.iter().map(|j| &j.name).collect::<Vec<_>>());
        for n in &w.snap.nodes {
            let s = w.node_status("cr", &n.name);
            prop_assert!(matches!(s, Some(Status::Complete | Status::Erroring)), "{} ended {s:?}", n.name);
            if s == Some(Status::Complete) && !external.contains(&n.name) {
                prop_assert!(!n.unschedulable, "{} complete but still cordoned", n.name);
            }
        }
    }
}

