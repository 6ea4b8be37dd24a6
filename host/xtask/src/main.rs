//! Developer tasks. `cargo xtask <task>`:
//!
//! - `setup`: install what the build and tests need (the wasm32-wasip2 and musl targets,
//!   Debian packages, the Go-built test control plane with the kubelet, helm and cosign,
//!   the Python and JavaScript plugin tools).
//! - `test [--jobs N] [FILTER…]`: setup, the formatting and clippy gates (warnings denied),
//!   one build of everything, then every test of the workspace, several at a time
//!   (`suite`), then a size report of the first-party plugins. FILTERs keep the tests
//!   whose `package/target::name` contains one of them.
//! - `demo [--teardown]`: the main job: a live rollout of the example NodeWrights on a
//!   local control plane with simulated nodes (`nodewright-demo`).
//! - `author-demo`: the plugin author loop on a scratch simulated node.
//! - `images`: the operator and agent images (static musl binaries, FROM scratch,
//!   byte-reproducible, one OCI index over linux/amd64 and linux/arm64 each), as OCI
//!   layouts under `<target>/images/`, with sizes and digests.
//! - `publish --registry REG [--insecure] [--tag T]`: the images and the first-party plugins
//!   pushed to `REG`, then the `helm install` that uses them.
//! - `bench [--compare FILE] [--save FILE]`: the engine, language and planner benchmarks,
//!   compared with a baseline or saved as one (`bench.rs`).
//! - `crds`: regenerate `deploy/crds/` from the API types (a test fails when they drift).
//!
//! Every task builds one way: release, for this machine's musl target, into
//! `$CARGO_TARGET_DIR` (default: the machine-wide `/var/cache/nodewright/target` when it
//! is writable), so the tests run the binaries the images ship, nothing is compiled twice
//! in a run, and repeated runs (and CI) reuse the build. Each task ends with its time
//! budget: every phase with its wall time.
//!
//! This crate is a task runner and nothing more: it depends on `anyhow` and `serde_json`
//! only, so `cargo xtask` is ready in seconds on a fresh machine; the work is done by the
//! workspace's own binaries (`nodewright-images`, `nodewright`).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{Context, Result, bail};

mod bench;
mod budget;
mod cargo;
mod cross;
mod polyglot;
mod release;
mod setup;
mod suite;

use budget::Budget;
use cargo::{cargo, musl_triple};
use setup::{APT_BUILD, APT_CLUSTER, APT_TESTS, COSIGN, HELM, KTEST};

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
    if std::fs::create_dir_all(shared).is_ok() && writable(shared) {
        shared.to_path_buf()
    } else {
        workspace().join("target")
    }
}

fn writable(dir: &Path) -> bool {
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
        let program = Path::new(cmd.get_program())
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let first = cmd.get_args().next().unwrap_or_default().to_string_lossy();
        bail!("{program} {first} failed ({status}); its output is above");
    }
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

fn plugin_sizes(target: &Path) -> Result<String> {
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
    Ok(format!("{} plugins, all within 200 KB", rows.len()))
}

/// `cargo xtask test`'s arguments.
#[derive(Debug)]
struct TestArgs {
    jobs: usize,
    filters: Vec<String>,
}

fn parse_test_args(args: &[String]) -> Result<TestArgs> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut parsed = TestArgs {
        // Most tests wait far more than they compute; see `suite`.
        jobs: std::env::var("NODEWRIGHT_TEST_JOBS")
            .ok()
            .and_then(|j| j.parse().ok())
            .unwrap_or(cores * 3),
        filters: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--jobs" | "-j" => {
                parsed.jobs = it
                    .next()
                    .and_then(|j| j.parse().ok())
                    .filter(|j| *j > 0)
                    .context("--jobs needs a positive number")?
            }
            f if f.starts_with('-') => {
                bail!("test: unknown option {f:?}; usage: cargo xtask test [--jobs N] [FILTER…]")
            }
            f => parsed.filters.push(f.to_string()),
        }
    }
    Ok(parsed)
}

