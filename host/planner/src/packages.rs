//! Per-package facts derived from the spec and a node's entry: config digests and changed
//! keys, the interrupt in scope after `plan`, and when a package is done on a node.

use std::collections::BTreeMap;

use nodewright_api::node_state::{NodeState, PackageStatus, Stage, State};
use nodewright_api::v1alpha1::{Interrupt, InterruptType, NodeWrightSpec, Package};
use sha2::{Digest, Sha256};

use crate::interrupts::{in_scope, rank};
use crate::stages::{Next, next_on_success};

/// Key → 12-hex digest of each config value: what a node records as applied.
pub fn config_digests(p: &Package) -> BTreeMap<String, String> {
    p.config_map
        .iter()
        .map(|(k, v)| (k.clone(), value_digest(v)))
        .collect()
}

fn value_digest(v: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let h = Sha256::digest(v.as_bytes());
    h.iter()
        .take(6)
        .flat_map(|b| {
            [
                HEX[usize::from(b >> 4)] as char,
                HEX[usize::from(b & 15)] as char,
            ]
        })
        .collect()
}

/// Config digests of every package of a spec, computed once per pass.
pub type Digests = BTreeMap<String, BTreeMap<String, String>>;

/// [`config_digests`] of every package.
pub fn digests(spec: &NodeWrightSpec) -> Digests {
    spec.packages
        .iter()
        .map(|(n, p)| (n.clone(), config_digests(p)))
        .collect()
}

/// The spec's packages and versions, `name:version,...` (also `status.packageList`).
pub fn version_list(spec: &NodeWrightSpec) -> String {
    spec.packages
        .iter()
        .map(|(n, p)| format!("{n}:{}", p.version))
        .collect::<Vec<_>>()
        .join(",")
}

/// Keys added, removed or changed between two digest maps, sorted.
pub fn changed_keys(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> Vec<String> {
    let mut keys: Vec<String> = old
        .keys()
        .chain(new.keys())
        .filter(|k| old.get(*k) != new.get(*k))
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The interrupts in scope for this entry's cycle: the package interrupt for installs and
/// upgrades, the matching `configInterrupts` for config cycles — capped by what `plan`
/// reported (the spec is the ceiling; a plan may ask for less, never more).
pub fn effective(p: &Package, e: Option<&PackageStatus>) -> Vec<Interrupt> {
    let scope = in_scope(p, e.map(|e| e.changed_keys.as_slice()).unwrap_or_default());
    let Some(planned) = e.and_then(|e| e.planned.as_ref()) else {
        return scope;
    };
    let Some(reported) = &planned.interrupt else {
        return Vec::new();
    };
    let Some(top) = scope.iter().map(|i| rank(i.kind)).max() else {
        return Vec::new();
    };
    if rank(reported.kind) > top {
        return scope;
    }
    if reported.kind == InterruptType::Service {
        let allowed: Vec<String> = scope
            .iter()
            .flat_map(|i| i.services.iter())
            .cloned()
            .collect();
        let units: Vec<String> = reported
            .services
            .iter()
            .filter(|u| allowed.contains(u) || top > rank(InterruptType::Service))
            .cloned()
            .collect();
        if units.is_empty() {
            return scope;
        }
        return vec![Interrupt {
            kind: InterruptType::Service,
            services: units,
        }];
    }
    vec![reported.clone()]
}

/// The entry's cycle is finished: `post-interrupt` complete, or `config` complete with no
/// interrupt in scope.
pub fn terminal(p: &Package, e: &PackageStatus) -> bool {
    e.state == State::Complete
        && match e.stage {
            Stage::PostInterrupt => true,
            Stage::Config => effective(p, Some(e)).is_empty(),
            Stage::Plan
            | Stage::Apply
            | Stage::Interrupt
            | Stage::Upgrade
            | Stage::Uninstall
            | Stage::UninstallInterrupt => false,
        }
}

/// Uninstall is wanted: `uninstall.enabled` and (`uninstall.apply` or the CR is going away).
pub fn uninstall_requested(p: &Package, deleting: bool) -> bool {
    p.uninstall
        .as_ref()
        .is_some_and(|u| u.enabled && (u.apply || deleting))
}

/// The entry that stands for `name` at `version` on the host: none when another version of
/// the package was put on the host after it. A downgrade keeps the newer version's entry (as
/// NodeWright keeps it: a mark that its files may remain), which must not read as the host
/// running that version when the spec goes back up to it.
pub fn standing<'s>(state: &'s NodeState, name: &str, version: &str) -> Option<&'s PackageStatus> {
    let mine = state
        .values()
        .find(|e| e.name == name && e.version == version)?;
    let later = state
        .values()
        .any(|o| o.name == name && o.version != version && o.generation > mine.generation);
    (!later).then_some(mine)
}

/// The package needs nothing more on this node (`digests`: its [`config_digests`]).
pub fn done(
    name: &str,
    p: &Package,
    digests: &BTreeMap<String, String>,
    state: &NodeState,
    deleting: bool,
) -> bool {
    // A node state holds a handful of entries: scanning them beats formatting a key.
    let entry = state
        .values()
        .find(|e| e.name == name && e.version == p.version);
    if uninstall_requested(p, deleting) {
        return entry.is_none();
    }
    if deleting {
        return true;
    }
    standing(state, name, &p.version).is_some_and(|e| terminal(p, e) && e.config == *digests)
}

/// Every package of the CR needs nothing more on this node.
pub fn node_done(
    spec: &NodeWrightSpec,
    digests: &Digests,
    state: &NodeState,
    deleting: bool,
) -> bool {
    spec.packages.iter().all(|(name, p)| {
        digests
            .get(name)
            .is_some_and(|d| done(name, p, d, state, deleting))
    })
}

/// The stage after a completed one, for this entry's cycle.
pub fn after(p: &Package, e: &PackageStatus) -> Next {
    next_on_success(e.stage, !effective(p, Some(e)).is_empty())
}
