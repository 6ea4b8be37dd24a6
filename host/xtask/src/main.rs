//! Developer tasks. `cargo xtask <task>`:
//!
//! - `setup`: install what the build and tests need (the wasm32-wasip2 and musl targets,
//!   Debian's docker-registry, containerd, runc, CNI plugins, iptables, musl-tools and prometheus, the
//!   Go-built test control plane with the kubelet, and helm).
//! - `test`: setup, the formatting and clippy gates (warnings denied), then every test in the
//!   workspace (release profile, one build), then a size report of the first-party plugins.
//! - `demo [--teardown]`: setup, build, then the main job: a live rollout of the example
//!   NodeWrights on a local control plane with simulated nodes (`nodewright-demo`).
//! - `author-demo`: the plugin author loop on a scratch simulated node.
//! - `images`: the operator and agent images (static musl binaries, FROM scratch,
//!   byte-reproducible), as OCI layouts under `<target>/images/`, with sizes and digests.
//! - `publish --registry REG [--insecure] [--tag T]`: the images and the first-party plugins
//!   pushed to `REG`, then the `helm install` that uses them.
//! - `bench`: the plugin engine benchmark.
//! - `crds`: regenerate `deploy/crds/` from the API types (a test fails when they drift).
//!
//! Heavy builds go to `$CARGO_TARGET_DIR`, defaulting to the machine-wide
//! `/var/cache/nodewright/target` when it is writable, so repeated runs (and CI) reuse them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

mod polyglot;
mod release;

const SHARED_TARGET: &str = "/var/cache/nodewright/target";

pub(crate) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("workspace root")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let shared = Path::new(SHARED_TARGET);
    if std::fs::create_dir_all(shared).is_ok() && tempfile_probe(shared) {
        shared.to_path_buf()
    } else {
        workspace().join("target")
    }
}

fn tempfile_probe(dir: &Path) -> bool {
    let probe = dir.join(".xtask-probe");
    let ok = std::fs::write(&probe, b"").is_ok();
    let _ = std::fs::remove_file(probe);
    ok
}

pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

pub(crate) fn cargo(target: &Path) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace()).env("CARGO_TARGET_DIR", target);
    cmd
}

/// Debian packages the tests need, by the binary that shows each is installed.
const APT_PACKAGES: &[(&str, &str)] = &[
    ("/usr/bin/docker-registry", "docker-registry"),
    // The control-plane harness probes /readyz with curl and reaps process groups with kill.
    ("/usr/bin/curl", "curl"),
    ("/bin/kill", "procps"),
    // The real test node: containerd and runc, bridge CNI, its network namespace's NAT.
    ("/usr/bin/containerd", "containerd"),
    ("/usr/sbin/runc", "runc"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/sbin/iptables", "iptables"),
    // The images' static binaries (aws-lc's C) and the real node's pause image.
    ("/usr/bin/musl-gcc", "musl-tools"),
    // The health-gate tests' real Prometheus (run as a plain process on a loopback port).
    ("/usr/bin/prometheus", "prometheus"),
];

/// The wasm32-wasip2 target (all the demo needs).
pub(crate) fn setup_wasm_target() -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("rustup is needed")?;
    if !String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.trim() == "wasm32-wasip2")
    {
        run(Command::new("rustup").args(["target", "add", "wasm32-wasip2"]))?;
    }
    Ok(())
}

