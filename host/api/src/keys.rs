//! Annotation, label, taint, finalizer and condition names.
//!
//! Prefix `nodewright.io/`. Per-CR keys end in `.<cr name>`.

/// The API group.
pub const GROUP: &str = "nodewright.io";
/// Finalizer on NodeWright objects (uninstall on delete).
pub const FINALIZER: &str = "nodewright.io/finalizer";
/// CR annotation: `"true"` pauses the rollout (no new work).
pub const PAUSE: &str = "nodewright.io/pause";
/// CR annotation: `"true"` disables the CR (stops and releases).
pub const DISABLE: &str = "nodewright.io/disable";
/// Node label: `"true"` excludes the node from every CR.
pub const IGNORE: &str = "nodewright.io/ignore";
/// Taint key of the runtime-required taint (`nodewright.io=runtime-required:NoSchedule`).
pub const RUNTIME_REQUIRED_TAINT_KEY: &str = "nodewright.io";
/// Value of the runtime-required taint.
pub const RUNTIME_REQUIRED_TAINT_VALUE: &str = "runtime-required";
/// Karpenter: keep the node while nodewright disrupts it.
pub const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// Karpenter: do not repair the node while nodewright disrupts it.
pub const KARPENTER_DO_NOT_REPAIR: &str = "karpenter.sh/do-not-repair";
/// Node annotation: which Karpenter annotations nodewright added (so only those are removed).
pub const KARPENTER_OWNED: &str = "nodewright.io/karpenter-owned";
/// Lease label: `"true"` on the Lease an operator's leader holds (whatever `--lease-name`
/// calls it), so tools find it.
pub const OPERATOR_LEASE: &str = "nodewright.io/operator-lease";

/// Namespace label: the Pod Security level enforced there. The stage Jobs' namespace needs
/// [`POD_SECURITY_PRIVILEGED`]: the agent runs privileged, in the host's PID and network
/// namespaces, with the host's root mounted.
pub const POD_SECURITY_ENFORCE: &str = "pod-security.kubernetes.io/enforce";
/// The level the stage Jobs' namespace must enforce (at most).
pub const POD_SECURITY_PRIVILEGED: &str = "privileged";

/// A node annotation nodewright keeps for one CR: `nodewright.io/<mark>.<cr>`. This is the
/// one list of them: letting go of a node (its CR deleted, or no longer selecting it) clears
/// each one but the record, so a mark added here is cleared with the others, and the
/// planner's tests refuse a per-CR annotation that is not one of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CrMark {
    /// The JSON [`crate::node_state::NodeState`]: what is installed, the source of truth.
    State,
    /// The CR owns a cordon on the node.
    Cordon,
    /// The node's roll-up status for the CR (also a label).
    Status,
    /// When the drain started.
    DrainStart,
    /// Why the drain is blocked (cleared once it proceeds).
    DrainBlocked,
    /// Which of the CR's payloads the node has staged, and how many bytes
    /// ([`crate::node_state::Staged`]).
    Staged,
    /// The CR tainted the new node `runtime-required`.
    AutoTaint,
    /// The CR's reboot of the node waits for the operator replicas running there (named in
    /// the value) to leave the webhook Service and hand over leadership: while a node has
    /// one, a replica on it reports not ready and does not lead.
    FenceOperator,
}

impl CrMark {
    /// Every mark.
    pub const ALL: [CrMark; 8] = [
        CrMark::State,
        CrMark::Cordon,
        CrMark::Status,
        CrMark::DrainStart,
        CrMark::DrainBlocked,
        CrMark::Staged,
        CrMark::AutoTaint,
        CrMark::FenceOperator,
    ];

    fn prefix(self) -> &'static str {
        match self {
            CrMark::State => "nodewright.io/state.",
            CrMark::Cordon => "nodewright.io/cordon.",
            CrMark::Status => "nodewright.io/status.",
            CrMark::DrainStart => "nodewright.io/drain-start.",
            CrMark::DrainBlocked => "nodewright.io/drain-blocked.",
            CrMark::Staged => "nodewright.io/staged.",
            CrMark::AutoTaint => "nodewright.io/auto-taint.",
            CrMark::FenceOperator => "nodewright.io/fence-operator.",
        }
    }

    /// The annotation's key for `cr`.
    pub fn key(self, cr: &str) -> String {
        format!("{}{cr}", self.prefix())
    }

    /// The mark and the CR an annotation key names, if it is one of these.
    pub fn parse(key: &str) -> Option<(CrMark, &str)> {
        CrMark::ALL.into_iter().find_map(|m| {
            key.strip_prefix(m.prefix())
                .filter(|cr| !cr.is_empty())
                .map(|cr| (m, cr))
        })
    }
}