/// `cargo xtask test`.
// Long on purpose: the phases in the order they run, each one line in the budget.
fn test(target: &Path, args: &[String], budget: &mut Budget) -> Result<()> {
    let args = parse_test_args(args)?;
    setup::require_root("test")?;
    let triple = musl_triple();
    // The Go builds need only Go: they start first and run beside everything else.
    let go = setup::go_builds(&[KTEST, HELM, COSIGN], &target.join("logs/go"))?;
    budget.phase("setup: targets, Debian packages", || {
        setup::rust_build_targets()?;
        setup::apt(&[APT_BUILD, APT_CLUSTER, APT_TESTS, &[cross::qemu()]].concat())?;
        Ok(((), "present".into()))
    })?;
    budget.phase("fmt", || fmt_check().map(|()| ((), "clean".into())))?;
    let tools = budget.phase("setup: Python and JavaScript tools, zig", || {
        let tools = polyglot::setup(target)?;
        cross::setup(target)?;
        Ok((tools, "present".into()))
    })?;
    // Lints gate before the long build and suite. Same target, profile and environment as
    // the build, so build scripts and proc-macros are compiled once for both.
    budget.phase("clippy (warnings denied)", || {
        let mut cmd = cargo(target);
        cmd.args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--release",
            "--locked",
        ])
        .args(["--target", &triple]);
        let b = cargo::build(cmd, &["-D", "warnings"])?;
        Ok(((), b.note()))
    })?;
    budget.phase("cargo build: binaries", || {
        let b = release::build_bins(target)?;
        Ok(((), b.note()))
    })?;
    // The images' other architecture: the suite runs it under qemu-user and publishes it.
    budget.phase(
        &format!("cargo build: images' binaries, {}", cross::triple()),
        || {
            let b = cross::build(target)?;
            Ok(((), b.note()))
        },
    )?;
    let built = budget.phase("cargo build: tests", || {
        let mut cmd = cargo(target);
        cmd.args(["test", "--workspace", "--no-run", "--release", "--locked"])
            .args(["--target", &triple]);
        let b = cargo::build(cmd, &[])?;
        b.ensure_no_heavy("the test build", "the binaries' build")?;
        let n = b.note();
        Ok((b, n))
    })?;
    go.wait(budget)?;
    budget.phase("doctests", || {
        run(cargo(target)
            .args([
                "test",
                "--doc",
                "--quiet",
                "--workspace",
                "--release",
                "--locked",
            ])
            .args(["--target", &triple]))?;
        Ok(((), "passed".into()))
    })?;
    let mut env: Vec<(String, std::ffi::OsString)> = tools
        .env()
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_os_str().to_owned()))
        .collect();
    env.push(("CARGO_TARGET_DIR".into(), target.as_os_str().to_owned()));
    env.push((
        "NODEWRIGHT_CROSS_BINARIES".into(),
        cross::bin_dir(target).into_os_string(),
    ));
    for var in [
        cargo::BUILT_ONCE,
        "NODEWRIGHT_REQUIRE_POLYGLOT",
        "NODEWRIGHT_REQUIRE_REAL_NODE",
        "NODEWRIGHT_REQUIRE_SETUP",
    ] {
        env.push((var.into(), "1".into()));
    }
    let opts = suite::Options {
        jobs: args.jobs,
        timeout: Duration::from_secs(30 * 60),
        min_available: 2 << 30,
        env,
        logs: target.join("logs/tests"),
        times: target.join("logs/test-times.tsv"),
        seed_times: workspace().join("host/xtask/test-times.tsv"),
        filters: args.filters.clone(),
    };
    let report = budget.phase("suite", || {
        let r = suite::run(&built.tests, &opts)?;
        let n = r.note();
        Ok((r, n))
    })?;
    budget.section("slowest ten tests", report.slowest(10));
    if !report.failed.is_empty() {
        for f in &report.failed {
            eprintln!("\n{f}");
        }
        let names: Vec<&str> = report
            .failed
            .iter()
            .filter_map(|f| f.lines().next())
            .collect();
        bail!(
            "{} of {} tests failed:\n{}",
            report.failed.len(),
            report.failed.len() + report.passed,
            names.join("\n")
        );
    }
    if args.filters.is_empty() {
        budget.phase("plugin sizes", || Ok(((), plugin_sizes(target)?)))?;
    }
    Ok(())
}

/// `cargo xtask demo`.
fn demo(target: &Path, args: &[String], budget: &mut Budget) -> Result<()> {
    let go = setup::go_builds(&[KTEST], &target.join("logs/go"))?;
    budget.phase("setup: targets, Debian packages", || {
        setup::rust_build_targets()?;
        setup::apt(&[APT_BUILD, APT_CLUSTER].concat())?;
        Ok(((), "present".into()))
    })?;
    budget.phase("cargo build: binaries", || {
        let b = release::build_bins(target)?;
        Ok(((), b.note()))
    })?;
    go.wait(budget)?;
    // The budget so far: the demo may run until Ctrl-C, which ends this process too.
    eprint!("{}", budget.render("demo (before the rollout)"));
    budget.phase("demo", || {
        run(Command::new(release::bin_dir(target).join("nodewright-demo")).args(args))?;
        Ok(((), "done".into()))
    })
}