/// Installs the Debian packages whose marker binaries are missing (as root), or says how.
pub(crate) fn apt(packages: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(bin, _)| !Path::new(bin).exists())
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !root {
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

fn setup() -> Result<()> {
    setup_wasm_target()?;
    apt(APT_PACKAGES)?;
    release::setup_musl()?;
    // The test control plane: built once per source change, cached machine-wide.
    run(Command::new("bash")
        .arg(workspace().join("tests/cluster/build.sh"))
        .stdout(std::process::Stdio::null()))?;
    // helm, for the chart tests (no Debian package has it).
    run(Command::new("bash")
        .arg(workspace().join("tests/cluster/build-helm.sh"))
        .stdout(std::process::Stdio::null()))?;
    // cosign, for the signature interop tests (from its Go module, like helm).
    run(Command::new("bash")
        .arg(workspace().join("tests/cluster/build-cosign.sh"))
        .stdout(std::process::Stdio::null()))?;
    Ok(())
}

/// `cargo fmt --check` over the workspace (rustfmt is installed with the toolchain's
/// component when missing).
fn fmt_check() -> Result<()> {
    let has_rustfmt = Command::new("cargo")
        .args(["fmt", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_rustfmt {
        run(Command::new("rustup").args(["component", "add", "rustfmt"]))?;
    }
    run(Command::new("cargo")
        .current_dir(workspace())
        .args(["fmt", "--all", "--check"]))
    .context("the tree is not rustfmt-clean: run `cargo fmt --all`")
}

fn plugin_sizes(target: &Path) -> Result<()> {
    let dir = target.join("wasm-artifacts/wasm32-wasip2/plugin");
    let mut rows = Vec::new();
    for entry in std::fs::read_dir(&dir)
        .with_context(|| format!("{} (were the plugins built?)", dir.display()))?
    {
        let path = entry?.path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(plugin) = name
            .strip_prefix("nodewright_plugin_")
            .and_then(|n| n.strip_suffix(".wasm"))
        {
            rows.push((plugin.replace('_', "-"), std::fs::metadata(&path)?.len()));
        }
    }
    rows.sort();
    println!(
        "\nfirst-party plugins (wasm32-wasip2, profile `plugin`: opt-level s, LTO, stripped; target <= 200 KB):"
    );
    let mut over = Vec::new();
    for (name, size) in &rows {
        println!(
            "  {name:<16} {:>8} bytes  {:>6.1} KB",
            size,
            *size as f64 / 1024.0
        );
        if *size > 200 * 1024 {
            over.push(name.clone());
        }
    }
    if !over.is_empty() {
        bail!("plugins over the 200 KB budget: {}", over.join(", "));
    }
    Ok(())
}

fn cluster_demo(target: &Path, args: &[String]) -> Result<()> {
    run(cargo(target).args([
        "build",
        "--release",
        "--locked",
        "-p",
        "nodewright-operator",
        "-p",
        "nodewright-agent",
        "-p",
        "nodewright-demo",
        "-p",
        "nodewright-cli",
    ]))?;
    run(Command::new(target.join("release/nodewright-demo")).args(args))
}

fn author_demo(target: &Path) -> Result<()> {
    run(cargo(target).args([
        "build",
        "--release",
        "-p",
        "nodewright-cli",
        "-p",
        "nodewright-artifacts",
    ]))?;
    let bin = target.join("release/nodewright");
    let wasm = target.join("wasm-artifacts/wasm32-wasip2/plugin/nodewright_plugin_sysctl.wasm");
    let root = std::env::temp_dir().join(format!("nodewright-demo-{}", std::process::id()));
    std::fs::create_dir_all(root.join("proc/sys/net/ipv4"))?;
    std::fs::write(root.join("proc/sys/net/ipv4/ip_forward"), "0\n")?;
    println!(
        "\nA simulated node at {}; the sysctl plugin planned, applied, planned again:\n",
        root.display()
    );
    for stage in ["plan", "apply", "plan"] {
        println!("$ nodewright plugin run sysctl.wasm --stage {stage} ...");
        run(Command::new(&bin).args([
            "plugin",
            "run",
            wasm.to_str().unwrap(),
            "--stage",
            stage,
            "--root",
            root.to_str().unwrap(),
            "--grant",
            "files=/etc/sysctl.d:rw",
            "--grant",
            "sysctl=net.ipv4.ip_forward",
            "--config",
            "net.ipv4.ip_forward=1",
            "--package",
            "tuning",
            "--node",
            "demo-node",
        ]))?;
        println!();
    }
    println!("The denied path: the same plugin asked for a key it was not granted:\n");
    let denied = Command::new(&bin)
        .args([
            "plugin",
            "run",
            wasm.to_str().unwrap(),
            "--stage",
            "apply",
            "--root",
            root.to_str().unwrap(),
            "--grant",
            "files=/etc/sysctl.d:rw",
            "--grant",
            "sysctl=net.ipv4.ip_forward",
            "--config",
            "kernel.panic=1",
            "--package",
            "tuning",
        ])
        .status()?;
    if denied.success() {
        bail!("an ungranted sysctl was not denied");
    }
    Ok(())
}

// Long on purpose: one match arm per task.
fn main() -> Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    let target = target_dir();
    match task.as_str() {
        "setup" => {
            setup()?;
            polyglot::setup(&target).map(drop)
        }
        "test" => {
            setup()?;
            // Formatting gates first: unformatted code is refused before the long suite runs.
            fmt_check()?;
            // The Python and JavaScript plugin tools, which the ports' builds need.
            let tools = polyglot::setup(&target)?;
            // The images' static binaries, which the real-node tests publish and install.
            release::build_binaries(&target)?;
            // Lints gate before the long suite too (same release profile and build-script
            // environment, so dependencies and the built plugins are shared with the tests).
            run(cargo(&target)
                .args([
                    "clippy",
                    "--workspace",
                    "--release",
                    "--all-targets",
                    "--locked",
                    "--",
                    "-D",
                    "warnings",
                ])
                .envs(tools.env()))?;
            run(cargo(&target)
                .args([
                    "test",
                    "--workspace",
                    "--release",
                    "--locked",
                    "--no-fail-fast",
                ])
                .envs(tools.env())
                .env("NODEWRIGHT_REQUIRE_POLYGLOT", "1")
                .env("NODEWRIGHT_REQUIRE_REAL_NODE", "1")
                .env("NODEWRIGHT_REQUIRE_SETUP", "1"))?;
            plugin_sizes(&target)
        }
        "demo" => {
            setup()?;
            let rest: Vec<String> = std::env::args().skip(2).collect();
            cluster_demo(&target, &rest)
        }
        "author-demo" => {
            setup_wasm_target()?;
            author_demo(&target)
        }
        "crds" => {
            // The CRDs, and the chart's copy (Helm installs a chart's crds/ directory).
            for rel in ["deploy/crds", "deploy/chart/nodewright/crds"] {
                let dir = workspace().join(rel);
                std::fs::create_dir_all(&dir)?;
                for (name, yaml) in nodewright_api::crdgen::generated() {
                    std::fs::write(dir.join(name), yaml)?;
                    println!("wrote {rel}/{name}");
                }
            }
            Ok(())
        }
        "images" => release::images(&target, env!("CARGO_PKG_VERSION")).map(drop),
        "publish" => {
            let rest: Vec<String> = std::env::args().skip(2).collect();
            release::publish(&target, &rest)
        }
        "bench" => {
            setup()?;
            let tools = polyglot::setup(&target)?;
            run(cargo(&target).args(["bench", "-p", "nodewright-cli", "--bench", "plugin"]))?;
            run(cargo(&target)
                .args(["bench", "-p", "nodewright-cli", "--bench", "languages"])
                .envs(tools.env())
                .env("NODEWRIGHT_REQUIRE_POLYGLOT", "1"))
        }
        other => bail!(
            "unknown task {other:?}; tasks: setup, test, demo, author-demo, images, publish, bench, crds"
        ),
    }
}
