//! What the planner decides: the operator executes these and nothing else.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Taint, Toleration};
use nodewright_api::v1alpha1::{Interrupt, NodeWrightStatus, Package};

use crate::snapshot::Work;

/// One thing to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create an agent Job.
    CreateJob(Box<JobRequest>),
    /// Delete a Job (and its pods). It belongs to `node`'s work: when that node's patch in
    /// the same pass fails, the delete must not happen either (it would lose the Job's
    /// result the failed patch was recording).
    DeleteJob {
        /// Name.
        name: String,
        /// The node the Job runs on.
        node: String,
        /// The Job is still running: it is stopped, and stays (as `stopping`) until its pods
        /// are gone, so whatever waits for it waits for the work to end.
        running: bool,
    },
    /// One write to a node: annotations, cordon, taints — applied together, optimistically
    /// (against the snapshot's resourceVersion).
    PatchNode(NodePatch),
    /// Remove a pod from a node being drained.
    Evict {
        /// Node being drained.
        node: String,
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// Delete instead of evicting (`drainConfig.disableEviction`).
        delete: bool,
        /// Grace period override.
        grace_seconds: Option<i64>,
    },
    /// Replace a CR's status (server-side apply).
    SetStatus {
        /// CR.
        cr: String,
        /// The whole status.
        status: Box<NodeWrightStatus>,
    },
    /// Record an Event.
    Event(Event),
    /// Add our finalizer to a CR.
    AddFinalizer {
        /// CR.
        cr: String,
    },
    /// Remove our finalizer: the CR's cleanup on every node is done.
    RemoveFinalizer {
        /// CR.
        cr: String,
    },
}

/// Everything an agent Job needs.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRequest {
    /// Deterministic name.
    pub name: String,
    /// CR.
    pub cr: String,
    /// CR uid (idempotence markers).
    pub cr_uid: String,
    /// CR generation.
    pub generation: i64,
    /// The state entry's run epoch ([`nodewright_api::node_state::PackageStatus::run`]; for
    /// an interrupt, its owner's): part of the agent's idempotence key.
    pub run: i64,
    /// Node.
    pub node: String,
    /// What it does.
    pub work: Work,
    /// The package (for package stages).
    pub package: Option<Package>,
    /// Pinned plugin reference (package stages).
    pub plugin: String,
    /// Config keys changed (config cycles).
    pub changed_keys: Vec<String>,
    /// Version upgraded from.
    pub previous_version: Option<String>,
    /// The node's place in the CR's rollout order (package stages of batch members): nodes
    /// that left earlier batches, then its rank in the current ones. NodeWright's node order.
    pub node_order: Option<u32>,
    /// The interrupt to run (interrupt Jobs), with `restartAllServices` expanded to units.
    pub interrupt: Option<Interrupt>,
    /// Units to restart for the interrupt.
    pub services: Vec<String>,
    /// The package may reboot (its interrupt is a reboot).
    pub reboot_allowed: bool,
    /// Deadline: per attempt for package stages, whole stage for interrupts (0: none).
    pub deadline_seconds: u64,
    /// Retries of genuine failures (package stages).
    pub backoff_limit: i32,
    /// Tolerations: our cordon, the runtime-required taint, the CR's additional ones.
    pub tolerations: Vec<Toleration>,
}

/// Changes to one node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodePatch {
    /// Node.
    pub node: String,
    /// The snapshot's resourceVersion (the write fails on a conflict and the pass re-runs).
    pub resource_version: String,
    /// Annotations to set (`Some`) or remove (`None`).
    pub annotations: BTreeMap<String, Option<String>>,
    /// `spec.unschedulable`.
    pub unschedulable: Option<bool>,
    /// Taints to add.
    pub add_taints: Vec<Taint>,
    /// Taint keys to remove.
    pub remove_taints: Vec<String>,
}

impl NodePatch {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.annotations.is_empty()
            && self.unschedulable.is_none()
            && self.add_taints.is_empty()
            && self.remove_taints.is_empty()
    }
}

/// What an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A NodeWright.
    Cr(String),
    /// A node.
    Node(String),
}

/// An Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Object.
    pub target: Target,
    /// `Warning` rather than `Normal`.
    pub warning: bool,
    /// Reason (`Apply`, `Interrupt`, `Drain`, `DrainTimeout`, `State`, ...).
    pub reason: &'static str,
    /// Message.
    pub message: String,
}
