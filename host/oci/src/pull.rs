//! The agent's pull path: pinned references only, cache first, everything verified.

use std::path::PathBuf;

use futures::{StreamExt as _, TryStreamExt as _};

use nodewright_api::payload::PayloadName;
use nodewright_api::pinned::PinnedRef;

use crate::artifact::Descriptor;
use crate::cache::{Keeps, NodeCache};
use crate::error::{Error, Result};
use crate::payload::{Payload, UnpackLimits};
use crate::progress::Progress;
use crate::registry::{Registry, parse_manifest};
use crate::resume::{Build, Checkpoint};
use crate::stream::Resume;

/// A verified plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pulled {
    /// The pinned reference pulled.
    pub reference: PinnedRef,
    /// Manifest digest.
    pub manifest_digest: String,
    /// Layer digest (the component's sha256).
    pub layer_digest: String,
    /// The component.
    pub bytes: Vec<u8>,
    /// The payloads the artifact carries, in the manifest's order: listed, not fetched
    /// ([`Puller::stage_payloads`] fetches them).
    pub payloads: Vec<Payload>,
    /// Whether nothing was downloaded.
    pub from_cache: bool,
}

/// A payload on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PulledPayload {
    /// Its name.
    pub name: PayloadName,
    /// Its layer's digest.
    pub digest: String,
    /// Its layer's size in bytes.
    pub size: u64,
    /// Its read-only tree.
    pub tree: PathBuf,
    /// Whether nothing was downloaded for it.
    pub from_cache: bool,
}

/// Payload layers fetched at once.
const PARALLEL_PAYLOADS: usize = 3;

/// Pulls pinned plugins through the node cache.
#[derive(Debug)]
pub struct Puller {
    registry: Registry,
    cache: NodeCache,
}

impl Puller {
    /// A puller over `registry` and `cache`.
    pub fn new(registry: Registry, cache: NodeCache) -> Self {
        Puller { registry, cache }
    }

    /// The cache.
    pub fn cache(&self) -> &NodeCache {
        &self.cache
    }

