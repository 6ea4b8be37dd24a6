//! `nodewright-images`: the operator and agent images from the static binaries of a build.
//!
//! Each `--binaries DIR` holds one build's `nodewright-operator` and `nodewright-agent`; the
//! architecture of each image is read from its binary's ELF header. Assembles each image
//! twice and refuses one whose digests differ (not reproducible) or that is over the size
//! budget, indexes each image's architectures in one OCI image index, writes both as OCI
//! image layouts under `--out`, and with `--push REGISTRY` sends them to
//! `REGISTRY/operator:VERSION` and `REGISTRY/agent:VERSION`. `cargo xtask images` and
//! `cargo xtask publish` run it on the binaries of the musl builds the tests also use, so
//! what is published is what was tested.
//!
//! Output, one block per image: `<repository> <index digest> index of <platforms>`, then a
//! line per platform, `  <platform> <digest> <size> compressed (<size> binary)`, then, when
//! pushed, `pushed <reference>` and the pinned reference on a line of its own.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Parser;
use nodewright_images::{Image, ImageKind, Index, Inputs};
use nodewright_oci::{Credentials, Registry, RegistryConfig};

/// Largest compressed image we accept.
const MAX_IMAGE_BYTES: usize = 25 << 20;

/// Build (and push) nodewright's operator and agent images.
#[derive(Debug, Parser)]
#[command(name = "nodewright-images", version)]
struct Args {
    /// A directory holding one build's static `nodewright-operator` and `nodewright-agent`
    /// (repeatable: one per architecture).
    #[arg(long, required = true)]
    binaries: Vec<PathBuf>,
    /// Where the OCI layouts go (`<out>/operator`, `<out>/agent`).
    #[arg(long)]
    out: PathBuf,
    /// `org.opencontainers.image.version`, and the tag pushed.
    #[arg(long)]
    version: String,
    /// `org.opencontainers.image.revision` (a commit).
    #[arg(long, default_value = "unknown")]
    revision: String,
    /// `created`, RFC 3339 (the commit's time, so rebuilding does not change it).
    #[arg(long, default_value = "1970-01-01T00:00:00Z")]
    created: String,
    /// `org.opencontainers.image.source`.
    #[arg(long, default_value = "https://github.com/nodewright/nodewright")]
    source: String,
    /// Push both images under this registry prefix (`host[:port][/path]`).
    #[arg(long, value_name = "REGISTRY")]
    push: Option<String>,
    /// A registry host reached over plain HTTP (repeatable).
    #[arg(long = "insecure-registry", value_name = "HOST")]
    insecure: Vec<String>,
    /// Registry username for the push (else the docker config.json is used).
    #[arg(long, env = "NODEWRIGHT_REGISTRY_USERNAME")]
    username: Option<String>,
    /// Registry password.
    #[arg(long, env = "NODEWRIGHT_REGISTRY_PASSWORD", hide_env_values = true)]
    password: Option<String>,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nodewright-images: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Assembles `kind` twice from the same inputs and keeps it only if both are identical
/// and within the size budget.
fn reproducible(kind: ImageKind, inputs: &Inputs) -> Result<Image> {
    let image = Image::build(kind, inputs)?;
    let again = Image::build(kind, inputs)?;
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
    Ok(image)
}

fn run(args: Args) -> Result<()> {
    let mut indexes = Vec::new();
    for kind in ImageKind::ALL {
        let mut images = Vec::new();
        let mut lines = Vec::new();
        for dir in &args.binaries {
            let inputs = Inputs {
                binary: dir.join(kind.binary()),
                ca_bundle: nodewright_images::system_ca_bundle(),
                version: args.version.clone(),
                revision: args.revision.clone(),
                source: args.source.clone(),
                created: args.created.clone(),
            };
            let image = reproducible(kind, &inputs)?;
            let binary = std::fs::metadata(&inputs.binary)
                .with_context(|| inputs.binary.display().to_string())?
                .len();
            lines.push((
                image.arch,
                format!(
                    "  {:<14} {}  {:>5.1} MB compressed ({:.1} MB binary)",
                    image.arch.platform(),
                    image.digest(),
                    image.compressed_size() as f64 / 1e6,
                    binary as f64 / 1e6,
                ),
            ));
            images.push(image);
        }
        let index = Index::new(images)?;
        index.write_layout(&args.out.join(kind.repository()))?;
        lines.sort();
        let platforms: Vec<String> = index.images.iter().map(|i| i.arch.platform()).collect();
        println!(
            "{:<9} {}  index of {}",
            kind.repository(),
            index.digest(),
            platforms.join(", ")
        );
        for (_, line) in lines {
            println!("{line}");
        }
        indexes.push((kind, index));
    }
    let Some(prefix) = &args.push else {
        return Ok(());
    };
    let registry = Registry::new(RegistryConfig {
        insecure: args.insecure.clone(),
        credentials: Credentials::explicit_or_environment(
            args.username.clone(),
            args.password.clone(),
        )?,
        ..Default::default()
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for (kind, index) in &indexes {
        let reference = format!(
            "{}/{}:{}",
            prefix.trim_end_matches('/'),
            kind.repository(),
            args.version
        );
        let pinned = rt
            .block_on(index.push(&registry, &reference, &|_| {}))
            .with_context(|| format!("pushing {reference}"))?;
        println!("pushed {reference}\n  {pinned}");
    }
    Ok(())
}
