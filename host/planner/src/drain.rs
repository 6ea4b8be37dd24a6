//! Drain decisions: the non-interrupt barrier, which pods go, how, and when to give up.

use nodewright_api::v1alpha1::DrainConfig;
use nodewright_api::validate::parse_duration;

use crate::action::Action;
use crate::select;
use crate::node::Env;
use crate::snapshot::{Cr, Pod};

/// Where a node's drain stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drain {
    /// Every pod that has to go is gone.
    Drained,
    /// Pods matching `podNonInterruptLabels` are running or pending: wait, without a timeout.
    Barrier(Vec<String>),
    /// Pods are being removed, or cannot be; the message says which and why.
    InProgress(Option<String>),
    /// `drainConfig.timeout` passed: the node is erroring and stays cordoned.
    TimedOut,
}

/// The drain of one node for one CR. `start` is when the first undrained pass saw it (the
/// `drain-start` annotation); the caller persists `now` when it is `None` and the result is
/// not [`Drain::Drained`]. Evictions are appended to `actions`.
pub fn drain(env: &Env<'_>, cr: &Cr, node: &str, pods: &[&Pod], start: Option<i64>, actions: &mut Vec<Action>) -> Drain {
    let (now, refusals, retry) = (env.now, env.refusals, env.settings.eviction_retry);
    let barrier_sel = cr.spec.pod_non_interrupt_labels.as_ref();
    if !select::is_empty(barrier_sel) {
        let held: Vec<String> = pods.iter().filter(|p| p.active && select::matches(barrier_sel, &p.labels)).map(|p| p.key()).collect();
        if !held.is_empty() {
            return Drain::Barrier(held);
        }
    }
    let config = cr.spec.drain_config.clone().unwrap_or_default();
    let going: Vec<&&Pod> = pods.iter().filter(|p| must_go(p)).collect();
    if going.is_empty() {
        return Drain::Drained;
    }
    if let (Some(start), Some(timeout)) = (start, timeout(&config))
        && now - start >= timeout
    {
        return Drain::TimedOut;
    }
    let grace = config.grace_period.as_deref().and_then(|g| parse_duration(g).ok()).map(|s| s as i64);
    let mut blocked: Vec<String> = Vec::new();
    for pod in going {
        if let Some(why) = blocker(pod, &config) {
            blocked.push(format!("{}: {why}", pod.key()));
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
            continue;
        }
        actions.push(Action::Evict { node: node.into(), namespace: pod.namespace.clone(), pod: pod.name.clone(), delete: config.disable_eviction, grace_seconds: grace });
    }
    Drain::InProgress((!blocked.is_empty()).then(|| blocked.join("; ")))
}

fn timeout(config: &DrainConfig) -> Option<i64> {
    let secs = parse_duration(config.timeout.as_deref()?).ok()? as i64;
    (secs > 0).then_some(secs)
}

/// Pods a drain removes: like `kubectl drain`, not mirror pods, DaemonSet pods, pods that
/// tolerate the cordon, or our own agent pods. Finished pods are already gone; terminating
/// ones still count until they are.
fn must_go(p: &Pod) -> bool {
    (p.active || p.terminating) && !p.mirror && !p.ours && !p.tolerates_unschedulable && p.controller.as_deref() != Some("DaemonSet")
}

fn blocker(p: &Pod, config: &DrainConfig) -> Option<String> {
    if p.controller.is_none() && !config.force {
        return Some("no controller would recreate it; set drainConfig.force to delete it anyway".into());
    }
    if p.empty_dir && !config.delete_empty_dir_data {
        return Some("uses emptyDir; set drainConfig.deleteEmptyDirData to allow losing that data".into());
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
    (now - start >= limit).then(|| format!("drain timed out after {}", config.timeout.as_deref().unwrap_or_default()))
}
