//! A forecast as an admin reads it: a summary first, then the nodes with the same outcome
//! grouped (a fleet of identical nodes is one line), then each node's pods.

use std::collections::BTreeMap;
use std::fmt;

use nodewright_api::v1alpha1::{InterruptType, Status};

use super::{Forecast, NodeForecast};

/// One NodeWright's forecast, for reading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The NodeWright.
    pub cr: String,
    /// The counts.
    pub summary: Summary,
    /// Nodes with the same outcome, in the order their work starts.
    pub groups: Vec<Group>,
    /// Each node the NodeWright selects, in the order its work starts (then by name).
    pub nodes: Vec<NodeLine>,
    /// Whether the rollout ran to its end within the forecast's passes.
    pub settled: bool,
}

/// The counts a report starts with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Nodes the NodeWright selects.
    pub nodes: usize,
    /// Nodes where some package runs.
    pub change: usize,
    /// Of those, how many take each interrupt.
    pub interrupts: BTreeMap<InterruptType, usize>,
    /// Nodes where nothing runs and the NodeWright is complete.
    pub converged: usize,
    /// Nodes the NodeWright cannot work on (an untolerated taint, an ignore label, ...).
    pub blocked: usize,
    /// Nodes neither done nor blocked when the forecast stopped.
    pub unfinished: usize,
    /// Pods evicted.
    pub evicted: usize,
    /// Pods whose eviction a disruption budget refuses now.
    pub refused: usize,
    /// Distinct passes in which nodes start their work: the rollout's batches.
    pub batches: usize,
    /// Seconds from the forecast's start to the rollout's last step, under the durations
    /// it assumed (`None`: it knew none).
    pub takes_seconds: Option<i64>,
    /// Seconds a node stays cordoned, on average and at most, over the nodes cordoned and
    /// uncordoned again.
    pub cordoned_seconds: Option<(i64, i64)>,
}

/// What happens to a node, without its name or pods: equal outcomes are grouped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Where the node ends.
    pub ends: Option<Status>,
    /// Cordoned and drained.
    pub cordoned: bool,
    /// Interrupts, in order.
    pub interrupts: Vec<InterruptType>,
    /// Package stages, in order (`package:stage`).
    pub stages: Vec<String>,
}

/// Nodes with one outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// The outcome.
    pub outcome: Outcome,
    /// The nodes, in the order their work starts.
    pub nodes: Vec<String>,
}

/// One node: its batch and pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLine {
    /// The node.
    pub name: String,
    /// Its batch (1-based), if its work starts.
    pub batch: Option<usize>,
    /// The outcome.
    pub outcome: Outcome,
    /// Pods evicted.
    pub evicted: Vec<String>,
    /// Pods whose eviction a budget refuses now.
    pub refused: Vec<String>,
}

impl Report {
    /// The report of NodeWright `cr` in `forecast`: the nodes it has a status for.
    pub fn new(forecast: &Forecast, cr: &str) -> Self {
        let mut picked: Vec<(&String, &NodeForecast)> = forecast
            .nodes
            .iter()
            .filter(|(_, n)| n.status.contains_key(cr))
            .collect();
        picked.sort_by_key(|(name, n)| (n.first_work.unwrap_or(usize::MAX), *name));
        let mut starts: Vec<usize> = picked.iter().filter_map(|(_, n)| n.first_work).collect();
        starts.dedup();
        let mut summary = Summary {
            nodes: picked.len(),
            batches: starts.len(),
            ..Summary::default()
        };
        let mut nodes = Vec::new();
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
            nodes.push(NodeLine {
                name: name.clone(),
                batch: n
                    .first_work
                    .and_then(|p| starts.iter().position(|s| *s == p))
                    .map(|i| i + 1),
                outcome,
                evicted: n.evicted.clone(),
                refused: n.refused.clone(),
            });
        }
        if forecast.timed {
            summary.takes_seconds = Some(forecast.ends_at - forecast.starts_at);
        }
        if let (true, Some(max)) = (forecast.timed, cordoned.iter().max()) {
            let mean = cordoned.iter().sum::<i64>() / cordoned.len() as i64;
            summary.cordoned_seconds = Some((mean, *max));
        }
        let mut groups: Vec<Group> = Vec::new();
        for line in &nodes {
            match groups.iter_mut().find(|g| g.outcome == line.outcome) {
                Some(g) => g.nodes.push(line.name.clone()),
                None => groups.push(Group {
                    outcome: line.outcome.clone(),
                    nodes: vec![line.name.clone()],
                }),
            }
        }
        Report {
            cr: cr.into(),
            summary,
            groups,
            nodes,
            settled: forecast.settled,
        }
    }
}

impl Summary {
    /// The nodes that change, by strongest interrupt: `31 change (12 reboot, 19 service)`.
    pub fn change_text(&self) -> String {
        if self.interrupts.is_empty() {
            return format!("{} change", self.change);
        }
        let each: Vec<String> = self
            .interrupts
            .iter()
            .rev()
            .map(|(kind, n)| format!("{n} {}", kind.as_str()))
            .collect();
        format!("{} change ({})", self.change, each.join(", "))
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} nodes: {}", self.nodes, self.change_text())?;
        write!(f, ", {} converged", self.converged)?;
        if self.blocked > 0 {
            write!(f, ", {} blocked", self.blocked)?;
        }
        if self.unfinished > 0 {
            write!(
                f,
                ", {} not done when the forecast stopped",
                self.unfinished
            )?;
        }
        write!(f, "; {} pods evicted", self.evicted)?;
        if self.refused > 0 {
            write!(f, ", {} refused by a disruption budget now", self.refused)?;
        }
        write!(f, "; {} batches", self.batches)?;
        if let Some(took) = self.takes_seconds {
            write!(f, "; about {}", Took(took))?;
        }
        if let Some((mean, max)) = self.cordoned_seconds {
            write!(
                f,
                ", a node cordoned {} on average ({} at most)",
                Took(mean),
                Took(max)
            )?;
        }
        Ok(())
    }
}

/// Seconds as a person reads them: `45 s`, `6 min`, `2 h 10 min`.
struct Took(i64);

impl fmt::Display for Took {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0.max(0);
        match s {
            0..60 => write!(f, "{s} s"),
            60..3600 => write!(f, "{} min", (s + 30) / 60),
            _ => write!(f, "{} h {:02} min", s / 3600, (s % 3600 + 30) / 60),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ends = self.ends.map_or("no status", Status::as_str);
        if self.stages.is_empty() {
            let what = if self.ends == Some(Status::Complete) {
                "converged"
            } else {
                "nothing runs"
            };
            return write!(f, "{what} ({ends})");
        }
        let mut parts = Vec::new();
        if self.cordoned {
            parts.push("cordon and drain".to_string());
        }
        parts.push(self.stages.join(" "));
        for kind in &self.interrupts {
            parts.push(kind.as_str().to_string());
        }
        write!(f, "{} → {ends}", parts.join(", "))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}: {}", self.cr, self.summary)?;
        if !self.settled {
            writeln!(
                f,
                "(the forecast stopped before the rollout ended: something holds it, see the nodes not done)"
            )?;
        }
        for g in &self.groups {
            let count = g.nodes.len();
            let shown: Vec<&str> = g.nodes.iter().take(5).map(String::as_str).collect();
            let more = if count > 5 {
                format!(" and {} more", count - 5)
            } else {
                String::new()
            };
            writeln!(f, "  {count} × {}: {}{more}", g.outcome, shown.join(", "))?;
        }
        Ok(())
    }
}
