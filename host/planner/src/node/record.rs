//! Folding finished Jobs into a node's state.

use nodewright_api::node_state::{PackageStatus, Planned, Stage, State};
use nodewright_api::result::StageResult;
use nodewright_api::v1alpha1::{Interrupt, InterruptType};

use crate::action::{Action, Event, Target};
use crate::snapshot::{Cr, JobPhase, ObservedJob, ObservedNode, Work};

use super::draft::Draft;

/// Folds finished Jobs into the node state; deletes Jobs that are done or no longer match
/// (stopping the ones still running). Jobs already stopping are left to finish stopping.
pub(super) fn record_jobs(
    cr: &Cr,
    node: &ObservedNode,
    state: &mut Draft<'_>,
    jobs: &[&ObservedJob],
    actions: &mut Vec<Action>,
    failures: &mut Vec<String>,
) {
    for job in jobs.iter().filter(|j| !j.stopping) {
        let delete = match &job.work {
            Work::Package {
                package,
                version,
                stage,
            } => {
                let what = (package.as_str(), version.as_str(), *stage);
                record_package(cr, node, state, job, what, actions, failures)
            }
            Work::Interrupt { stage, kind, owner } => {
                let what = (*stage, *kind, owner.as_str());
                record_interrupt(node, state, job, what, failures)
            }
            // Recorded in the node's annotations (`crate::prestage::record`).
            Work::Prestage { .. } => false,
        };
        if delete {
            actions.push(Action::DeleteJob {
                name: job.name.clone(),
                node: node.name.clone(),
                running: job.running(),
            });
        }
    }
}

/// A package stage's Job into its entry: attempts while it runs, complete (with a plan's
/// findings), or erroring with a `StageFailed` event. True when the Job is to be deleted:
/// succeeded, retried after a disruption, or stale (superseded, the package left the spec,
/// or the entry moved on). A genuinely failed Job is kept, with its pods and their logs,
/// while its entry stays parked on that failure — until the stage runs again (the entry
/// re-armed: a newer generation or a new run) or the Job's `ttlSecondsAfterFinished`.
fn record_package(
    cr: &Cr,
    node: &ObservedNode,
    state: &mut Draft<'_>,
    job: &ObservedJob,
    (package, version, stage): (&str, &str, Stage),
    actions: &mut Vec<Action>,
    failures: &mut Vec<String>,
) -> bool {
    let current = cr
        .spec
        .packages
        .get(package)
        .is_some_and(|p| p.version == version);
    let Some(e) = state
        .find(package, version)
        .filter(|e| current && e.stage == stage)
    else {
        return true;
    };
    if let JobPhase::Failed { .. } = job.phase {
        // A failure from before the entry was re-armed (a newer generation, or the entry
        // made again: a rerun, a reset) says nothing of the attempt to come.
        if job.generation < e.generation || (job.run != 0 && job.run != e.run) {
            return true;
        }
    }
    if e.state == State::Erroring {
        // The parked failure this Job recorded: kept for its logs.
        return !matches!(job.phase, JobPhase::Failed { genuine: true, .. });
    }
    if !matches!(e.state, State::InProgress | State::Unknown) {
        return true;
    }
    match &job.phase {
        JobPhase::Active { failed, last } => {
            // A pod that cannot start is a failed attempt for as long as it cannot (the
            // kubelet's next try is the next attempt); it does not spend the retry budget,
            // which counts runs of the stage, so the node goes on by itself once it starts.
            let attempts = (*failed + u32::from(job.stuck.is_some())) as i32;
            let message = match (&job.stuck, last) {
                (Some(stuck), _) => Some(stuck.clone()),
                (None, Some(r)) => Some(summary(r)),
                (None, None) => None,
            };
            let news = |e: &PackageStatus| {
                e.attempts != attempts || message.as_ref().is_some_and(|m| *m != e.message)
            };
            if let Some(e) = state.find_mut_if(package, version, news) {
                e.attempts = attempts;
                if let Some(m) = message {
                    e.message = m;
                }
            }
            false
        }
        JobPhase::Succeeded(result) => {
            let e = state.edit().find_mut(package, version).expect("read above");
            e.state = State::Complete;
            e.message.clear();
            if stage == Stage::Plan {
                e.planned = Some(planned(result.as_deref()));
            }
            true
        }
        JobPhase::Failed {
            genuine: true,
            attempts,
            reason,
            last,
        } => {
            let e = state.edit().find_mut(package, version).expect("read above");
            e.state = State::Erroring;
            e.attempts = *attempts as i32;
            e.message = last
                .as_deref()
                .map(summary)
                .unwrap_or_else(|| reason.clone());
            failures.push(format!("{package}: {}", e.message));
            actions.push(Action::Event(Event {
                target: Target::Cr(cr.name.clone()),
                warning: true,
                reason: "StageFailed",
                message: format!(
                    "{} of {package} {version} failed on {} after {attempts} attempt(s): {}",
                    stage.as_str(),
                    node.name,
                    e.message
                ),
            }));
            // Kept, with its pods, for `kubectl logs` (see above).
            false
        }
        // Disruptions only: run again.
        JobPhase::Failed { genuine: false, .. } => true,
    }
}

