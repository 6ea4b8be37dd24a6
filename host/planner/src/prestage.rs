//! Payloads staged before the cordon (`spec.prestage`).
//!
//! A CR whose plugins carry payloads stages them on a node — one prestage Job pulling every
//! such plugin's payloads into the node cache — before the node's first Job of the CR, so
//! no download happens while the node is cordoned and a node whose payloads cannot be
//! staged is never cordoned. The node records what it staged in its
//! [`keys::staged`] annotation ([`Staged`]); a different set (a new pin) is staged again
//! before the next cordon. With `batch` a node stages once it is picked for its batch; with
//! `all` every eligible node stages from the start, whatever its batch; with `none` nothing
//! is staged ahead (each stage pulls what it needs, after the cordon).

use std::collections::BTreeSet;

use nodewright_api::keys;
use nodewright_api::node_state::{NodeState, Staged};
use nodewright_api::payload::ImagePayload;
use nodewright_api::pinned::PinnedRef;
use nodewright_api::result::StageResult;
use nodewright_api::units::format_bytes;
use nodewright_api::v1alpha1::{Prestage, Status};
use sha2::{Digest, Sha256};

use crate::action::{Action, Event, Target};
use crate::hold::Hold;
use crate::jobs::prestage_job;
use crate::node::Visit;
use crate::snapshot::{Cr, JobPhase, ObservedNode, PluginCheck, Work};
use crate::work::{Env, NodeWork};

/// The payloads a CR stages ahead of its cordons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayloadSet {
    /// `batch` or `all`.
    pub mode: Prestage,
    /// A fingerprint of the pinned plugins that carry payloads (16 hex digits).
    pub fingerprint: String,
    /// Those plugins, sorted.
    pub plugins: Vec<PinnedRef>,
    /// The CR's payloads from container images, sorted.
    pub images: Vec<ImagePayload>,
    /// Their payloads' total size.
    pub bytes: u64,
}

impl PayloadSet {
    /// What `cr` stages ahead: nothing with `prestage: none`, before its plugins are ready,
    /// when none of them carries a payload, or while it is deleted (its nodes uninstall:
    /// nothing to download for).
    pub fn of(cr: &Cr) -> Option<PayloadSet> {
        let mode = cr.spec.prestage();
        let PluginCheck::Ready(resolved) = &cr.plugins else {
            return None;
        };
        if mode == Prestage::None || cr.deleting {
            return None;
        }
        let mut plugins: Vec<PinnedRef> = Vec::new();
        let mut bytes = 0u64;
        for (package, size) in resolved.payloads.iter().filter(|(_, size)| **size > 0) {
            if let Some(pin) = resolved.pinned.get(package)
                && !plugins.contains(pin)
            {
                plugins.push(pin.clone());
                bytes = bytes.saturating_add(*size);
            }
        }
        let mut images: Vec<ImagePayload> = resolved.images.values().flatten().cloned().collect();
        if plugins.is_empty() && images.is_empty() {
            return None;
        }
        plugins.sort();
        images.sort();
        images.dedup();
        let mut hash = Sha256::new();
        for p in &plugins {
            hash.update(p.as_str().as_bytes());
            hash.update(b"\n");
        }
        for i in &images {
            hash.update(i.to_string().as_bytes());
            hash.update(b"\n");
        }
        let fingerprint = hash
            .finalize()
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect();
        Some(PayloadSet {
            mode,
            fingerprint,
            plugins,
            images,
            bytes,
        })
    }

    /// Whether the node has staged this set (as this pass has left its annotations).
    fn staged_on(&self, cr: &str, work: &NodeWork<'_>) -> bool {
        work.get(&keys::staged(cr))
            .and_then(|v| v.parse::<Staged>().ok())
            .is_some_and(|s| s.set == self.fingerprint)
    }
}

/// Folds the node's prestage Job into its annotations: staged once it succeeded (the Job
/// deleted), a failure of its last attempt among the node's `failures` while it retries,
/// its final failure too (the Job kept, with its pods' logs, until its TTL ends it and the
/// next pass stages again). A Job of another set, or one that failed for an older
/// generation, is let go of.
pub(crate) fn record(
    v: &Visit<'_, '_>,
    work: &mut NodeWork<'_>,
    actions: &mut Vec<Action>,
    failures: &mut Vec<String>,
) {
    let (cr, set) = (v.cr, v.env.prestage);
    for job in v.jobs.iter().filter(|j| !j.stopping) {
        let Work::Prestage { set: staging } = &job.work else {
            continue;
        };
        let current = set.filter(|s| s.fingerprint == *staging);
        let delete = match (current, &job.phase) {
            (None, _) => true,
            (Some(_), JobPhase::Active { last, .. }) => {
                if let Some(r) = last.as_deref().filter(|r| !r.is_ok()) {
                    cannot_stage(v, work, failed(r), actions, failures);
                }
                false
            }
            (Some(set), JobPhase::Succeeded(result)) => {
                let staged = Staged {
                    set: set.fingerprint.clone(),
                    bytes: set.bytes,
                };
                work.set(&keys::staged(&cr.name), Some(staged.to_string()));
                actions.push(Action::Event(Event {
                    target: Target::Node(v.node.name.clone()),
                    warning: false,
                    reason: "Staged",
                    message: match result {
                        Some(r) => format!("{} ({})", r.message, cr.name),
                        None => {
                            format!("payloads staged: {} ({})", format_bytes(set.bytes), cr.name)
                        }
                    },
                }));
                true
            }
            (Some(_), JobPhase::Failed { genuine, .. })
                if !genuine || job.generation < cr.generation =>
            {
                true
            }
            (Some(_), JobPhase::Failed { reason, last, .. }) => {
                let why = last
                    .as_deref()
                    .map_or_else(|| format!("payloads could not be staged: {reason}"), failed);
                cannot_stage(v, work, why, actions, failures);
                false
            }
        };
        if delete {
            actions.push(Action::DeleteJob {
                name: job.name.clone(),
                node: v.node.name.clone(),
                running: job.running(),
            });
        }
    }
}

