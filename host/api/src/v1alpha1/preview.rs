//! The `NodeWrightPreview` kind: what a NodeWright's rollout would do, node by node, found
//! before it does anything.
//!
//! The leader answers one by resolving and checking the proposed packages' plugins as it
//! would for the NodeWright, running each package's read-only `plan` stage on every node
//! the rollout would reach (Jobs that never cordon, drain or write, as many at once as the
//! operator allows), and running the planner forward on a copy of the cluster with those
//! plans' answers. The report — a summary, nodes with the same outcome and host changes
//! grouped, each node's batch and pods — is the status. A preview is deleted
//! `ttlSecondsAfterFinished` after it finishes.

use std::collections::BTreeMap;
use std::fmt;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::nodewright::{NodeWrightSpec, Status};
use super::package::InterruptType;

/// Seconds a finished preview is kept unless its spec says otherwise.
pub const PREVIEW_TTL_SECONDS: u32 = 3600;

/// A preview of a NodeWright's rollout.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "nodewright.io",
    version = "v1alpha1",
    kind = "NodeWrightPreview",
    plural = "nodewrightpreviews",
    shortname = "nwp",
    status = "PreviewStatus",
    printcolumn = r#"{"name":"NodeWright","type":"string","jsonPath":".spec.nodewright"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Plans","type":"string","jsonPath":".status.plans.text"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeWrightPreviewSpec {
    /// The NodeWright previewed. One of this name running is where the preview starts from
    /// (it shows the change from its spec); none: the rollout of a new one.
    pub nodewright: String,
    /// The proposed spec, as it would be applied.
    pub spec: NodeWrightSpec,
    /// Only these nodes are planned and reported (the rollout's order and batches are still
    /// the whole fleet's). Empty: every node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// Seconds the preview is kept once finished (default 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<u32>,
}

impl NodeWrightPreviewSpec {
    /// Whether `node` is reported.
    pub fn reports(&self, node: &str) -> bool {
        self.nodes.is_empty() || self.nodes.iter().any(|n| n == node)
    }
}

/// Where a preview is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PreviewPhase {
    /// Resolving, pulling and checking the plugins.
    Resolving,
    /// Running plan stages on the nodes.
    Planning,
    /// Done: the report is the status.
    Ready,
    /// Cannot be previewed (the message says why: a plugin refused, a trust policy, ...).
    Failed,
}

impl PreviewPhase {
    /// Whether the preview is finished (its TTL runs).
    pub fn finished(self) -> bool {
        matches!(self, PreviewPhase::Ready | PreviewPhase::Failed)
    }
}

/// What the preview found.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreviewStatus {
    /// Where it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<PreviewPhase>,
    /// Why it failed, or what it waits for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The plan stages it runs.
    #[serde(default)]
    pub plans: PlanCount,
    /// When it finished (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// The spec's generation this status answers: an edited preview runs again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The report (once ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<PreviewReport>,
}

/// The plan stages a preview runs, counted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanCount {
    /// Plans the rollout would run on the reported nodes.
    pub wanted: u32,
    /// Of those, answered.
    pub done: u32,
    /// Of those, failed (their node's outcome then shows the failure).
    pub failed: u32,
    /// `done/wanted`, for `kubectl get`.
    #[serde(default)]
    pub text: String,
}

impl PlanCount {
    /// Counts, with their text.
    pub fn new(wanted: u32, done: u32, failed: u32) -> Self {
        PlanCount {
            wanted,
            done,
            failed,
            text: format!("{done}/{wanted}"),
        }
    }
}

/// A rollout foretold: the counts, the nodes with the same outcome grouped, each node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreviewReport {
    /// The counts.
    pub summary: PreviewSummary,
    /// Nodes with the same outcome, in the order their work starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<Group>,
    /// Each node, in the order its work starts (then by name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeLine>,
    /// Whether the rollout ran to its end in the forecast (false: something holds it).
    pub settled: bool,
    /// What holds the rollout at the forecast's end, as its conditions would say
    /// (`Blocked (NodesBlocked): n4: untolerated taint ...`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blockers: Vec<String>,
    /// What the forecast took for granted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assumed: Vec<String>,
}

