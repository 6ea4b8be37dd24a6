//! Every host function a plugin may import has its call in both bundled SDKs: a capability
//! added to the WIT world without a Python and a JavaScript wrapper fails here, naming it.

use crate::world::PLUGIN_WIT;

/// Interfaces plugins import that the SDKs wrap (`types` holds no functions, `log` is the
/// SDKs' logger, `stages` is what a plugin exports).
const WRAPPED: [&str; 7] = [
    "node", "files", "kmod", "services", "sysctl", "exec", "power",
];

/// `(interface, function)` for every function of the wrapped interfaces, as the WIT names
/// them (`list-dir`).
fn host_functions() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<&str> = None;
    for line in PLUGIN_WIT.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("interface ") {
            current = rest.split_whitespace().next();
            continue;
        }
        let Some(iface) = current.filter(|i| WRAPPED.contains(i)) else {
            continue;
        };
        if let Some((name, _)) = line.split_once(": func(") {
            out.push((iface.to_string(), name.to_string()));
        }
    }
    out
}

fn camel(wit: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in wit.chars() {
        if c == '-' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn every_host_function_has_a_python_and_a_javascript_wrapper() {
    let functions = host_functions();
    // The parse found the world: every wrapped interface, the payload operations among them.
    for iface in WRAPPED {
        assert!(
            functions.iter().any(|(i, _)| i == iface),
            "no functions read for {iface}"
        );
    }
    for wanted in [("files", "install"), ("kmod", "depmod")] {
        assert!(
            functions
                .iter()
                .any(|(i, f)| (i.as_str(), f.as_str()) == wanted),
            "{wanted:?}"
        );
    }
    let python: String = crate::python::sdk_sources().collect();
    let js = crate::js::SDK_JS;
    let types = crate::js::SDK_TYPES;
    let mut missing = Vec::new();
    for (iface, f) in &functions {
        let py = format!("_interface(\"{iface}\").{}", f.replace('-', "_"));
        if !python.contains(&py) {
            missing.push(format!("python: {py}"));
        }
        let js_call = format!("iface('{iface}').{}", camel(f));
        if !js.contains(&js_call) {
            missing.push(format!("javascript: {js_call}"));
        }
        let declared = format!("  {}(", camel(f));
        if !types.contains(&declared) {
            missing.push(format!("index.d.ts: {}", declared.trim()));
        }
    }
    assert!(missing.is_empty(), "SDK wrappers missing: {missing:#?}");
}

/// The Rust SDK's capability methods, conveniences included (`run_payload`).
const RUST_CAPS: &str = include_str!("../../../sdk/src/caps.rs");

#[test]
fn every_capability_method_of_the_rust_sdk_is_in_the_python_and_javascript_ones() {
    // `read_string` is `read` decoded: Python's bytes and JavaScript's Uint8Array decode
    // natively.
    const RUST_ONLY: [&str; 1] = ["read_string"];
    let methods: std::collections::BTreeSet<&str> = RUST_CAPS
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub fn "))
        .filter_map(|l| l.split(['(', '<']).next())
        .filter(|m| !RUST_ONLY.contains(m))
        .collect();
    assert!(methods.contains("run_payload") && methods.contains("install"));
    let python: String = crate::python::sdk_sources().collect();
    let mut missing = Vec::new();
    for m in &methods {
        if !python.contains(&format!("def {m}(")) {
            missing.push(format!("python: {m}"));
        }
        let js = format!("  {}(", camel(&m.replace('_', "-")));
        if !crate::js::SDK_JS.contains(&js) {
            missing.push(format!("javascript: {}", js.trim()));
        }
        if !crate::js::SDK_TYPES.contains(&js) {
            missing.push(format!("index.d.ts: {}", js.trim()));
        }
    }
    assert!(missing.is_empty(), "SDK methods missing: {missing:#?}");
}
