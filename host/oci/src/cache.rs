//! The node's content-addressed plugin cache.
//!
//! ```text
//! <root>/blobs/sha256/<hex>        component layers (and configs), image payload layers
//! <root>/blobs/sha256/<hex>.partial  an image payload's layer while it downloads (resumed from)
//! <root>/blobs/sha256/<hex>.checkpoint  where a plugin payload's cut-off download resumes
//! <root>/manifests/sha256/<hex>    manifests, by manifest digest
//! <root>/trees/sha256/<hex>        payload layers unpacked (read-only files), by layer digest
//! <root>/trees/sha256/.<hex>.staging  a plugin payload's tree while it downloads
//! <root>/code/                     the engine's precompiled code (see nodewright-engine)
//! <root>/locks/sha256/<hex>        held by the one process downloading a payload layer
//! <root>/.lock                     shared by readers and writers, exclusive for gc
//! ```
//!
//! Guarantees:
//! - a file or tree is only ever visible complete (written to a temp name, then renamed);
//! - a plugin's payload tree is unpacked from the registry's stream as it arrives, hashed
//!   once, synced to disk and kept only when the whole layer matched its digest — the tree
//!   is what stays, not the blob beside it; a tree once made is used as it is (the cache is
//!   root's, mode 0700);
//! - every load re-hashes the content; a mismatch moves the file aside and is an error, so
//!   a corrupted or tampered file is never used (the puller then fetches it again);
//! - any number of processes may read and write at once (identical content under identical
//!   names), and one at a time downloads a payload layer (the others wait for its tree);
//!   the empty lock files stay, since removing one another process waits on would let a
//!   third take a new one beside it; garbage collection takes the lock exclusively and removes only what is not in
//!   the keep-set it is given.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::digest::{Hashing, parse_digest, sha256_digest};
use crate::error::{Error, Result};
use crate::payload::{self, Payload, UnpackLimits};

/// The node cache.
#[derive(Clone, Debug)]
pub struct NodeCache {
    root: PathBuf,
}

#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Blob,
    Manifest,
}

impl Kind {
    pub(crate) fn dir(self) -> &'static str {
        match self {
            Kind::Blob => "blobs/sha256",
            Kind::Manifest => "manifests/sha256",
        }
    }
}

/// Where payload trees live.
pub(crate) const TREES: &str = "trees/sha256";
const LOCKS: &str = "locks/sha256";

/// What staging a payload keeps in the node cache ([`NodeCache::room_for`] counts it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keeps {
    /// Its tree only: a plugin's payload is unpacked as it downloads, with no copy of its
    /// layer.
    Tree,
    /// Its layers as blobs, and the tree made of them: an image payload.
    LayersAndTree,
}

impl std::fmt::Display for Keeps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Keeps::Tree => "its unpacked tree",
            Keeps::LayersAndTree => "its layers and its unpacked tree",
        })
    }
}

