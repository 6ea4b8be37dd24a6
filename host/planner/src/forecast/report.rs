//! A forecast as an admin reads it: a summary first, then the nodes with the same outcome
//! grouped (a fleet of identical nodes is one group), then each node's batch and pods. The
//! shapes are the API's ([`PreviewReport`]): a `NodeWrightPreview`'s status is this.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use nodewright_api::keys::{condition, reason};
use nodewright_api::v1alpha1::{
    Group, NodeLine, Outcome, PreviewReport, PreviewSummary as Summary, Status,
};

use super::{Forecast, NodeForecast};

/// The report of NodeWright `cr` in `forecast`: the nodes it has a status for, of those
/// the ones `reported` keeps (a preview limited to some nodes).
pub fn report(forecast: &Forecast, cr: &str, reported: &dyn Fn(&str) -> bool) -> PreviewReport {
    let mut picked: Vec<(&String, &NodeForecast)> = forecast
        .nodes
        .iter()
        .filter(|(name, n)| n.status.contains_key(cr) && reported(name))
        .collect();
    picked.sort_by_key(|(name, n)| (n.first_work.unwrap_or(usize::MAX), *name));
    let mut summary = Summary {
        nodes: picked.len(),
        batches: picked
            .iter()
            .filter_map(|(_, n)| n.placed.get(cr))
            .map(|p| (&p.compartment, p.batch))
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        ..Summary::default()
    };
    let mut nodes = Vec::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut cordoned = Vec::new();
    for (name, n) in picked {
        if let (Some(from), Some(to)) = (n.cordoned_at, n.uncordoned_at) {
            cordoned.push(to - from);
        }
        let outcome = Outcome {
            ends: n.status.get(cr).copied(),
            cordoned: n.cordoned,
            interrupts: n.interrupts.clone(),
            stages: n.stages.clone(),
            plans: n.plans.values().cloned().collect(),
        };
        if !outcome.stages.is_empty() {
            summary.change += 1;
            if let Some(strongest) = outcome.interrupts.iter().max() {
                *summary.interrupts.entry(*strongest).or_default() += 1;
            }
        } else if outcome.ends == Some(Status::Complete) {
            summary.converged += 1;
        }
        match outcome.ends {
            Some(Status::Blocked) => summary.blocked += 1,
            Some(Status::Complete) => {}
            _ => summary.unfinished += 1,
        }
        summary.evicted += n.evicted.len();
        summary.refused += n.refused.len();
        let group = match groups.iter().position(|g| g.outcome == outcome) {
            Some(i) => i,
            None => {
                groups.push(Group {
                    outcome,
                    nodes: Vec::new(),
                });
                groups.len() - 1
            }
        };
        groups[group].nodes.push(name.clone());
        let placed = n.placed.get(cr);
        nodes.push(NodeLine {
            name: name.clone(),
            compartment: placed.map(|p| p.compartment.clone()),
            batch: placed.map(|p| p.batch),
            group,
            evicted: n.evicted.clone(),
            refused: n.refused.clone(),
        });
    }
    if forecast.timed {
        summary.takes_seconds = Some(forecast.ends_at - forecast.starts_at);
        if let Some(max) = cordoned.iter().max() {
            summary.cordoned_mean_seconds =
                Some(cordoned.iter().sum::<i64>() / cordoned.len() as i64);
            summary.cordoned_max_seconds = Some(*max);
        }
    }
    PreviewReport {
        summary,
        groups,
        nodes,
        settled: forecast.settled,
        blockers: forecast
            .conditions
            .get(cr)
            .map(|c| blockers(c))
            .unwrap_or_default(),
        assumed: Vec::new(),
    }
}

/// The conditions that hold the rollout, as `Type (Reason): message`: a barrier, a drain a
/// budget refuses, an untolerated taint (`Blocked`), plugins or health gates not passing, a
/// closed maintenance window.
fn blockers(conditions: &[Condition]) -> Vec<String> {
    conditions
        .iter()
        .filter(|c| match c.type_.as_str() {
            condition::BLOCKED
            | condition::DRAIN_BLOCKED
            | condition::DELETION_BLOCKED
            | condition::UNINSTALL_FAILED
            | condition::NODE_STATE_MALFORMED => c.status == "True",
            condition::PLUGINS_READY | condition::HEALTH_GATES_PASSING => c.status == "False",
            condition::READY => {
                c.status == "False"
                    && [
                        reason::OUTSIDE_MAINTENANCE_WINDOW,
                        reason::HEALTH_GATE_FAILING,
                    ]
                    .contains(&c.reason.as_str())
            }
            _ => false,
        })
        .map(|c| format!("{} ({}): {}", c.type_, c.reason, c.message))
        .collect()
}
