//! Cargo invocations: one target (this machine's musl triple) and one profile (release) for
//! every build, so the binaries the tests run are the ones the images ship and no crate is
//! compiled twice in one run. Each build reads cargo's JSON messages to report what it
//! compiled and to hand back the test executables and binaries it produced.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::polyglot::Tools;
use crate::workspace;

/// Crates whose compilation is expensive enough that compiling one twice in a run is a
/// regression worth naming in the budget.
const HEAVY: &[&str] = &[
    "wasmtime",
    "cranelift-codegen",
    "k8s-openapi",
    "kube-client",
    "aws-lc-sys",
];

/// This machine's static (musl) target: `x86_64-unknown-linux-musl` on x86-64.
pub fn musl_triple() -> String {
    format!("{}-unknown-linux-musl", std::env::consts::ARCH)
}

/// The cargo that runs this task (cargo sets `CARGO` for `cargo run`).
pub fn cargo_bin() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// A cargo command in the workspace, building into `target`. Every build gets the same
/// environment — Debian's `musl-gcc` for this machine's musl target, the Python and
/// JavaScript tools once installed, which the artifacts' build script reads — so no build
/// undoes another's. (The other architecture's C is zig's: [`crate::cross`].)
pub fn cargo(target: &Path) -> Command {
    let mut cmd = Command::new(cargo_bin());
    cmd.current_dir(workspace())
        .env("CARGO_TARGET_DIR", target)
        .env(
            format!("CC_{}", musl_triple().replace('-', "_")),
            "musl-gcc",
        );
    let tools = Tools::at(target);
    if tools.installed() {
        cmd.envs(tools.env());
    }
    cmd
}

/// A test executable cargo built.
#[derive(Debug, Clone)]
pub struct TestExe {
    /// The package, e.g. `nodewright-operator`.
    pub package: String,
    /// The target: the library (`lib`), a binary's name, or an integration test's name.
    pub target: String,
    pub path: PathBuf,
    /// The package's directory (cargo runs a package's tests there).
    pub manifest_dir: PathBuf,
}

impl TestExe {
    /// `package/target`, how the suite names the executable.
    pub fn label(&self) -> String {
        format!("{}/{}", self.package, self.target)
    }
}

/// What one cargo build did.
#[derive(Debug, Default)]
pub struct Built {
    /// Units compiled in this build (not fresh).
    pub compiled: usize,
    /// Units already up to date.
    pub fresh: usize,
    /// The heavy crates this build compiled (codegen, not a check).
    pub heavy: Vec<String>,
    /// Test executables, in the order cargo reported them.
    pub tests: Vec<TestExe>,
    /// Binaries by name.
    pub bins: BTreeMap<String, PathBuf>,
}

impl Built {
    /// The budget's note: `412 compiled, 9 fresh; heavy: wasmtime, k8s-openapi`.
    pub fn note(&self) -> String {
        let heavy = if self.heavy.is_empty() {
            "none of the heavy crates".to_string()
        } else {
            format!("heavy: {}", self.heavy.join(", "))
        };
        format!("{} compiled, {} fresh; {heavy}", self.compiled, self.fresh)
    }
}

/// Runs `cmd` (a cargo build, test --no-run, clippy, …) with JSON messages on stdout and
/// cargo's own progress and rendered diagnostics on stderr; `passthrough` goes after `--`
/// (clippy's lint levels).
pub fn build(mut cmd: Command, passthrough: &[&str]) -> Result<Built> {
    cmd.arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped());
    if !passthrough.is_empty() {
        cmd.arg("--").args(passthrough);
    }
    eprintln!("+ {cmd:?}");
    let mut child = cmd.spawn().with_context(|| format!("cannot run {cmd:?}"))?;
    let stdout = child.stdout.take().expect("piped");
    let mut built = Built::default();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        match serde_json::from_str::<Value>(&line) {
            Ok(msg) => built.read(&msg),
            // Not a message (a build script's output on stdout): pass it on.
            Err(_) => println!("{line}"),
        }
    }
    let status = child.wait()?;
    if !status.success() {
        let sub = cmd.get_args().next().unwrap_or_default().to_string_lossy();
        bail!("cargo {sub} failed ({status}); its errors are above");
    }
    Ok(built)
}

/// Set (to `1`) in the suite's environment: everything is built, so a build a test runs
/// (`cargo xtask publish` in the real-node test) must compile nothing.
pub const BUILT_ONCE: &str = "NODEWRIGHT_BUILT_ONCE";

impl Built {
    /// Fails when this build compiled one of the heavy crates: `earlier` already did, with
    /// other features (a member's dependencies changed without `cargo hakari generate`).
    pub fn ensure_no_heavy(&self, what: &str, earlier: &str) -> Result<()> {
        if self.heavy.is_empty() {
            return Ok(());
        }
        bail!(
            "{what} compiled {} again after {earlier}: a crate's features differ between the two builds; run `cargo hakari generate && cargo hakari manage-deps` (see .config/hakari.toml)",
            self.heavy.join(", ")
        )
    }

    /// Under [`BUILT_ONCE`], fails when this build compiled anything.
    pub fn ensure_fresh_if_built_once(&self, what: &str) -> Result<()> {
        if std::env::var_os(BUILT_ONCE).is_none_or(|v| v != "1") || self.compiled == 0 {
            return Ok(());
        }
        bail!(
            "{what} compiled {} units although the test build had built everything ({BUILT_ONCE} is set): the two builds differ",
            self.compiled
        )
    }

