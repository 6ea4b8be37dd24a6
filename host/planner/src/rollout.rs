//! Compartments and batches: which nodes may work at once.

use std::collections::BTreeMap;

use nodewright_api::v1alpha1::{
    BatchParams, BatchState, Budget, CompartmentStatus, DeploymentPolicySpec, Strategy,
};

use crate::batches::{Growth, ceiling, evaluate, next_batch_size};
use crate::select;
use crate::snapshot::ObservedNode;

/// The synthetic compartment of nodes no compartment selects (and of CRs without a policy).
pub use nodewright_api::names::DEFAULT_COMPARTMENT as DEFAULT;

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
    /// The updated compartment status.
    pub status: CompartmentStatus,
}

impl Batch {
    /// Nodes that may work this pass (the batch's members, in order).
    pub fn members(&self) -> &[String] {
        &self.status.batch_nodes
    }
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
    let standing: rustc_hash::FxHashMap<&str, Standing> = nodes.iter().copied().collect();
    let last: Vec<Option<(&str, Standing)>> = previous
        .iter()
        .flat_map(|p| &p.batch_nodes)
        .map(|m| standing.get_key_value(m.as_str()).map(|(n, s)| (*n, *s)))
        .collect();
    batch_of(rules, previous, nodes, &last, |n| n, era).0
}

/// [`batch`] over node handles `N` (the planner's pass: its nodes, not their names):
/// `nodes` the compartment's, each with its standing, in rollout order; `last` the last
/// batch's members (`previous`'s `batch_nodes`, one for one), each as found among `nodes`
/// (`None`: not one of them); `name` a node's name, asked only of a new member. With the
/// batch, its members' handles in order (one for each of `batch_nodes`). A caller that
/// found the last members once need not find them again, nor read every node's name.
// Long on purpose: the batch state machine (keep, grow, stop, reset) in one place, as the
// spec states it.
pub fn batch_of<'n, N: Copy>(
    rules: &Rules,
    previous: Option<&CompartmentStatus>,
    nodes: &[(N, Standing)],
    last: &[Option<(N, Standing)>],
    name: impl Fn(N) -> &'n str,
    era: &Era,
) -> (Batch, Vec<N>) {
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
    let listed = previous.map_or(&[][..], |p| &p.batch_nodes[..]);
    debug_assert_eq!(listed.len(), last.len(), "one finding per listed member");
    // The last batch's members still among `nodes`: name, handle, standing.
    let mut members: Vec<(&str, N, Standing)> = listed
        .iter()
        .zip(last)
        .filter_map(|(m, found)| found.map(|(n, s)| (m.as_str(), n, s)))
        .collect();
    // Before this batch is folded in, the counters cover at most the done and failed
    // nodes that are not members of it (a name the status lists twice is one member).
    let mut distinct = rustc_hash::FxHashSet::default();
    let (mut done_inside, mut failed_inside) = (0, 0);
    for &(m, _, s) in &members {
        if distinct.insert(m) {
            done_inside += i32::from(s == Standing::Done);
            failed_inside += i32::from(s == Standing::Failed);
        }
    }
    let count = |want: Standing| nodes.iter().filter(|(_, s)| *s == want).count() as i32;
    let (completed, failed_now) = (count(Standing::Done), count(Standing::Failed));
    state.completed_nodes = state.completed_nodes.min(completed - done_inside);
    state.failed_nodes = state.failed_nodes.min(failed_now - failed_inside);
    let open = members.iter().any(|(_, _, s)| *s == Standing::Eligible);
    if !open {
        if !members.is_empty() {
            let among = |want: Standing| members.iter().filter(|m| m.2 == want).count() as u32;
            let (ok, failed) = (among(Standing::Done), among(Standing::Failed));
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
                .map(|&(n, s)| (name(n), n, s))
                .collect();
        }
    }
    // Counters never claim more nodes than the compartment has done or failed now: nodes
    // that left it (relabelled, removed, deselected) or need work again are not counted,
    // so `remaining` can never hide a node that still needs a batch.
    state.completed_nodes = state.completed_nodes.min(completed);
    state.failed_nodes = state.failed_nodes.min(failed_now);
    let in_progress = members
        .iter()
        .filter(|(_, _, s)| *s == Standing::Eligible)
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
        batch_nodes: members.iter().map(|(m, _, _)| (*m).into()).collect(),
    };
    let handles = members.into_iter().map(|(_, n, _)| n).collect();
    (Batch { status }, handles)
}

#[cfg(test)]
mod tests;
