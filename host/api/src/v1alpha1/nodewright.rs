//! The `NodeWright` kind: which nodes get which packages, and its status.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::package::Package;

/// Default `spec.priority`.
pub const DEFAULT_PRIORITY: i32 = 200;

/// Which nodes get which packages, and how disruptively.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "nodewright.io",
    version = "v1alpha1",
    kind = "NodeWright",
    plural = "nodewrights",
    shortname = "nw",
    status = "NodeWrightStatus",
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.status"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Complete","type":"string","jsonPath":".status.completeNodes"}"#,
    printcolumn = r#"{"name":"In-Progress","type":"integer","jsonPath":".status.nodesInProgress"}"#,
    printcolumn = r#"{"name":"Packages","type":"string","jsonPath":".status.packageList"}"#,
    printcolumn = r#"{"name":"Policy","type":"string","jsonPath":".spec.deploymentPolicy"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeWrightSpec {
    /// Candidate nodes. Empty selects every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selectors: Option<LabelSelector>,
    /// Legacy concurrency cap (exclusive with `deploymentPolicy`); unset means 100%.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interruption_budget: Option<Budget>,
    /// Name of a cluster-scoped DeploymentPolicy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_policy: Option<String>,
    /// A `kubernetes.io/dockerconfigjson` Secret in the operator's namespace: the login for
    /// this NodeWright's plugin pulls (asked before the operator-wide `pluginRegistries.secrets`), and
    /// an `imagePullSecrets` entry of its agent pods. The operator may read only the Secrets
    /// the chart names (`pluginRegistries.packageSecrets`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secret: Option<String>,
    /// Per-CR overrides of the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_policy_options: Option<DeploymentPolicyOptions>,
    /// Lower runs first (≥ 1, default 200); ties broken by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// How this CR gates lower-priority CRs: `node` (default) or `all`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequencing: Option<Sequencing>,
    /// When a node's payloads are pulled into its cache, before it is cordoned: `batch`
    /// (default: once the node is picked for its batch), `all` (on every targeted node as the
    /// rollout starts) or `none` (by each stage, after the cordon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prestage: Option<Prestage>,
    /// One package per node per pass.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub serial: bool,
    /// Pods matching this selector hold the drain until they end. Empty matches no pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_non_interrupt_labels: Option<LabelSelector>,
    /// Wait for pods matching `podNonInterruptLabels` to end *before* cordoning, so the
    /// node stays schedulable while it waits (default: cordon first, as NodeWright does).
    /// A protected pod that arrives between the cordon and the drain still holds the drain.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cordon_after_barrier: bool,
    /// Drain tuning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_config: Option<DrainConfig>,
    /// Checks that must pass before the rollout disrupts another node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_gates: Option<crate::gates::HealthGates>,
    /// Added to every agent pod, and to the node taint-tolerance check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_tolerations: Vec<Toleration>,
    /// Nodes must finish this CR before the runtime-required taint is removed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub runtime_required: bool,
    /// Keep a cordon after removing the runtime-required taint (needs `runtimeRequired`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub runtime_required_cordon_after: bool,
    /// Taint new matching nodes with the runtime-required taint (needs `runtimeRequired`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_taint_new_nodes: bool,
    /// When new disruptive work may start; replaces the policy's windows. Unset (and no
    /// policy windows): any time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_windows: Option<crate::windows::MaintenanceWindows>,
    /// The packages, keyed by name.
    #[serde(default)]
    pub packages: BTreeMap<String, Package>,
}

/// A concurrency budget: exactly one of `percent` (1–100) or `count` (≥ 1).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    /// Percent of matched nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i32>,
    /// Absolute number of nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i32>,
}

/// Per-CR policy overrides.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentPolicyOptions {
    /// Overrides the policy's `resetBatchStateOnCompletion`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_batch_state_on_completion: Option<bool>,
}

/// How a CR gates lower-priority CRs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Sequencing {
    /// A node may start lower-priority CRs once it finished this one.
    #[default]
    Node,
    /// Lower-priority CRs wait until every node finished this one.
    All,
}