impl NodeCache {
    /// Opens (creating, mode 0700) the cache at `root`.
    pub fn open(root: &Path) -> Result<Self> {
        for dir in [Kind::Blob.dir(), Kind::Manifest.dir(), TREES, LOCKS, "code"] {
            let d = root.join(dir);
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&d)
                .map_err(|e| Error::cache(&d, e))?;
        }
        Ok(NodeCache {
            root: root.to_path_buf(),
        })
    }

    /// The cache root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the engine keeps precompiled code for these blobs.
    pub fn code_dir(&self) -> PathBuf {
        self.root.join("code")
    }

    pub(crate) fn lock(&self, exclusive: bool) -> Result<File> {
        locked(&self.root.join(".lock"), exclusive)
    }

    fn lock_path(&self, digest: &str) -> Result<PathBuf> {
        let hex = parse_digest(digest).ok_or_else(|| Error::InvalidArtifact {
            reference: digest.into(),
            reason: "not a sha256 digest".into(),
        })?;
        Ok(self.root.join(LOCKS).join(hex))
    }

    pub(crate) fn path(&self, kind: Kind, digest: &str) -> Result<PathBuf> {
        let hex = parse_digest(digest).ok_or_else(|| Error::InvalidArtifact {
            reference: digest.into(),
            reason: "not a sha256 digest".into(),
        })?;
        Ok(self.root.join(kind.dir()).join(hex))
    }

    fn load(&self, kind: Kind, digest: &str) -> Result<Option<Vec<u8>>> {
        let path = self.path(kind, digest)?;
        let _guard = self.lock(false)?;
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::cache(&path, e)),
        };
        let actual = sha256_digest(&bytes);
        if actual != digest {
            let aside = path.with_extension("corrupt");
            let _ = std::fs::rename(&path, &aside);
            tracing::warn!(%digest, %actual, path = %path.display(), "cached file does not match its digest; moved aside");
            return Err(Error::CacheCorrupt {
                digest: digest.into(),
                actual,
            });
        }
        Ok(Some(bytes))
    }

    fn store(&self, kind: Kind, digest: &str, bytes: &[u8]) -> Result<()> {
        let actual = sha256_digest(bytes);
        if actual != digest {
            return Err(Error::DigestMismatch {
                reference: digest.into(),
                what: "content to cache".into(),
                expected: digest.into(),
                actual,
            });
        }
        let path = self.path(kind, digest)?;
        let _guard = self.lock(false)?;
        nodewright_api::atomic::write(&path, bytes).map_err(|e| Error::cache(&path, e))
    }

    /// A blob, re-hashed; `None` when absent.
    pub fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        self.load(Kind::Blob, digest)
    }

    /// Stores a blob after checking it hashes to `digest`.
    pub fn put_blob(&self, digest: &str, bytes: &[u8]) -> Result<()> {
        self.store(Kind::Blob, digest, bytes)
    }

    /// A manifest, re-hashed; `None` when absent.
    pub fn manifest(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        self.load(Kind::Manifest, digest)
    }

    /// Stores a manifest after checking it hashes to `digest`.
    pub fn put_manifest(&self, digest: &str, bytes: &[u8]) -> Result<()> {
        self.store(Kind::Manifest, digest, bytes)
    }

    /// Where a payload blob kept as a blob (an image payload's layer) downloads to before
    /// it is complete (kept between pulls, so an interrupted download resumes).
    pub fn partial_path(&self, digest: &str) -> Result<PathBuf> {
        Ok(self.path(Kind::Blob, digest)?.with_extension("partial"))
    }

    /// Where a plugin payload's download keeps its last checkpoint (see `resume`).
    pub fn checkpoint_path(&self, digest: &str) -> Result<PathBuf> {
        Ok(self.path(Kind::Blob, digest)?.with_extension("checkpoint"))
    }

    /// Where a plugin payload's tree is built while it downloads (kept, with its
    /// checkpoint, between pulls): `trees/sha256/.<hex>.staging`.
    pub fn staging_path(&self, digest: &str) -> Result<PathBuf> {
        let tree = self.tree_path(digest)?;
        let hex = tree.file_name().unwrap_or_default().to_string_lossy();
        Ok(tree.with_file_name(format!(".{hex}.staging")))
    }

    /// Removes what a cut-off download of payload `digest` kept to resume from.
    pub(crate) fn discard_staging(&self, digest: &str) -> Result<()> {
        let _ = std::fs::remove_file(self.checkpoint_path(digest)?);
        let staging = self.staging_path(digest)?;
        match std::fs::remove_dir_all(&staging) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::cache(&staging, e)),
            _ => Ok(()),
        }
    }

    /// Holds the download of one payload blob for this process: an exclusive lock on
    /// `locks/sha256/<hex>`, taken blocking, released when the file is dropped. Two stages
    /// or prestages on one node sharing a layer would otherwise append to one `.partial`
    /// together; the second waits, then finds the tree the first left.
    pub fn lock_download(&self, digest: &str) -> Result<File> {
        locked(&self.lock_path(digest)?, true)
    }

    /// Whether `payload`'s tree is here.
    pub fn has_tree(&self, payload: &Payload) -> bool {
        self.tree(&payload.layer.digest).is_ok_and(|t| t.is_some())
    }

    /// Refuses (before a byte is fetched) `payloads` whose staging — what `keeps` says —
    /// would leave fewer than `limits.min_free_bytes` free on the cache's filesystem, or take
    /// the cache past `limits.cache_quota`. A tree is counted as large as its layer; what a
    /// layer's partial download already holds counts as there (a tree's checkpointed part
    /// does not: the count errs on the safe side by at most that).
    pub fn room_for(
        &self,
        reference: &str,
        payloads: &[&Payload],
        keeps: Keeps,
        limits: &crate::PullLimits,
    ) -> Result<()> {
        let (mut size, mut needed) = (0u64, 0u64);
        for payload in payloads {
            let layer = u64::try_from(payload.layer.size).unwrap_or(0);
            size = size.saturating_add(layer);
            needed = needed.saturating_add(layer);
            if keeps == Keeps::LayersAndTree {
                let partial = std::fs::metadata(self.partial_path(&payload.layer.digest)?)
                    .map_or(0, |m| m.len())
                    .min(layer);
                needed = needed.saturating_add(layer - partial);
            }
        }
        let names = || {
            let names: Vec<String> = payloads.iter().map(|p| p.name.to_string()).collect();
            names.join(", ")
        };
        let floor = limits.min_free_bytes;
        let st = rustix::fs::statvfs(&self.root).map_err(|e| Error::cache(&self.root, e.into()))?;
        let available = st.f_bavail.saturating_mul(st.f_frsize);
        if available < needed.saturating_add(floor) {
            return Err(Error::NoRoom {
                reference: reference.into(),
                payload: names(),
                keeps,
                size,
                needed,
                available,
                floor,
                path: self.root.display().to_string(),
            });
        }
        if let Some(quota) = limits.cache_quota
            && needed > 0
        {
            let used = crate::gc::bytes_under(&self.root);
            if used.saturating_add(needed) > quota {
                return Err(Error::OverQuota {
                    reference: reference.into(),
                    payload: names(),
                    size,
                    needed,
                    used,
                    quota,
                });
            }
        }
        Ok(())
    }

    /// Makes a complete, verified [`NodeCache::partial_path`] the blob.
    pub fn commit_partial(&self, digest: &str) -> Result<()> {
        let blob = self.path(Kind::Blob, digest)?;
        let partial = self.partial_path(digest)?;
        let _guard = self.lock(false)?;
        std::fs::rename(&partial, &blob).map_err(|e| Error::cache(&partial, e))
    }

    /// The read-only tree of `payload`, unpacked from its blob the first time it is asked
    /// for — hashing the blob as it is read, and keeping the tree only when the hash
    /// matches; `None` when the blob is not here. A blob that does not match is moved aside
    /// ([`Error::CacheCorrupt`]: fetch it again); an entry a payload may not hold is
    /// [`Error::UnsafePayload`].
    pub fn payload_tree(
        &self,
        reference: &str,
        payload: &Payload,
        limits: UnpackLimits,
    ) -> Result<Option<PathBuf>> {
        let digest = &payload.layer.digest;
        if let Some(tree) = self.tree(digest)? {
            return Ok(Some(tree));
        }
        if !self.has_blob(digest) {
            return Ok(None);
        }
        self.make_tree(digest, |tmp| {
            self.read_blob(digest, |tar| {
                payload::unpack(&payload.name, tar, tmp, limits)
            })?
            .map(drop)
            .map_err(|source| Error::UnsafePayload {
                reference: reference.into(),
                source,
            })
        })
        .map(Some)
    }

    /// The tree kept under `key` (`sha256:<hex>`: a payload layer's digest, or an image
    /// payload's key), if it was made.
    pub fn tree(&self, key: &str) -> Result<Option<PathBuf>> {
        let tree = self.tree_path(key)?;
        Ok(tree.is_dir().then_some(tree))
    }

    fn tree_path(&self, key: &str) -> Result<PathBuf> {
        let hex = parse_digest(key).ok_or_else(|| Error::InvalidArtifact {
            reference: key.into(),
            reason: "a tree's key is not a sha256 digest".into(),
        })?;
        Ok(self.root.join(TREES).join(hex))
    }

    /// Whether blob `digest` is in the cache (its content is verified when it is read).
    pub fn has_blob(&self, digest: &str) -> bool {
        self.path(Kind::Blob, digest).is_ok_and(|p| p.is_file())
    }

    /// The tree under `key`, made by `build` the first time: into a new directory of ours,
    /// renamed into place only when `build` succeeds (removed when it fails); a tree another
    /// process made first is used as it is.
    pub(crate) fn make_tree(
        &self,
        key: &str,
        build: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<PathBuf> {
        let tree = self.tree_path(key)?;
        let unique = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = tree.file_name().unwrap_or_default().to_string_lossy();
        let tmp = tree.with_file_name(format!(".{name}.{}.{unique}", std::process::id()));
        self.build_tree(key, &tmp, |tmp| {
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(tmp)
                .map_err(|e| Error::cache(tmp, e))?;
            build(tmp).inspect_err(|_| {
                let _ = std::fs::remove_dir_all(tmp);
            })
        })
    }

    /// The tree under `key`, built by `build` in the directory `staging` and renamed into
    /// place when it succeeds; what `build` leaves there when it fails stays (the caller
    /// decides). Under the cache's shared lock, so a collection never removes `staging`
    /// while it is being built.
    pub(crate) fn build_tree(
        &self,
        key: &str,
        staging: &Path,
        build: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<PathBuf> {
        let tree = self.tree_path(key)?;
        let _guard = self.lock(false)?;
        if tree.is_dir() {
            return Ok(tree);
        }
        build(staging)?;
        if let Err(e) = std::fs::rename(staging, &tree) {
            let _ = std::fs::remove_dir_all(staging);
            // Another process made the same tree first.
            if !tree.is_dir() {
                return Err(Error::cache(&tree, e));
            }
        }
        Ok(tree)
    }

    /// Streams blob `digest` through `read`, hashing every byte (what `read` leaves unread
    /// is drained so the hash covers the whole blob). A blob that does not hash to its name
    /// is moved aside and is [`Error::CacheCorrupt`], whatever `read` made of it.
    pub(crate) fn read_blob<T>(
        &self,
        digest: &str,
        read: impl FnOnce(&mut dyn std::io::Read) -> T,
    ) -> Result<T> {
        let blob = self.path(Kind::Blob, digest)?;
        let file = File::open(&blob).map_err(|e| Error::cache(&blob, e))?;
        let mut reader = Hashing::new(std::io::BufReader::with_capacity(1 << 16, file));
        let out = read(&mut reader);
        let drained = std::io::copy(&mut reader, &mut std::io::sink());
        let (actual, _) = reader.finish();
        if actual != digest {
            let _ = std::fs::rename(&blob, blob.with_extension("corrupt"));
            tracing::warn!(%digest, %actual, "cached blob does not match its digest; moved aside");
            return Err(Error::CacheCorrupt {
                digest: digest.into(),
                actual,
            });
        }
        drained.map_err(|e| Error::cache(&blob, e))?;
        Ok(out)
    }
}

/// The lock file `path` (made if missing), locked shared or exclusive, blocking; released
/// when the file is dropped.
fn locked(path: &Path, exclusive: bool) -> Result<File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::cache(path, e))?;
    if exclusive { f.lock() } else { f.lock_shared() }.map_err(|e| Error::cache(path, e))?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_download_of_a_layer_at_a_time_across_cache_handles() {
        let tmp = tempfile::tempdir().unwrap();
        // Two handles on one directory, as two agent processes on one node have.
        let (a, b) = (
            NodeCache::open(tmp.path()).unwrap(),
            NodeCache::open(tmp.path()).unwrap(),
        );
        let d = sha256_digest(b"layer");
        let held = a.lock_download(&d).unwrap();
        let path = a.lock_path(&d).unwrap();
        let probe = File::open(&path).unwrap();
        assert!(
            matches!(probe.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
            "held while the first download runs"
        );
        let other = sha256_digest(b"another layer");
        drop(b.lock_download(&other).unwrap()); // another layer is not held up
        drop(held);
        let second = b.lock_download(&d).unwrap();
        assert!(matches!(
            probe.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        drop(second);
        probe.try_lock().expect("free once both are done");
    }

    #[test]
    fn stores_verifies_and_refuses_corruption() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = NodeCache::open(tmp.path()).unwrap();
        let d = sha256_digest(b"component");
        assert_eq!(cache.blob(&d).unwrap(), None);
        cache.put_blob(&d, b"component").unwrap();
        assert_eq!(cache.blob(&d).unwrap().as_deref(), Some(&b"component"[..]));
        assert!(
            cache.put_blob(&d, b"other").is_err(),
            "content must hash to its name"
        );

        std::fs::write(
            tmp.path()
                .join("blobs/sha256")
                .join(parse_digest(&d).unwrap()),
            b"tampered",
        )
        .unwrap();
        let err = cache.blob(&d).unwrap_err();
        assert!(matches!(err, Error::CacheCorrupt { .. }), "{err}");
        assert_eq!(
            cache.blob(&d).unwrap(),
            None,
            "the corrupt file is moved aside"
        );
        assert!(cache.blob("sha256:../../../etc/passwd").is_err());
    }

    #[test]
    fn concurrent_writers_of_the_same_blob_are_safe() {
        let tmp = tempfile::tempdir().unwrap();
        let data = vec![7u8; 1 << 20];
        let d = sha256_digest(&data);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let cache = NodeCache::open(tmp.path()).unwrap();
                    for _ in 0..10 {
                        cache.put_blob(&d, &data).unwrap();
                        assert_eq!(cache.blob(&d).unwrap().unwrap().len(), data.len());
                    }
                });
            }
        });
    }
}
