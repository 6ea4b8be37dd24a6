//! `cargo xtask images` and `cargo xtask publish`: nodewright as something to install.
//!
//! `images` builds the operator and the agent as static musl binaries and assembles their
//! images (see `nodewright-images`) into OCI image layouts under `<target>/images/`,
//! printing sizes and digests; it assembles each twice and fails if the digests differ.
//! `publish --registry REG [--insecure] [--tag T]` also builds the five first-party plugins
//! and pushes everything to `REG`: `REG/operator:T`, `REG/agent:T` and
//! `REG/plugins/<name>:T` (T, default the crate version, is also the images' version
//! label), then prints the pinned references and the `helm install` that uses them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use nodewright_images::{Image, ImageKind, Inputs};
use nodewright_oci::{Registry, RegistryConfig};

use crate::{cargo, run, workspace};

/// The target the images' static binaries are built for.
pub const MUSL: &str = "x86_64-unknown-linux-musl";

/// The first-party plugins, by package and published name.
const PLUGINS: [(&str, &str); 5] = [
    ("nodewright-plugin-files", "files"),
    ("nodewright-plugin-kernel-module", "kernel-module"),
    ("nodewright-plugin-shell", "shell"),
    ("nodewright-plugin-sysctl", "sysctl"),
    ("nodewright-plugin-systemd", "systemd"),
];

/// Largest compressed image we accept.
const MAX_IMAGE_BYTES: usize = 25 << 20;

/// The musl target and its C compiler (aws-lc builds C for TLS).
pub fn setup_musl() -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("rustup is needed")?;
    if !String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.trim() == MUSL)
    {
        run(Command::new("rustup").args(["target", "add", MUSL]))?;
    }
    crate::apt(&[("/usr/bin/musl-gcc", "musl-tools")])
}

/// Builds the static operator and agent; returns the directory they are in.
pub fn build_binaries(target: &Path) -> Result<PathBuf> {
    setup_musl()?;
    run(cargo(target)
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            MUSL,
            "-p",
            "nodewright-operator",
            "-p",
            "nodewright-agent",
        ])
        .env(format!("CC_{}", MUSL.replace('-', "_")), "musl-gcc"))?;
    Ok(target.join(MUSL).join("release"))
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

/// What goes into an image besides its binary: the version, the commit and its time.
pub fn inputs(bin_dir: &Path, kind: ImageKind, version: &str) -> Inputs {
    Inputs {
        binary: bin_dir.join(kind.binary()),
        ca_bundle: nodewright_images::system_ca_bundle(),
        version: version.into(),
        revision: git(&["describe", "--always", "--dirty", "--abbrev=40"])
            .unwrap_or_else(|| "unknown".into()),
        source: std::env::var("NODEWRIGHT_SOURCE")
            .unwrap_or_else(|_| "https://github.com/nodewright/nodewright".into()),
        created: git(&["log", "-1", "--format=%cI"])
            .unwrap_or_else(|| "1970-01-01T00:00:00Z".into()),
    }
}

/// Writes `image` as an OCI image layout in `dir` (for `skopeo copy oci:DIR ...`).
fn write_layout(image: &Image, dir: &Path) -> Result<()> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    for bytes in [&image.layer, &image.config, &image.manifest] {
        let digest = nodewright_oci::sha256_digest(bytes);
        std::fs::write(blobs.join(digest.trim_start_matches("sha256:")), bytes)?;
    }
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": nodewright_images::media::MANIFEST, "digest": image.digest(), "size": image.manifest.len()}],
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index)?)?;
    Ok(())
}