/// The node cannot stage: it reads erroring with `why`; a warning says so as it turns.
fn cannot_stage(
    v: &Visit<'_, '_>,
    work: &NodeWork<'_>,
    why: String,
    actions: &mut Vec<Action>,
    failures: &mut Vec<String>,
) {
    let cr = &v.cr.name;
    if work.get(&keys::node_status(cr)) != Some(Status::Erroring.as_str()) {
        actions.push(Action::Event(Event {
            target: Target::Cr(cr.clone()),
            warning: true,
            reason: "PrestageFailed",
            message: format!("{why} on {}; it is not cordoned", v.node.name),
        }));
    }
    failures.push(why);
}

fn failed(r: &StageResult) -> String {
    format!(
        "payloads could not be staged: [{}] {}",
        r.blame.as_str(),
        r.message
    )
}

/// Whether the node must stage the CR's payloads before anything of the CR starts on it
/// (its runnable steps are then held back this pass): it has a set to stage, has not staged
/// it, and is not past its cordon (a node already cordoned finishes with what its stages
/// pull). Starts the prestage Job when `wanted` (the node has work and no failure) and the
/// node may begin it: picked for its batch (`member`), or any node under `all`; never under
/// a hold of everything.
pub(crate) fn holds(
    v: &Visit<'_, '_>,
    work: &NodeWork<'_>,
    wanted: bool,
    member: bool,
    actions: &mut Vec<Action>,
) -> bool {
    let (cr, env) = (v.cr, v.env);
    let Some(set) = env.prestage else {
        return false;
    };
    if work.get(&keys::cordon(&cr.name)).is_some() || set.staged_on(&cr.name, work) {
        return false;
    }
    let may_begin = member || set.mode == Prestage::All;
    let w = Work::Prestage {
        set: set.fingerprint.clone(),
    };
    if wanted && may_begin && env.hold != Hold::All && !v.jobs.iter().any(|j| j.work.same_job(&w)) {
        actions.push(Action::Event(Event {
            target: Target::Node(v.node.name.clone()),
            warning: false,
            reason: "Prestage",
            message: format!(
                "staging {} of payloads before the cordon ({})",
                format_bytes(set.bytes),
                cr.name
            ),
        }));
        let req = prestage_job(env, cr, v.node, set);
        actions.push(Action::CreateJob(Box::new(req)));
    }
    true
}

/// Whether the node's staging of `set` failed for good at this generation: its Job failed
/// genuinely and is kept. The node counts as failed for its batch (as a parked stage does)
/// until the Job's TTL ends it, or a new generation starts over.
pub(crate) fn failed_for_good(
    cr: &Cr,
    set: Option<&PayloadSet>,
    jobs: &[&crate::snapshot::ObservedJob],
) -> bool {
    let Some(set) = set else {
        return false;
    };
    jobs.iter().any(|j| {
        !j.stopping
            && j.generation >= cr.generation
            && matches!(&j.work, Work::Prestage { set: s } if *s == set.fingerprint)
            && matches!(j.phase, JobPhase::Failed { genuine: true, .. })
    })
}

/// Whether a node outside the CR's batches stages now: under `all`, until it has.
pub(crate) fn ahead(set: Option<&PayloadSet>, cr: &str, work: &NodeWork<'_>) -> bool {
    set.is_some_and(|s| s.mode == Prestage::All && !s.staged_on(cr, work))
}

/// What the node's cache keeps beside `set` when the prestage collects garbage: the pinned
/// plugins and image payloads of every NodeWright that selects the node (their next stages
/// run from them), and every plugin a package's state on the node recorded (an uninstall
/// runs the version that was installed) — each once, none already in `set`.
pub(crate) fn kept_beside(
    env: &Env<'_>,
    set: &PayloadSet,
    node: &ObservedNode,
) -> (Vec<PinnedRef>, Vec<ImagePayload>) {
    let mut plugins: BTreeSet<PinnedRef> = BTreeSet::new();
    let mut images: BTreeSet<ImagePayload> = BTreeSet::new();
    for other in env.nodewrights {
        if let PluginCheck::Ready(r) = &other.plugins
            && crate::select::matches(other.spec.node_selectors.as_ref(), &node.labels)
        {
            plugins.extend(r.pinned.values().cloned());
            images.extend(r.images.values().flatten().cloned());
        }
        if let Ok(state) = NodeState::read(&node.name, &node.annotations, &other.name) {
            plugins.extend(state.values().filter_map(|e| e.digest.clone()));
        }
    }
    let plugins = plugins
        .into_iter()
        .filter(|p| !set.plugins.contains(p))
        .collect();
    let images = images
        .into_iter()
        .filter(|i| !set.images.contains(i))
        .collect();
    (plugins, images)
}
