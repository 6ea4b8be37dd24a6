//! Property test of mid-rollout changes: random edits, deletions and node churn never
//! strand a node (every node ends released, complete or erroring, with nothing of a gone
//! NodeWright left on it).

use crate::fleet;
use crate::world;

use std::collections::BTreeSet;

use fleet::{Fleet, build, fleet, outcome};
use nodewright_api::keys;
use nodewright_planner::Action;
use proptest::prelude::*;
use serde_json::json;
use world::World;

/// An everyday change made in the middle of a rollout.
#[derive(Clone, Debug)]
enum Event {
    VersionBump(u8),
    ConfigChange(u8),
    Selector(u8),
    Relabel(u8),
    NodeAdded(bool),
    NodeRemoved(u8),
    PolicyChanged(u8),
    Deleted,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        any::<u8>().prop_map(Event::VersionBump),
        any::<u8>().prop_map(Event::ConfigChange),
        (0u8..3).prop_map(Event::Selector),
        any::<u8>().prop_map(Event::Relabel),
        any::<bool>().prop_map(Event::NodeAdded),
        any::<u8>().prop_map(Event::NodeRemoved),
        any::<u8>().prop_map(Event::PolicyChanged),
        Just(Event::Deleted),
    ]
}

fn apply_event(w: &mut World, f: &Fleet, e: &Event, added: &mut usize) {
    let alive = w
        .snap
        .nodewrights
        .iter()
        .any(|c| c.name == "cr" && !c.deleting);
    let pick = |w: &World, i: u8| {
        w.snap
            .nodes
            .get(i as usize % w.snap.nodes.len().max(1))
            .map(|n| n.name.clone())
    };
    match e {
        Event::VersionBump(i) if alive => {
            let n = *i as usize % f.packages.len();
            w.edit("cr", |s| {
                let name = format!("p{n}");
                let next = match s.packages[&name].version.as_str() {
                    "1.0.0" => "2.0.0",
                    _ => "3.0.0",
                };
                s.packages.get_mut(&name).unwrap().version = next.into();
                // Keep every dependsOn pointing at the version now in the spec.
                let versions: Vec<(String, String)> = s
                    .packages
                    .iter()
                    .map(|(k, p)| (k.clone(), p.version.clone()))
                    .collect();
                for p in s.packages.values_mut() {
                    for (dep, v) in p.depends_on.iter_mut() {
                        *v = versions
                            .iter()
                            .find(|(k, _)| k == dep)
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default();
                    }
                }
            });
        }
        Event::ConfigChange(i) if alive => {
            let n = *i as usize % f.packages.len();
            w.edit("cr", |s| {
                s.packages
                    .get_mut(&format!("p{n}"))
                    .unwrap()
                    .config_map
                    .insert("k".into(), format!("v{i}"));
            });
        }
        Event::Selector(k) if alive => w.edit("cr", |s| {
            s.node_selectors = match k {
                0 => None,
                1 => Some(serde_json::from_value(json!({"matchLabels": {"tier": "a"}})).unwrap()),
                _ => Some(serde_json::from_value(json!({"matchLabels": {"tier": "b"}})).unwrap()),
            };
        }),
        Event::Relabel(i) => {
            if let Some(name) = pick(w, *i) {
                let n = w.node_mut(&name);
                let tier = if n.labels.get("tier").is_some_and(|t| t == "a") {
                    "b"
                } else {
                    "a"
                };
                n.labels.insert("tier".into(), tier.into());
            }
        }
        Event::NodeAdded(tier_a) => {
            *added += 1;
            w.add_node(
                &format!("x{added}"),
                &[("tier", if *tier_a { "a" } else { "b" })],
            );
        }
        Event::NodeRemoved(i) => {
            if w.snap.nodes.len() > 1
                && let Some(name) = pick(w, *i)
            {
                w.remove_node(&name);
            }
        }
        Event::PolicyChanged(i) if f.with_policy => {
            let p = w.snap.policies.get_mut("pol").unwrap();
            p.default.budget.count = Some(1 + (*i % 3) as i32);
            if let Some(fixed) = p
                .compartments
                .first_mut()
                .and_then(|c| c.strategy.as_mut())
                .and_then(|s| s.fixed.as_mut())
            {
                fixed.initial_batch = Some(1 + (*i % 2) as i32);
            }
        }
        // Without our finalizer yet, the apiserver removes it at once.
        Event::Deleted if alive && !w.cr("cr").has_finalizer => {
            w.snap.nodewrights.retain(|c| c.name != "cr")
        }
        Event::Deleted if alive => w.cr_mut("cr").deleting = true,
        _ => {}
    }
}