/// How far ahead of its cordon a node's payloads are staged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Prestage {
    /// When the node is picked for its batch, before its cordon.
    #[default]
    Batch,
    /// On every node the rollout targets, from its start (while the canary compartment
    /// runs), whatever batch the node is in.
    All,
    /// Not ahead: each stage pulls what it needs, after the cordon.
    None,
}

/// Drain tuning.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainConfig {
    /// Give up (node erroring, stays cordoned) after this long, e.g. `30m`. Unset: wait forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Grace period for evicted pods, e.g. `30s`. Unset: each pod's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<String>,
    /// Delete pods instead of evicting them (bypasses PodDisruptionBudgets).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disable_eviction: bool,
    /// Also remove pods that no controller owns.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
    /// Also remove pods with emptyDir volumes (their data is lost).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delete_empty_dir_data: bool,
    /// Leave DaemonSet pods in place (default `true`); `false` drains them like other pods
    /// (a DaemonSet pod that tolerates the cordon, as the controller makes them, stays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_daemon_sets: Option<bool>,
}

/// Roll-up status of a CR or a node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Not known yet.
    #[default]
    Unknown,
    /// Everything complete.
    Complete,
    /// Held by a barrier (non-interrupt pods, taints, missing policy).
    Blocked,
    /// Waiting for ordering or a batch.
    Waiting,
    /// Disabled by annotation.
    Disabled,
    /// Paused by annotation.
    Paused,
    /// Work under way.
    InProgress,
    /// A stage failed terminally or a drain timed out.
    Erroring,
}

/// Observed state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeWrightStatus {
    /// CR roll-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Per-node roll-up.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_status: BTreeMap<String, Status>,
    /// Conditions (`Ready`, `Blocked`, `DrainBlocked`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Generation last seen complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Boot IDs for reboot tracking.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_boot_ids: BTreeMap<String, String>,
    /// The next maintenance window's opening (RFC 3339), while the rollout waits for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window: Option<String>,
    /// Package name → pinned plugin reference (`repo@sha256:…`) resolved from the spec.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resolved_plugins: BTreeMap<String, String>,
    /// `<package>/<payload>` → pinned image reference, for each payload a package takes from
    /// a container image (`spec.packages.<name>.payloads`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resolved_payloads: BTreeMap<String, String>,
    /// Package name → the trusted signers whose signatures of its resolved plugin verified
    /// (set when a `PluginTrustPolicy` applies).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugin_signers: BTreeMap<String, Vec<String>>,
    /// Per-compartment rollout state.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub compartment_statuses: BTreeMap<String, CompartmentStatus>,
    /// Printer helper: nodes in progress or erroring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_in_progress: Option<i32>,
    /// Printer helper: "complete/total".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_nodes: Option<String>,
    /// Printer helper: "a:1.0,b:2.0".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_list: Option<String>,
}

impl NodeWrightStatus {
    /// A copy of everything but the per-node maps (`nodeStatus`, `nodeBootIds`), which grow
    /// with the fleet: what a planner pass rewrites every time.
    pub fn without_nodes(&self) -> NodeWrightStatus {
        let mut copy = self.without_nodes_or_batches();
        copy.compartment_statuses = self.compartment_statuses.clone();
        copy
    }

    /// [`NodeWrightStatus::without_nodes`] without the compartments' statuses either (a
    /// planner pass writes each again; a batch lists its members by name).
    pub fn without_nodes_or_batches(&self) -> NodeWrightStatus {
        // Destructured without `..`: a new field must be decided on here.
        let NodeWrightStatus {
            status,
            node_status: _,
            conditions,
            observed_generation,
            node_boot_ids: _,
            next_window,
            resolved_plugins,
            resolved_payloads,
            plugin_signers,
            compartment_statuses: _,
            nodes_in_progress,
            complete_nodes,
            package_list,
        } = self;
        NodeWrightStatus {
            status: *status,
            node_status: BTreeMap::new(),
            conditions: conditions.clone(),
            observed_generation: *observed_generation,
            node_boot_ids: BTreeMap::new(),
            next_window: next_window.clone(),
            resolved_plugins: resolved_plugins.clone(),
            resolved_payloads: resolved_payloads.clone(),
            plugin_signers: plugin_signers.clone(),
            compartment_statuses: BTreeMap::new(),
            nodes_in_progress: *nodes_in_progress,
            complete_nodes: complete_nodes.clone(),
            package_list: package_list.clone(),
        }
    }

