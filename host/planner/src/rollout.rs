//! Compartments and batches: which nodes may work at once.

use std::collections::BTreeMap;

use nodewright_api::v1alpha1::{
    BatchParams, BatchState, Budget, CompartmentStatus, DeploymentPolicySpec, Strategy,
};

use crate::batches::{Growth, ceiling, evaluate, next_batch_size};
use crate::select;
use crate::snapshot::ObservedNode;

/// The synthetic compartment of nodes no compartment selects (and of CRs without a policy).
pub const DEFAULT: &str = "__default__";

/// A compartment's rules.
#[derive(Clone, Debug)]
pub struct Rules {
    /// Budget.
    pub budget: Budget,
    /// Strategy, if any (none: batches of the budget's ceiling).
    pub strategy: Option<Strategy>,
}

/// Compartment rules of a CR: its policy's, or `interruptionBudget` as the default one.
pub fn rules(
    policy: Option<&DeploymentPolicySpec>,
    budget: Option<&Budget>,
) -> BTreeMap<String, Rules> {
    let mut out = BTreeMap::new();
    match policy {
        Some(p) => {
            out.insert(
                DEFAULT.to_string(),
                Rules {
                    budget: p.default.budget.clone(),
                    strategy: p.default.strategy.clone(),
                },
            );
            for c in &p.compartments {
                out.insert(
                    c.name.clone(),
                    Rules {
                        budget: c.budget.clone(),
                        strategy: c.strategy.clone().or(p.default.strategy.clone()),
                    },
                );
            }
        }
        None => {
            let budget = budget.cloned().unwrap_or(Budget {
                percent: Some(100),
                count: None,
            });
            out.insert(
                DEFAULT.to_string(),
                Rules {
                    budget,
                    strategy: None,
                },
            );
        }
    }
    out
}

/// `resetBatchStateOnCompletion`: the CR's option, else the policy's, else true.
pub fn resets_batch_state(cr: &crate::snapshot::Cr, policy: Option<&DeploymentPolicySpec>) -> bool {
    cr.spec
        .deployment_policy_options
        .as_ref()
        .and_then(|o| o.reset_batch_state_on_completion)
        .or(policy.and_then(|p| p.reset_batch_state_on_completion))
        .unwrap_or(true)
}

fn safety(s: Option<&Strategy>) -> u8 {
    match s.and_then(Growth::of) {
        Some(Growth::Fixed(_)) => 0,
        Some(Growth::Linear(_)) => 1,
        Some(Growth::Exponential(_)) => 2,
        None => 3,
    }
}

/// Assigns each node to a compartment: among the matching ones the safest strategy
/// (fixed < linear < exponential < none), then the smaller ceiling (on the CR's nodes that
/// compartment's selector matches), then the name; no match: [`DEFAULT`].
pub fn assign<'a>(
    policy: Option<&DeploymentPolicySpec>,
    nodes: &[&'a ObservedNode],
) -> BTreeMap<String, Vec<&'a ObservedNode>> {
    let mut out: BTreeMap<String, Vec<&ObservedNode>> = BTreeMap::new();
    out.insert(DEFAULT.into(), Vec::new());
    let Some(policy) = policy else {
        out.insert(DEFAULT.into(), nodes.to_vec());
        return out;
    };
    let matched: Vec<u32> = policy
        .compartments
        .iter()
        .map(|c| {
            nodes
                .iter()
                .filter(|n| select::matches(Some(&c.selector), &n.labels))
                .count() as u32
        })
        .collect();
    for node in nodes {
        let best = policy
            .compartments
            .iter()
            .enumerate()
            .filter(|(_, c)| select::matches(Some(&c.selector), &node.labels))
            .min_by_key(|(i, c)| {
                (
                    safety(c.strategy.as_ref().or(policy.default.strategy.as_ref())),
                    ceiling(matched[*i], &c.budget),
                    c.name.clone(),
                )
            });
        let name = best
            .map(|(_, c)| c.name.clone())
            .unwrap_or_else(|| DEFAULT.into());
        out.entry(name).or_default().push(node);
    }
    out
}

