//! The `DeploymentPolicy` kind: compartments of nodes, each with its own strategy.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::nodewright::Budget;

/// Rollout strategy for nodes, in compartments.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "nodewright.io",
    version = "v1alpha1",
    kind = "DeploymentPolicy",
    plural = "deploymentpolicies",
    shortname = "dp"
)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentPolicySpec {
    /// Reset batch state when a rollout completes (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_batch_state_on_completion: Option<bool>,
    /// Nodes matched by no compartment.
    pub default: PolicyDefault,
    /// Named groups of nodes with their own budget and strategy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compartments: Vec<Compartment>,
    /// When the NodeWrights using this policy may start disruptive work (a NodeWright's own
    /// `maintenanceWindows` replace these).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_windows: Option<crate::windows::MaintenanceWindows>,
}

/// The default compartment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyDefault {
    /// Budget.
    pub budget: Budget,
    /// Strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
}

/// A named compartment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Compartment {
    /// Unique name (`__default__` is reserved).
    pub name: String,
    /// Nodes in the compartment.
    pub selector: LabelSelector,
    /// Budget.
    pub budget: Budget,
    /// Strategy (default: the policy default's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
}

/// Exactly one of the strategies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Strategy {
    /// Constant batch size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed: Option<BatchParams>,
    /// Batch grows by `delta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear: Option<BatchParams>,
    /// Batch grows by `growthFactor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exponential: Option<BatchParams>,
}

/// Batch parameters (each strategy uses the relevant ones).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchParams {
    /// First batch size (≥ 1, default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_batch: Option<i32>,
    /// Linear growth (≥ 1, default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<i32>,
    /// Exponential growth (≥ 2, default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth_factor: Option<i32>,
    /// Percent of a batch that must succeed (1–100, default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_threshold: Option<i32>,
    /// Consecutive failed batches that stop the compartment (≥ 1; unset: never stop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<i32>,
    /// Progress percent below which failures count (1–100, default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety_limit: Option<i32>,
}
