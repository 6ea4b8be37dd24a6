//! What the build and the tests need on the machine: Rust targets, Debian packages, and
//! the Go-built tools (the test control plane, helm, cosign), cached machine-wide.
//!
//! The Go tools build in the background while cargo builds: both are CPU-bound, but each
//! leaves a core idle for long stretches (cargo on its large single crates and links, Go on
//! its links), so side by side they finish sooner than one after the other.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::budget::Budget;
use crate::cargo::musl_triple;
use crate::{run, workspace};

/// Debian packages, by the file that shows each is installed.
type Apt = (&'static str, &'static str);

/// What every build needs: the static (musl) build's C compiler (aws-lc's and mimalloc's
/// C) and the linker `.cargo/config.toml` names.
pub const APT_BUILD: &[Apt] = &[
    ("/usr/bin/musl-gcc", "musl-tools"),
    ("/usr/bin/mold", "mold"),
];

/// What the demo's local cluster needs.
pub const APT_CLUSTER: &[Apt] = &[
    ("/usr/bin/docker-registry", "docker-registry"),
    // The control-plane harness probes /readyz with curl and reaps process groups with kill.
    ("/usr/bin/curl", "curl"),
    ("/bin/kill", "procps"),
];

/// What the tests need besides.
pub const APT_TESTS: &[Apt] = &[
    // The real test node: containerd and runc, bridge CNI, its network namespace's NAT.
    ("/usr/bin/containerd", "containerd"),
    ("/usr/sbin/runc", "runc"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/sbin/iptables", "iptables"),
    // The health-gate tests' real Prometheus (run as a plain process on a loopback port).
    ("/usr/bin/prometheus", "prometheus"),
    // GNU time: the payload benchmark's peak RSS of each process.
    ("/usr/bin/time", "time"),
];

/// A Go tool built by a script under `tests/cluster` (cached by version or source hash).
#[derive(Debug, Clone, Copy)]
pub struct GoTool {
    pub name: &'static str,
    script: &'static str,
}

/// The test control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
/// kubelet).
pub const KTEST: GoTool = GoTool {
    name: "ktest",
    script: "tests/cluster/build.sh",
};
/// helm, for the chart tests.
pub const HELM: GoTool = GoTool {
    name: "helm",
    script: "tests/cluster/build-helm.sh",
};
/// cosign, for the signature interop tests.
pub const COSIGN: GoTool = GoTool {
    name: "cosign",
    script: "tests/cluster/build-cosign.sh",
};
/// crane, the yardstick of the payload benchmark.
pub const CRANE: GoTool = GoTool {
    name: "crane",
    script: "tests/cluster/build-crane.sh",
};

/// Installs the Rust targets `targets` names that rustup lacks.
pub fn rust_targets(targets: &[&str]) -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("rustup is needed")?;
    let installed = String::from_utf8_lossy(&installed.stdout);
    for t in targets {
        if !installed.lines().any(|l| l.trim() == *t) {
            run(Command::new("rustup").args(["target", "add", t]))?;
        }
    }
    Ok(())
}

/// The targets every build needs: the plugins' and this machine's static one.
pub fn rust_build_targets() -> Result<()> {
    rust_targets(&["wasm32-wasip2", &musl_triple()])
}

/// Installs the Debian packages whose marker files are missing (as root), or says how.
pub fn apt(packages: &[Apt]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(file, _)| !Path::new(file).exists())
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing Debian packages {}: run `sudo apt-get install -y {}`",
            missing.join(", "),
            missing.join(" ")
        );
    }
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Fails at once, saying why, when `task` is not run as root.
pub fn require_root(task: &str) -> Result<()> {
    if !is_root() {
        bail!(
            "cargo xtask {task} needs root: it installs Debian packages and runs a real kubelet \
             (containerd, runc) in namespaces of its own; run it as root (CI does)"
        );
    }
    Ok(())
}

/// The Go the tools' modules name (`go 1.26.0` in their go.mod); the scripts build with
/// `GOTOOLCHAIN=local`, so an older Go is never upgraded behind the user's back.
const MIN_GO: (u32, u32) = (1, 26);

