//! Property tests over random fleets and random Job outcomes: the rollout's invariants
//! hold at every pass, and every run ends with each node complete or erroring.

use crate::fleet;
use crate::world;

use std::collections::{BTreeMap, BTreeSet};

use fleet::{Fleet, HELD_PASSES, build, fleet, gate_fails, held, limits, outcome, protected_pods};
use nodewright_api::keys;
use nodewright_api::node_state::{Stage, state_key};
use nodewright_api::v1alpha1::Status;
use nodewright_planner::packages::effective;
use nodewright_planner::{Action, GateFinding, JobPhase, Work};
use proptest::prelude::*;
use world::World;

fn check_pass(
    w: &World,
    f: &Fleet,
    acted: &[Action],
    external: &BTreeSet<String>,
    interrupts: &mut BTreeMap<(String, i64, String), u32>,
) -> Result<(), TestCaseError> {
    let cr = w.cr("cr");
    // 1. Nodes at work per compartment never exceed its batch size.
    let mut at_work: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (node, (comp, _)) in limits(f) {
        // Staging payloads ahead (`prestage: all`) is not work on the node: it disrupts
        // nothing and runs outside the batches by design.
        let busy = w.snap.jobs.iter().any(|j| {
            j.node == node
                && matches!(j.phase, JobPhase::Active { .. })
                && !matches!(j.work, Work::Prestage { .. })
        });
        let ours = w.node(&node).annotations.contains_key(&keys::cordon("cr"));
        let settled = matches!(
            w.node_status("cr", &node),
            Some(Status::Erroring | Status::Complete)
        );
        if busy || (ours && !settled) {
            at_work.entry(comp).or_default().insert(node);
        }
    }
    for (comp, nodes) in &at_work {
        let limit = limits(f)
            .values()
            .find(|(c, _)| c == comp)
            .map(|(_, l)| *l)
            .unwrap_or(0);
        prop_assert!(
            nodes.len() <= limit,
            "compartment {comp}: {} nodes at work, limit {limit}: {nodes:?}",
            nodes.len()
        );
    }
    for a in acted {
        let Action::CreateJob(req) = a else { continue };
        let node = w.node(&req.node);
        match &req.work() {
            // 2. Disruptive stages of an interrupting package run only cordoned and drained.
            Work::Package {
                package,
                version,
                stage: Stage::Apply | Stage::Config | Stage::Upgrade | Stage::Uninstall,
            } => {
                let p = &cr.spec.packages[package];
                let st = w.state("cr", &req.node);
                if !effective(p, st.get(&state_key(package, version))).is_empty() {
                    prop_assert!(
                        node.unschedulable,
                        "{} of {package} on uncordoned {}",
                        req.name,
                        req.node
                    );
                    prop_assert!(
                        !w.snap.pods.iter().any(|p| p.node == req.node),
                        "{} of {package} on undrained {}",
                        req.name,
                        req.node
                    );
                }
            }
            // Staging disrupts nothing; property 7 holds the cordon back until it is done.
            Work::Prestage { .. } => {}
            // 3. A merged interrupt runs at most once per node, generation and owner (a disrupted
            //    attempt is re-created; a finished one never), and alone.
            Work::Interrupt { owner, .. } => {
                let done = interrupts
                    .get(&(req.node.clone(), req.generation, owner.clone()))
                    .copied()
                    .unwrap_or(0);
                prop_assert_eq!(
                    done,
                    0,
                    "second interrupt on {} for {} after one succeeded",
                    req.node,
                    owner
                );
                let others = w
                    .snap
                    .jobs
                    .iter()
                    .filter(|j| {
                        j.node == req.node
                            && j.name != req.name
                            && matches!(j.work, Work::Package { .. })
                            && matches!(j.phase, JobPhase::Active { .. })
                    })
                    .count();
                prop_assert_eq!(
                    others,
                    0,
                    "interrupt on {} while package Jobs run",
                    req.node
                );
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn rollouts_keep_their_invariants_and_terminate(f in fleet()) {
        rollout_keeps_its_invariants(&f)?;
    }
}

/// Found by the property (the harness, not the planner, was wrong: it called the world quiet
/// on the pass the holds were lifted, before the protected pods' end was seen).
#[test]
fn a_barrier_held_node_finishes_once_the_holds_are_lifted() {
    let outcomes = vec![
        62, 44, 0, 8, 0, 44, 0, 0, 0, 0, 62, 26, 0, 0, 8, 26, 53, 0, 0, 188, 26, 0, 44, 8, 0, 8,
        55, 0, 0, 0, 17, 0, 80, 0, 0, 0, 0, 80, 0, 44, 0, 0, 8, 8, 0, 0, 8, 0, 26, 0, 8, 0, 0, 0,
        8, 8, 0, 134, 8, 8, 0, 80, 0, 8,
    ];
    let f = Fleet {
        nodes: vec![(false, 0, false), (false, 0, false)],
        packages: vec![(1, false)],
        budget: 2,
        with_policy: false,
        canary_batch: 1,
        outcomes,
        windows: vec![(4, 1)],
        gate_fails: vec![false; 16],
        barrier_first: false,
        protected: 16470,
        prestage: 0,
    };
    rollout_keeps_its_invariants(&f).unwrap();
}

fn rollout_keeps_its_invariants(f: &Fleet) -> Result<(), TestCaseError> {
    let f = f.clone();
    {
        let mut w = build(&f);
        let external: BTreeSet<String> = w
            .snap
            .nodes
            .iter()
            .filter(|n| n.unschedulable)
            .map(|n| n.name.clone())
            .collect();
        let mut interrupts = BTreeMap::new();
        let mut quiet = false;
        for pass in 0..400 {
            if pass == HELD_PASSES {
                // The windows give way (no new generation: only time would have moved).
                w.cr_mut("cr").spec.maintenance_windows = None;
            }
            let gate = gate_fails(&f, pass);
            w.cr_mut("cr").failing_gates = if gate {
                vec![GateFinding {
                    gate: "prometheus".into(),
                    reason: "AlertsFiring".into(),
                    message: "x".into(),
                }]
            } else {
                vec![]
            };
            let hold = pass < HELD_PASSES && held(&f, w.now, pass);
            let marked: BTreeSet<String> = w
                .snap
                .nodes
                .iter()
                .filter(|n| n.annotations.contains_key(&keys::cordon("cr")))
                .map(|n| n.name.clone())
                .collect();
            let protected = protected_pods(&w);
            let staged: BTreeSet<String> = w
                .snap
                .nodes
                .iter()
                .filter(|n| n.annotations.contains_key(&keys::staged("cr")))
                .map(|n| n.name.clone())
                .collect();
            let acted = w.step();
            check_pass(&w, &f, &acted, &external, &mut interrupts)?;
            for a in &acted {
                let Action::PatchNode(p) = a else { continue };
                let new_mark = matches!(p.annotations.get(&keys::cordon("cr")), Some(Some(_)))
                    && !marked.contains(&p.node);
                // 5. Outside every window, or while a gate fails, no node starts disrupting.
                prop_assert!(
                    !(hold && new_mark),
                    "pass {pass}: {} cordoned while held (windows {:?})",
                    p.node,
                    f.windows
                );
                // 7. A node whose payloads are not staged is never cordoned for them.
                let staging_now = matches!(p.annotations.get(&keys::staged("cr")), Some(Some(_)));
                prop_assert!(
                    f.prestage == 0 || !new_mark || staged.contains(&p.node) || staging_now,
                    "pass {pass}: {} cordoned before its payloads were staged",
                    p.node
                );
                // 6. With cordonAfterBarrier, never cordoned while a protected pod runs there.
                prop_assert!(
                    !(f.barrier_first && new_mark && protected.contains(&p.node)),
                    "pass {pass}: {} cordoned with a protected pod running",
                    p.node
                );
            }
            // Protected pods end now and then (all of them once the holds are lifted).
            let r = f.outcomes[pass % f.outcomes.len()];
            w.snap.pods.retain(|p| {
                !(p.labels.contains_key("job")
                    && (pass >= HELD_PASSES || (r as usize + p.node.len()).is_multiple_of(9)))
            });
            // Quiet only once a pass has seen the holds lifted and the protected pods gone.
            let holds_ahead = pass <= HELD_PASSES
                && (!f.windows.is_empty() || f.gate_fails.contains(&true) || f.protected != 0);
            if acted.iter().all(|a| matches!(a, Action::Event(_))) && w.at_rest() && !holds_ahead {
                quiet = true;
                break;
            }
            let mut i = 0;
            let mut succeeded = Vec::new();
            w.finish_jobs(|j| {
                i += 1;
                let o = outcome(&f, pass, i, &j.work);
                if let (Work::Interrupt { owner, .. }, Some(JobPhase::Succeeded(_))) = (&j.work, &o)
                {
                    succeeded.push((j.node.clone(), j.generation, owner.clone()));
                }
                o
            });
            for k in succeeded {
                *interrupts.entry(k).or_default() += 1;
            }
        }
        prop_assert!(
            quiet,
            "no convergence: jobs {:?}",
            w.snap.jobs.iter().map(|j| &j.name).collect::<Vec<_>>()
        );
        for n in &w.snap.nodes {
            let s = w.node_status("cr", &n.name);
            prop_assert!(
                matches!(s, Some(Status::Complete | Status::Erroring)),
                "{} ended {s:?}",
                n.name
            );
            if s == Some(Status::Complete) && !external.contains(&n.name) {
                prop_assert!(!n.unschedulable, "{} complete but still cordoned", n.name);
            }
        }
    }
    Ok(())
}