/// Builds both images labelled `version` (twice, to check they are reproducible), writes
/// their layouts and prints their sizes and digests.
pub fn images(target: &Path, version: &str) -> Result<Vec<Image>> {
    let bin_dir = build_binaries(target)?;
    println!(
        "\nimages (FROM scratch, static musl binaries; OCI layouts in {}):",
        target.join("images").display()
    );
    let mut out = Vec::new();
    for kind in ImageKind::ALL {
        let inputs = inputs(&bin_dir, kind, version);
        let image = Image::build(kind, &inputs)?;
        let again = Image::build(kind, &inputs)?;
        if again.digest() != image.digest() {
            bail!(
                "{} is not reproducible: {} then {}",
                kind.binary(),
                image.digest(),
                again.digest()
            );
        }
        if image.compressed_size() > MAX_IMAGE_BYTES {
            bail!(
                "{} is {} bytes compressed; the budget is {MAX_IMAGE_BYTES}",
                kind.binary(),
                image.compressed_size()
            );
        }
        write_layout(&image, &target.join("images").join(kind.repository()))?;
        let binary = std::fs::metadata(&inputs.binary)?.len();
        println!(
            "  {:<9} {}  {:>5.1} MB compressed ({:.1} MB binary), revision {}",
            kind.repository(),
            image.digest(),
            image.compressed_size() as f64 / 1e6,
            binary as f64 / 1e6,
            inputs.revision
        );
        out.push(image);
    }
    Ok(out)
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
        tag: env!("CARGO_PKG_VERSION").into(),
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

/// `cargo xtask publish`.
// Long on purpose: build, push and print the install command, step by step as the output
// shows it.
pub fn publish(target: &Path, args: &[String]) -> Result<()> {
    let args = parse(args)?;
    let host = args
        .registry
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let images = images(target, &args.tag)?;
    crate::setup_wasm_target()?;
    let mut build = cargo(target);
    build
        .args([
            "build",
            "--profile",
            "plugin",
            "--locked",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(target.join("wasm-artifacts"));
    for (package, _) in PLUGINS {
        build.args(["-p", package]);
    }
    run(&mut build)?;
    run(cargo(target).args(["build", "--release", "--locked", "-p", "nodewright-cli"]))?;

    let config = RegistryConfig {
        insecure: if args.insecure {
            vec![host.clone()]
        } else {
            vec![]
        },
        ..Default::default()
    };
    let registry = Registry::new(config);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut pinned = Vec::new();
    for (kind, image) in ImageKind::ALL.into_iter().zip(&images) {
        let reference = format!("{}/{}:{}", args.registry, kind.repository(), args.tag);
        let p = rt
            .block_on(image.push(&registry, &reference, &|_| {}))
            .with_context(|| format!("pushing {reference}"))?;
        println!("pushed {reference}\n  {p}");
        pinned.push((kind, image.digest()));
    }
    let cli = target.join("release/nodewright");
    let mut plugin_refs = Vec::new();
    for (package, name) in PLUGINS {
        let wasm = target
            .join("wasm-artifacts/wasm32-wasip2/plugin")
            .join(format!("{}.wasm", package.replace('-', "_")));
        let reference = format!("{}/plugins/{name}:{}", args.registry, args.tag);
        let mut push = Command::new(&cli);
        push.args(["plugin", "push"]).arg(&wasm).arg(&reference);
        if args.insecure {
            push.args(["--insecure-registry", &host]);
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
        let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
        println!("pushed {reference}\n  {p}");
        plugin_refs.push(p);
    }
    let digest = |k: ImageKind| {
        pinned
            .iter()
            .find(|(kind, _)| *kind == k)
            .map(|(_, d)| d.clone())
            .unwrap_or_default()
    };
    let mut helm = format!(
        "helm install nodewright {} --namespace nodewright --create-namespace --set registry={} --set image.digest={} --set agent.image.digest={}",
        workspace().join("deploy/chart/nodewright").display(),
        args.registry,
        digest(ImageKind::Operator),
        digest(ImageKind::Agent)
    );
    if args.insecure {
        helm.push_str(&format!(" --set insecureRegistries[0]={host}"));
    }
    println!(
        "\nInstall it with:\n\n  {helm}\n\nand name the plugins by digest in your NodeWrights, e.g.\n  plugin: {}",
        plugin_refs.first().cloned().unwrap_or_default()
    );
    Ok(())
}
