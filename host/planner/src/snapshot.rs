//! What the operator observed: the planner's only input besides the clock.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::states::StateCache;
use k8s_openapi::api::core::v1::Taint;
use nodewright_api::node_state::Stage;
use nodewright_api::payload::ImagePayload;
use nodewright_api::pinned::PinnedRef;
use nodewright_api::result::StageResult;
use nodewright_api::v1alpha1::{
    DeploymentPolicySpec, InterruptType, NodeWrightSpec, NodeWrightStatus,
};

/// One observation of the cluster.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Every NodeWright.
    pub nodewrights: Vec<Cr>,
    /// DeploymentPolicies by name.
    pub policies: BTreeMap<String, DeploymentPolicySpec>,
    /// Every node.
    pub nodes: Vec<ObservedNode>,
    /// The operator's Jobs.
    pub jobs: Vec<ObservedJob>,
    /// Pods bound to nodes.
    pub pods: Vec<ObservedPod>,
    /// Evictions a PodDisruptionBudget refused, by `namespace/name`.
    pub refusals: BTreeMap<String, Refusal>,
    /// Operator settings.
    pub settings: Settings,
    /// Node states parsed by earlier passes (a memo: an empty cache gives the same plan).
    pub states: Arc<StateCache>,
    /// The pods' grouping by node as earlier passes found it (a memo: an empty one gives the
    /// same plan).
    pub pod_places: Arc<crate::places::PodPlaces>,
    /// The Jobs' grouping by node as earlier passes found it (a memo: an empty one gives the
    /// same plan).
    pub job_places: Arc<crate::places::JobPlaces>,
    /// The node list's index, order and briefs as earlier passes made them (a memo: an
    /// empty one gives the same plan).
    pub roster: Arc<crate::roster::Roster>,
    /// Whether the API server admits the agent's pods in the Jobs' namespace.
    pub agent_pods: AgentPods,
    /// The operator's own replicas (empty: unknown, and nothing waits for them).
    pub replicas: Vec<Replica>,
}

/// One of the operator's replicas: its pod, where it runs, and whether it is ready (it
/// serves the fail-closed webhook and may lead).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    /// The pod's name.
    pub pod: String,
    /// Its node.
    pub node: String,
    /// Its `Ready` condition is true.
    pub ready: bool,
}

/// The API server's answer, as the operator last asked it (a server-side dry run of the
/// pod its stage Jobs create), to "may the agent's pods run in the Jobs' namespace?". Pod
/// Security admission, or a policy engine, refusing them would leave every Job without a
/// pod and every node it started cordoned: a refusal holds all new work instead.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AgentPods {
    /// Not asked, or the question itself failed (the operator logs why): nothing holds.
    #[default]
    Unknown,
    /// Admitted.
    Admitted,
    /// Refused: the message says by what, and what to change.
    Refused(String),
}

/// Operator settings the rules depend on.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Namespace of the agent Jobs.
    pub namespace: String,
    /// Retries of a failed package stage (`backoffLimit` of its Job); disruptions do not count.
    pub backoff_limit: i32,
    /// Per-attempt deadline of package stages (whole stage for interrupts) when the package
    /// sets no `stageTimeout`, in seconds; 0 means none.
    pub stage_timeout: u64,
    /// Reset a node's state for every CR when its boot ID changes outside our interrupts.
    pub reapply_on_reboot: bool,
    /// How long to wait before retrying an eviction a PodDisruptionBudget refused.
    pub eviction_retry: i64,
    /// Units `restartAllServices` restarts.
    pub restart_all_services: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            namespace: "nodewright".into(),
            backoff_limit: 3,
            stage_timeout: 3600,
            reapply_on_reboot: false,
            eviction_retry: 30,
            restart_all_services: vec!["procps.service".into()],
        }
    }
}

/// A NodeWright as observed.
#[derive(Clone, Debug, Default)]
pub struct Cr {
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// `metadata.generation`.
    pub generation: i64,
    /// Spec.
    pub spec: NodeWrightSpec,
    /// Status as last written (shared: at thousands of nodes its per-node maps are large,
    /// and the operator converts it once per version of the NodeWright).
    pub status: Observed<NodeWrightStatus>,
    /// `nodewright.io/pause: "true"`.
    pub paused: bool,
    /// `nodewright.io/disable: "true"`.
    pub disabled: bool,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Our finalizer is present.
    pub has_finalizer: bool,
    /// Outcome of resolving, pulling and grant-checking the plugins (done by the operator
    /// before any node is touched).
    pub plugins: PluginCheck,
    /// Health gates the operator evaluated that fail now (empty: none fails, or none set).
    pub failing_gates: Vec<GateFinding>,
}

