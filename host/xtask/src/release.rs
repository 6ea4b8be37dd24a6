//! `cargo xtask images` and `cargo xtask publish`: nodewright as something to install.
//!
//! Both use the binaries of the one musl build (`cargo build --workspace --bins` for this
//! machine's musl target, which the test build shares) and of the other architecture's
//! (`cross`), so publishing after a test run compiles nothing. `nodewright-images`
//! assembles the images, one index over both architectures each (and pushes them); the
//! `nodewright` CLI pushes the plugins. `publish --registry REG [--insecure] [--tag T]`
//! pushes `REG/operator:T`, `REG/agent:T` and `REG/plugins/<name>:T` (T, default the crate
//! version, is also the images' version label), then prints the pinned references and the
//! `helm install` that uses them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::budget::Budget;
use crate::cargo::{self, Built, cargo, musl_triple};
use crate::{cross, workspace};

/// The first-party plugins, by package and published name.
const PLUGINS: [(&str, &str); 6] = [
    ("nodewright-plugin-driver", "driver"),
    ("nodewright-plugin-files", "files"),
    ("nodewright-plugin-kernel-module", "kernel-module"),
    ("nodewright-plugin-shell", "shell"),
    ("nodewright-plugin-sysctl", "sysctl"),
    ("nodewright-plugin-systemd", "systemd"),
];

/// The version the images are labelled with when no `--tag` is given.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Every binary of the workspace, static, release: the build the tests, the images and
/// the demo share.
pub fn build_bins(target: &Path) -> Result<Built> {
    let mut cmd = cargo(target);
    cmd.args(["build", "--workspace", "--bins", "--release", "--locked"])
        .args(["--target", &musl_triple()]);
    let built = cargo::build(cmd, &[])?;
    built.ensure_fresh_if_built_once("the binaries' build")?;
    Ok(built)
}