/// Every [`CrMark`]'s key for one CR, spelled once. A planner pass asks each node it works
/// on for several of them; spelling a key again for every question allocated it again, and
/// at ten thousand nodes an allocation is a cache miss of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrKeys {
    cr: String,
    /// In [`CrMark::ALL`]'s order (a mark's discriminant is its place).
    keys: [String; CrMark::ALL.len()],
}

impl CrKeys {
    /// The keys of `cr`.
    pub fn new(cr: &str) -> Self {
        CrKeys {
            cr: cr.into(),
            keys: CrMark::ALL.map(|m| m.key(cr)),
        }
    }

    /// The CR's name.
    pub fn cr(&self) -> &str {
        &self.cr
    }

    /// `mark`'s key.
    pub fn get(&self, mark: CrMark) -> &str {
        &self.keys[mark as usize]
    }
}

/// Node annotation holding the JSON [`crate::node_state::NodeState`] of `cr`: the source of truth.
pub fn node_state(cr: &str) -> String {
    CrMark::State.key(cr)
}

/// Node annotation: `cr` owns a cordon on the node.
pub fn cordon(cr: &str) -> String {
    CrMark::Cordon.key(cr)
}

/// Node annotation and label: the node's roll-up status for `cr`.
pub fn node_status(cr: &str) -> String {
    CrMark::Status.key(cr)
}

/// Node annotation: when the drain for `cr` started.
pub fn drain_start(cr: &str) -> String {
    CrMark::DrainStart.key(cr)
}

/// Node annotation: which of `cr`'s payloads the node has staged, and how many bytes
/// ([`crate::node_state::Staged`]).
pub fn staged(cr: &str) -> String {
    CrMark::Staged.key(cr)
}

/// Node annotation: `cr` tainted the node `runtime-required` when it joined.
pub fn auto_taint(cr: &str) -> String {
    CrMark::AutoTaint.key(cr)
}

/// Whether a node's annotations fence the operator replicas running on it (some CR's
/// [`CrMark::FenceOperator`]).
pub fn fences_operator<'k>(mut annotation_keys: impl Iterator<Item = &'k String>) -> bool {
    annotation_keys.any(|k| matches!(CrMark::parse(k), Some((CrMark::FenceOperator, _))))
}

/// Condition types on the CR.
pub mod condition {
    /// True iff the CR is complete.
    pub const READY: &str = "Ready";
    /// A barrier holds the rollout.
    pub const BLOCKED: &str = "Blocked";
    /// A drain cannot proceed.
    pub const DRAIN_BLOCKED: &str = "DrainBlocked";
    /// A plugin needs a capability that is not granted (or cannot be resolved/pulled).
    pub const PLUGINS_READY: &str = "PluginsReady";
    /// The referenced DeploymentPolicy does not exist.
    pub const DEPLOYMENT_POLICY_NOT_FOUND: &str = "DeploymentPolicyNotFound";
    /// Some node's state annotation cannot be parsed.
    pub const NODE_STATE_MALFORMED: &str = "NodeStateMalformed";
    /// The CR's health gates pass (set only when it has gates that hold a rollout).
    pub const HEALTH_GATES_PASSING: &str = "HealthGatesPassing";
    /// Some node is uninstalling a package.
    pub const UNINSTALL_IN_PROGRESS: &str = "UninstallInProgress";
    /// Some node's uninstall failed.
    pub const UNINSTALL_FAILED: &str = "UninstallFailed";
    /// The CR is being deleted, and its pause or disable keeps uninstalls from running.
    pub const DELETION_BLOCKED: &str = "DeletionBlocked";
}

/// Condition and event reasons.
pub mod reason {
    /// All nodes converged.
    pub const NODES_CONVERGED: &str = "NodesConverged";
    /// Work in progress.
    pub const PROGRESSING: &str = "Progressing";
    /// Pods matching podNonInterruptLabels are running.
    pub const NON_INTERRUPT_PODS_RUNNING: &str = "NonInterruptPodsRunning";
    /// A PodDisruptionBudget refused an eviction.
    pub const POD_DISRUPTION_BUDGET: &str = "PodDisruptionBudget";
    /// The grant check failed.
    pub const GRANT_MISSING: &str = "GrantMissing";
    /// A capability call was denied at run time.
    pub const CAPABILITY_DENIED: &str = "CapabilityDenied";
    /// Every maintenance window is closed: new disruptive work waits for the next.
    pub const OUTSIDE_MAINTENANCE_WINDOW: &str = "OutsideMaintenanceWindow";
    /// A health gate holds new disruptive work.
    pub const HEALTH_GATE_FAILING: &str = "HealthGateFailing";
    /// A node's reboot waits for an operator replica to become ready on another node.
    pub const OPERATOR_REPLICA_STARTING: &str = "OperatorReplicaStarting";
    /// The API server refuses the agent's pods (Pod Security, a policy engine): nothing new
    /// starts.
    pub const AGENT_PODS_REFUSED: &str = "AgentPodsRefused";
    /// A drain waits on pods no controller owns (`drainConfig.force` is off).
    pub const UNMANAGED_POD: &str = "UnmanagedPod";
    /// A drain waits on pods with emptyDir data (`drainConfig.deleteEmptyDirData` is off).
    pub const EMPTY_DIR_DATA: &str = "EmptyDirData";
    /// A drain waits for more than one kind of reason.
    pub const MULTIPLE_CAUSES: &str = "MultipleCauses";
    /// A package waits on a dependency that is being (or has been) uninstalled.
    pub const DEPENDENCY_UNINSTALLED: &str = "DependencyUninstalled";
    /// Deletion waits: the CR is paused and some node has an uninstall to run.
    pub const PAUSED_WITH_PENDING_UNINSTALL: &str = "PausedWithPendingUninstall";
    /// Deletion waits: the CR is disabled and some node has an uninstall to run.
    pub const DISABLED_WITH_PENDING_UNINSTALL: &str = "DisabledWithPendingUninstall";
}

