//! Payloads from existing container images: the image a package names, pinned by digest
//! (an image index narrowed to this node's platform), its layers streamed into the node
//! cache like any payload layer, and applied in order into one read-only tree
//! ([`crate::layers`]), kept under `trees/sha256/<key>` where the key hashes the platform
//! manifest's digest and the path taken from the image.

use std::path::{Path, PathBuf};

use nodewright_api::payload::ImagePayload;
use nodewright_api::pinned::PinnedRef;
use serde::Deserialize;

use crate::artifact::{Descriptor, Manifest};
use crate::cache::Keeps;
use crate::digest::sha256_digest;
use crate::error::{Error, Result};
use crate::layers::{self, Applied, Compression};
use crate::payload::{Payload, UnpackLimits};
use crate::progress::Progress;
use crate::pull::{PulledPayload, Puller};
use crate::registry::{RESOLVE_TYPES, parse_reference};

/// An image index (or a Docker manifest list): one manifest per platform.
#[derive(Debug, Deserialize)]
struct Index {
    manifests: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
struct Entry {
    digest: String,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Debug, Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

/// The OCI architecture this node runs (`amd64`, `arm64`, …).
pub fn this_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

impl Puller {
    /// Stages the payload `image` names: its tree from the cache, else the image's layers
    /// fetched (one download per layer on a node, resumable, verified) and applied in order.
    pub async fn stage_image(
        &self,
        image: &ImagePayload,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<PulledPayload> {
        let reference = image.image.as_str();
        self.registry()
            .bounded(reference, self.stage_image_unbounded(image, progress))
            .await
    }

    /// The layers of the image `image` names for this node's platform, with that
    /// platform manifest's digest — each a layer this node can apply (a plain or
    /// gzip-compressed tar), else an error naming it. What the operator checks an image
    /// payload with before any node stages it.
    pub async fn image_layers(&self, image: &PinnedRef) -> Result<(String, Vec<Descriptor>)> {
        self.registry()
            .bounded(image.as_str(), self.layers_unbounded(image.as_str()))
            .await
    }

    async fn layers_unbounded(&self, reference: &str) -> Result<(String, Vec<Descriptor>)> {
        let (digest, manifest) = self.platform_manifest(reference).await?;
        if let Some(layer) = manifest
            .layers
            .iter()
            .find(|l| Compression::of(&l.media_type).is_none())
        {
            return Err(Error::InvalidArtifact {
                reference: reference.into(),
                reason: format!(
                    "layer {} has media type {:?}; a payload image's layers must be tars, plain or gzip-compressed",
                    layer.digest, layer.media_type
                ),
            });
        }
        Ok((digest, manifest.layers))
    }

    async fn stage_image_unbounded(
        &self,
        image: &ImagePayload,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<PulledPayload> {
        let reference = image.image.as_str();
        // Within `stage_image`'s one deadline.
        let (digest, layers) = self.layers_unbounded(reference).await?;
        let key = crate::gc::image_tree_key(&digest, &image.path);
        let size = Descriptor::total(&layers);
        let staged = |tree: PathBuf, from_cache: bool| PulledPayload {
            name: image.name.clone(),
            digest: digest.clone(),
            size,
            tree,
            from_cache,
        };
        if let Some(tree) = self.cache().tree(&key)? {
            progress(Progress::Cached {
                what: "payload",
                digest: digest.clone(),
            });
            return Ok(staged(tree, true));
        }
        let missing: Vec<Payload> = layers
            .iter()
            .filter(|l| !self.cache().has_blob(&l.digest))
            .map(|l| Payload {
                name: image.name.clone(),
                layer: l.clone(),
            })
            .collect();
        for p in &missing {
            self.registry().payload_size(reference, &p.layer)?;
        }
        self.cache().room_for(
            reference,
            &missing.iter().collect::<Vec<_>>(),
            Keeps::LayersAndTree,
            &self.registry().limits(),
        )?;
        let mut fetched = false;
        for layer in &layers {
            fetched |= self.blob_to_cache(reference, layer, progress).await?;
        }
        let tree = self.cache().make_tree(&key, |into| {
            let mut applied = Applied::default();
            for layer in &layers {
                self.apply(reference, image, layer, into, &mut applied)?;
            }
            progress(Progress::Applied {
                digest: digest.clone(),
                summary: applied.summary(),
            });
            Ok(())
        })?;
        Ok(staged(tree, !fetched))
    }

    /// One cached layer applied onto the tree being made, decompressed as its media type
    /// says, its blob hashed as it is read.
    fn apply(
        &self,
        reference: &str,
        image: &ImagePayload,
        layer: &Descriptor,
        into: &Path,
        applied: &mut Applied,
    ) -> Result<()> {
        let limits = UnpackLimits::default();
        let name = image.name.as_str();
        let unsafe_payload = |source| Error::UnsafePayload {
            reference: reference.into(),
            source,
        };
        match Compression::of(&layer.media_type) {
            Some(Compression::Gzip) => self.cache().read_blob(&layer.digest, |blob| {
                let gz = flate2::read::GzDecoder::new(blob);
                layers::apply_layer(name, gz, into, &image.path, limits, applied)
            })?,
            _ => self.cache().read_blob(&layer.digest, |blob| {
                layers::apply_layer(name, blob, into, &image.path, limits, applied)
            })?,
        }
        .map_err(unsafe_payload)
    }

    /// The image manifest `reference` names for this node: the manifest itself, or the
    /// entry of an index for `linux/<this architecture>`, fetched by its digest. Both are
    /// verified against their digests and kept in the cache.
    async fn platform_manifest(&self, reference: &str) -> Result<(String, Manifest)> {
        let pinned = parse_reference(reference)?;
        let top = pinned
            .digest()
            .ok_or_else(|| Error::NotPinned {
                reference: reference.into(),
            })?
            .to_string();
        let raw = self.manifest_by_digest(reference, &top).await?;
        let value: serde_json::Value =
            serde_json::from_slice(&raw).map_err(|e| Error::InvalidArtifact {
                reference: reference.into(),
                reason: format!("the image manifest is not JSON: {e}"),
            })?;
        if value.get("manifests").is_none() {
            return Ok((top, image_manifest(reference, &raw)?));
        }
        let index: Index = serde_json::from_value(value).map_err(|e| Error::InvalidArtifact {
            reference: reference.into(),
            reason: format!("the image index does not parse: {e}"),
        })?;
        let arch = this_architecture();
        let entry = index
            .manifests
            .iter()
            .find(|m| {
                m.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == arch)
            })
            .ok_or_else(|| Error::InvalidArtifact {
                reference: reference.into(),
                reason: format!(
                    "the image index has no linux/{arch} image (it has {})",
                    platforms(&index)
                ),
            })?;
        let raw = self.manifest_by_digest(reference, &entry.digest).await?;
        Ok((entry.digest.clone(), image_manifest(reference, &raw)?))
    }

    /// A manifest or index by digest: from the cache, else fetched (as any image manifest
    /// type), checked against the digest and cached.
    async fn manifest_by_digest(&self, reference: &str, digest: &str) -> Result<Vec<u8>> {
        if let Ok(Some(raw)) = self.cache().manifest(digest) {
            return Ok(raw);
        }
        let repo = reference.split_once('@').map_or(reference, |(r, _)| r);
        let at = format!("{repo}@{digest}");
        let r = parse_reference(&at)?;
        let raw = self
            .registry()
            .manifest_body(&at, &r, RESOLVE_TYPES)
            .await?;
        let actual = sha256_digest(&raw);
        if actual != digest {
            return Err(Error::DigestMismatch {
                reference: at,
                what: "manifest".into(),
                expected: digest.into(),
                actual,
            });
        }
        self.cache().put_manifest(digest, &raw)?;
        Ok(raw)
    }
}

fn image_manifest(reference: &str, raw: &[u8]) -> Result<Manifest> {
    serde_json::from_slice(raw).map_err(|e| Error::InvalidArtifact {
        reference: reference.into(),
        reason: format!("the image manifest does not parse: {e}"),
    })
}

fn platforms(index: &Index) -> String {
    let list: Vec<String> = index
        .manifests
        .iter()
        .filter_map(|m| m.platform.as_ref())
        .map(|p| format!("{}/{}", p.os, p.architecture))
        .collect();
    if list.is_empty() {
        "no platforms".into()
    } else {
        list.join(", ")
    }
}
