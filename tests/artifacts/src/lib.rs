//! Paths of the first-party plugins and test guests, built for `wasm32-wasip2` by this
//! crate's build script. Tests depend on this crate instead of building wasm themselves.

include!(concat!(env!("OUT_DIR"), "/artifacts.rs"));

pub mod crafted;

/// One narrow grant for each capability the hostile guest ([`HOSTILE`]) imports, as
/// `--grant` flags take them (it links only when each is granted).
pub const HOSTILE_GRANTS: [&str; 6] = [
    "files=/etc/app:rw",
    "kmod=br_netfilter",
    "service=containerd.service",
    "sysctl=net.ipv4.ip_forward",
    "command=/usr/bin/tool:--safe",
    "power",
];

/// Reads a built component.
pub fn read(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// A plugin written in Python or JavaScript (`SYSCTL_PY`, `FILES_JS`, ...), or `None`
/// with a line saying how to get it when its build tools were not set up. Under
/// `NODEWRIGHT_REQUIRE_POLYGLOT=1` (set by `cargo xtask test`) a missing one fails instead.
pub fn port(built: Option<&'static str>, name: &str) -> Option<&'static str> {
    if built.is_none() {
        if std::env::var_os("NODEWRIGHT_REQUIRE_POLYGLOT").is_some_and(|v| v == "1") {
            panic!(
                "{name} was not built: run `cargo xtask setup` (componentize-py, componentize-js)"
            );
        }
        eprintln!("skipped: {name} was not built (run the suite with `cargo xtask test`)");
    }
    built
}
