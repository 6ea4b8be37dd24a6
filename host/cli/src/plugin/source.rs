//! Where a plugin comes from: a file, or an OCI reference pulled through the local cache.

use nodewright_api::units::format_bytes;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use nodewright_api::agent::RegistryCa;
use nodewright_api::payload::PayloadName;
use nodewright_api::pinned::PinnedRef;
use nodewright_engine::{Engine, LoadedPlugin};
use nodewright_oci::payload::Payload;
use nodewright_oci::{Credentials, NodeCache, Progress, Puller, Registry, RegistryConfig};

/// Registry flags shared by the commands that talk to registries.
#[derive(Debug, Clone, Args)]
pub struct RegistryArgs {
    /// Registry (host:port) to reach over plain HTTP. Repeatable. Only these ever are.
    #[arg(long = "insecure-registry", value_name = "HOST")]
    insecure: Vec<String>,
    /// Extra CA bundle for one registry: HOST=PEM-FILE. Repeatable.
    #[arg(long = "registry-ca", value_name = "HOST=PEM")]
    ca: Vec<RegistryCa>,
    /// Registry username (else the docker config.json is used).
    #[arg(long, env = "NODEWRIGHT_REGISTRY_USERNAME")]
    username: Option<String>,
    /// Registry password.
    #[arg(long, env = "NODEWRIGHT_REGISTRY_PASSWORD", hide_env_values = true)]
    password: Option<String>,
}

impl RegistryArgs {
    pub fn config(&self) -> anyhow::Result<RegistryConfig> {
        let ca_bundles = self
            .ca
            .iter()
            .map(|c| (c.registry.clone(), c.pem.clone().into()))
            .collect();
        let credentials =
            Credentials::explicit_or_environment(self.username.clone(), self.password.clone())
                .context("--username and --password")?;
        Ok(RegistryConfig {
            insecure: self.insecure.clone(),
            ca_bundles,
            credentials,
            ..Default::default()
        })
    }
}

/// Prints transfer progress to stderr.
pub fn print_progress(p: Progress) {
    match p {
        Progress::Cached { what, digest } => eprintln!("  {what:<8} {} from cache", short(&digest)),
        Progress::Downloading {
            what,
            digest,
            bytes,
        } if bytes > 0 => {
            eprintln!(
                "  {what:<8} {} downloading {}",
                short(&digest),
                format_bytes(bytes)
            )
        }
        Progress::Downloading { what, digest, .. } => {
            eprintln!("  {what:<8} {} downloading", short(&digest))
        }
        Progress::Applied { digest, summary } => {
            eprintln!("  payload  {} applied: {summary}", short(&digest))
        }
        Progress::Uploading {
            what,
            digest,
            bytes,
        } => {
            eprintln!(
                "  {what:<8} {} uploading {}",
                short(&digest),
                format_bytes(bytes)
            )
        }
    }
}

/// `sha256:0123456789ab`.
pub fn short(digest: &str) -> &str {
    &digest[..digest.len().min(19)]
}

/// A loaded plugin and where it came from.
pub struct Source {
    pub plugin: LoadedPlugin,
    pub load_time: Duration,
    /// File path, or the pinned reference.
    pub display: String,
    /// For references: whether the artifact came from the local cache.
    pub pulled_from_cache: Option<bool>,
    /// For references: the pinned reference.
    pub pinned: Option<PinnedRef>,
    /// For references: the artifact's payloads, listed ([`stage`] fetches them).
    pub payloads: Vec<Payload>,
}

/// The payloads of a pulled reference, fetched into the local cache (laid out like a
/// node's) and unpacked, by name; none for a file.
pub async fn stage(
    source: &Source,
    registry: &RegistryArgs,
) -> anyhow::Result<BTreeMap<PayloadName, PathBuf>> {
    let Some(pinned) = source
        .pinned
        .as_ref()
        .filter(|_| !source.payloads.is_empty())
    else {
        return Ok(BTreeMap::new());
    };
    let cache = NodeCache::open(&super::cache_root()?)?;
    let puller = Puller::new(Registry::new(registry.config()?), cache);
    let staged = puller
        .stage_payloads(pinned, &source.payloads, &print_progress)
        .await?;
    Ok(staged.into_iter().map(|p| (p.name, p.tree)).collect())
}

/// The payloads of a plugin just pulled, fetched into the local cache and unpacked as a
/// node stages them.
pub async fn stage_pulled(
    pulled: &nodewright_oci::Pulled,
    registry: &RegistryArgs,
) -> anyhow::Result<Vec<nodewright_oci::PulledPayload>> {
    if pulled.payloads.is_empty() {
        return Ok(Vec::new());
    }
    let cache = NodeCache::open(&super::cache_root()?)?;
    let puller = Puller::new(Registry::new(registry.config()?), cache);
    Ok(puller
        .stage_payloads(&pulled.reference, &pulled.payloads, &print_progress)
        .await?)
}

/// Whether `s` names an OCI reference rather than a file.
pub fn is_reference(s: &str) -> bool {
    !Path::new(s).exists()
        && s.contains('/')
        && (s.contains(':') || s.contains('@'))
        && !s.starts_with('.')
        && !s.starts_with('/')
}

/// Resolves (if needed) and pulls `reference` through the CLI's node cache.
pub async fn pull(
    reference: &str,
    registry: &RegistryArgs,
) -> anyhow::Result<nodewright_oci::Pulled> {
    let reg = Registry::new(registry.config()?);
    let pinned = reg.pinned(reference).await?;
    if pinned.as_str() != reference {
        eprintln!("resolved {reference} -> {pinned}");
    }
    let cache = NodeCache::open(&super::cache_root()?)?;
    let puller = Puller::new(reg, cache);
    Ok(puller.pull_pinned(&pinned, &print_progress).await?)
}

/// Loads a plugin from a file or a reference.
pub async fn load(
    engine: &Engine,
    source: &str,
    registry: &RegistryArgs,
) -> anyhow::Result<Source> {
    if !is_reference(source) {
        let (plugin, load_time) = super::load(engine, Path::new(source))?;
        return Ok(Source {
            plugin,
            load_time,
            display: source.to_string(),
            pulled_from_cache: None,
            pinned: None,
            payloads: Vec::new(),
        });
    }
    let pulled = pull(source, registry).await?;
    let started = Instant::now();
    let plugin = engine
        .load(&pulled.bytes)
        .with_context(|| pulled.reference.clone())?;
    Ok(Source {
        plugin,
        load_time: started.elapsed(),
        display: pulled.reference.to_string(),
        pulled_from_cache: Some(pulled.from_cache),
        pinned: Some(pulled.reference.clone()),
        payloads: pulled.payloads,
    })
}