/// A node's standing in its compartment this pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Nothing to do on it.
    Done,
    /// Parked after a terminal failure.
    Failed,
    /// Cannot be worked on now (ignored, untolerated taint, gated, paused).
    Ineligible,
    /// Needs work and may get it.
    Eligible,
}

/// Which rollout the batch counters belong to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Era {
    /// The CR's generation.
    pub generation: i64,
    /// Its package versions, `name:version,...`.
    pub versions: String,
    /// Reset the whole state when the versions change (`resetBatchStateOnCompletion`).
    pub reset_on_version_change: bool,
}

impl Era {
    /// The batch state to continue from: `previous` if it is this era's, else restarted as
    /// [`batch`] says.
    pub fn carry(&self, previous: Option<&BatchState>) -> BatchState {
        let fresh = BatchState {
            current_batch: 1,
            generation: self.generation,
            versions: self.versions.clone(),
            ..Default::default()
        };
        let Some(prev) = previous else { return fresh };
        if prev.generation == self.generation && prev.versions == self.versions {
            return prev.clone();
        }
        if prev.versions != self.versions && self.reset_on_version_change {
            return fresh;
        }
        BatchState {
            completed_nodes: 0,
            failed_nodes: 0,
            generation: self.generation,
            versions: self.versions.clone(),
            ..prev.clone()
        }
    }
}

/// Result of choosing a compartment's batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Nodes that may work this pass.
    pub members: Vec<String>,
    /// The updated compartment status.
    pub status: CompartmentStatus,
}

