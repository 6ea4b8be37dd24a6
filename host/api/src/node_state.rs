//! The node record: what a NodeWright has done on one node, kept on the node itself.
//!
//! Every NodeWright writes a handful of annotations on each node it works on, each ending in
//! `.<cr name>`: its package state (the source of truth, JSON), the node's roll-up status,
//! its cordon mark, when its drain started and why the drain is blocked. This module is the
//! one place that knows their names ([`keys`]), reads and writes the state ([`NodeState`]),
//! and says what starting over clears ([`reset`]). The planner, the operator (metrics,
//! webhook), the CLI and the demo all go through it; none parses the annotation itself.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::keys::{self, CrMark};
use crate::pinned::PinnedRef;
use crate::v1alpha1::{Interrupt, is_zero};

/// The marks a CR may write on a node for its rollout: state, status, cordon mark, drain
/// start, drain-blocked and staged payloads. A node the CR no longer targets carries none
/// of them.
pub const MARKS: [CrMark; 6] = [
    CrMark::State,
    CrMark::Status,
    CrMark::Cordon,
    CrMark::DrainStart,
    CrMark::DrainBlocked,
    CrMark::Staged,
];

/// The annotations of [`MARKS`] for `cr`.
pub fn keys(cr: &str) -> [String; 6] {
    MARKS.map(|m| m.key(cr))
}

/// What starting `cr` over on a node clears (as a patch: every value `None`): the state,
/// the roll-up status, the drain marks, so a drain that timed out starts again too, and the
/// staged mark, so the node's payloads are checked again before its next cordon. The
/// cordon mark stays: the planner releases it (or keeps it) as the new run proceeds.
pub fn reset(cr: &str) -> BTreeMap<String, Option<String>> {
    [
        keys::node_state(cr),
        keys::node_status(cr),
        keys::drain_start(cr),
        keys::drain_blocked(cr),
        keys::staged(cr),
    ]
    .into_iter()
    .map(|k| (k, None))
    .collect()
}

/// What a node has staged of a CR's payloads, as its [`keys::staged`] annotation says:
/// `<set> <bytes>` — the payload set's fingerprint (the planner's hash of the pinned
/// plugins that carry payloads) and their total size. Written when the node's prestage Job
/// succeeded; a different set (a new pin) is staged again before the next cordon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staged {
    /// The payload set's fingerprint.
    pub set: String,
    /// Bytes of payload staged.
    pub bytes: u64,
}

impl std::fmt::Display for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.set, self.bytes)
    }
}

impl std::str::FromStr for Staged {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not `<set> <bytes>`");
        let (set, bytes) = s.split_once(' ').ok_or_else(bad)?;
        if set.is_empty() || !set.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(bad());
        }
        Ok(Staged {
            set: set.into(),
            bytes: bytes.parse().map_err(|_| bad())?,
        })
    }
}

/// Whether `key` is [`state_key`]`(name, version)`.
fn is_key(key: &str, name: &str, version: &str) -> bool {
    key.len() == name.len() + 1 + version.len()
        && key.starts_with(name)
        && key.as_bytes()[name.len()] == b'|'
        && key.ends_with(version)
}

/// Key of a package in a [`NodeState`]: `name|version`.
pub fn state_key(name: &str, version: &str) -> String {
    format!("{name}|{version}")
}

/// One NodeWright's packages on one node: `"name|version"` → [`PackageStatus`], stored as
/// JSON in the node annotation [`keys::node_state`]. An absent annotation is an empty state,
/// and an empty state is written as no annotation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct NodeState(BTreeMap<String, PackageStatus>);

/// A state annotation that does not parse: the node is left alone for that CR until an
/// admin resets it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{node}: {key}: {reason}")]
pub struct Malformed {
    /// The node.
    pub node: String,
    /// The annotation.
    pub key: String,
    /// What the JSON parser said.
    pub reason: String,
}

impl NodeState {
    /// No packages.
    pub fn new() -> Self {
        NodeState::default()
    }