/// Node annotation: why the drain of `cr` is blocked (cleared once it proceeds).
pub fn drain_blocked(cr: &str) -> String {
    CrMark::DrainBlocked.key(cr)
}

/// Labels on agent Jobs and their pods (what the operator reads back into the planner).
pub mod job {
    /// Marks our Jobs and pods: `"true"` a rollout's, [`MANAGED_PREVIEW`] a preview's plan
    /// stages (the rollout's caches select `"true"` only, so no pass ever reads one).
    pub const MANAGED: &str = "nodewright.io/managed";
    /// [`MANAGED`]'s value on a preview's Jobs and pods.
    pub const MANAGED_PREVIEW: &str = "preview";
    /// The `NodeWrightPreview` a plan Job answers.
    pub const PREVIEW: &str = "nodewright.io/preview";

    /// Whether `labels` mark one of our pods, a rollout's or a preview's: never drained,
    /// never a workload a barrier waits for.
    pub fn is_ours(labels: &std::collections::BTreeMap<String, String>) -> bool {
        labels
            .get(MANAGED)
            .is_some_and(|v| v == "true" || v == MANAGED_PREVIEW)
    }
    /// CR name.
    pub const CR: &str = "nodewright.io/cr";
    /// Node name.
    pub const NODE: &str = "nodewright.io/node";
    /// Package name (package stages), or the interrupt's owner.
    pub const PACKAGE: &str = "nodewright.io/package";
    /// Package version (package stages).
    pub const VERSION: &str = "nodewright.io/version";
    /// Stage.
    pub const STAGE: &str = "nodewright.io/stage";
    /// Interrupt type (interrupt Jobs).
    pub const INTERRUPT: &str = "nodewright.io/interrupt";
    /// The payload set a prestage Job stages (prestage Jobs; see
    /// [`crate::node_state::Staged`]).
    pub const PRESTAGE: &str = "nodewright.io/prestage";
    /// CR generation the Job was created for.
    pub const GENERATION: &str = "nodewright.io/generation";
    /// The node-state entry's `run` the Job was created for: a Job kept after it failed is
    /// told from the entry's next attempt by it (and by the generation).
    pub const RUN: &str = "nodewright.io/run";
    /// The Job's name: finished Jobs are deleted many to a request, by a set-based selector
    /// on it.
    pub const JOB: &str = "nodewright.io/job";
}

/// Node annotation: nodewright cordoned the node when it removed the runtime-required taint
/// (`runtimeRequiredCordonAfter`); only an admin releases that cordon.
pub const RUNTIME_REQUIRED_CORDON: &str = "nodewright.io/runtime-required-cordon";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mark_of_a_cr_reads_back_as_itself_and_nothing_else_does() {
        for mark in CrMark::ALL {
            let key = mark.key("gpu-drivers");
            assert_eq!(CrMark::parse(&key), Some((mark, "gpu-drivers")), "{key}");
        }
        let distinct: std::collections::HashSet<&str> =
            CrMark::ALL.iter().map(|m| m.prefix()).collect();
        assert_eq!(distinct.len(), CrMark::ALL.len());
        for other in [
            PAUSE,
            KARPENTER_OWNED,
            RUNTIME_REQUIRED_CORDON,
            "nodewright.io/state.",
            "example.com/state.gpu",
        ] {
            assert_eq!(CrMark::parse(other), None, "{other}");
        }
    }

    #[test]
    fn a_crs_keys_spell_each_mark_as_the_mark_does() {
        let keys = CrKeys::new("gpu-drivers");
        assert_eq!(keys.cr(), "gpu-drivers");
        for mark in CrMark::ALL {
            assert_eq!(keys.get(mark), mark.key("gpu-drivers"), "{mark:?}");
        }
    }
}