/// What must hold once a rollout with mid-rollout changes has settled.
fn check_settled(w: &World, external: &BTreeSet<String>) -> Result<(), TestCaseError> {
    prop_assert!(
        w.at_rest(),
        "Jobs left: {:?}",
        w.snap.jobs.iter().map(|j| &j.name).collect::<Vec<_>>()
    );
    let cr = w.snap.nodewrights.iter().find(|c| c.name == "cr");
    for n in &w.snap.nodes {
        let targeted = cr.is_some_and(|c| {
            !c.deleting
                && nodewright_planner::select::matches(c.spec.node_selectors.as_ref(), &n.labels)
        });
        let marks = [
            keys::cordon("cr"),
            keys::drain_start("cr"),
            keys::drain_blocked("cr"),
            keys::KARPENTER_DO_NOT_DISRUPT.into(),
            keys::KARPENTER_DO_NOT_REPAIR.into(),
            keys::KARPENTER_OWNED.into(),
        ];
        if targeted {
            let s = n.annotations.get(&keys::node_status("cr")).cloned();
            prop_assert!(
                matches!(s.as_deref(), Some("complete" | "erroring")),
                "{} is targeted and ended {s:?}",
                n.name
            );
            if s.as_deref() == Some("complete") {
                for key in &marks {
                    prop_assert!(
                        !n.annotations.contains_key(key),
                        "{} is complete and still carries {key}",
                        n.name
                    );
                }
            }
        } else {
            // Let go of: none of the CR's marks. A node the CR left keeps no state either; a
            // deleted CR leaves a non-empty state as the record of what is installed.
            let mut keys_ = marks.to_vec();
            keys_.push(keys::node_status("cr"));
            if cr.is_some() {
                keys_.push(keys::node_state("cr"));
            }
            for key in &keys_ {
                prop_assert!(
                    !n.annotations.contains_key(key),
                    "{} is not targeted and still carries {key}",
                    n.name
                );
            }
            if !external.contains(&n.name) {
                prop_assert!(
                    !n.unschedulable,
                    "{} is not targeted and still cordoned",
                    n.name
                );
            }
        }
    }
    if let Some(c) = cr {
        prop_assert!(
            !c.deleting,
            "the finalizer of a deleted CR was never removed"
        );
        for (name, comp) in &c.status.compartment_statuses {
            if let Some(b) = &comp.batch_state {
                prop_assert!(
                    b.completed_nodes + b.failed_nodes <= comp.matched,
                    "compartment {name}: counters {b:?} for {} nodes",
                    comp.matched
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn mid_rollout_changes_never_strand_a_node(f in fleet(), events in prop::collection::vec((0usize..40, event()), 1..5)) {
        // Windows and barriers are the other property's; here every change may land at once.
        let f = Fleet { windows: vec![], protected: 0, ..f };
        let mut w = build(&f);
        let external: BTreeSet<String> = w.snap.nodes.iter().filter(|n| n.unschedulable).map(|n| n.name.clone()).collect();
        let mut added = 0;
        let mut quiet = false;
        for pass in 0..600 {
            for (_, e) in events.iter().filter(|(at, _)| *at == pass) {
                apply_event(&mut w, &f, e, &mut added);
            }
            let running: BTreeSet<String> = w.snap.jobs.iter().filter(|j| j.running()).map(|j| j.node.clone()).collect();
            let any_jobs = !w.snap.jobs.is_empty();
            let acted = w.step();
            // Let go only of what nothing of ours still runs on: a cordon is lifted, and the
            // finalizer removed, only once the Jobs are gone.
            for a in &acted {
                match a {
                    Action::RemoveFinalizer { .. } => prop_assert!(!any_jobs, "finalizer removed while Jobs exist"),
                    Action::PatchNode(p) if p.unschedulable == Some(false) || p.annotations.get(&keys::cordon("cr")) == Some(&None) => {
                        prop_assert!(!running.contains(&p.node), "{} released while a Job of ours runs on it", p.node);
                    }
                    _ => {}
                }
            }
            let pending = events.iter().any(|(at, _)| *at > pass);
            if !pending && acted.iter().all(|a| matches!(a, Action::Event(_))) && w.at_rest() {
                quiet = true;
                break;
            }
            let mut i = 0;
            w.finish_jobs(|j| {
                i += 1;
                outcome(&f, pass, i, &j.work)
            });
        }
        prop_assert!(quiet, "no convergence: jobs {:?}", w.snap.jobs.iter().map(|j| &j.name).collect::<Vec<_>>());
        check_settled(&w, &external)?;
    }
}