    /// `cr`'s state among a node's annotations (empty when it has none).
    pub fn read(
        node: &str,
        annotations: &BTreeMap<String, String>,
        cr: &str,
    ) -> Result<Self, Malformed> {
        NodeState::from_annotation(
            node,
            cr,
            annotations.get(&keys::node_state(cr)).map(String::as_str),
        )
    }

    /// `cr`'s state from the value of its annotation on `node`, if it has one.
    pub fn from_annotation(node: &str, cr: &str, value: Option<&str>) -> Result<Self, Malformed> {
        match value {
            None => Ok(NodeState::new()),
            Some(raw) => NodeState::parse(raw).map_err(|reason| Malformed {
                node: node.into(),
                key: keys::node_state(cr),
                reason,
            }),
        }
    }

    /// Parses the annotation's value.
    pub fn parse(raw: &str) -> Result<Self, String> {
        serde_json::from_str(raw).map_err(|e| e.to_string())
    }

    /// The entry of package `name` at `version` (key `name|version`), found without
    /// building the key: a state holds a handful of entries.
    pub fn find(&self, name: &str, version: &str) -> Option<&PackageStatus> {
        self.0
            .iter()
            .find(|(k, _)| is_key(k, name, version))
            .map(|(_, e)| e)
    }

    /// [`NodeState::find`], to change the entry.
    pub fn find_mut(&mut self, name: &str, version: &str) -> Option<&mut PackageStatus> {
        self.0
            .iter_mut()
            .find(|(k, _)| is_key(k, name, version))
            .map(|(_, e)| e)
    }

    /// The annotation's value: `None` (remove it) when no package is left.
    pub fn annotation(&self) -> Option<String> {
        (!self.0.is_empty()).then(|| serde_json::to_string(&self.0).expect("node state serializes"))
    }

    /// Writes itself back into a patch of `cr`'s annotations (`None` removes one).
    pub fn write(&self, cr: &str, patch: &mut BTreeMap<String, Option<String>>) {
        patch.insert(keys::node_state(cr), self.annotation());
    }
}