/// The batch of one compartment: the current members until each is done or failed (sticky),
/// then — after folding the finished batch into the batch state — the next nodes in order,
/// as many as the strategy (or the budget's ceiling) allows, unless the compartment stopped.
///
/// The counters belong to one [`Era`] of the CR. On a new generation the progress
/// counters (`completedNodes`, `failedNodes`) restart: the nodes done under the old spec
/// need the new one too, and counting them twice would leave nodes with no batch to join.
/// On a version change the whole state restarts at batch 1 (NodeWright's reset on a version
/// change), unless the CR or policy turned `resetBatchStateOnCompletion` off; a config-only
/// edit keeps the batch position and a stop. Members already at work keep working and are
/// counted into the new counters.
pub fn batch(
    rules: &Rules,
    previous: Option<&CompartmentStatus>,
    nodes: &[(&str, Standing)],
    era: &Era,
) -> Batch {
    let total = nodes.len() as u32;
    let ceil = ceiling(total, &rules.budget);
    let synthetic = Strategy {
        fixed: Some(BatchParams {
            initial_batch: Some(ceil.max(1) as i32),
            ..Default::default()
        }),
        ..Default::default()
    };
    let strategy = rules.strategy.as_ref().unwrap_or(&synthetic);
    let kind =
        Growth::of(strategy).unwrap_or(Growth::Fixed(synthetic.fixed.as_ref().expect("set above")));
    let mut state = era.carry(previous.and_then(|p| p.batch_state.as_ref()));
    let standing: BTreeMap<&str, Standing> = nodes.iter().copied().collect();
    let mut members: Vec<String> = previous.map(|p| p.batch_nodes.clone()).unwrap_or_default();
    members.retain(|m| standing.contains_key(m.as_str()));
    // Before this batch is folded in, the counters cover at most the done and failed
    // nodes that are not members of it.
    let in_batch: rustc_hash::FxHashSet<&str> = members.iter().map(String::as_str).collect();
    let outside = |want: Standing| {
        nodes
            .iter()
            .filter(|(n, s)| *s == want && !in_batch.contains(n))
            .count() as i32
    };
    state.completed_nodes = state.completed_nodes.min(outside(Standing::Done));
    state.failed_nodes = state.failed_nodes.min(outside(Standing::Failed));
    let open = members
        .iter()
        .any(|m| standing[m.as_str()] == Standing::Eligible);
    if !open {
        if !members.is_empty() {
            let ok = members
                .iter()
                .filter(|m| standing[m.as_str()] == Standing::Done)
                .count() as u32;
            let failed = members
                .iter()
                .filter(|m| standing[m.as_str()] == Standing::Failed)
                .count() as u32;
            if ok + failed > 0 {
                state = evaluate(kind, &state, ok, failed, ok + failed, total);
            }
        }
        members.clear();
        if !state.should_stop {
            let size = match rules.strategy {
                Some(_) => next_batch_size(kind, &state, total),
                None => ceil,
            } as usize;
            members = nodes
                .iter()
                .filter(|(_, s)| *s == Standing::Eligible)
                .take(size)
                .map(|(n, _)| n.to_string())
                .collect();
        }
    }
    let completed = nodes.iter().filter(|(_, s)| *s == Standing::Done).count() as i32;
    // Counters never claim more nodes than the compartment has done or failed now: nodes
    // that left it (relabelled, removed, deselected) or need work again are not counted,
    // so `remaining` can never hide a node that still needs a batch.
    let failed_now = nodes.iter().filter(|(_, s)| *s == Standing::Failed).count() as i32;
    state.completed_nodes = state.completed_nodes.min(completed);
    state.failed_nodes = state.failed_nodes.min(failed_now);
    let in_progress = members
        .iter()
        .filter(|m| standing[m.as_str()] == Standing::Eligible)
        .count() as i32;
    let status = CompartmentStatus {
        matched: total as i32,
        ceiling: ceil as i32,
        in_progress,
        completed,
        progress_percent: if total == 0 {
            100
        } else {
            completed * 100 / total as i32
        },
        batch_state: Some(state),
        batch_nodes: members.clone(),
    };
    Batch { members, status }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, tier: &str) -> ObservedNode {
        ObservedNode {
            name: name.into(),
            labels: [("tier".to_string(), tier.to_string())].into(),
            ..Default::default()
        }
    }

    fn policy(json: serde_json::Value) -> DeploymentPolicySpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn overlapping_compartments_resolve_by_safety_then_ceiling_then_name() {
        let p = policy(serde_json::json!({
            "default": {"budget": {"count": 1}},
            "compartments": [
                {"name": "fast", "selector": {"matchLabels": {"tier": "a"}}, "budget": {"count": 5}, "strategy": {"exponential": {"initialBatch": 1}}},
                {"name": "safe", "selector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, "budget": {"count": 5}, "strategy": {"fixed": {"initialBatch": 1}}},
                {"name": "b-small", "selector": {"matchLabels": {"tier": "b"}}, "budget": {"count": 1}},
                {"name": "a-big", "selector": {"matchLabels": {"tier": "b"}}, "budget": {"count": 3}}
            ]
        }));
        // Drop "safe" for the tie-break checks: b-small and a-big (no strategy) differ by ceiling.
        let nodes = [node("n1", "a"), node("n2", "b"), node("n3", "c")];
        let refs: Vec<&ObservedNode> = nodes.iter().collect();
        let got = assign(Some(&p), &refs);
        let names = |c: &str| {
            got.get(c)
                .map(|v| v.iter().map(|n| n.name.clone()).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        assert_eq!(
            names("safe"),
            ["n1", "n2", "n3"],
            "fixed beats exponential and no strategy"
        );
        let mut p2 = p.clone();
        p2.compartments.retain(|c| c.name != "safe");
        let got = assign(Some(&p2), &refs);
        let names = |c: &str| {
            got.get(c)
                .map(|v| v.iter().map(|n| n.name.clone()).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        assert_eq!(names("fast"), ["n1"]);
        assert_eq!(
            names("b-small"),
            ["n2"],
            "same safety: the smaller ceiling wins over the name"
        );
        assert_eq!(names(DEFAULT), ["n3"], "no match: the default compartment");
    }

    #[test]
    fn batches_are_sticky_until_each_member_is_done_or_failed() {
        let rules = Rules {
            budget: Budget {
                count: Some(2),
                percent: None,
            },
            strategy: None,
        };
        let first = batch(
            &rules,
            None,
            &[
                ("a", Standing::Eligible),
                ("b", Standing::Eligible),
                ("c", Standing::Eligible),
            ],
            &era(1, "p:1"),
        );
        assert_eq!(first.members, ["a", "b"]);
        // a is done, b still working: the batch holds; c does not start.
        let held = batch(
            &rules,
            Some(&first.status),
            &[
                ("a", Standing::Done),
                ("b", Standing::Eligible),
                ("c", Standing::Eligible),
            ],
            &era(1, "p:1"),
        );
        assert_eq!(held.members, ["a", "b"]);
        // b failed: the batch is evaluated and the next one picks c (failed nodes are not re-picked).
        let next = batch(
            &rules,
            Some(&held.status),
            &[
                ("a", Standing::Done),
                ("b", Standing::Failed),
                ("c", Standing::Eligible),
            ],
            &era(1, "p:1"),
        );
        assert_eq!(next.members, ["c"]);
        let state = next.status.batch_state.unwrap();
        assert_eq!(
            (
                state.current_batch,
                state.completed_nodes,
                state.failed_nodes
            ),
            (2, 1, 1)
        );
    }

    fn era(generation: i64, versions: &str) -> Era {
        Era {
            generation,
            versions: versions.into(),
            reset_on_version_change: true,
        }
    }

    #[test]
    fn a_version_change_restarts_the_counters_and_keeps_the_members_at_work() {
        let rules = Rules {
            budget: Budget {
                count: Some(2),
                percent: None,
            },
            strategy: Some(Strategy {
                fixed: Some(BatchParams {
                    initial_batch: Some(2),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        let all = |s: Standing| [("a", s), ("b", s), ("c", s), ("d", s)];
        let first = batch(&rules, None, &all(Standing::Eligible), &era(1, "p:1"));
        let done = batch(
            &rules,
            Some(&first.status),
            &[
                ("a", Standing::Done),
                ("b", Standing::Done),
                ("c", Standing::Eligible),
                ("d", Standing::Eligible),
            ],
            &era(1, "p:1"),
        );
        assert_eq!(done.members, ["c", "d"]);
        // Version 2 while c and d work: a and b need it too.
        let bumped = batch(
            &rules,
            Some(&done.status),
            &all(Standing::Eligible),
            &era(2, "p:2"),
        );
        assert_eq!(bumped.members, ["c", "d"], "the batch at work is kept");
        let state = bumped.status.batch_state.clone().unwrap();
        assert_eq!(
            (state.generation, state.completed_nodes, state.current_batch),
            (2, 0, 1)
        );
        let after = batch(
            &rules,
            Some(&bumped.status),
            &[
                ("a", Standing::Eligible),
                ("b", Standing::Eligible),
                ("c", Standing::Done),
                ("d", Standing::Done),
            ],
            &era(2, "p:2"),
        );
        assert_eq!(
            after.members,
            ["a", "b"],
            "the untouched nodes get the next batch"
        );
        assert_eq!(after.status.batch_state.unwrap().completed_nodes, 2);
    }

    #[test]
    fn a_config_edit_keeps_a_stop_and_the_batch_position_but_not_the_progress() {
        let stopped = BatchState {
            current_batch: 3,
            completed_nodes: 4,
            failed_nodes: 2,
            should_stop: true,
            consecutive_failures: 2,
            generation: 1,
            versions: "p:1".into(),
            ..Default::default()
        };
        let carried = era(2, "p:1").carry(Some(&stopped));
        assert!(carried.should_stop);
        assert_eq!(
            (
                carried.current_batch,
                carried.completed_nodes,
                carried.failed_nodes,
                carried.generation
            ),
            (3, 0, 0, 2)
        );
        let versioned = era(2, "p:2").carry(Some(&stopped));
        assert!(!versioned.should_stop);
        assert_eq!(versioned.current_batch, 1);
        let kept = Era {
            reset_on_version_change: false,
            ..era(2, "p:2")
        }
        .carry(Some(&stopped));
        assert!(
            kept.should_stop,
            "resetBatchStateOnCompletion: false keeps the stop"
        );
        assert_eq!(kept.completed_nodes, 0, "but never the old spec's progress");
        assert_eq!(era(1, "p:1").carry(Some(&stopped)), stopped);
    }
}