/// `(major, minor)` of `go version`'s output (`go version go1.26.1 linux/amd64`).
fn go_version(output: &str) -> Option<(u32, u32)> {
    let v = output.split_whitespace().nth(2)?.strip_prefix("go")?;
    let mut parts = v.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// Fails at once, before minutes of cargo, when a tool must be built and no Go new enough is
/// on the PATH.
fn require_go(uncached: &[&str]) -> Result<()> {
    let found = Command::new("go")
        .arg("version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let (want_major, want_minor) = MIN_GO;
    match found.as_deref().map(|f| (f, go_version(f))) {
        Some((_, Some(v))) if v >= MIN_GO => Ok(()),
        found => bail!(
            "Go {want_major}.{want_minor} or newer is needed to build {} (found: {}); install it \
             (https://go.dev/dl, or Debian's golang package when it is new enough) and put `go` \
             on the PATH",
            uncached.join(", "),
            found.map_or("no `go` on the PATH", |(f, _)| f)
        ),
    }
}

/// Whether `tool` is built already (its script asked only that).
fn cached(tool: GoTool) -> Result<Option<PathBuf>, String> {
    let script = workspace().join(tool.script);
    let out = Command::new("bash")
        .arg(&script)
        .env("NODEWRIGHT_CHECK_ONLY", "1")
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    Ok(out.status.success().then(|| path_of(&out.stdout)))
}

/// Go tools building in the background, one after another.
#[derive(Debug)]
pub struct GoBuilds {
    handle: JoinHandle<Vec<GoResult>>,
}

#[derive(Debug)]
struct GoResult {
    tool: GoTool,
    wall: Duration,
    outcome: Result<GoOutcome, String>,
}

#[derive(Debug)]
enum GoOutcome {
    Cached(PathBuf),
    Built(PathBuf),
}

/// Starts building `tools` (each a no-op when cached) on a background thread; the log of
/// each build goes to `<logs>/<name>.log`.
pub fn go_builds(tools: &[GoTool], logs: &Path) -> Result<GoBuilds> {
    std::fs::create_dir_all(logs)?;
    // Each tool's cache asked once, here: what must be built needs Go, checked now.
    let checked: Vec<(GoTool, Result<Option<PathBuf>, String>)> =
        tools.iter().map(|t| (*t, cached(*t))).collect();
    let uncached: Vec<&str> = checked
        .iter()
        .filter(|(_, c)| !matches!(c, Ok(Some(_))))
        .map(|(t, _)| t.name)
        .collect();
    if !uncached.is_empty() {
        require_go(&uncached)?;
    }
    let logs = logs.to_path_buf();
    let handle = std::thread::spawn(move || {
        checked
            .into_iter()
            .map(|(tool, cached)| {
                let start = Instant::now();
                let outcome = match cached {
                    Ok(Some(path)) => Ok(GoOutcome::Cached(path)),
                    Ok(None) => build_go(tool, &logs.join(format!("{}.log", tool.name))),
                    Err(e) => Err(e),
                };
                GoResult {
                    tool,
                    wall: start.elapsed(),
                    outcome,
                }
            })
            .collect()
    });
    Ok(GoBuilds { handle })
}

/// Builds `tool`, which is not cached.
fn build_go(tool: GoTool, log: &Path) -> Result<GoOutcome, String> {
    let script = workspace().join(tool.script);
    let err = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    // Compiling at the lowest priority: the Go builds run beside cargo and fill the
    // stretches where cargo has one crate left to compile (k8s-openapi, cranelift-codegen,
    // the links, the plugins' LTO) instead of slowing the crates on its critical path. The
    // scripts download modules at normal priority first (network-bound, a few seconds
    // alone, starved for minutes at `nice 19` beside a busy cargo).
    let out = Command::new("bash")
        .arg(&script)
        .env("NODEWRIGHT_GO_NICE", "19")
        .stderr(err)
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!(
            "{} failed ({}); its log, {}, ends:\n{}",
            script.display(),
            out.status,
            log.display(),
            tail.join("\n")
        ));
    }
    Ok(GoOutcome::Built(path_of(&out.stdout)))
}

fn path_of(stdout: &[u8]) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(stdout).trim())
}

impl GoBuilds {
    /// Waits for the builds, records each in `budget` (as having run beside the others)
    /// and fails on the first that failed.
    pub fn wait(self, budget: &mut Budget) -> Result<()> {
        let results = self
            .handle
            .join()
            .map_err(|_| anyhow::anyhow!("the Go build thread panicked"))?;
        let mut failed = None;
        for r in results {
            let note = match &r.outcome {
                Ok(GoOutcome::Cached(p)) => format!("cached: {}", p.display()),
                Ok(GoOutcome::Built(p)) => format!("built from its Go module: {}", p.display()),
                Err(e) => {
                    failed.get_or_insert_with(|| e.clone());
                    format!("FAILED: {}", e.lines().next().unwrap_or_default())
                }
            };
            budget.record(&format!("go: {}", r.tool.name), r.wall, note, true);
        }
        match failed {
            Some(e) => bail!("{e}"),
            None => Ok(()),
        }
    }
}

/// A fresh Python virtualenv at `venv` with `packages` (pinned `name==version`) from PyPI;
/// `what` says what needs them.
pub fn pip_venv(venv: &Path, packages: &[String], what: &str) -> Result<()> {
    eprintln!(
        "installing {} (PyPI) into {}",
        packages.join(", "),
        venv.display()
    );
    let _ = std::fs::remove_dir_all(venv);
    run(Command::new("python3").args(["-m", "venv"]).arg(venv))
        .with_context(|| format!("python3 with venv is needed for {what}"))?;
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .args(packages))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_versions_are_read_and_compared() {
        assert_eq!(go_version("go version go1.26.1 linux/amd64"), Some((1, 26)));
        assert_eq!(
            go_version("go version go1.27rc1 linux/arm64"),
            Some((1, 27))
        );
        assert_eq!(go_version("go version go1.22.2 linux/amd64"), Some((1, 22)));
        assert_eq!(go_version("bash: go: command not found"), None);
        assert!(Some((1, 22)) < Some(MIN_GO) && (1, 26) >= MIN_GO && (2, 0) >= MIN_GO);
    }
}
