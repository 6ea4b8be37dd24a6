//! Garbage collection of a node's cache: what no package of the node refers to goes —
//! manifests, blobs, precompiled code and payload trees — unless it was touched within a
//! grace period (a pull or an unpack another process has under way).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, SystemTime};

use nodewright_api::payload::ImagePayload;
use serde::Deserialize;

use crate::cache::{Kind, NodeCache, TREES};
use crate::digest::parse_digest;
use crate::error::{Error, Result};

/// What a node's cache must keep: everything some package of the node refers to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keep {
    /// Pinned manifests by digest: plugins, and the images payloads come from (an index
    /// keeps every image it lists).
    pub manifests: BTreeSet<String>,
    /// Image payloads (their trees; their images are kept through `manifests`).
    pub images: BTreeSet<ImagePayload>,
    /// Nothing changed more recently than this is removed, referred to or not.
    pub grace: Duration,
}

/// What garbage collection did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Manifests and blobs removed, by digest.
    pub removed: Vec<String>,
    /// Payload trees removed.
    pub trees_removed: usize,
    /// Manifests, blobs and trees kept.
    pub kept: usize,
    /// Bytes freed.
    pub freed: u64,
}

/// The part of an image index garbage collection reads.
#[derive(Deserialize)]
struct Listing {
    manifests: Vec<Listed>,
}

#[derive(Deserialize)]
struct Listed {
    digest: String,
}

/// The key of the tree an image payload is unpacked into: the image's manifest for this
/// node's platform and the path taken from it.
pub(crate) fn image_tree_key(platform_manifest: &str, path: &Path) -> String {
    crate::digest::sha256_digest(format!("{platform_manifest}\0{}", path.display()).as_bytes())
}

impl NodeCache {
    /// Removes every manifest `keep` does not name (nor an index it names lists), every
    /// blob no kept manifest references (with its precompiled code), every payload tree
    /// neither a kept layer nor a kept image payload, and leftovers (temp files, files moved
    /// aside as corrupt, unpacks a crash left) — except what changed within `keep.grace`.
    pub fn gc(&self, keep: &Keep) -> Result<GcReport> {
        let _guard = self.lock(true)?;
        let now = SystemTime::now();
        let recent = |path: &Path| {
            std::fs::symlink_metadata(path)
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).map_or(true, |age| age < keep.grace))
        };
        // Read under the exclusive lock: by path, not through the shared-lock readers.
        let read = |digest: &str| {
            self.path(Kind::Manifest, digest)
                .ok()
                .and_then(|p| std::fs::read(p).ok())
        };
        let listed = |digest: &str| -> Vec<String> {
            read(digest)
                .and_then(|raw| serde_json::from_slice::<Listing>(&raw).ok())
                .map(|l| l.manifests.into_iter().map(|m| m.digest).collect())
                .unwrap_or_default()
        };
        let mut manifests = keep.manifests.clone();
        for d in &keep.manifests {
            manifests.extend(listed(d));
        }
        let mut blobs = BTreeSet::new();
        for d in &manifests {
            if let Some(m) = read(d)
                .and_then(|raw| serde_json::from_slice::<crate::artifact::Manifest>(&raw).ok())
            {
                blobs.insert(m.config.digest);
                blobs.extend(m.layers.into_iter().map(|l| l.digest));
            }
        }
        // Trees: a plugin's payload layers by digest, an image payload's by its key.
        let mut trees: BTreeSet<String> = blobs.clone();
        for image in &keep.images {
            let pin = image.image.digest();
            let platforms = match listed(pin) {
                l if l.is_empty() => vec![pin.to_string()],
                l => l,
            };
            trees.extend(platforms.iter().map(|p| image_tree_key(p, &image.path)));
        }
        let mut report = GcReport::default();
        for (kind, kept) in [(Kind::Manifest, &manifests), (Kind::Blob, &blobs)] {
            let dir = self.root().join(kind.dir());
            for entry in std::fs::read_dir(&dir).map_err(|e| Error::cache(&dir, e))? {
                let entry = entry.map_err(|e| Error::cache(&dir, e))?;
                let digest = format!("sha256:{}", entry.file_name().to_string_lossy());
                if kept.contains(&digest) || recent(&entry.path()) {
                    report.kept += 1;
                    continue;
                }
                report.freed += entry.metadata().map_or(0, |m| m.len());
                std::fs::remove_file(entry.path()).map_err(|e| Error::cache(&entry.path(), e))?;
                if parse_digest(&digest).is_some() {
                    if matches!(kind, Kind::Blob) {
                        self.remove_code(&digest);
                    }
                    report.removed.push(digest);
                }
            }
        }
        let dir = self.root().join(TREES);
        for entry in std::fs::read_dir(&dir).map_err(|e| Error::cache(&dir, e))? {
            let entry = entry.map_err(|e| Error::cache(&dir, e))?;
            let key = format!("sha256:{}", entry.file_name().to_string_lossy());
            if trees.contains(&key) || recent(&entry.path()) {
                report.kept += 1;
                continue;
            }
            report.freed += bytes_under(&entry.path());
            std::fs::remove_dir_all(entry.path()).map_err(|e| Error::cache(&entry.path(), e))?;
            report.trees_removed += 1;
        }
        Ok(report)
    }

    /// Precompiled code for a removed layer, under every engine's directory: the code and
    /// its integrity sidecar (BLAKE3; SHA-256 before).
    fn remove_code(&self, digest: &str) {
        let Some(hex) = parse_digest(digest) else {
            return;
        };
        let Ok(engines) = std::fs::read_dir(self.code_dir()) else {
            return;
        };
        for engine in engines.flatten() {
            for suffix in ["cwasm", "cwasm.blake3", "cwasm.sha256"] {
                let _ = std::fs::remove_file(engine.path().join(format!("{hex}.{suffix}")));
            }
        }
    }
}

