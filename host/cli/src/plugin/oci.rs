//! `nodewright plugin push|pull|resolve`.

use nodewright_api::units::format_bytes;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use nodewright_oci::Registry;
use nodewright_oci::artifact::ComponentInfo;

use super::source::{RegistryArgs, print_progress};

/// Arguments of `plugin push`.
#[derive(Debug, Args)]
pub struct PushArgs {
    /// The component (.wasm). It must pass the world check.
    file: PathBuf,
    /// Where to push: registry/repository:tag.
    reference: String,
    /// A file or directory the package carries beside its component, as a layer of the
    /// same artifact (covered by its digest and signatures); the plugin reads it at
    /// /payload/NAME. NAME defaults to the file or directory name. Repeatable.
    #[arg(long = "payload", value_name = "[NAME=]PATH")]
    payloads: Vec<super::payloads::PayloadArg>,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// Arguments of `plugin pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// registry/repository:tag or registry/repository@sha256:...
    reference: String,
    /// Also write the component to this file.
    #[arg(long, short)]
    output: Option<PathBuf>,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// Arguments of `plugin resolve`.
#[derive(Debug, Args)]
pub struct ResolveArgs {
    /// registry/repository:tag
    reference: String,
    #[command(flatten)]
    registry: RegistryArgs,
}

pub async fn push(args: PushArgs) -> anyhow::Result<ExitCode> {
    let engine = super::engine()?;
    let (plugin, _) = super::load(&engine, &args.file)?;
    let bytes = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let info = ComponentInfo {
        imports: plugin.imports.iter().map(|i| i.name.clone()).collect(),
        exports: plugin.exports.clone(),
        target: Some("nodewright:plugin/plugin@0.1.0".into()),
    };
    let payloads = super::payloads::PackedFiles::pack(&args.payloads)?;
    eprintln!(
        "pushing {} ({}) to {}",
        args.file.display(),
        format_bytes(bytes.len() as u64),
        args.reference
    );
    for p in &payloads.files {
        eprintln!("  payload  {} ({})", p.name, format_bytes(p.size));
    }
    let registry = Registry::new(args.registry.config()?);
    let pushed = registry
        .push_package(
            &args.reference,
            &bytes,
            info,
            &payloads.files,
            &print_progress,
        )
        .await?;
    println!("{}", pushed.pinned);
    Ok(ExitCode::SUCCESS)
}

pub async fn pull(args: PullArgs) -> anyhow::Result<ExitCode> {
    let pulled = super::source::pull(&args.reference, &args.registry).await?;
    // Its payloads too, as a node stages them: streamed to the cache, verified, unpacked.
    let staged = super::source::stage_pulled(&pulled, &args.registry).await?;
    let engine = super::engine()?;
    let plugin = engine
        .load(&pulled.bytes)
        .with_context(|| pulled.reference.clone())?;
    if let Some(out) = &args.output {
        std::fs::write(out, &pulled.bytes)
            .with_context(|| format!("cannot write {}", out.display()))?;
    }
    let caps: Vec<&str> = plugin
        .required_capabilities()
        .iter()
        .map(|c| c.interface())
        .collect();
    println!("{}", pulled.reference);
    eprintln!(
        "{} {}, layer {}, needs {}",
        if pulled.from_cache {
            "cached"
        } else {
            "pulled"
        },
        format_bytes(pulled.bytes.len() as u64),
        pulled.layer_digest,
        if caps.is_empty() {
            "no capabilities".to_string()
        } else {
            caps.join(", ")
        }
    );
    for p in &staged {
        eprintln!(
            "payload {} {} ({}){}: {}",
            p.name.as_str(),
            format_bytes(p.size),
            p.digest,
            if p.from_cache { ", cached" } else { "" },
            p.tree.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn resolve(args: ResolveArgs) -> anyhow::Result<ExitCode> {
    let registry = Registry::new(args.registry.config()?);
    let digest = registry.resolve(&args.reference).await?;
    println!("{}", nodewright_oci::pin(&args.reference, &digest)?);
    Ok(ExitCode::SUCCESS)
}
