//! A plugin once loaded ([`LoadedPlugin`]: checked, compiled, its imports known) and once
//! linked for a grant ([`PreparedPlugin`]: ready to run stages), and the comparison of the
//! two ([`check_grants`]).

use nodewright_api::agent::RunStage;
use nodewright_api::grants::{Capability, GrantSet};
use wasmtime::component::{ComponentExportIndex, InstancePre};

use crate::bindings::PluginPre;
use crate::error::GrantCheck;
use crate::inspect::{EXPECTED_EXPORT, ImportKind, PluginImport};
use crate::state::HostState;

/// A component that passed the world check, with its compiled code.
#[derive(Clone)]
pub struct LoadedPlugin {
    /// `sha256:<hex>` of the component bytes.
    pub digest: String,
    /// Size of the component in bytes.
    pub size: usize,
    /// Whether the native code came from the on-disk cache.
    pub from_cache: bool,
    /// The component's imports, classified.
    pub imports: Vec<PluginImport>,
    /// The component's top-level export names.
    pub exports: Vec<String>,
    pub(crate) component: wasmtime::component::Component,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("digest", &self.digest)
            .field("size", &self.size)
            .field("from_cache", &self.from_cache)
            .field("imports", &self.imports)
            .finish_non_exhaustive()
    }
}

impl LoadedPlugin {
    /// The capabilities this component imports (its request).
    pub fn required_capabilities(&self) -> Vec<Capability> {
        self.imports
            .iter()
            .filter_map(|i| match i.kind {
                ImportKind::Capability(c) => Some(c),
                ImportKind::AlwaysLinked | ImportKind::Wasi => None,
            })
            .collect()
    }
}

/// A component linked for one capability set, and where each stage's export lies in it:
/// both found, and every export's type checked, once, when the plugin is prepared. A run
/// then looks up and checks only the function it calls — the generated bindings'
/// `instantiate` type-checks all eight exports on every instantiation, about 7 % of a warm
/// `plan`.
#[derive(Clone)]
pub(crate) struct Linked {
    pub(crate) pre: InstancePre<HostState>,
    exports: [ComponentExportIndex; RunStage::ALL.len()],
}

impl Linked {
    /// Checks `pre`'s component against the plugin world's exports and finds each stage's.
    pub(crate) fn new(pre: InstancePre<HostState>) -> wasmtime::Result<Self> {
        // The bindings' own check of every export's name and type.
        let pre = PluginPre::new(pre)?.instance_pre().clone();
        let component = pre.component();
        let stages = component
            .get_export_index(None, EXPECTED_EXPORT)
            .ok_or_else(|| wasmtime::format_err!("no export `{EXPECTED_EXPORT}`"))?;
        let mut exports = Vec::with_capacity(RunStage::ALL.len());
        for stage in RunStage::ALL {
            let name = export_name(stage);
            exports.push(
                component
                    .get_export_index(Some(&stages), name)
                    .ok_or_else(|| wasmtime::format_err!("no export `{name}`"))?,
            );
        }
        Ok(Linked {
            exports: exports.try_into().expect("one export per stage"),
            pre,
        })
    }

    /// Where the function that runs `stage` lies in the component.
    pub(crate) fn export(&self, stage: RunStage) -> &ComponentExportIndex {
        let at = RunStage::ALL
            .iter()
            .position(|s| *s == stage)
            .expect("every stage is in ALL");
        &self.exports[at]
    }
}

/// The export of `nodewright:plugin/stages` that runs `stage` (every check is the one
/// `check` export).
fn export_name(stage: RunStage) -> &'static str {
    if stage.is_check() {
        "check"
    } else {
        stage.as_str()
    }
}

/// A plugin linked for one capability set, ready to run stages.
#[derive(Clone)]
pub struct PreparedPlugin {
    pub(crate) linked: Linked,
    pub(crate) engine: wasmtime::Engine,
    pub(crate) slots: crate::pool::RunSlots,
    pub(crate) digest: String,
}

impl std::fmt::Debug for PreparedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedPlugin")
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

impl PreparedPlugin {
    /// Digest of the component.
    pub fn digest(&self) -> &str {
        &self.digest
    }
}

/// Compares the capabilities a plugin imports with what `grants` allows.
pub fn check_grants(plugin: &LoadedPlugin, grants: &GrantSet) -> GrantCheck {
    let required = plugin.required_capabilities();
    let mut check = GrantCheck::default();
    for cap in Capability::ALL {
        match (required.contains(&cap), grants.grants(cap)) {
            (true, false) => {
                check.missing.push(cap);
                check
                    .hints
                    .push(format!("grant it with {}", grants.source.field(cap)));
            }
            (false, true) => check.excess.push(cap),
            (true, true) | (false, false) => {}
        }
    }
    check
}