/// `cargo xtask author-demo`.
fn author_demo(target: &Path, budget: &mut Budget) -> Result<()> {
    budget.phase("setup: targets", || {
        setup::rust_build_targets()?;
        setup::apt(APT_BUILD)?;
        Ok(((), "present".into()))
    })?;
    budget.phase("cargo build: binaries", || {
        let b = release::build_bins(target)?;
        Ok(((), b.note()))
    })?;
    let bin = release::bin_dir(target).join("nodewright");
    let wasm = target.join("wasm-artifacts/wasm32-wasip2/plugin/nodewright_plugin_sysctl.wasm");
    let root = std::env::temp_dir().join(format!("nodewright-demo-{}", std::process::id()));
    std::fs::create_dir_all(root.join("proc/sys/net/ipv4"))?;
    std::fs::write(root.join("proc/sys/net/ipv4/ip_forward"), "0\n")?;
    println!(
        "\nA simulated node at {}; the sysctl plugin planned, applied, planned again:\n",
        root.display()
    );
    let plugin_run = |stage: &str, key: &str| {
        let mut cmd = Command::new(&bin);
        cmd.args(["plugin", "run"])
            .arg(&wasm)
            .args(["--stage", stage, "--root"])
            .arg(&root)
            .args(["--grant", "files=/etc/sysctl.d/:rw"])
            .args(["--grant", "sysctl=net.ipv4.ip_forward"])
            .args([
                "--config",
                key,
                "--package",
                "tuning",
                "--node",
                "demo-node",
            ]);
        cmd
    };
    for stage in ["plan", "apply", "plan"] {
        println!("$ nodewright plugin run sysctl.wasm --stage {stage} ...");
        run(&mut plugin_run(stage, "net.ipv4.ip_forward=1"))?;
        println!();
    }
    println!("The denied path: the same plugin asked for a key it was not granted:\n");
    if plugin_run("apply", "kernel.panic=1").status()?.success() {
        bail!("an ungranted sysctl was not denied");
    }
    Ok(())
}

/// `cargo xtask setup`.
fn setup_all(target: &Path, budget: &mut Budget) -> Result<()> {
    // The Go builds need only Go: they start first and run beside everything else.
    let go = setup::go_builds(&[KTEST, HELM, COSIGN], &target.join("logs/go"))?;
    budget.phase("setup: targets, Debian packages", || {
        setup::rust_build_targets()?;
        setup::apt(&[APT_BUILD, APT_CLUSTER, APT_TESTS, &[cross::qemu()]].concat())?;
        Ok(((), "present".into()))
    })?;
    budget.phase("setup: Python and JavaScript tools, zig", || {
        polyglot::setup(target)?;
        cross::setup(target)?;
        Ok(((), "present".into()))
    })?;
    go.wait(budget)
}

/// `cargo xtask crds`: the api crate's drift test, told to write what it generates.
fn crds(target: &Path) -> Result<()> {
    setup::rust_build_targets()?;
    run(cargo(target)
        .args([
            "test",
            "--release",
            "--locked",
            "-p",
            "nodewright-api",
            "--test",
            "it",
        ])
        .args(["--target", &musl_triple()])
        .args(["--", "--exact", "crds::committed_crds_match_the_types"])
        .env("NODEWRIGHT_UPDATE_CRDS", "1"))
}

const TASKS: &str = "setup, test, demo, author-demo, images, publish, bench, crds";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().cloned().unwrap_or_default();
    let rest = args.get(1..).unwrap_or_default();
    let target = target_dir();
    let mut budget = Budget::new();
    let result = match task.as_str() {
        "setup" => setup_all(&target, &mut budget),
        "test" => test(&target, rest, &mut budget),
        "demo" => demo(&target, rest, &mut budget),
        "author-demo" => author_demo(&target, &mut budget),
        "images" => release::images(&target, &mut budget),
        "publish" => release::publish(&target, rest, &mut budget),
        "bench" => bench::bench(&target, rest, &mut budget),
        "crds" => crds(&target),
        "" => Err(anyhow::anyhow!("usage: cargo xtask <task>; tasks: {TASKS}")),
        other => Err(anyhow::anyhow!("unknown task {other:?}; tasks: {TASKS}")),
    };
    if !budget.is_empty() {
        eprint!("{}", budget.render(&task));
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\nerror: {e:#}");
            ExitCode::FAILURE
        }
    }
}
