//! A plugin once loaded ([`LoadedPlugin`]: checked, compiled, its imports known) and once
//! linked for a grant ([`PreparedPlugin`]: ready to run stages), and the comparison of the
//! two ([`check_grants`]).

use nodewright_api::grants::{Capability, GrantSet};

use crate::bindings::PluginPre;
use crate::error::GrantCheck;
use crate::inspect::{ImportKind, PluginImport};
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

/// A plugin linked for one capability set, ready to run stages.
#[derive(Clone)]
pub struct PreparedPlugin {
    pub(crate) pre: PluginPre<HostState>,
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
