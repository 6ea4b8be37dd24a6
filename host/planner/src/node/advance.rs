//! Moving a node's entries along the stage graph between passes.

use nodewright_api::node_state::{NodeState, PackageStatus, Stage, State, state_key};

use crate::packages::{after, changed_keys, standing, terminal, uninstall_requested};
use crate::snapshot::Cr;
use crate::stages::Next;

/// Moves completed entries to their next stage; starts config, upgrade and uninstall cycles;
/// re-arms parked stages on a newer generation.
// Long on purpose: one pass over the packages with an arm per stage transition (upgrade,
// config, uninstall, re-arm); the graph reads in one place.
pub(super) fn advance(cr: &Cr, all_digests: &crate::packages::Digests, state: &mut NodeState) {
    let generation = cr.generation;
    for (name, p) in &cr.spec.packages {
        let key = || state_key(name, &p.version);
        let wants_uninstall = uninstall_requested(p, cr.deleting);
        // An entry another version was installed after (a downgrade's kept entry, gone
        // back up to) no longer stands for the host: it starts again.
        let present = state.find(name, &p.version).is_some();
        let superseded = present && standing(state, name, &p.version).is_none();
        // Version change: upgrade from a completed older version.
        if (superseded || !present) && !wants_uninstall && !cr.deleting {
            let older = state
                .values()
                .filter(|e| e.name == *name && older_than(&e.version, &p.version))
                .max_by(|a, b| cmp_versions(&a.version, &b.version));
            if let Some(old) = older.filter(|o| terminal(p, o) || o.state == State::Complete) {
                let mut e = PackageStatus::new(name, &p.version, Stage::Upgrade, generation);
                e.previous_version = Some(old.version.clone());
                state.insert(key(), e);
            } else if superseded {
                // Nothing complete to upgrade from: install afresh.
                state.insert(
                    key(),
                    PackageStatus::new(name, &p.version, Stage::Apply, generation),
                );
            }
        }
        let Some(e) = state.find_mut(name, &p.version) else {
            continue;
        };
        if e.state == State::Erroring && e.generation < generation {
            e.state = State::InProgress;
            e.attempts = 0;
            e.message.clear();
            e.generation = generation;
        }
        // Deleting the CR uninstalls even a package whose install failed (NodeWright would
        // wait for a `complete` install that never comes, and the deletion would hang).
        if cr.deleting
            && wants_uninstall
            && e.state == State::Erroring
            && !matches!(e.stage, Stage::Uninstall | Stage::UninstallInterrupt)
        {
            *e = PackageStatus {
                config: e.config.clone(),
                ..PackageStatus::new(name, &p.version, Stage::Uninstall, generation)
            };
        }
        // Cancelled uninstall: back to installing (an uninstall interrupt runs to its end).
        if e.stage == Stage::Uninstall && !wants_uninstall && e.state != State::Complete {
            *e = PackageStatus {
                config: e.config.clone(),
                ..PackageStatus::new(name, &p.version, Stage::Apply, generation)
            };
        }
        if e.state == State::Complete {
            if wants_uninstall
                && !matches!(e.stage, Stage::Uninstall | Stage::UninstallInterrupt)
                && terminal(p, e)
            {
                *e = PackageStatus {
                    config: e.config.clone(),
                    ..PackageStatus::new(name, &p.version, Stage::Uninstall, generation)
                };
                continue;
            }
            if e.stage == Stage::Plan {
                let converged = e
                    .planned
                    .as_ref()
                    .is_some_and(|pl| pl.changes == 0 && pl.interrupt.is_none());
                let (stage, state_) = if converged {
                    (Stage::Config, State::Complete)
                } else {
                    (Stage::Apply, State::InProgress)
                };
                e.stage = stage;
                e.state = state_;
                continue;
            }
            match after(p, e) {
                Next::Stage(next) => {
                    e.stage = next;
                    e.state = State::InProgress;
                    e.attempts = 0;
                    // A new interrupt stage records its own pre-reboot boot ID (an older
                    // cycle's is stale). Later stages keep it: it marks the reboot as ours.
                    if matches!(next, Stage::Interrupt | Stage::UninstallInterrupt) {
                        e.boot_id.clear();
                    }
                }
                Next::Remove => {
                    state.remove(&key());
                    continue;
                }
                Next::Done => {}
            }
        }
        // Config change at a settled point: the package complete, or parked after config.
        let Some(e) = state.find_mut(name, &p.version) else {
            continue;
        };
        let settled = terminal(p, e)
            || (e.state == State::Erroring
                && matches!(
                    e.stage,
                    Stage::Config | Stage::Interrupt | Stage::PostInterrupt
                ));
        let digests = &all_digests[name];
        if settled && !wants_uninstall && e.config != *digests {
            let mut keys = changed_keys(&e.config, digests);
            if e.state == State::Erroring {
                keys.extend(e.changed_keys.iter().cloned());
                keys.sort();
                keys.dedup();
            }
            *e = PackageStatus {
                config: digests.clone(),
                changed_keys: keys,
                digest: e.digest.clone(),
                ..PackageStatus::new(name, &p.version, Stage::Config, generation)
            };
        }
        // Upgrade done: drop the older versions' entries.
        if state.find(name, &p.version).is_some_and(|e| terminal(p, e)) {
            state.retain(|_, o| {
                o.name != *name || o.version == p.version || !older_than(&o.version, &p.version)
            });
        }
    }
}

fn cmp_versions(a: &str, b: &str) -> std::cmp::Ordering {
    match (semver::Version::parse(a), semver::Version::parse(b)) {
        (Ok(a), Ok(b)) => a.cmp(&b),
        _ => a.cmp(b),
    }
}

fn older_than(a: &str, b: &str) -> bool {
    cmp_versions(a, b) == std::cmp::Ordering::Less
}