/// A health gate that holds new disruptive work, as the operator found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateFinding {
    /// The gate: `prometheus`.
    pub gate: String,
    /// Machine-readable: `AlertsFiring`, `PrometheusUnreachable`, ...
    pub reason: String,
    /// What it found, for the condition.
    pub message: String,
}

/// The plugins of a CR, resolved and checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PluginCheck {
    /// Not checked yet.
    #[default]
    Pending,
    /// Every package is pinned, trusted (where a trust policy applies) and its grants cover
    /// every import.
    Ready(Resolved),
    /// Some plugin cannot be used; the message names the package and what to fix.
    NotReady {
        /// `GrantMissing`, `ResolveFailed`, ...
        reason: String,
        /// For the condition.
        message: String,
    },
}

/// What the operator's plugin check found for a ready CR.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// Package → its pinned reference.
    pub pinned: BTreeMap<String, PinnedRef>,
    /// Package → the trusted signers whose signatures verified (empty with no trust policy).
    pub signers: BTreeMap<String, Vec<String>>,
    /// Trust findings of policies in `warn` mode: rolled out anyway, reported.
    pub warnings: Vec<String>,
    /// Package → the bytes of payload it stages — its plugin's payloads and its image
    /// payloads, as their manifests declare them (packages without payloads are absent).
    pub payloads: BTreeMap<String, u64>,
    /// Package → its payloads from container images, pinned (packages without are absent).
    pub images: BTreeMap<String, Vec<ImagePayload>>,
}

impl From<BTreeMap<String, PinnedRef>> for Resolved {
    fn from(pinned: BTreeMap<String, PinnedRef>) -> Self {
        Resolved {
            pinned,
            ..Default::default()
        }
    }
}

/// An observed object, shared: a snapshot's copy of a node or pod is a reference count
/// (the operator converts a cached object once, not once per pass, and a forecast's steps
/// share the nodes they do not change). Reads go through to the object; a write copies it
/// first when it is shared (`Arc::make_mut`), so no other snapshot sees the change.
#[derive(Default, PartialEq)]
pub struct Observed<T>(Arc<T>);

impl<T> Observed<T> {
    /// Shares `facts`.
    pub fn new(facts: T) -> Self {
        Observed(Arc::new(facts))
    }