    /// Whether `self` and `other` agree on everything but the per-node maps, compared in
    /// place (a copy allocates every batch member's name again).
    pub fn same_without_nodes(&self, other: &NodeWrightStatus) -> bool {
        self.but_nodes() == other.but_nodes()
    }

    /// Every field but the per-node maps.
    fn but_nodes(&self) -> impl PartialEq + '_ {
        // Destructured without `..`: a new field must be decided on here.
        let NodeWrightStatus {
            status,
            node_status: _,
            conditions,
            observed_generation,
            node_boot_ids: _,
            next_window,
            resolved_plugins,
            resolved_payloads,
            plugin_signers,
            compartment_statuses,
            nodes_in_progress,
            complete_nodes,
            package_list,
        } = self;
        (
            status,
            conditions,
            observed_generation,
            next_window,
            resolved_plugins,
            resolved_payloads,
            plugin_signers,
            compartment_statuses,
            nodes_in_progress,
            complete_nodes,
            package_list,
        )
    }
}

/// One compartment's rollout state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompartmentStatus {
    /// Nodes matched.
    pub matched: i32,
    /// Budget ceiling.
    pub ceiling: i32,
    /// Nodes in progress.
    pub in_progress: i32,
    /// Nodes complete.
    pub completed: i32,
    /// Percent complete.
    pub progress_percent: i32,
    /// Batch state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_state: Option<BatchState>,
    /// Members of the current batch (sticky until each is complete or erroring).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch_nodes: Vec<String>,
}

/// Batch bookkeeping of a compartment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchState {
    /// Current batch number (1-based).
    pub current_batch: i32,
    /// Consecutive failed batches.
    pub consecutive_failures: i32,
    /// Nodes completed so far.
    pub completed_nodes: i32,
    /// Nodes failed so far.
    pub failed_nodes: i32,
    /// Set when failureThreshold stopped the compartment.
    #[serde(default)]
    pub should_stop: bool,
    /// Size of the last batch.
    pub last_batch_size: i32,
    /// Whether the last batch failed.
    #[serde(default)]
    pub last_batch_failed: bool,
    /// The NodeWright generation the progress counters belong to: on a new generation
    /// `completedNodes`/`failedNodes` restart (nodes done under the old spec need the new
    /// one), and on a version change the whole state does (see `versions`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: i64,
    /// The package versions (`name:version,...`) the counters belong to.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub versions: String,
}

