//! Planner benchmark: one steady-state `plan` pass over 1k, 5k and 10k nodes × 5 packages,
//! mid-rollout (a third of the nodes complete, a tenth at work — cordoned, drained, a Job
//! running for each package — the rest waiting with five pods each): the world the
//! operator sees between two changes, on which a pass must ask for nothing new. The nodes
//! come in rollout order, as the operator sorts them; the pods in a fixed shuffle, as the
//! operator's cache hands them over (until 2026-12-07 they came grouped by node, which
//! flattered the pass: 10k 14 ms then, 23 ms with the pods shuffled). Prints the
//! median and p90 wall time of a pass, the 1k → 10k ratio, the peak heap the pass allocated
//! (counted by a wrapping global allocator) and the actions a pass returned. Figures vary
//! with machine load; the ratio less so.
//!
//! Run: `cargo bench -p nodewright-planner --bench plan`.

use std::alloc::{GlobalAlloc, Layout};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use nodewright_api::keys;
use nodewright_api::node_state::{NodeState, PackageStatus, Stage, State, state_key};
use nodewright_api::pinned::PinnedRef;
use nodewright_api::v1alpha1::NodeWrightSpec;
use nodewright_figures::Figure;
use nodewright_planner::{
    Cr, JobPhase, NodeFacts, ObservedJob, ObservedNode, ObservedPod, PluginCheck, PodFacts,
    Snapshot, Work, plan,
};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The operator's allocator (`host/operator/src/main.rs`): the figures are those of the
/// binary that ships, not of musl's malloc, which is several times slower here.
static INNER: mimalloc::MiMalloc = mimalloc::MiMalloc;