    fn read(&mut self, msg: &Value) {
        if msg["reason"] != "compiler-artifact" {
            return;
        }
        if msg["fresh"].as_bool() == Some(true) {
            self.fresh += 1;
        } else {
            self.compiled += 1;
            let name = msg["target"]["name"].as_str().unwrap_or_default();
            let codegen = msg["filenames"].as_array().is_some_and(|f| {
                f.iter()
                    .any(|f| f.as_str().is_some_and(|f| f.ends_with(".rlib")))
            });
            let crate_name = name.replace('_', "-");
            if codegen && HEAVY.contains(&crate_name.as_str()) && !self.heavy.contains(&crate_name)
            {
                self.heavy.push(crate_name);
            }
        }
        let kinds: Vec<&str> = msg["target"]["kind"]
            .as_array()
            .map(|k| k.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let Some(exe) = msg["executable"].as_str() else {
            return;
        };
        let target = msg["target"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if msg["profile"]["test"].as_bool() == Some(true) {
            // Benches (harness = false) and examples are built, not run as tests.
            if kinds.iter().any(|k| *k == "bench" || *k == "example") {
                return;
            }
            let manifest = PathBuf::from(msg["manifest_path"].as_str().unwrap_or_default());
            self.tests.push(TestExe {
                package: package_name(msg["package_id"].as_str().unwrap_or_default()),
                target: if kinds.contains(&"lib") {
                    "lib".into()
                } else {
                    target
                },
                path: exe.into(),
                manifest_dir: manifest.parent().unwrap_or(Path::new(".")).to_path_buf(),
            });
        } else if kinds.contains(&"bin") {
            self.bins.insert(target, exe.into());
        }
    }
}

/// The package name in a package id: `path+file:///w/host/cli#nodewright-cli@0.1.0` (or the
/// older `nodewright-cli 0.1.0 (path+file:///…)`).
fn package_name(id: &str) -> String {
    if let Some((_, tail)) = id.rsplit_once('#') {
        let name = tail.split('@').next().unwrap_or(tail);
        // `…/host/cli#0.1.0`: the name is the last path segment.
        if name.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            return id
                .rsplit_once('#')
                .map(|(path, _)| path.rsplit('/').next().unwrap_or(path).to_string())
                .unwrap_or_default();
        }
        return name.to_string();
    }
    id.split(' ').next().unwrap_or(id).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_second_compile_of_a_heavy_crate_fails_the_run() {
        let fresh = Built::default();
        assert!(
            fresh
                .ensure_no_heavy("the test build", "the binaries' build")
                .is_ok()
        );
        let again = Built {
            compiled: 40,
            heavy: vec!["wasmtime".into()],
            ..Built::default()
        };
        let err = again
            .ensure_no_heavy("the test build", "the binaries' build")
            .unwrap_err()
            .to_string();
        assert!(err.contains("compiled wasmtime again"), "{err}");
        assert!(err.contains("cargo hakari generate"), "{err}");
    }

    #[test]
    fn package_names_from_both_id_forms() {
        assert_eq!(
            package_name("path+file:///w/host/cli#nodewright-cli@0.1.0"),
            "nodewright-cli"
        );
        assert_eq!(package_name("path+file:///w/host/xtask#0.1.0"), "xtask");
        assert_eq!(
            package_name("nodewright-cli 0.1.0 (path+file:///w/host/cli)"),
            "nodewright-cli"
        );
    }

    #[test]
    fn artifacts_are_sorted_into_tests_bins_and_heavy_crates() {
        let mut b = Built::default();
        b.read(&json!({"reason": "compiler-artifact", "fresh": false,
            "target": {"name": "wasmtime", "kind": ["lib"]},
            "filenames": ["/t/libwasmtime-1.rlib", "/t/libwasmtime-1.rmeta"],
            "profile": {"test": false}, "executable": null,
            "package_id": "registry+https://github.com/rust-lang/crates.io-index#wasmtime@48.0.8"}));
        // A check (clippy) of a heavy crate is not a second compile.
        b.read(&json!({"reason": "compiler-artifact", "fresh": false,
            "target": {"name": "k8s_openapi", "kind": ["lib"]},
            "filenames": ["/t/libk8s_openapi-1.rmeta"],
            "profile": {"test": false}, "executable": null, "package_id": "x"}));
        b.read(&json!({"reason": "compiler-artifact", "fresh": true,
            "target": {"name": "rollout", "kind": ["test"]},
            "filenames": ["/t/rollout-1"], "profile": {"test": true},
            "executable": "/t/rollout-1", "manifest_path": "/w/host/operator/Cargo.toml",
            "package_id": "path+file:///w/host/operator#nodewright-operator@0.1.0"}));
        b.read(&json!({"reason": "compiler-artifact", "fresh": true,
            "target": {"name": "plugin", "kind": ["bench"]},
            "filenames": ["/t/plugin-1"], "profile": {"test": true},
            "executable": "/t/plugin-1", "manifest_path": "/w/host/cli/Cargo.toml",
            "package_id": "path+file:///w/host/cli#nodewright-cli@0.1.0"}));
        b.read(&json!({"reason": "compiler-artifact", "fresh": false,
            "target": {"name": "nodewright", "kind": ["bin"]},
            "filenames": ["/t/nodewright"], "profile": {"test": false},
            "executable": "/t/nodewright", "manifest_path": "/w/host/cli/Cargo.toml",
            "package_id": "path+file:///w/host/cli#nodewright-cli@0.1.0"}));
        b.read(&json!({"reason": "build-finished", "success": true}));
        assert_eq!((b.compiled, b.fresh), (3, 2));
        assert_eq!(b.heavy, ["wasmtime"]);
        assert_eq!(b.tests.len(), 1);
        assert_eq!(b.tests[0].label(), "nodewright-operator/rollout");
        assert_eq!(b.tests[0].manifest_dir, Path::new("/w/host/operator"));
        assert_eq!(b.bins["nodewright"], Path::new("/t/nodewright"));
    }
}