    /// Whether both are the same shared object (not merely equal).
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl<T> Clone for Observed<T> {
    fn clone(&self) -> Self {
        Observed(Arc::clone(&self.0))
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Observed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<T> std::ops::Deref for Observed<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Clone> std::ops::DerefMut for Observed<T> {
    fn deref_mut(&mut self) -> &mut T {
        Arc::make_mut(&mut self.0)
    }
}

impl<T> From<T> for Observed<T> {
    fn from(facts: T) -> Self {
        Observed::new(facts)
    }
}

/// A node as observed.
pub type ObservedNode = Observed<NodeFacts>;

/// What a pass reads of a node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    /// Name.
    pub name: String,
    /// Creation time (unix seconds); nodes are ordered by it, then name.
    pub created: i64,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// `spec.taints`.
    pub taints: Vec<Taint>,
    /// `status.nodeInfo.bootID`.
    pub boot_id: String,
    /// `status.conditions`: type → status (`True`, `False`, `Unknown`).
    pub conditions: BTreeMap<String, String>,
    /// `metadata.resourceVersion`, for optimistic writes.
    pub resource_version: String,
}

#[cfg(test)]
impl Observed<NodeFacts> {
    /// A node with a name and nothing else, for tests.
    pub(crate) fn named(name: &str) -> Self {
        Observed::new(NodeFacts {
            name: name.into(),
            ..Default::default()
        })
    }
}

impl NodeFacts {
    /// Where the node comes in a rollout: by creation time, then name. The planner takes
    /// nodes in this order; the operator hands them over in it.
    pub fn rollout_key(&self) -> (i64, &str) {
        (self.created, &self.name)
    }

    /// The same node as far as a pass can tell: equal in everything but the
    /// resourceVersion (a heartbeat moves only that once a node is read).
    pub fn same_as(&self, other: &NodeFacts) -> bool {
        let bare = |n: &NodeFacts| NodeFacts {
            resource_version: String::new(),
            ..n.clone()
        };
        bare(self) == bare(other)
    }
}

/// What a Job does; parsed from its labels.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Work {
    /// One stage of one package.
    Package {
        /// Package name.
        package: String,
        /// Version.
        version: String,
        /// Stage.
        stage: Stage,
    },
    /// The node's merged interrupt, or a package's uninstall interrupt.
    Interrupt {
        /// `Interrupt` or `UninstallInterrupt`.
        stage: Stage,
        /// Kind.
        kind: InterruptType,
        /// The package that owns it.
        owner: String,
    },
    /// Staging the CR's payloads on the node before its cordon.
    Prestage {
        /// The payload set's fingerprint ([`nodewright_api::node_state::Staged::set`]).
        set: String,
    },
}

impl Work {
    /// Whether a Job doing `self` is the Job that would do `other`: the same key its name
    /// is made from ([`crate::jobs::job_name`]) — package, version and stage for a package
    /// stage; stage and type for an interrupt, whoever owns it (one merged interrupt per
    /// node); the node alone for a prestage.
    pub fn same_job(&self, other: &Work) -> bool {
        match (self, other) {
            (
                Work::Package {
                    package,
                    version,
                    stage,
                },
                Work::Package {
                    package: p,
                    version: v,
                    stage: s,
                },
            ) => package == p && version == v && stage == s,
            (
                Work::Interrupt { stage, kind, .. },
                Work::Interrupt {
                    stage: s, kind: k, ..
                },
            ) => stage == s && kind == k,
            // One per node and CR, whatever set it stages.
            (Work::Prestage { .. }, Work::Prestage { .. }) => true,
            (Work::Package { .. } | Work::Prestage { .. }, Work::Interrupt { .. })
            | (Work::Interrupt { .. } | Work::Prestage { .. }, Work::Package { .. })
            | (Work::Package { .. } | Work::Interrupt { .. }, Work::Prestage { .. }) => false,
        }
    }
}

/// One of the operator's Jobs.
#[derive(Clone, Debug)]
pub struct ObservedJob {
    /// Name.
    pub name: String,
    /// CR it belongs to.
    pub cr: String,
    /// Node it runs on.
    pub node: String,
    /// CR generation it was created for.
    pub generation: i64,
    /// The node-state entry's `run` it was created for (0: unknown).
    pub run: i64,
    /// What it does.
    pub work: Work,
    /// How it is going.
    pub phase: JobPhase,
    /// Being deleted (its pods are stopping): no longer the planner's to record, but it
    /// still holds its node and its name until it is gone.
    pub stopping: bool,
    /// Its pod cannot start (the image cannot be pulled, the container cannot be created):
    /// the kubelet's reason and message, naming the image. The kubelet keeps trying; the
    /// node reads erroring, with this, until it succeeds.
    pub stuck: Option<String>,
}

impl ObservedJob {
    /// Not finished.
    pub fn running(&self) -> bool {
        matches!(self.phase, JobPhase::Active { .. })
    }
}

/// How a Job is going.
#[derive(Clone, Debug)]
pub enum JobPhase {
    /// Not finished; `failed` counted attempts so far, with the last one's result.
    Active {
        /// Counted (genuine) failed attempts.
        failed: u32,
        /// The last failed attempt's result.
        last: Option<Box<StageResult>>,
    },
    /// Finished successfully.
    Succeeded(Option<Box<StageResult>>),
    /// Finished unsuccessfully.
    Failed {
        /// At least one attempt failed for a reason that counts (a non-zero exit with a
        /// verdict, or its deadline) — not only disruptions or admission rejections.
        genuine: bool,
        /// Counted attempts.
        attempts: u32,
        /// The Job's failure reason (`BackoffLimitExceeded`, `DeadlineExceeded`, ...).
        reason: String,
        /// The last failed attempt's result.
        last: Option<Box<StageResult>>,
    },
}

/// A pod bound to a node, as observed.
pub type ObservedPod = Observed<PodFacts>;

/// What a pass reads of a pod bound to a node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodFacts {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.nodeName`.
    pub node: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Running or Pending (not Succeeded/Failed).
    pub active: bool,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// Controller owner kind, if any.
    pub controller: Option<String>,
    /// A mirror (static) pod.
    pub mirror: bool,
    /// Uses an emptyDir volume.
    pub empty_dir: bool,
    /// Tolerates `node.kubernetes.io/unschedulable:NoSchedule`.
    pub tolerates_unschedulable: bool,
    /// One of our agent pods.
    pub ours: bool,
}

impl PodFacts {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// An eviction a PodDisruptionBudget refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// When (unix seconds).
    pub at: i64,
    /// The apiserver's message.
    pub message: String,
}