/// The bytes of the regular files under `dir`.
pub(crate) fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::sha256_digest;

    #[test]
    fn gc_keeps_only_what_kept_manifests_reference() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = NodeCache::open(tmp.path()).unwrap();
        let manifest_for = |layer: &[u8]| {
            let m = crate::artifact::Manifest {
                schema_version: 2,
                media_type: Some(crate::artifact::OCI_MANIFEST.into()),
                artifact_type: None,
                config: crate::artifact::Descriptor::new(
                    crate::artifact::WASM_CONFIG,
                    sha256_digest(b"{}"),
                    2,
                ),
                layers: vec![crate::artifact::Descriptor::new(
                    crate::artifact::WASM_LAYER,
                    sha256_digest(layer),
                    1,
                )],
            };
            serde_json::to_vec(&m).unwrap()
        };
        let (m1, m2) = (manifest_for(b"one"), manifest_for(b"two"));
        for (m, layer) in [(&m1, &b"one"[..]), (&m2, &b"two"[..])] {
            cache.put_manifest(&sha256_digest(m), m).unwrap();
            cache.put_blob(&sha256_digest(layer), layer).unwrap();
        }
        cache.put_blob(&sha256_digest(b"{}"), b"{}").unwrap();
        let keep = Keep {
            manifests: [sha256_digest(&m1)].into(),
            ..Default::default()
        };
        let report = cache.gc(&keep).unwrap();
        assert_eq!(report.removed.len(), 2, "{report:?}");
        assert!(cache.blob(&sha256_digest(b"one")).unwrap().is_some());
        assert!(cache.blob(&sha256_digest(b"{}")).unwrap().is_some());
        assert!(cache.blob(&sha256_digest(b"two")).unwrap().is_none());
        assert!(cache.manifest(&sha256_digest(&m2)).unwrap().is_none());
    }

    /// What a cut-off payload download keeps to resume from — its staging tree and its
    /// checkpoint — is collected once it is past the grace period, like anything unkept.
    #[test]
    fn a_cut_off_downloads_staging_and_checkpoint_are_collected() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = NodeCache::open(tmp.path()).unwrap();
        let digest = sha256_digest(b"payload");
        let staging = cache.staging_path(&digest).unwrap();
        std::fs::create_dir_all(staging.join("lib")).unwrap();
        std::fs::write(staging.join("lib/module.ko"), b"half").unwrap();
        let checkpoint = cache.checkpoint_path(&digest).unwrap();
        std::fs::write(&checkpoint, b"{}").unwrap();
        let recent = Keep {
            grace: Duration::from_secs(3600),
            ..Default::default()
        };
        cache.gc(&recent).unwrap();
        assert!(
            staging.is_dir() && checkpoint.is_file(),
            "kept while recent"
        );
        cache.gc(&Keep::default()).unwrap();
        assert!(!staging.exists() && !checkpoint.exists());
    }
}