impl std::ops::Deref for NodeState {
    type Target = BTreeMap<String, PackageStatus>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for NodeState {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl From<BTreeMap<String, PackageStatus>> for NodeState {
    fn from(entries: BTreeMap<String, PackageStatus>) -> Self {
        NodeState(entries)
    }
}

impl<const N: usize> From<[(String, PackageStatus); N]> for NodeState {
    fn from(entries: [(String, PackageStatus); N]) -> Self {
        NodeState(entries.into())
    }
}

impl FromIterator<(String, PackageStatus)> for NodeState {
    fn from_iter<I: IntoIterator<Item = (String, PackageStatus)>>(iter: I) -> Self {
        NodeState(iter.into_iter().collect())
    }
}

impl IntoIterator for NodeState {
    type Item = (String, PackageStatus);
    type IntoIter = std::collections::btree_map::IntoIter<String, PackageStatus>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a NodeState {
    type Item = (&'a String, &'a PackageStatus);
    type IntoIter = std::collections::btree_map::Iter<'a, String, PackageStatus>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// One package on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PackageStatus {
    /// Package name.
    pub name: String,
    /// Version.
    pub version: String,
    /// Pinned plugin reference the node ran (`None` before the first stage's Job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<PinnedRef>,
    /// Current stage.
    pub stage: Stage,
    /// State within the stage.
    pub state: State,
    /// Counted attempts of the current stage.
    #[serde(default)]
    pub attempts: i32,
    /// CR generation this entry was last written for (a parked stage re-runs on a newer one).
    #[serde(default)]
    pub generation: i64,
    /// Digests (12 hex) of the config values the last config cycle applied, by key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, String>,
    /// Keys changed by the config cycle in progress (empty: an install or upgrade cycle).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed_keys: Vec<String>,
    /// What `plan` reported: the interrupt the changes need (`None`: no plan ran, the spec's
    /// interrupt applies). Never stronger than the spec's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned: Option<Planned>,
    /// Boot ID when a reboot interrupt started; the interrupt completes on a different one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
    /// Version being upgraded from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_version: Option<String>,
    /// Last failure, for erroring entries.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When the planner created this entry (unix seconds). Agents key their idempotence
    /// markers on it beside the generation, so an entry made again — a node reset, a
    /// package rerun, a reapply after reboot — runs its stages again rather than finding
    /// them done.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub run: i64,
}

/// The outcome of a `plan` stage, as recorded on the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Planned {
    /// Changes the plugin would make.
    pub changes: u32,
    /// The interrupt those changes need (`None`: no interrupt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupt: Option<Interrupt>,
}

impl PackageStatus {
    /// A fresh entry at `stage`, `in_progress`.
    pub fn new(name: &str, version: &str, stage: Stage, generation: i64) -> Self {
        PackageStatus {
            name: name.into(),
            version: version.into(),
            digest: None,
            stage,
            state: State::InProgress,
            attempts: 0,
            generation,
            config: BTreeMap::new(),
            changed_keys: Vec::new(),
            planned: None,
            boot_id: String::new(),
            previous_version: None,
            message: String::new(),
            run: 0,
        }
    }

    /// Makes the entry run again from `stage` (an admin's "rerun from here"): in progress,
    /// no counted attempts, and a run epoch later than the old one, so the agent's markers
    /// of the earlier run do not answer for the new one. What the earlier cycle decided is
    /// cleared where the new cycle must decide again: from `apply` or `upgrade` the plan's
    /// verdict and a config cycle's keys (a whole install cycle, the spec's interrupt in
    /// scope); at an interrupt the plan's verdict and the recorded boot ID (the reboot to
    /// come records its own).
    pub fn restart_at(&mut self, stage: Stage, now: i64) {
        self.stage = stage;
        self.state = State::InProgress;
        self.attempts = 0;
        self.message.clear();
        self.run = now.max(self.run + 1);
        match stage {
            Stage::Plan | Stage::Apply | Stage::Upgrade => {
                self.planned = None;
                self.changed_keys.clear();
            }
            Stage::Interrupt | Stage::UninstallInterrupt => {
                self.planned = None;
                self.boot_id.clear();
            }
            Stage::Config | Stage::PostInterrupt | Stage::Uninstall => {}
        }
    }
}

/// Package stages as tracked on nodes.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Read-only dry run before a disruptive install: a converged node needs no cordon.
    Plan,
    /// Install.
    Apply,
    /// Configure.
    Config,
    /// The coalesced interrupt.
    Interrupt,
    /// After the interrupt.
    PostInterrupt,
    /// Version change.
    Upgrade,
    /// Removal.
    Uninstall,
    /// The interrupt after removal.
    UninstallInterrupt,
}

/// State of a package stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Done.
    Complete,
    /// Running.
    InProgress,
    /// Covered by another package's merged interrupt.
    Skipped,
    /// Failed terminally.
    Erroring,
    /// Unknown.
    Unknown,
}

impl Stage {
    /// As the API spells it (`post-interrupt`, ...): node state, Job labels, agent flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Plan => "plan",
            Stage::Apply => "apply",
            Stage::Config => "config",
            Stage::Interrupt => "interrupt",
            Stage::PostInterrupt => "post-interrupt",
            Stage::Upgrade => "upgrade",
            Stage::Uninstall => "uninstall",
            Stage::UninstallInterrupt => "uninstall-interrupt",
        }
    }

    /// Every stage, in lifecycle order.
    pub const ALL: [Stage; 8] = [
        Stage::Plan,
        Stage::Apply,
        Stage::Config,
        Stage::Interrupt,
        Stage::PostInterrupt,
        Stage::Upgrade,
        Stage::Uninstall,
        Stage::UninstallInterrupt,
    ];
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Stage {
    type Err = String;

    /// Parses [`Stage::as_str`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Stage::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown stage {s:?}"))
    }
}

impl State {
    /// As the API spells it (`in_progress`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            State::Complete => "complete",
            State::InProgress => "in_progress",
            State::Skipped => "skipped",
            State::Erroring => "erroring",
            State::Unknown => "unknown",
        }
    }
}

#[cfg(test)]
mod tests;
