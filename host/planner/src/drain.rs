//! Drain decisions: the non-interrupt barrier, which pods go, how, and when to give up.

use nodewright_api::keys::reason;
use nodewright_api::units::parse_duration;
use nodewright_api::v1alpha1::DrainConfig;

use crate::action::Action;
use crate::select;
use crate::snapshot::{Cr, ObservedPod};
use crate::work::Env;

/// Where a node's drain stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drain {
    /// Every pod that has to go is gone.
    Drained,
    /// Pods matching `podNonInterruptLabels` are running or pending: wait, without a timeout.
    Barrier(Vec<String>),
    /// Pods are being removed, or some cannot be yet (which, and why).
    InProgress(Option<Blocked>),
    /// `drainConfig.timeout` passed: the node is erroring and stays cordoned.
    TimedOut,
}

/// Why a drain cannot finish yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// `PodDisruptionBudget`, `UnmanagedPod`, `EmptyDirData`, or `MultipleCauses` when
    /// pods wait for more than one of those.
    pub reason: &'static str,
    /// Each waiting pod with its cause.
    pub message: String,
}

/// Pods matching `podNonInterruptLabels` that are running or pending on the node.
pub fn barrier(cr: &Cr, pods: &[&ObservedPod]) -> Vec<String> {
    let sel = cr.spec.pod_non_interrupt_labels.as_ref();
    if select::is_empty(sel) {
        return Vec::new();
    }
    pods.iter()
        .filter(|p| p.active && select::matches(sel, &p.labels))
        .map(|p| p.key())
        .collect()
}

/// The drain of one node for one CR. `start` is when the first undrained pass saw it (the
/// `drain-start` annotation); the caller persists `now` when it is `None` and the result is
/// not [`Drain::Drained`]. Evictions are appended to `actions`.
pub fn drain(
    env: &Env<'_>,
    cr: &Cr,
    node: &str,
    pods: &[&ObservedPod],
    start: Option<i64>,
    actions: &mut Vec<Action>,
) -> Drain {
    let (now, refusals, retry) = (env.now, env.refusals, env.settings.eviction_retry);
    let held = barrier(cr, pods);
    if !held.is_empty() {
        return Drain::Barrier(held);
    }
    let config = cr.spec.drain_config.clone().unwrap_or_default();
    let going: Vec<&&ObservedPod> = pods.iter().filter(|p| must_go(p, &config)).collect();
    if going.is_empty() {
        return Drain::Drained;
    }
    if let (Some(start), Some(timeout)) = (start, timeout(&config))
        && now - start >= timeout
    {
        return Drain::TimedOut;
    }
    let grace = config
        .grace_period
        .as_deref()
        .and_then(|g| parse_duration(g).ok())
        .map(|s| s as i64);
    let mut blocked: Vec<String> = Vec::new();
    let mut causes: Vec<&'static str> = Vec::new();
    for pod in going {
        if let Some((cause, why)) = blocker(pod, &config) {
            blocked.push(format!("{}: {why}", pod.key()));
            causes.push(cause);
            continue;
        }
        if pod.terminating {
            continue;
        }
        if let Some(r) = refusals.get(&pod.key())
            && now - r.at < retry
            && !config.disable_eviction
        {
            blocked.push(format!("{}: {}", pod.key(), r.message));
            causes.push(reason::POD_DISRUPTION_BUDGET);
            continue;
        }
        actions.push(Action::Evict {
            node: node.into(),
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            delete: config.disable_eviction,
            grace_seconds: grace,
        });
    }
    causes.sort();
    causes.dedup();
    let reason = match causes.as_slice() {
        [one] => *one,
        _ => reason::MULTIPLE_CAUSES,
    };
    Drain::InProgress((!blocked.is_empty()).then(|| Blocked {
        reason,
        message: blocked.join("; "),
    }))
}

fn timeout(config: &DrainConfig) -> Option<i64> {
    let secs = parse_duration(config.timeout.as_deref()?).ok()? as i64;
    (secs > 0).then_some(secs)
}

/// Pods a drain removes: like `kubectl drain`, not mirror pods, pods that tolerate the
/// cordon, our own agent pods, or DaemonSet pods (unless `ignoreDaemonSets: false`).
/// Finished pods are already gone; terminating ones still count until they are.
fn must_go(p: &ObservedPod, config: &DrainConfig) -> bool {
    let daemon =
        p.controller.as_deref() == Some("DaemonSet") && config.ignore_daemon_sets != Some(false);
    (p.active || p.terminating) && !p.mirror && !p.ours && !p.tolerates_unschedulable && !daemon
}

fn blocker(p: &ObservedPod, config: &DrainConfig) -> Option<(&'static str, &'static str)> {
    if p.controller.is_none() && !config.force {
        return Some((
            reason::UNMANAGED_POD,
            "no controller would recreate it; set drainConfig.force to delete it anyway",
        ));
    }
    if p.empty_dir && !config.delete_empty_dir_data {
        return Some((
            reason::EMPTY_DIR_DATA,
            "uses emptyDir; set drainConfig.deleteEmptyDirData to allow losing that data",
        ));
    }
    None
}

/// The `drain-start` annotation, parsed.
pub fn started(raw: Option<&str>) -> Option<i64> {
    raw.and_then(|v| v.parse().ok())
}

/// `Some("drain timed out after …")` once `drainConfig.timeout` has passed since the drain
/// of `cr` started.
pub fn timed_out(cr: &Cr, start: Option<i64>, now: i64) -> Option<String> {
    let config = cr.spec.drain_config.as_ref()?;
    let limit = timeout(config)?;
    let start = start?;
    (now - start >= limit).then(|| {
        format!(
            "drain timed out after {}",
            config.timeout.as_deref().unwrap_or_default()
        )
    })
}