impl Status {
    /// As the API spells it (`in_progress`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Unknown => "unknown",
            Status::Complete => "complete",
            Status::Blocked => "blocked",
            Status::Waiting => "waiting",
            Status::Disabled => "disabled",
            Status::Paused => "paused",
            Status::InProgress => "in_progress",
            Status::Erroring => "erroring",
        }
    }

    /// The status `text` spells as [`Status::as_str`] does (`None`: it spells none).
    pub fn parse(text: &str) -> Option<Status> {
        [
            Status::Unknown,
            Status::Complete,
            Status::Blocked,
            Status::Waiting,
            Status::Disabled,
            Status::Paused,
            Status::InProgress,
            Status::Erroring,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

pub(crate) fn is_zero(v: &i64) -> bool {
    *v == 0
}

impl NodeWrightSpec {
    /// `priority`, defaulted.
    pub fn priority(&self) -> i32 {
        self.priority.unwrap_or(DEFAULT_PRIORITY)
    }

    /// `prestage`, defaulted.
    pub fn prestage(&self) -> Prestage {
        self.prestage.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every text the schema admits for a status (a variant's `const`, or an `enum`).
    fn spellings(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("const", serde_json::Value::String(s)) => out.push(s.clone()),
                        ("enum", serde_json::Value::Array(a)) => {
                            out.extend(a.iter().filter_map(|s| s.as_str().map(String::from)));
                        }
                        _ => spellings(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| spellings(v, out)),
            _ => {}
        }
    }

    /// `Status::parse` reads every status the API spells, as serde does, and nothing else.
    #[test]
    fn every_status_the_api_spells_parses_back() {
        let schema = serde_json::to_value(schemars::schema_for!(Status)).expect("a schema");
        let mut texts = Vec::new();
        spellings(&schema, &mut texts);
        assert_eq!(texts.len(), 8, "the schema's statuses: {texts:?}");
        for text in &texts {
            let serde: Status = serde_json::from_value(serde_json::json!(text)).expect("serde");
            assert_eq!(Status::parse(text), Some(serde), "{text}");
            assert_eq!(serde.as_str(), text);
        }
        assert_eq!(Status::parse("In_Progress"), None);
        assert_eq!(Status::parse(""), None);
    }

    /// A status with every field the schema lists set, and each field set otherwise: the
    /// comparison without the per-node maps sees every other field change, and the copies
    /// leave out what they say (a field added later is in the schema, so it is asked too).
    #[test]
    fn a_status_compared_without_its_nodes_sees_every_other_field() {
        let full = serde_json::json!({
            "status": "in_progress",
            "nodeStatus": {"a": "complete"},
            "conditions": [{"type": "Ready", "status": "False", "reason": "R", "message": "m",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "observedGeneration": 2,
            "nodeBootIds": {"a": "b1"},
            "nextWindow": "2026-01-01T00:00:00Z",
            "resolvedPlugins": {"p": "r/p@sha256:0"},
            "resolvedPayloads": {"p/i": "r/i@sha256:0"},
            "pluginSigners": {"p": ["s"]},
            "compartmentStatuses": {"c": {"matched": 1, "ceiling": 1, "inProgress": 1,
                "completed": 0, "progressPercent": 0, "batchNodes": ["a"]}},
            "nodesInProgress": 1,
            "completeNodes": "0/1",
            "packageList": "p:1",
        });
        let schema = serde_json::to_value(schemars::schema_for!(NodeWrightStatus)).unwrap();
        let fields = schema["properties"].as_object().expect("properties");
        let base: NodeWrightStatus = serde_json::from_value(full.clone()).unwrap();
        for field in fields.keys() {
            let mut other = full.clone();
            other[field] = match &full[field] {
                serde_json::Value::Null => panic!("{field}: set it in this test"),
                serde_json::Value::String(_) if field == "status" => serde_json::json!("complete"),
                serde_json::Value::String(_) => serde_json::json!("else"),
                serde_json::Value::Number(_) => serde_json::json!(7),
                serde_json::Value::Array(_) => serde_json::json!([]),
                serde_json::Value::Object(_) => serde_json::json!({}),
                v => panic!("{field}: {v}"),
            };
            let other: NodeWrightStatus = serde_json::from_value(other).unwrap();
            assert_ne!(base, other, "{field}");
            let per_node = matches!(field.as_str(), "nodeStatus" | "nodeBootIds");
            assert_eq!(base.same_without_nodes(&other), per_node, "{field}");
        }
        let copy = base.without_nodes();
        assert!(copy.node_status.is_empty() && copy.node_boot_ids.is_empty());
        assert!(copy.same_without_nodes(&base));
        let lean = base.without_nodes_or_batches();
        assert!(lean.compartment_statuses.is_empty());
        let mut back = lean.clone();
        back.compartment_statuses = base.compartment_statuses.clone();
        assert!(back.same_without_nodes(&base) && !lean.same_without_nodes(&base));
    }
}