// SAFETY: every call is forwarded to the operator's allocator unchanged; only counters are
// added.
#[expect(
    unsafe_code,
    reason = "a counting allocator is the way to measure peak heap in-process"
)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { INNER.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { INNER.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// NodeWright `fleet` of `packages` packages (the first rebooting; each with a config map
/// when `config`), 10 % of the nodes at a time, its plugins pinned.
fn fleet(packages: usize, config: bool) -> Cr {
    let specs: BTreeMap<String, serde_json::Value> = (0..packages)
        .map(|i| {
            let mut p =
                serde_json::json!({"version": "1.0.0", "plugin": format!("r.example/p{i}:1")});
            if config {
                p["configMap"] = serde_json::json!({"a": "1", "b": "2"});
            }
            if i == 0 {
                p["interrupt"] = serde_json::json!({"type": "reboot"});
            }
            (format!("p{i}"), p)
        })
        .collect();
    let spec: NodeWrightSpec = serde_json::from_value(
        serde_json::json!({"interruptionBudget": {"percent": 10}, "packages": specs}),
    )
    .unwrap();
    let pinned: BTreeMap<String, PinnedRef> = spec
        .packages
        .keys()
        .map(|k| {
            let pin = format!("r.example/{k}@sha256:{}", "0".repeat(64));
            (k.clone(), pin.parse().unwrap())
        })
        .collect();
    Cr {
        name: "fleet".into(),
        uid: "u".into(),
        generation: 1,
        spec,
        has_finalizer: true,
        plugins: PluginCheck::Ready(pinned.into()),
        ..Default::default()
    }
}

/// Five ReplicaSet pods on `node`.
fn five_pods(node: &str) -> impl Iterator<Item = ObservedPod> + '_ {
    (0..5).map(move |p| {
        ObservedPod::new(PodFacts {
            namespace: "apps".into(),
            name: format!("{node}-pod{p}"),
            node: node.into(),
            active: true,
            controller: Some("ReplicaSet".into()),
            ..Default::default()
        })
    })
}

fn snapshot(nodes: usize) -> Snapshot {
    let cr = fleet(5, true);
    let spec = cr.spec.clone();
    let mut snap = Snapshot {
        nodewrights: vec![cr],
        ..Default::default()
    };
    let batch: Vec<String> = (nodes / 3..nodes / 3 + nodes / 10)
        .map(|i| format!("node-{i:05}"))
        .collect();
    let in_batch: std::collections::HashSet<&String> = batch.iter().collect();
    for i in 0..nodes {
        let name = format!("node-{i:05}");
        let mut annotations = BTreeMap::new();
        let mut state = NodeState::new();
        if i < nodes / 3 {
            for (pn, p) in &spec.packages {
                let stage = if p.interrupt.is_some() {
                    Stage::PostInterrupt
                } else {
                    Stage::Config
                };
                let mut e = PackageStatus::new(pn, &p.version, stage, 1);
                e.state = State::Complete;
                e.config = nodewright_planner::packages::config_digests(p);
                state.insert(state_key(pn, &p.version), e);
            }
        } else if in_batch.contains(&name) {
            for (pn, p) in &spec.packages {
                state.insert(
                    state_key(pn, &p.version),
                    PackageStatus::new(pn, &p.version, Stage::Apply, 1),
                );
                let work = Work::Package {
                    package: pn.clone(),
                    version: p.version.clone(),
                    stage: Stage::Apply,
                };
                snap.jobs.push(ObservedJob {
                    name: nodewright_planner::jobs::job_name("fleet", &name, &work),
                    cr: "fleet".into(),
                    node: name.clone(),
                    generation: 1,
                    run: 0,
                    work,
                    phase: JobPhase::Active {
                        failed: 0,
                        last: None,
                    },
                    stopping: false,
                    stuck: None,
                });
            }
            annotations.insert(keys::cordon("fleet"), "true".into());
        }
        if !state.is_empty() {
            annotations.insert(
                keys::node_state("fleet"),
                serde_json::to_string(&state).unwrap(),
            );
        }
        // The nodes at work are drained already: their pods are elsewhere.
        if !in_batch.contains(&name) {
            snap.pods.extend(five_pods(&name));
        }
        snap.nodes.push(ObservedNode::new(NodeFacts {
            name,
            created: i as i64,
            annotations,
            unschedulable: i >= nodes / 3 && i < nodes / 3 + nodes / 10,
            boot_id: format!("b{i}"),
            resource_version: "1".into(),
            ..Default::default()
        }));
    }
    // As the operator hands them over: nodes in rollout order (it sorts them), pods in its
    // cache's hash order (a fixed shuffle here).
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for i in (1..snap.pods.len()).rev() {
        snap.pods.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    let mut status = snap.nodewrights[0].status.clone();
    status.compartment_statuses.insert(
        "__default__".into(),
        nodewright_api::v1alpha1::CompartmentStatus {
            batch_nodes: batch,
            batch_state: Some(Default::default()),
            ..Default::default()
        },
    );
    snap.nodewrights[0].status = status;
    snap
}

fn main() {
    println!(
        "planner: one steady-state pass, 5 packages, a third complete, a tenth at work, 5 pods per node"
    );
    // `PLAN_BENCH_NODES=10000` runs one size and not the forecast (for a profiler); the
    // default runs all three and the forecast.
    let one_size = std::env::var("PLAN_BENCH_NODES").ok();
    let sizes: Vec<usize> = match &one_size {
        Some(n) => vec![n.parse().expect("PLAN_BENCH_NODES is a number")],
        None => vec![1_000, 5_000, 10_000],
    };
    // `PLAN_BENCH_PASSES=500` times more passes (for a profiler started after the setup).
    let passes: usize = std::env::var("PLAN_BENCH_PASSES")
        .map_or(15, |n| n.parse().expect("PLAN_BENCH_PASSES is a number"));
    let mut medians = Vec::new();
    for nodes in sizes {
        let mut snap = snapshot(nodes);
        // Steady state: the first pass's node writes and CR status have landed. What the
        // state cache keeps between passes is measured across that first pass.
        let before_first = CURRENT.load(Ordering::Relaxed);
        let index: std::collections::HashMap<String, usize> = snap
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), i))
            .collect();
        for a in plan(&snap, 1_000_000) {
            match a {
                nodewright_planner::Action::PatchNode(p) => {
                    let n = &mut snap.nodes[index[&p.node]];
                    for (k, v) in p.annotations {
                        match v {
                            Some(v) => n.annotations.insert(k, v),
                            None => n.annotations.remove(&k),
                        };
                    }
                    if let Some(u) = p.unschedulable {
                        n.unschedulable = u;
                    }
                }
                nodewright_planner::Action::SetStatus { status, .. } => {
                    snap.nodewrights[0].status = (*status).into()
                }
                _ => {}
            }
        }
        let cache_heap = CURRENT.load(Ordering::Relaxed).saturating_sub(before_first);
        let mut times = Vec::new();
        let mut peak = 0;
        let mut actions = 0;
        let mut kinds = BTreeMap::new();
        for _ in 0..passes {
            let base = CURRENT.load(Ordering::Relaxed);
            PEAK.store(base, Ordering::Relaxed);
            let t = Instant::now();
            let out = plan(&snap, 1_000_000);
            times.push(t.elapsed());
            peak = peak.max(PEAK.load(Ordering::Relaxed) - base);
            actions = out.len();
            kinds = out.iter().fold(BTreeMap::new(), |mut m, a| {
                let kind = match a {
                    nodewright_planner::Action::CreateJob(_) => "create-job",
                    nodewright_planner::Action::DeleteJob { .. } => "delete-job",
                    nodewright_planner::Action::PatchNode(_) => "patch-node",
                    nodewright_planner::Action::Evict { .. } => "evict",
                    nodewright_planner::Action::SetStatus { .. } => "status",
                    nodewright_planner::Action::Event(_) => "event",
                    _ => "other",
                };
                *m.entry(kind).or_insert(0usize) += 1;
                m
            });
            drop(out);
        }
        let pass = Figure::timed("plan", format!("pass, {nodes} nodes"), times.clone());
        pass.write();
        times.sort();
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        let t = Instant::now();
        let parsed: usize = snap
            .nodes
            .iter()
            .map(|n| {
                NodeState::read(&n.name, &n.annotations, "fleet")
                    .unwrap()
                    .len()
            })
            .sum();
        let parse = t.elapsed();
        assert!(parsed > 0);
        println!(
            "{nodes:>6} nodes: median {:>7.2} ms   p90 {:>7.2} ms   peak heap during a pass {:>6.1} MiB   actions {actions}   (parsing the node states alone: {:.2} ms)",
            ms(times[times.len() / 2]),
            ms(times[times.len() * 9 / 10]),
            peak as f64 / (1024.0 * 1024.0),
            ms(parse)
        );
        println!(
            "        actions by kind: {kinds:?}; kept between passes: {} parsed states, {:.1} MiB of heap",
            snap.states.len(),
            cache_heap as f64 / (1024.0 * 1024.0)
        );
        medians.push((nodes, ms(times[times.len() / 2])));
    }
    if let (Some((small, a)), Some((large, b))) = (medians.first(), medians.last())
        && large > small
    {
        Figure::value(
            "plan",
            format!("growth, {small} -> {large} nodes"),
            "x",
            b / a,
        )
        .write();
        println!(
            "{small} -> {large} nodes: time x{:.1} for nodes x{:.0} (linear: x{:.0})",
            b / a,
            *large as f64 / *small as f64,
            *large as f64 / *small as f64
        );
    }
    if one_size.is_none() {
        forecast_bench();
    }
}

