//! What a component asks for, and whether a grant covers it — with nothing running.

use wasmtime::component::types::ComponentItem;

use nodewright_api::grants::Capability;

use crate::error::{Error, Result};

/// The export every nodewright plugin must have.
pub const EXPECTED_EXPORT: &str = "nodewright:plugin/stages@0.1.0";

/// The functions [`EXPECTED_EXPORT`] must contain.
pub const STAGE_FUNCTIONS: [&str; 8] = [
    "plan",
    "apply",
    "config",
    "interrupt",
    "post-interrupt",
    "upgrade",
    "uninstall",
    "check",
];

const PLUGIN_PACKAGE: &str = "nodewright:plugin/";

/// The one version of our package a plugin may import: the world it was checked against.
const PLUGIN_VERSION: &str = "0.1.0";

/// WASI interfaces the sandbox links (with nothing behind them: no preopens, no network,
/// empty environment). Rust's std imports `wasi:cli` and `wasi:io` even for a plugin that
/// never prints.
const WASI_PACKAGES: [&str; 7] = [
    "wasi:io/",
    "wasi:cli/",
    "wasi:clocks/",
    "wasi:random/",
    "wasi:filesystem/",
    "wasi:sockets/",
    "wasi:sockets/",
];

/// How an import is satisfied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportKind {
    /// `log`, `node`, `types`: always linked.
    AlwaysLinked,
    /// A capability that needs a grant.
    Capability(Capability),
    /// WASI, linked with nothing granted.
    Wasi,
}

/// One import of a component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginImport {
    /// Full import name, e.g. `nodewright:plugin/kmod@0.1.0`.
    pub name: String,
    /// How it is satisfied.
    pub kind: ImportKind,
}

/// Rejects anything that is not a component before wasmtime sees it, with a clear reason.
pub(crate) fn check_is_component(bytes: &[u8]) -> Result<()> {
    if wasmparser::Parser::is_component(bytes) {
        Ok(())
    } else if wasmparser::Parser::is_core_wasm(bytes) {
        Err(Error::CoreModule)
    } else {
        Err(Error::NotWasm)
    }
}

fn classify(name: &str) -> Option<ImportKind> {
    if let Some(rest) = name.strip_prefix(PLUGIN_PACKAGE) {
        // Exactly our version: another version of an interface is another contract.
        let (iface, version) = rest.split_once('@')?;
        if version != PLUGIN_VERSION {
            return None;
        }
        return match iface {
            "log" | "node" | "types" => Some(ImportKind::AlwaysLinked),
            other => Capability::from_interface(other).map(ImportKind::Capability),
        };
    }
    WASI_PACKAGES
        .iter()
        .any(|p| name.starts_with(p))
        .then_some(ImportKind::Wasi)
}

/// Classifies imports and checks the stage exports.
pub(crate) fn describe(
    engine: &wasmtime::Engine,
    component: &wasmtime::component::Component,
) -> Result<(Vec<PluginImport>, Vec<String>)> {
    let ty = component.component_type();
    let mut imports = Vec::new();
    for (name, _) in ty.imports(engine) {
        let kind = classify(name).ok_or_else(|| {
            Error::WrongWorld(format!("it imports {name}, which nodewright does not provide (world nodewright:plugin/plugin@0.1.0)"))
        })?;
        imports.push(PluginImport {
            name: name.to_string(),
            kind,
        });
    }
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let stages = ty
        .exports(engine)
        .find(|(n, _)| *n == EXPECTED_EXPORT)
        .map(|(_, item)| item.ty);
    let Some(ComponentItem::ComponentInstance(instance)) = stages else {
        return Err(Error::WrongWorld(format!(
            "it does not export {EXPECTED_EXPORT} (exports: {}); build it with nodewright-sdk's export_package!",
            if exports.is_empty() {
                "none".to_string()
            } else {
                exports.join(", ")
            }
        )));
    };
    let functions: Vec<String> = instance
        .exports(engine)
        .map(|(n, _)| n.to_string())
        .collect();
    let missing: Vec<&str> = STAGE_FUNCTIONS
        .iter()
        .copied()
        .filter(|f| !functions.iter().any(|g| g == f))
        .collect();
    if !missing.is_empty() {
        return Err(Error::WrongWorld(format!(
            "{EXPECTED_EXPORT} lacks the stage functions {}",
            missing.join(", ")
        )));
    }
    Ok((imports, exports))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_are_classified() {
        assert_eq!(
            classify("nodewright:plugin/kmod@0.1.0"),
            Some(ImportKind::Capability(Capability::Kmod))
        );
        assert_eq!(
            classify("nodewright:plugin/log@0.1.0"),
            Some(ImportKind::AlwaysLinked)
        );
        assert_eq!(classify("wasi:cli/stdout@0.2.6"), Some(ImportKind::Wasi));
        assert_eq!(classify("wasi:http/outgoing-handler@0.2.6"), None);
        assert_eq!(classify("acme:evil/root@1.0.0"), None);
        assert_eq!(classify("nodewright:plugin/teleport@0.1.0"), None);
        assert_eq!(classify("nodewright:plugin/files@0.2.0"), None);
        assert_eq!(classify("nodewright:plugin/files@0.1.1"), None);
        assert_eq!(classify("nodewright:plugin/files"), None);
    }

    #[test]
    fn core_modules_and_junk_are_told_apart() {
        assert!(matches!(
            check_is_component(b"\0asm\x01\0\0\0"),
            Err(Error::CoreModule)
        ));
        assert!(matches!(
            check_is_component(b"#!/bin/sh\n"),
            Err(Error::NotWasm)
        ));
    }
}