/// An interrupt's Job into the entries at its stage: complete once it succeeded (a reboot
/// only once the node is back with a new boot ID; an uninstall interrupt's owner entry
/// removed), the owner erroring when it failed for good. True when the Job is to be
/// deleted.
fn record_interrupt(
    node: &ObservedNode,
    state: &mut Draft<'_>,
    job: &ObservedJob,
    (stage, kind, owner): (Stage, InterruptType, &str),
    failures: &mut Vec<String>,
) -> bool {
    let at_stage: Vec<String> = state
        .iter()
        .filter(|(_, e)| {
            e.stage == stage
                && matches!(e.state, State::InProgress | State::Skipped | State::Unknown)
        })
        .map(|(k, _)| k.clone())
        .collect();
    let Some(owner_key) = at_stage.iter().find(|k| state[*k].name == owner).cloned() else {
        return true;
    };
    match &job.phase {
        JobPhase::Active { .. } => false,
        JobPhase::Succeeded(_) => {
            if kind == InterruptType::Reboot && state[&owner_key].boot_id == node.boot_id {
                return false; // the node has not come back with a new boot ID yet
            }
            let state = state.edit();
            if stage == Stage::UninstallInterrupt {
                state.remove(&owner_key);
            } else {
                for k in at_stage {
                    if let Some(e) = state.get_mut(&k) {
                        e.state = State::Complete;
                    }
                }
            }
            true
        }
        JobPhase::Failed {
            genuine,
            reason,
            last,
            ..
        } => {
            if *genuine || kind == InterruptType::Reboot || reason == "DeadlineExceeded" {
                let e = state.edit().get_mut(&owner_key).expect("found above");
                e.state = State::Erroring;
                e.message = last
                    .as_deref()
                    .map(summary)
                    .unwrap_or_else(|| reason.clone());
                failures.push(format!("{owner}: {}", e.message));
            }
            true
        }
    }
}

fn planned(result: Option<&StageResult>) -> Planned {
    match result {
        Some(r) => Planned {
            changes: r.change_count.max(r.changes.len() as u32),
            // A plan that did not say what its changes need: assume the worst (the spec
            // caps it).
            interrupt: match &r.interrupt {
                Some(needs) => needs.interrupt().cloned(),
                None => Some(Interrupt {
                    kind: InterruptType::Reboot,
                    services: vec![],
                }),
            },
        },
        // No readable result: assume the worst (the spec caps it).
        None => Planned {
            changes: 1,
            interrupt: Some(Interrupt {
                kind: InterruptType::Reboot,
                services: vec![],
            }),
        },
    }
}

fn summary(r: &StageResult) -> String {
    format!("[{}] {}", r.blame.as_str(), r.message)
}