/// A forecast of a whole rollout (#33's preview core): 1,000 nodes with five pods each, a
/// NodeWright of three packages (one rebooting) rolling out 10 % at a time from nothing,
/// every Job succeeding. Prints the wall time, the passes it took, the peak heap and the
/// report's summary.
fn forecast_bench() {
    use nodewright_planner::forecast::{Assume, forecast, report};
    let nodes = 1_000;
    let mut snap = Snapshot {
        nodewrights: vec![fleet(3, false)],
        ..Default::default()
    };
    for i in 0..nodes {
        let name = format!("node-{i:05}");
        snap.pods.extend(five_pods(&name));
        snap.nodes.push(ObservedNode::new(NodeFacts {
            name,
            created: i as i64,
            boot_id: format!("b{i}"),
            resource_version: "1".into(),
            ..Default::default()
        }));
    }
    let outcome = |j: &ObservedJob| {
        let plan = matches!(
            &j.work,
            Work::Package {
                stage: Stage::Plan,
                ..
            }
        );
        let interrupt = if plan { "reboot" } else { "none" };
        JobPhase::Succeeded(Some(Box::new(nodewright_api::result::StageResult {
            interrupt: Some(interrupt.parse().unwrap()),
            change_count: 1,
            ..nodewright_api::result::StageResult::passed(
                nodewright_api::agent::RunStage::Plan,
                "p",
                "",
            )
        })))
    };
    let assume = Assume {
        outcome: &outcome,
        runs_for: None,
        evicts_for: None,
        pdb_blocked: Default::default(),
        step_seconds: 2,
        max_passes: 5_000,
        enough: None,
    };
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let t = Instant::now();
    let f = forecast(&snap, 1_000_000, &assume);
    let report = report(&f, "fleet", &|_| true);
    let took = t.elapsed();
    let peak = PEAK.load(Ordering::Relaxed) - base;
    assert!(f.settled && report.summary.change == nodes, "{report}");
    Figure::timed(
        "plan",
        format!("forecast, {nodes} nodes x 3 packages"),
        vec![took],
    )
    .write();
    println!(
        "forecast of a whole rollout, {nodes} nodes x 3 packages, 10 % at a time: {:.2} s, {} passes ({:.2} ms each), peak heap {:.1} MiB",
        took.as_secs_f64(),
        f.passes,
        took.as_secs_f64() * 1000.0 / f.passes as f64,
        peak as f64 / (1024.0 * 1024.0)
    );
    println!("        {}", report.summary);
}
