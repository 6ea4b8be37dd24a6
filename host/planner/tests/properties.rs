//! Property tests over random fleets and random Job outcomes: the rollout's invariants
//! hold at every pass, and every run ends with each node complete or erroring.

mod world;

use std::collections::{BTreeMap, BTreeSet};

use nodewright_api::keys;
use nodewright_api::node_state::{Stage, state_key};
use nodewright_api::v1alpha1::Status;
use nodewright_planner::packages::effective;
use nodewright_planner::{Action, GateFinding, JobPhase, Work};
use proptest::prelude::*;
use serde_json::json;
use world::{World, ok, policy, spec};

#[derive(Clone, Debug)]
struct Fleet {
    nodes: Vec<(bool, u8, bool)>, // (tier a, pods, externally cordoned)
    packages: Vec<(u8, bool)>, // (interrupt: 0 none, 1 service, 2 reboot; depends on the previous)
    budget: u8,
    with_policy: bool,
    canary_batch: u8,
    outcomes: Vec<u8>,
    /// Maintenance windows from 10:00 UTC on: (start minute, minutes open). None: no windows.
    windows: Vec<(u8, u8)>,
    /// Whether a health gate fails, per stretch of 10 passes.
    gate_fails: Vec<bool>,
    /// `cordonAfterBarrier`, and which nodes start with a protected pod (bit i: node i).
    barrier_first: bool,
    protected: u16,
}

fn fleet() -> impl Strategy<Value = Fleet> {
    (
        prop::collection::vec((any::<bool>(), 0u8..3, prop::bool::weighted(0.15)), 1..12),
        prop::collection::vec((0u8..3, any::<bool>()), 1..4),
        1u8..4,
        any::<bool>(),
        1u8..3,
        prop::collection::vec(any::<u8>(), 64),
        (
            prop::collection::vec((0u8..6, 1u8..3), 0..3),
            prop::collection::vec(prop::bool::weighted(0.3), 16),
            any::<bool>(),
            any::<u16>(),
        ),
    )
        .prop_map(
            |(
                nodes,
                packages,
                budget,
                with_policy,
                canary_batch,
                outcomes,
                (windows, gate_fails, barrier_first, protected),
            )| Fleet {
                nodes,
                packages,
                budget,
                with_policy,
                canary_batch,
                outcomes,
                windows,
                gate_fails,
                barrier_first,
                protected,
            },
        )
}

/// 2026-12-01T10:00:00Z, where the fleet's windows start counting.
const TEN: i64 = 1_796_119_200;

/// Whether new disruption is held at `now` / `pass`, from the fleet alone.
fn held(f: &Fleet, now: i64, pass: usize) -> bool {
    let minute = (now - TEN) / 60;
    let window_closed = !f.windows.is_empty()
        && !f
            .windows
            .iter()
            .any(|(start, len)| (*start as i64..(*start + *len) as i64).contains(&minute));
    window_closed || gate_fails(f, pass)
}

fn gate_fails(f: &Fleet, pass: usize) -> bool {
    pass < HELD_PASSES && f.gate_fails[(pass / 10) % f.gate_fails.len()]
}

/// Passes with windows and gates in force; after them both are lifted and the rollout must
/// finish.
const HELD_PASSES: usize = 150;

fn protected_pods(w: &World) -> BTreeSet<String> {
    w.snap
        .pods
        .iter()
        .filter(|p| p.labels.get("job").is_some_and(|j| j == "train") && p.active)
        .map(|p| p.node.clone())
        .collect()
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
        if f.protected & (1 << i) != 0 {
            w.add_pod(
                &name,
                &format!("{name}-train"),
                &[("job", "train")],
                Some("Job"),
            );
        }
    }
    w.now = TEN;
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
    let mut s = json!({"packages": packages, "podNonInterruptLabels": {"matchLabels": {"job": "train"}}, "cordonAfterBarrier": f.barrier_first});
    if !f.windows.is_empty() {
        let windows: Vec<serde_json::Value> = f.windows.iter().map(|(start, len)| json!({"start": format!("10:{start:02}"), "duration": format!("{len}m")})).collect();
        s["maintenanceWindows"] = json!({"windows": windows});
    }
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
        let busy = w
            .snap
            .jobs
            .iter()
            .any(|j| j.node == node && matches!(j.phase, JobPhase::Active { .. }));
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
        match &req.work {
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

fn outcome(f: &Fleet, pass: usize, i: usize, work: &Work) -> Option<JobPhase> {
    let r = f.outcomes[(pass * 7 + i * 13) % f.outcomes.len()];
    Some(match r % 20 {
        0 => JobPhase::Failed {
            genuine: true,
            attempts: 4,
            reason: "BackoffLimitExceeded".into(),
            last: None,
        },
        1 => JobPhase::Failed {
            genuine: false,
            attempts: 0,
            reason: "BackoffLimitExceeded".into(),
            last: None,
        },
        2 | 3 => return None, // still running
        _ => JobPhase::Succeeded(Some(match work {
            Work::Package {
                stage: Stage::Plan, ..
            } => match r % 3 {
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
            if acted.iter().all(|a| matches!(a, Action::Event(_)))
                && w.snap.jobs.is_empty()
                && !holds_ahead
            {
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
        w.snap.jobs.is_empty(),
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
            if !pending && acted.iter().all(|a| matches!(a, Action::Event(_))) && w.snap.jobs.is_empty() {
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