/// The counts a report starts with.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreviewSummary {
    /// Nodes the NodeWright selects (and the preview reports).
    pub nodes: usize,
    /// Nodes where some package runs.
    pub change: usize,
    /// Of those, how many take each interrupt (the strongest one per node).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
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
    /// The batches the nodes join (each compartment's counted apart).
    pub batches: usize,
    /// Seconds from the start to the rollout's last step, under the durations assumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takes_seconds: Option<i64>,
    /// Seconds a node stays cordoned, on average, over the nodes cordoned and uncordoned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cordoned_mean_seconds: Option<i64>,
    /// The longest a node stays cordoned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cordoned_max_seconds: Option<i64>,
}

/// What happens to a node, without its name or pods: equal outcomes are grouped.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// Where the node ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends: Option<Status>,
    /// Cordoned and drained.
    #[serde(default)]
    pub cordoned: bool,
    /// Interrupts, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interrupts: Vec<InterruptType>,
    /// Package stages, in order (`package:stage`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<String>,
    /// What each package's plan stage answered on the node, by package.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plans: Vec<PackagePlan>,
}

/// One package's plan stage on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PackagePlan {
    /// The package.
    pub package: String,
    /// Nothing to change.
    pub converged: bool,
    /// The plan failed (the message says why).
    #[serde(default)]
    pub failed: bool,
    /// The rollout does not run this plan — the package has no interrupt, or is upgraded —
    /// and applies whatever it says; the preview ran it to show the host changes.
    #[serde(default)]
    pub report_only: bool,
    /// What its changes need (`none`, `reboot`, `service:a.service`, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub interrupt: String,
    /// How many changes it would make.
    pub change_count: u32,
    /// The changes (`kind target: from -> to`), as the plugin reported them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
    /// The plan's message (a failure's reason).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Nodes with one outcome.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Group {
    /// The outcome.
    pub outcome: Outcome,
    /// The nodes, in the order their work starts.
    pub nodes: Vec<String>,
}

/// One node: its batch, pods, and which group's outcome is its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeLine {
    /// The node.
    pub name: String,
    /// The compartment whose batch it joins (`__default__`: no compartment selects it),
    /// if its work starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compartment: Option<String>,
    /// The batch of its compartment it joins (1-based; compartments count apart), if its
    /// work starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<i32>,
    /// Index of its group in the report's groups.
    pub group: usize,
    /// Pods evicted (`namespace/name`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evicted: Vec<String>,
    /// Pods whose eviction a disruption budget refuses now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
}

impl PreviewSummary {
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

impl fmt::Display for PreviewSummary {
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
        if let (Some(mean), Some(max)) = (self.cordoned_mean_seconds, self.cordoned_max_seconds) {
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
#[derive(Debug)]
pub struct Took(pub i64);

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

impl fmt::Display for PackagePlan {
    /// `driver: converged`, `driver: plan failed: why`, `driver: 3 change(s), needs
    /// reboot`; a report-only plan says the rollout applies the package regardless.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.failed {
            write!(f, "{}: plan failed: {}", self.package, self.message)?;
        } else if self.converged {
            write!(f, "{}: converged", self.package)?;
        } else {
            write!(f, "{}: {} change(s)", self.package, self.change_count)?;
            if !self.interrupt.is_empty() && self.interrupt != "none" {
                write!(f, ", needs {}", self.interrupt)?;
            }
        }
        if self.report_only {
            write!(f, " (the rollout applies it without a plan)")?;
        }
        Ok(())
    }
}

/// Nodes of a group named before the rest are counted.
const NAMED: usize = 5;

impl fmt::Display for PreviewReport {
    /// The summary, then each group: its outcome, its nodes, and what each package's plan
    /// answered there (up to five changes each).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.summary)?;
        if !self.settled {
            writeln!(
                f,
                "(the forecast stopped before the rollout ended: something holds it, see the nodes not done)"
            )?;
        }
        for g in &self.groups {
            let count = g.nodes.len();
            let shown: Vec<&str> = g.nodes.iter().take(NAMED).map(String::as_str).collect();
            let more = if count > NAMED {
                format!(" and {} more", count - NAMED)
            } else {
                String::new()
            };
            writeln!(f, "  {count} × {}: {}{more}", g.outcome, shown.join(", "))?;
            for plan in &g.outcome.plans {
                writeln!(f, "      {plan}")?;
                for change in plan.changes.iter().take(NAMED) {
                    writeln!(f, "        {change}")?;
                }
                if plan.changes.len() > NAMED {
                    writeln!(f, "        ... {} more", plan.changes.len() - NAMED)?;
                }
            }
        }
        for b in &self.blockers {
            writeln!(f, "  held by {b}")?;
        }
        for a in &self.assumed {
            writeln!(f, "  assumed: {a}")?;
        }
        Ok(())
    }
}
