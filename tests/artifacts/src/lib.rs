//! Paths of the first-party plugins and test guests, built for `wasm32-wasip2` by this
//! crate's build script. Tests depend on this crate instead of building wasm themselves.

include!(concat!(env!("OUT_DIR"), "/artifacts.rs"));

pub mod crafted;

/// Reads a built component.
pub fn read(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {path}: {e}"))
}
