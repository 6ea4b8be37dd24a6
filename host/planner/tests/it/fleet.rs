//! Random fleets for the property tests: nodes, packages, policies, windows, gates and
//! protected pods, and the Job outcomes a pass draws for them.

use std::collections::{BTreeMap, BTreeSet};

use crate::world::{World, ok, policy, spec};
use nodewright_api::node_state::Stage;
use nodewright_planner::{JobPhase, Work};
use proptest::prelude::*;
use serde_json::json;

#[derive(Clone, Debug)]
pub struct Fleet {
    pub nodes: Vec<(bool, u8, bool)>, // (tier a, pods, externally cordoned)
    pub packages: Vec<(u8, bool)>, // (interrupt: 0 none, 1 service, 2 reboot; depends on the previous)
    pub budget: u8,
    pub with_policy: bool,
    pub canary_batch: u8,
    pub outcomes: Vec<u8>,
    /// Maintenance windows from 10:00 UTC on: (start minute, minutes open). None: no windows.
    pub windows: Vec<(u8, u8)>,
    /// Whether a health gate fails, per stretch of 10 passes.
    pub gate_fails: Vec<bool>,
    /// `cordonAfterBarrier`, and which nodes start with a protected pod (bit i: node i).
    pub barrier_first: bool,
    pub protected: u16,
    /// The packages' plugins carry payloads, staged `batch` (1) or `all` (2); 0: none.
    pub prestage: u8,
}

pub fn fleet() -> impl Strategy<Value = Fleet> {
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
            0u8..3,
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
                (windows, gate_fails, barrier_first, protected, prestage),
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
                prestage,
            },
        )
}

/// 2026-12-01T10:00:00Z, where the fleet's windows start counting.
pub const TEN: i64 = 1_796_119_200;

/// Whether new disruption is held at `now` / `pass`, from the fleet alone.
pub fn held(f: &Fleet, now: i64, pass: usize) -> bool {
    let minute = (now - TEN) / 60;
    let window_closed = !f.windows.is_empty()
        && !f
            .windows
            .iter()
            .any(|(start, len)| (*start as i64..(*start + *len) as i64).contains(&minute));
    window_closed || gate_fails(f, pass)
}

pub fn gate_fails(f: &Fleet, pass: usize) -> bool {
    pass < HELD_PASSES && f.gate_fails[(pass / 10) % f.gate_fails.len()]
}

/// Passes with windows and gates in force; after them both are lifted and the rollout must
/// finish.
pub const HELD_PASSES: usize = 150;

pub fn protected_pods(w: &World) -> BTreeSet<String> {
    w.snap
        .pods
        .iter()
        .filter(|p| p.labels.get("job").is_some_and(|j| j == "train") && p.active)
        .map(|p| p.node.clone())
        .collect()
}

pub fn build(f: &Fleet) -> World {
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
    if f.prestage == 2 {
        s["prestage"] = json!("all");
    }
    w.add_cr("cr", spec(s));
    if f.prestage > 0 {
        let payloads: Vec<(String, u64)> = (0..f.packages.len())
            .map(|i| (format!("p{i}"), 1 << 20))
            .collect();
        let payloads: Vec<(&str, u64)> = payloads.iter().map(|(p, b)| (p.as_str(), *b)).collect();
        w.with_payloads("cr", &payloads);
    }
    w
}

/// The most nodes each node's compartment may have at work at once, from the fleet alone.
pub fn limits(f: &Fleet) -> BTreeMap<String, (String, usize)> {
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

pub fn outcome(f: &Fleet, pass: usize, i: usize, work: &Work) -> Option<JobPhase> {
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
        _ => JobPhase::Succeeded(Some(Box::new(match work {
            Work::Package {
                stage: Stage::Plan, ..
            } => match r % 3 {
                0 => ok("none", 0),
                1 => ok("reboot", 1),
                _ => ok("none", 2),
            },
            _ => ok("none", 1),
        }))),
    })
}