    /// The registry client.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Pulls `repo@sha256:...` within the registry's pull deadline. Cached
    /// content is re-hashed; corrupt cache entries are moved aside and fetched again.
    pub async fn pull_pinned(
        &self,
        reference: &PinnedRef,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<Pulled> {
        self.registry
            .bounded(reference.as_str(), self.pull_unbounded(reference, progress))
            .await
    }

    async fn pull_unbounded(
        &self,
        pinned: &PinnedRef,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<Pulled> {
        let reference = pinned.as_str();
        let manifest_digest = pinned.digest().to_string();
        let mut from_cache = true;
        let raw = match self.cached(|c| c.manifest(&manifest_digest))? {
            Some(raw) => {
                progress(Progress::Cached {
                    what: "manifest",
                    digest: manifest_digest.clone(),
                });
                raw
            }
            None => {
                from_cache = false;
                progress(Progress::Downloading {
                    what: "manifest",
                    digest: manifest_digest.clone(),
                    bytes: 0,
                });
                let (raw, _) = self.registry.fetch_manifest(reference).await?;
                self.cache.put_manifest(&manifest_digest, &raw)?;
                raw
            }
        };
        let manifest = parse_manifest(reference, &raw)?;
        let (layer, payloads) = manifest.plugin_layers(reference)?;
        let layer = layer.clone();
        let bytes = match self.cached(|c| c.blob(&layer.digest))? {
            Some(b) => {
                progress(Progress::Cached {
                    what: "layer",
                    digest: layer.digest.clone(),
                });
                b
            }
            None => {
                from_cache = false;
                progress(Progress::Downloading {
                    what: "layer",
                    digest: layer.digest.clone(),
                    bytes: layer.bytes(),
                });
                let b = self.registry.fetch_blob(reference, &layer).await?;
                self.cache.put_blob(&layer.digest, &b)?;
                b
            }
        };
        Ok(Pulled {
            reference: pinned.clone(),
            manifest_digest,
            layer_digest: layer.digest,
            bytes,
            payloads,
            from_cache,
        })
    }

    /// Fetches `payloads` of `reference` (from its [`Pulled`]) into the node cache and
    /// unpacks them, a few layers at once, within the registry's pull deadline: what is
    /// there already is used as it is, a download cut off earlier is resumed, and nothing
    /// is fetched when the cache's filesystem has no room for all that is missing
    /// ([`Error::NoRoom`]). Separate from [`Puller::pull_pinned`]
    /// so that what only checks a plugin (the operator) never downloads its payloads.
    pub async fn stage_payloads(
        &self,
        reference: &PinnedRef,
        payloads: &[Payload],
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<Vec<PulledPayload>> {
        let missing: Vec<&Payload> = payloads
            .iter()
            .filter(|p| !self.cache.has_tree(p))
            .collect();
        // Every layer within the limit before a byte of any is fetched: a refusal must not
        // leave a sibling's download cut off half-way.
        for p in &missing {
            self.registry.payload_size(reference.as_str(), &p.layer)?;
        }
        self.cache.room_for(
            reference.as_str(),
            &missing,
            Keeps::Tree,
            &self.registry.limits(),
        )?;
        self.registry
            .bounded(
                reference.as_str(),
                futures::stream::iter(payloads)
                    .map(|p| self.staged(reference.as_str(), p, progress))
                    .buffered(PARALLEL_PAYLOADS)
                    .try_collect(),
            )
            .await
    }

    /// One payload staged.
    async fn staged(
        &self,
        reference: &str,
        payload: &Payload,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<PulledPayload> {
        let (tree, from_cache) = self.payload(reference, payload, progress).await?;
        Ok(PulledPayload {
            name: payload.name.clone(),
            digest: payload.layer.digest.clone(),
            size: payload.layer.bytes(),
            tree,
            from_cache,
        })
    }

    /// A payload's tree: from the cache, else unpacked from the registry's stream as it
    /// arrives (resuming what an earlier pull left), kept once the whole layer matched its
    /// digest. Whether it was all cached.
    async fn payload(
        &self,
        reference: &str,
        payload: &Payload,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<(PathBuf, bool)> {
        let limits = UnpackLimits::default();
        let digest = &payload.layer.digest;
        // A tree made earlier — or made now from a whole blob a cache of an earlier version
        // holds.
        let cached = |cache: &NodeCache| match cache.payload_tree(reference, payload, limits) {
            Err(Error::CacheCorrupt { .. }) => Ok(None),
            other => other,
        };
        if let Some(tree) = cached(&self.cache)? {
            progress(Progress::Cached {
                what: "payload",
                digest: digest.clone(),
            });
            return Ok((tree, true));
        }
        let _download = self.lock_download(digest).await?;
        // Another process on the node made it while this one waited.
        if let Some(tree) = self.cache.tree(digest)? {
            return Ok((tree, true));
        }
        progress(Progress::Downloading {
            what: "payload",
            digest: digest.clone(),
            bytes: payload.layer.bytes(),
        });
        let staging = self.cache.staging_path(digest)?;
        let checkpoint_file = self.cache.checkpoint_path(digest)?;
        let declared = payload.layer.bytes();
        let checkpoint = Checkpoint::load(&checkpoint_file, digest, declared, &staging);
        let resume = Resume::Checkpoint(checkpoint.as_ref().map(|c| (c.offset, c.hash.clone())));
        let build = Build {
            cache: self.cache.clone(),
            name: payload.name.clone(),
            digest: digest.clone(),
            reference: reference.to_string(),
            staging,
            checkpoint_file,
            checkpoint,
            limits,
            every: self.registry.limits().checkpoint_every,
        };
        let built = self
            .registry
            .stream_blob(reference, &payload.layer, resume, move |reader| {
                build.run(reader)
            })
            .await;
        // A cut-off download keeps its staging tree and checkpoint for the next pull;
        // anything else (wrong bytes, a refused entry) throws them away.
        if let Err(e) = &built
            && !e.is_retryable()
        {
            self.cache.discard_staging(digest)?;
        }
        Ok((built?, false))
    }

    /// Puts the payload-sized blob `layer` in the cache unless it is there: streamed to its
    /// `.partial` (resuming what an earlier pull left), verified, renamed into place. One
    /// process at a time fetches a layer on a node; one that waited finds it there. True
    /// when this call downloaded it.
    pub(crate) async fn blob_to_cache(
        &self,
        reference: &str,
        layer: &Descriptor,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<bool> {
        let digest = &layer.digest;
        if self.cache.has_blob(digest) {
            return Ok(false);
        }
        let _download = self.lock_download(digest).await?;
        if self.cache.has_blob(digest) {
            return Ok(false);
        }
        progress(Progress::Downloading {
            what: "payload",
            digest: digest.clone(),
            bytes: layer.bytes(),
        });
        let partial = self.cache.partial_path(digest)?;
        self.registry
            .fetch_blob_to_file(reference, layer, &partial)
            .await?;
        self.cache.commit_partial(digest)?;
        Ok(true)
    }

    /// This process's turn to download layer `digest` on the node (waited for off the
    /// async threads); held until the returned lock file is dropped.
    async fn lock_download(&self, digest: &str) -> Result<std::fs::File> {
        let (cache, digest) = (self.cache.clone(), digest.to_string());
        tokio::task::spawn_blocking(move || cache.lock_download(&digest))
            .await
            .map_err(|e| Error::Cache {
                path: self.cache.root().display().to_string(),
                source: std::io::Error::other(e),
            })?
    }

    /// A cache read where corruption means "fetch again".
    fn cached(
        &self,
        read: impl Fn(&NodeCache) -> Result<Option<Vec<u8>>>,
    ) -> Result<Option<Vec<u8>>> {
        match read(&self.cache) {
            Err(Error::CacheCorrupt { digest, actual }) => {
                tracing::warn!(%digest, %actual, "refused a corrupt cache entry; fetching it again");
                Ok(None)
            }
            other => other,
        }
    }
}

/// Makes what was written under `dir` durable before it is renamed into use: one `syncfs`
/// of the cache's filesystem (a tree of many files costs one call, not one per file).
pub(crate) fn durable(dir: &std::path::Path) -> Result<()> {
    let handle = std::fs::File::open(dir).map_err(|e| Error::cache(dir, e))?;
    rustix::fs::syncfs(&handle).map_err(|e| Error::cache(dir, e.into()))
}
