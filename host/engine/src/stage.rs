//! What a stage runs with: the stage itself (the agent contract's [`RunStage`]) and why it
//! runs ([`StageContext`]), as the plugin's WIT `context` sees them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use nodewright_api::payload::PayloadName;

use serde::{Deserialize, Serialize};

pub use nodewright_api::agent::RunStage;

use crate::bindings::types as wit;

/// The environment variable that carries [`StageContext::node_order`].
pub const NODE_ORDER_ENV: &str = "NODEWRIGHT_NODE_ORDER";

/// Why a stage is running (the WIT `context` minus the stage, which comes from [`RunStage`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageContext {
    /// Node name.
    pub node: String,
    /// Package name.
    pub package: String,
    /// Version.
    pub version: String,
    /// Previous version (upgrade).
    pub previous_version: Option<String>,
    /// Configuration.
    pub config: BTreeMap<String, String>,
    /// Keys changed since the last successful config.
    pub changed_keys: Vec<String>,
    /// The node's place in its NodeWright's rollout order, if it is in a batch. The plugin
    /// sees it as the environment variable `NODEWRIGHT_NODE_ORDER` (the only variable it
    /// sees), as NodeWright packages see theirs.
    pub node_order: Option<u32>,
    /// The package's payloads: each name's read-only tree on the host, which the plugin
    /// reads at `/payload/<name>` (read-only, nothing else of the host's filesystem).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub payloads: BTreeMap<PayloadName, PathBuf>,
}

impl StageContext {
    /// A context for `package` `version` on `node`.
    pub fn new(node: &str, package: &str, version: &str) -> Self {
        StageContext {
            node: node.into(),
            package: package.into(),
            version: version.into(),
            ..Default::default()
        }
    }

    /// Adds a payload tree.
    pub fn with_payload(mut self, name: PayloadName, tree: PathBuf) -> Self {
        self.payloads.insert(name, tree);
        self
    }

    /// Adds a config entry.
    pub fn with_config(mut self, key: &str, value: &str) -> Self {
        self.config.insert(key.into(), value.into());
        self
    }

    pub(crate) fn to_wit(&self, stage: RunStage) -> wit::Context {
        wit::Context {
            node: self.node.clone(),
            package: self.package.clone(),
            version: self.version.clone(),
            previous_version: self.previous_version.clone(),
            stage: wit_stage(stage),
            config: self
                .config
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            changed_keys: self.changed_keys.clone(),
        }
    }
}

/// The stage the plugin sees in `context.stage` (for a check, the stage verified).
fn wit_stage(stage: RunStage) -> wit::Stage {
    use nodewright_api::node_state::Stage;
    match stage.stage() {
        Stage::Plan => wit::Stage::Plan,
        Stage::Apply => wit::Stage::Apply,
        Stage::Config => wit::Stage::Config,
        Stage::Interrupt | Stage::UninstallInterrupt => wit::Stage::Interrupt,
        Stage::PostInterrupt => wit::Stage::PostInterrupt,
        Stage::Upgrade => wit::Stage::Upgrade,
        Stage::Uninstall => wit::Stage::Uninstall,
    }
}
