//! Moving a node's entries along the stage graph between passes.

use std::borrow::Cow;
use std::collections::BTreeMap;

use nodewright_api::node_state::{PackageStatus, Stage, State, state_key};
use nodewright_api::v1alpha1::Package;

use crate::packages::{after, changed_keys, standing, terminal, uninstall_requested};
use crate::snapshot::Cr;
use crate::stages::Next;

use super::draft::Draft;

/// Moves completed entries to their next stage; starts config, upgrade and uninstall cycles;
/// re-arms parked stages on a newer generation. Each change is asked of the entry as read
/// first: a state nothing changes is not copied ([`Draft`]).
pub(super) fn advance(cr: &Cr, all_digests: &crate::packages::Digests, state: &mut Draft<'_>) {
    for (name, p) in &cr.spec.packages {
        advance_package(cr, name, p, &all_digests[name], state);
    }
    // A package that left the spec mid-stage: its Job is stopped (`record`). Its entry
    // stays, as every removed package's does (a record that its files may remain), but must
    // not read as running for ever.
    let left =
        |e: &PackageStatus| e.state == State::InProgress && !cr.spec.packages.contains_key(&e.name);
    if state.values().any(left) {
        for e in state.edit().values_mut().filter(|e| left(e)) {
            e.state = State::Unknown;
            e.message = format!(
                "left the spec during {}: the host may hold part of its changes",
                e.stage.as_str()
            );
        }
    }
}

/// One package's entry along the stage graph, in order: a version change, a re-arm or
/// redirect of its current stage, the next stage once complete, a config change at a
/// settled point, and the older versions' entries dropped once an upgrade is done.
fn advance_package(
    cr: &Cr,
    name: &str,
    p: &Package,
    digests: &BTreeMap<String, String>,
    state: &mut Draft<'_>,
) {
    let generation = cr.generation;
    let version = p.version.as_str();
    let wants_uninstall = uninstall_requested(p, cr.deleting);
    version_change(cr, name, p, wants_uninstall, state);
    let redirect = |e| redirected(cr, name, p, wants_uninstall, e);
    if let Some(new) = state.find(name, version).and_then(redirect) {
        replace(state, name, version, new);
    }
    let Some(e) = state.find(name, version) else {
        return;
    };
    if e.state == State::Complete {
        if wants_uninstall
            && !matches!(e.stage, Stage::Uninstall | Stage::UninstallInterrupt)
            && terminal(p, e)
        {
            if let Some(e) = state.edit().find_mut(name, version) {
                *e = PackageStatus {
                    config: std::mem::take(&mut e.config),
                    ..PackageStatus::new(name, version, Stage::Uninstall, generation)
                };
            }
            return;
        }
        if e.stage == Stage::Plan {
            let converged = e
                .planned
                .as_ref()
                .is_some_and(|pl| pl.changes == 0 && pl.interrupt.is_none());
            if let Some(e) = state.edit().find_mut(name, version) {
                (e.stage, e.state) = if converged {
                    (Stage::Config, State::Complete)
                } else {
                    (Stage::Apply, State::InProgress)
                };
            }
            return;
        }
        match after(p, e) {
            Next::Stage(next) => {
                if let Some(e) = state.edit().find_mut(name, version) {
                    e.stage = next;
                    e.state = State::InProgress;
                    e.attempts = 0;
                    // A new interrupt stage records its own pre-reboot boot ID (an older
                    // cycle's is stale). Later stages keep it: it marks the reboot as ours.
                    if matches!(next, Stage::Interrupt | Stage::UninstallInterrupt) {
                        e.boot_id.clear();
                    }
                }
            }
            Next::Remove => {
                state.edit().remove(&state_key(name, version));
                return;
            }
            Next::Done => {}
        }
    }
    let config = |e| config_change(name, p, digests, wants_uninstall, generation, e);
    if let Some(new) = state.find(name, version).and_then(config) {
        replace(state, name, version, new);
    }
    // Upgrade done: drop the older versions' entries.
    if state.find(name, version).is_some_and(|e| terminal(p, e)) {
        let older = |o: &PackageStatus| o.name == *name && older_than(&o.version, version);
        if state.values().any(older) {
            state.edit().retain(|_, o| !older(o));
        }
    }
}

