//! What the planner decides: the operator executes these and nothing else.

use std::collections::BTreeMap;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Taint, Toleration};
use nodewright_api::agent::{InterruptAsk, PrestageAsk, StageAsk};
use nodewright_api::node_state::Stage;
use nodewright_api::v1alpha1::{NodeWrightStatus, Resources};

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

/// Everything an agent Job needs: who it is, how long and how often it may run, where it
/// may be scheduled, and what it asks of the agent. The operator adds only its deployment
/// (image, namespace, backend, registries).
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
    /// Deadline: per attempt for a stage (also the agent's own stage timeout), for the whole
    /// Job for an interrupt (whose pod restarts in place across the reboot). `None`: none.
    pub deadline: Option<Duration>,
    /// Failed pods the Job may replace: genuine failures of a stage (disruptions and host
    /// failures are not counted), restarts of an interrupt's pod.
    pub backoff_limit: i32,
    /// Tolerations: our cordon, the runtime-required taint, the CR's additional ones.
    pub tolerations: Vec<Toleration>,
    /// The CR's `imagePullSecret`: the first login asked for the plugin pull, and an
    /// `imagePullSecrets` entry of the agent pod.
    pub image_pull_secret: Option<String>,
    /// What the agent is asked.
    pub ask: Ask,
}

/// What an agent Job asks: a package stage or an interrupt, each in the agent's own terms.
#[allow(
    clippy::large_enum_variant,
    reason = "a request travels boxed (`Action::CreateJob`); boxing the stage again buys nothing"
)]
#[derive(Clone, Debug, PartialEq)]
pub enum Ask {
    /// One stage of one package (then its check).
    Stage {
        /// The stage, with its plugin, grants, config and sandbox bounds.
        call: StageAsk,
        /// The agent container's resources (`spec.packages.<name>.resources`).
        resources: Option<Resources>,
    },
    /// The node's merged interrupt, or a package's uninstall interrupt.
    Interrupt {
        /// After a removal (`uninstall-interrupt`) rather than the cycle's `interrupt`.
        uninstall: bool,
        /// The interrupt, with `restartAllServices` expanded to units.
        call: InterruptAsk,
    },
    /// The node's payloads staged before its cordon.
    Prestage {
        /// The payload set's fingerprint (the Job's key).
        set: String,
        /// The plugins whose payloads to stage.
        call: PrestageAsk,
    },
}

impl JobRequest {
    /// The Job's key, as its labels will say ([`Work`]).
    pub fn work(&self) -> Work {
        match &self.ask {
            Ask::Stage { call, .. } => Work::Package {
                package: call.package.clone(),
                version: call.version.clone(),
                stage: call.stage.stage(),
            },
            Ask::Interrupt { uninstall, call } => Work::Interrupt {
                stage: if *uninstall {
                    Stage::UninstallInterrupt
                } else {
                    Stage::Interrupt
                },
                kind: call.kind,
                owner: call.package.clone(),
            },
            Ask::Prestage { set, .. } => Work::Prestage { set: set.clone() },
        }
    }

    /// The package stage asked, if it is one.
    pub fn stage(&self) -> Option<&StageAsk> {
        match &self.ask {
            Ask::Stage { call, .. } => Some(call),
            Ask::Interrupt { .. } | Ask::Prestage { .. } => None,
        }
    }
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
