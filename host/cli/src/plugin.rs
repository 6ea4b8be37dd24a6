//! `nodewright plugin ...`: the author loop.

mod build;
mod inspect;
mod new;
mod oci;
mod payloads;
mod run;
mod sign;
mod source;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use nodewright_engine::{Engine, EngineConfig, LoadedPlugin};

/// Plugin subcommands.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once per process")]
pub enum PluginCommand {
    /// Create a new plugin (Rust, Python or JavaScript) from a template that builds as is.
    New(new::NewArgs),
    /// Build a plugin (cargo, componentize-py or componentize-js) and check it is a nodewright plugin.
    Build(build::BuildArgs),
    /// Show a plugin's world, exports, required capabilities, size and digest.
    Inspect(inspect::InspectArgs),
    /// Run one stage of a plugin against a simulated node rooted at a scratch directory.
    // `--version` is the package version here, not the CLI's (propagated from the root).
    #[command(disable_version_flag = true)]
    Run(run::RunArgs),
    /// Push a plugin to an OCI registry; prints the pinned reference (repo@sha256:...).
    Push(oci::PushArgs),
    /// Pull a plugin into the local cache (by tag or digest), verifying every digest.
    Pull(oci::PullArgs),
    /// Resolve a tag to the digest nodes will pull.
    Resolve(oci::ResolveArgs),
    /// Write a key pair for signing plugins (cosign's formats; the private key encrypted).
    Keygen(sign::KeygenArgs),
    /// Sign a plugin in its registry, as `cosign sign --key` does.
    Sign(sign::SignArgs),
    /// Check a plugin's signatures against public keys, as `cosign verify --key` does.
    Verify(sign::VerifyArgs),
}

/// Runs a plugin subcommand.
pub async fn run(cmd: PluginCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PluginCommand::New(args) => new::run(args),
        PluginCommand::Build(args) => build::run(args),
        PluginCommand::Inspect(args) => inspect::run(args).await,
        PluginCommand::Run(args) => run::run(args).await,
        PluginCommand::Push(args) => oci::push(args).await,
        PluginCommand::Pull(args) => oci::pull(args).await,
        PluginCommand::Resolve(args) => oci::resolve(args).await,
        PluginCommand::Keygen(args) => sign::keygen(args),
        PluginCommand::Sign(args) => sign::sign(args).await,
        PluginCommand::Verify(args) => sign::verify(args).await,
    }
}

/// The local plugin cache, laid out like a node's: `$NODEWRIGHT_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/nodewright`, else `~/.cache/nodewright`. Pulled artifacts go to
/// `blobs/` and `manifests/`, precompiled code to `code/`.
fn cache_root() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("NODEWRIGHT_CACHE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .ok_or_else(|| anyhow::anyhow!("no cache directory: set NODEWRIGHT_CACHE_DIR or HOME"))?;
    Ok(base.join("nodewright"))
}

/// The engine with the user's code cache.
fn engine() -> anyhow::Result<Engine> {
    Ok(Engine::new(EngineConfig {
        cache_dir: Some(cache_root()?.join("code")),
        // Each of these commands runs at most one stage: a pool of one slot (a quarter of
        // the default's mappings to make and index).
        concurrent_runs: std::num::NonZeroU32::MIN,
        ..Default::default()
    })?)
}

/// Reads and loads a plugin file, naming the file in every error.
fn load(
    engine: &Engine,
    file: &std::path::Path,
) -> anyhow::Result<(LoadedPlugin, std::time::Duration)> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let started = std::time::Instant::now();
    let plugin = engine
        .load(&bytes)
        .with_context(|| format!("{}", file.display()))?;
    Ok((plugin, started.elapsed()))
}
