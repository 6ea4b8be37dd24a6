//! The pinned releases of the Python and JavaScript build tools.
//!
//! This file has no imports on purpose: `cargo xtask` includes it by path to install the
//! same versions for the tests without building this crate.

/// The componentize-py release the Python SDK is written against.
pub const COMPONENTIZE_PY: &str = "0.25.1";
/// The componentize-js release the JavaScript SDK is written against.
pub const COMPONENTIZE_JS: &str = "0.23.0";
/// The esbuild release that bundles a JavaScript plugin with the SDK.
pub const ESBUILD: &str = "0.28.2";