/// Package `name`'s entry at `version` replaced by `new`.
fn replace(state: &mut Draft<'_>, name: &str, version: &str, new: PackageStatus) {
    if let Some(e) = state.edit().find_mut(name, version) {
        *e = new;
    }
}

/// A version the node does not stand on yet (no entry, or one another version was
/// installed after — a downgrade's kept entry, gone back up to): an upgrade from a
/// completed older version, else a fresh install.
fn version_change(cr: &Cr, name: &str, p: &Package, wants_uninstall: bool, state: &mut Draft<'_>) {
    let present = state.find(name, &p.version).is_some();
    let superseded = present && standing(state, name, &p.version).is_none();
    // A current entry, or the package on its way out: nothing to change.
    let stands = present && !superseded;
    if stands || wants_uninstall || cr.deleting {
        return;
    }
    let older = state
        .values()
        .filter(|e| e.name == *name && older_than(&e.version, &p.version))
        .max_by(|a, b| cmp_versions(&a.version, &b.version));
    let key = state_key(name, &p.version);
    if let Some(old) = older.filter(|o| terminal(p, o) || o.state == State::Complete) {
        let mut e = PackageStatus::new(name, &p.version, Stage::Upgrade, cr.generation);
        e.previous_version = Some(old.version.clone());
        state.edit().insert(key, e);
    } else if superseded {
        // Nothing complete to upgrade from: install afresh.
        let e = PackageStatus::new(name, &p.version, Stage::Apply, cr.generation);
        state.edit().insert(key, e);
    }
}

/// The current stage re-armed or redirected: a parked stage runs again on a newer
/// generation; deleting the CR uninstalls even a package whose install failed (NodeWright
/// would wait for a `complete` install that never comes, and the deletion would hang); a
/// cancelled uninstall goes back to installing (an uninstall interrupt runs to its end).
/// The entry as it goes on, when it changes (the rules in order, each on the entry as the
/// rules before it left it; copied on the first change).
fn redirected(
    cr: &Cr,
    name: &str,
    p: &Package,
    wants_uninstall: bool,
    e: &PackageStatus,
) -> Option<PackageStatus> {
    let generation = cr.generation;
    let mut e = Cow::Borrowed(e);
    if e.state == State::Erroring && e.generation < generation {
        let e = e.to_mut();
        e.state = State::InProgress;
        e.attempts = 0;
        e.message.clear();
        e.generation = generation;
    }
    let restart_at = |e: &mut Cow<'_, PackageStatus>, stage| {
        *e = Cow::Owned(PackageStatus {
            config: e.config.clone(),
            ..PackageStatus::new(name, &p.version, stage, generation)
        });
    };
    if cr.deleting
        && wants_uninstall
        && e.state == State::Erroring
        && !matches!(e.stage, Stage::Uninstall | Stage::UninstallInterrupt)
    {
        restart_at(&mut e, Stage::Uninstall);
    }
    if e.stage == Stage::Uninstall && !wants_uninstall && e.state != State::Complete {
        restart_at(&mut e, Stage::Apply);
    }
    match e {
        Cow::Owned(e) => Some(e),
        Cow::Borrowed(_) => None,
    }
}

/// A config change at a settled point (the package complete, or parked after config): a
/// config cycle over the keys that changed (and those a parked one had not applied yet).
/// The new entry, when there is one.
fn config_change(
    name: &str,
    p: &Package,
    digests: &BTreeMap<String, String>,
    wants_uninstall: bool,
    generation: i64,
    e: &PackageStatus,
) -> Option<PackageStatus> {
    let settled = terminal(p, e)
        || (e.state == State::Erroring
            && matches!(
                e.stage,
                Stage::Config | Stage::Interrupt | Stage::PostInterrupt
            ));
    if !settled || wants_uninstall || e.config == *digests {
        return None;
    }
    let mut keys = changed_keys(&e.config, digests);
    if e.state == State::Erroring {
        keys.extend(e.changed_keys.iter().cloned());
        keys.sort();
        keys.dedup();
    }
    Some(PackageStatus {
        config: digests.clone(),
        changed_keys: keys,
        digest: e.digest.clone(),
        ..PackageStatus::new(name, &p.version, Stage::Config, generation)
    })
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