/// Where the static binaries are.
pub fn bin_dir(target: &Path) -> PathBuf {
    target.join(musl_triple()).join("release")
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(workspace())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Both architectures' binaries of the images, each phase in `budget`.
fn build_image_bins(target: &Path, budget: &mut Budget) -> Result<()> {
    budget.phase("cargo build: binaries", || {
        let b = build_bins(target)?;
        let note = b.note();
        Ok(((), note))
    })?;
    budget.phase(
        &format!("cargo build: images' binaries, {}", cross::triple()),
        || {
            cross::setup(target)?;
            let b = cross::build(target)?;
            let note = b.note();
            Ok(((), note))
        },
    )
}

/// Runs `nodewright-images` on both builds' binaries; `push` is `(registry, insecure)`.
fn run_images(target: &Path, version: &str, push: Option<(&str, Option<&str>)>) -> Result<String> {
    let bins = bin_dir(target);
    let mut cmd = Command::new(bins.join("nodewright-images"));
    cmd.arg("--binaries")
        .arg(&bins)
        .arg("--binaries")
        .arg(cross::bin_dir(target))
        .arg("--out")
        .arg(target.join("images"))
        .args(["--version", version]);
    if let Some(rev) = git(&["describe", "--always", "--dirty", "--abbrev=40"]) {
        cmd.args(["--revision", &rev]);
    }
    if let Some(created) = git(&["log", "-1", "--format=%cI"]) {
        cmd.args(["--created", &created]);
    }
    if let Ok(source) = std::env::var("NODEWRIGHT_SOURCE") {
        cmd.args(["--source", &source]);
    }
    if let Some((registry, insecure)) = push {
        cmd.args(["--push", registry]);
        if let Some(host) = insecure {
            cmd.args(["--insecure-registry", host]);
        }
    }
    let out = cmd
        .output()
        .with_context(|| format!("running {}", bins.join("nodewright-images").display()))?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `cargo xtask images`.
pub fn images(target: &Path, budget: &mut Budget) -> Result<()> {
    build_image_bins(target, budget)?;
    let out = budget.phase("images", || {
        Ok((
            run_images(target, VERSION, None)?,
            "assembled twice, identical".into(),
        ))
    })?;
    println!(
        "\nimages (FROM scratch, static musl binaries, an index of both architectures; OCI layouts in {}):\n{out}",
        target.join("images").display()
    );
    Ok(())
}

/// The arguments of `publish`.
#[derive(Debug)]
struct PublishArgs {
    registry: String,
    insecure: bool,
    tag: String,
}

fn parse(args: &[String]) -> Result<PublishArgs> {
    let mut p = PublishArgs {
        registry: String::new(),
        insecure: false,
        tag: VERSION.into(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--registry" => {
                p.registry = it
                    .next()
                    .context("--registry needs a value: host[:port][/path]")?
                    .trim_end_matches('/')
                    .to_string()
            }
            "--insecure" => p.insecure = true,
            "--tag" => p.tag = it.next().context("--tag needs a value")?.clone(),
            other => bail!(
                "publish: unknown argument {other:?}; usage: cargo xtask publish --registry REG [--insecure] [--tag TAG]"
            ),
        }
    }
    if p.registry.is_empty() {
        bail!(
            "usage: cargo xtask publish --registry REG [--insecure] [--tag TAG] (REG: host[:port][/path])"
        );
    }
    Ok(p)
}

/// The plugins' wasm build (the same profile and target directory the tests' artifacts
/// use, so after a test run it compiles nothing).
fn build_plugins(target: &Path) -> Result<Built> {
    let mut build = cargo(target);
    build
        .args(["build", "--profile", "plugin", "--locked"])
        .args(["--target", "wasm32-wasip2", "--target-dir"])
        .arg(target.join("wasm-artifacts"));
    for (package, _) in PLUGINS {
        build.args(["-p", package]);
    }
    let built = cargo::build(build, &[])?;
    built.ensure_fresh_if_built_once("the plugins' build")?;
    Ok(built)
}

/// Pushes one plugin with the CLI; returns the pinned reference it printed.
fn push_plugin(cli: &Path, wasm: &Path, reference: &str, insecure: Option<&str>) -> Result<String> {
    let mut push = Command::new(cli);
    push.args(["plugin", "push"]).arg(wasm).arg(reference);
    if let Some(host) = insecure {
        push.args(["--insecure-registry", host]);
    }
    let out = push
        .output()
        .with_context(|| format!("running {}", cli.display()))?;
    if !out.status.success() {
        bail!(
            "pushing {reference}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `cargo xtask publish`.
pub fn publish(target: &Path, args: &[String], budget: &mut Budget) -> Result<()> {
    let args = parse(args)?;
    let host = args.registry.split('/').next().unwrap_or_default();
    let insecure = args.insecure.then_some(host);
    build_image_bins(target, budget)?;
    budget.phase("cargo build: plugins (wasm)", || {
        let b = build_plugins(target)?;
        let note = b.note();
        Ok(((), note))
    })?;
    let pushed = budget.phase("images: build and push", || {
        let out = run_images(target, &args.tag, Some((&args.registry, insecure)))?;
        Ok((out, format!("to {}", args.registry)))
    })?;
    print!("{pushed}");
    let digest = |repository: &str| {
        pushed
            .lines()
            .find(|l| l.starts_with(repository))
            .and_then(|l| l.split_whitespace().nth(1))
            .map(String::from)
            .with_context(|| format!("nodewright-images printed no digest for {repository}"))
    };
    let (operator, agent) = (digest("operator")?, digest("agent")?);
    let cli = bin_dir(target).join("nodewright");
    let plugin_refs = budget.phase("plugins: push", || {
        let mut refs = Vec::new();
        for (package, name) in PLUGINS {
            let wasm = target
                .join("wasm-artifacts/wasm32-wasip2/plugin")
                .join(format!("{}.wasm", package.replace('-', "_")));
            let reference = format!("{}/plugins/{name}:{}", args.registry, args.tag);
            let pinned = push_plugin(&cli, &wasm, &reference, insecure)?;
            println!("pushed {reference}\n  {pinned}");
            refs.push(pinned);
        }
        Ok((refs, format!("{} plugins", PLUGINS.len())))
    })?;
    let mut helm = format!(
        "helm install nodewright {} --namespace nodewright --set registry={} --set image.digest={operator} --set agent.image.digest={agent}",
        workspace().join("deploy/chart/nodewright").display(),
        args.registry,
    );
    if let Some(host) = insecure {
        helm.push_str(&format!(" --set insecureRegistries[0]={host}"));
    }
    // The stage Jobs' pods are privileged: a cluster enforcing Pod Security `baseline` by
    // default refuses them unless the namespace says otherwise.
    println!(
        "\nInstall it with:\n\n  kubectl create namespace nodewright\n  kubectl label namespace nodewright pod-security.kubernetes.io/enforce=privileged\n  {helm}\n\nand name the plugins by digest in your NodeWrights, e.g.\n  plugin: {}",
        plugin_refs.first().cloned().unwrap_or_default()
    );
    Ok(())
}
