//! The operator's Prometheus metrics and its plain-HTTP endpoint (`/metrics`, `/healthz`,
//! `/readyz`).
//!
//! Names follow the Prometheus conventions: a `nodewright_` prefix, base units, `_total`
//! on counters. docs/operator.md lists them.

mod rollout;

use std::sync::atomic::{AtomicBool, Ordering};

use nodewright_planner::Action;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label of [`Metrics::actions`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// The planner action: `create_job`, `patch_node`, …
    pub action: &'static str,
}

/// Label of [`Metrics::events`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// The event's reason: `DrainTimeout`, `StageFailed`, `Interrupt`, …
    pub reason: &'static str,
}

/// Labels of [`Metrics::admissions`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// `NodeWright` or `DeploymentPolicy`.
    pub kind: String,
    /// `CREATE`, `UPDATE` or `DELETE`.
    pub operation: String,
    /// `allowed`, `denied` or `error` (could not check: denied, fail closed).
    pub verdict: &'static str,
}

/// Every metric the operator exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Planner passes: snapshot, plan and execute.
    pub pass_duration: Histogram,
    /// Actions executed, by kind.
    pub actions: Family<ActionLabels, Counter>,
    /// API writes (creates, patches, deletes, evictions, status applies).
    pub api_writes: Counter,
    /// Writes the API refused or that failed.
    pub api_write_failures: Counter,
    /// Writes previews send (plan Jobs, statuses, deletes): beside the rollout's, outside
    /// its rate limit.
    pub preview_writes: Counter,
    /// Write requests as they are sent (events included), after the rate limit.
    pub api_requests: Counter,
    /// 1 while this replica holds the leader lease (or runs without election).
    pub leader: Gauge,
    /// Admission reviews answered.
    pub admissions: Family<AdmissionLabels, Counter>,
    /// Events emitted, by reason.
    pub events: Family<EventLabels, Counter>,
    /// Rollout state from the last snapshot.
    pub rollout: rollout::Rollout,
    ready: AtomicBool,
    /// The replica's node is fenced for a reboot (watched by the webhook listener, which
    /// drains while it is).
    fenced: tokio::sync::watch::Sender<bool>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let pass_duration = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        let actions = Family::<ActionLabels, Counter>::default();
        let api_writes = Counter::default();
        let api_write_failures = Counter::default();
        let preview_writes = Counter::default();
        let api_requests = Counter::default();
        let leader = Gauge::default();
        let admissions = Family::<AdmissionLabels, Counter>::default();
        let events = Family::<EventLabels, Counter>::default();
        let rollout = rollout::Rollout::default();
        registry.register(
            "nodewright_reconcile_duration_seconds",
            "Duration of one planner pass: snapshot, plan and execute",
            pass_duration.clone(),
        );
        registry.register(
            "nodewright_actions",
            "Planner actions executed, by action",
            actions.clone(),
        );
        registry.register(
            "nodewright_api_writes",
            "Writes sent to the Kubernetes API",
            api_writes.clone(),
        );
        registry.register(
            "nodewright_api_write_failures",
            "Writes the Kubernetes API refused or that failed",
            api_write_failures.clone(),
        );
        registry.register(
            "nodewright_preview_writes",
            "Writes NodeWrightPreviews sent to the Kubernetes API (plan Jobs, statuses, deletes), outside the rollout's rate limit",
            preview_writes.clone(),
        );
        registry.register(
            "nodewright_api_requests",
            "Write requests sent to the Kubernetes API as they go out (events included), after the client-side rate limit",
            api_requests.clone(),
        );
        registry.register(
            "nodewright_leader",
            "1 while this replica plans (holds the leader lease)",
            leader.clone(),
        );
        registry.register(
            "nodewright_admission_reviews",
            "Admission reviews answered by the webhook",
            admissions.clone(),
        );
        registry.register(
            "nodewright_events",
            "Events emitted, by reason (DrainTimeout, StageFailed, Interrupt, ...)",
            events.clone(),
        );
        rollout.register(&mut registry);
        Metrics {
            registry,
            pass_duration,
            actions,
            api_writes,
            api_write_failures,
            preview_writes,
            api_requests,
            leader,
            admissions,
            events,
            rollout,
            ready: AtomicBool::new(false),
            fenced: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Counts one executed action.
    pub fn action(&self, a: &Action) {
        let action = match a {
            Action::CreateJob(_) => "create_job",
            Action::DeleteJob { .. } => "delete_job",
            Action::PatchNode(_) => "patch_node",
            Action::Evict { .. } => "evict",
            Action::SetStatus { .. } => "set_status",
            Action::Event(e) => {
                self.events
                    .get_or_create(&EventLabels { reason: e.reason })
                    .inc();
                "event"
            }
            Action::AddFinalizer { .. } => "add_finalizer",
            Action::RemoveFinalizer { .. } => "remove_finalizer",
        };
        self.actions.get_or_create(&ActionLabels { action }).inc();
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// `/readyz` answers 200 from now on (caches synced, webhook certificate loaded).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Whether `/readyz` answers 200 (unless fenced).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// This replica's node is fenced for a reboot: `/readyz` answers 503, and it does not
    /// lead.
    pub fn set_fenced(&self, fenced: bool) {
        self.fenced
            .send_if_modified(|f| std::mem::replace(f, fenced) != fenced);
    }

    /// Whether this replica's node is fenced.
    pub fn is_fenced(&self) -> bool {
        *self.fenced.borrow()
    }

    /// Whether this replica's node is fenced, now and as it changes.
    pub fn fence_changes(&self) -> tokio::sync::watch::Receiver<bool> {
        self.fenced.subscribe()
    }
}
