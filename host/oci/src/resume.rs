//! Resuming a payload's download from its half-built tree, with no copy of the bytes.
//!
//! A payload layer is an uncompressed tar, unpacked as it downloads into a staging
//! directory (`trees/sha256/.<hex>.staging`). Every [`EVERY`] bytes or so, at the first
//! boundary between two tar entries past that, a checkpoint is taken: the stream's offset
//! there, the SHA-256 state at that offset and what the tree holds ([`Made`]); on a thread
//! of its own the staging tree is synced to disk, then `blobs/sha256/<hex>.checkpoint` is
//! written atomically with that record. A pull cut off after that re-opens the staging tree, removes what
//! was written after the checkpoint ([`crate::payload::prune`]), restores the hash and asks
//! the registry for the rest with a range request. The final digest check covers every byte
//! as before — the restored state hashed the bytes before the checkpoint when they arrived —
//! so a checkpoint that lies about the hash ends in a digest mismatch, and the tree is
//! thrown away.
//!
//! This replaces keeping a `.partial` copy of the layer beside the tree (a second gigabyte
//! written for a 1 GiB payload, see docs/artifacts.md).

use std::cell::RefCell;
use std::io::{Read, Write as _};
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use nodewright_api::payload::PayloadName;
use serde::{Deserialize, Serialize};

use crate::cache::NodeCache;
use crate::digest::HashState;
use crate::error::{Error, Result};
use crate::payload::{self, Boundaries, Made, UnpackLimits};
use crate::pull::durable;
use crate::stream::{BlobReader, Verified};

/// Bytes of stream between checkpoints (at least: each is taken at the next entry boundary).
pub(crate) const EVERY: u64 = 256 << 20;

/// Where a payload's download can go on from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    /// Bytes of the layer taken, up to a boundary between entries.
    pub(crate) offset: u64,
    /// The hash of those bytes, part way.
    pub(crate) hash: HashState,
    /// What the staging tree holds.
    pub(crate) made: Made,
}

/// The file form of a [`Checkpoint`]; it names its layer so one is never used for another.
#[derive(Serialize, Deserialize)]
struct Record {
    digest: String,
    offset: u64,
    sha256_state: String,
    made: Made,
}

impl Checkpoint {
    /// The checkpoint at `path` for layer `digest` of `declared` bytes, when there is one
    /// that can be resumed from: its file parses, names this layer, its offset is a tar
    /// boundary inside the layer, its hash state is one, and `staging` is there. Anything
    /// else is removed (said in the log), and the pull starts over.
    pub(crate) fn load(path: &Path, digest: &str, declared: u64, staging: &Path) -> Option<Self> {
        let raw = match std::fs::read(path) {
            Ok(raw) => raw,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => return discard(path, &format!("unreadable: {e}")),
        };
        let Ok(record) = serde_json::from_slice::<Record>(&raw) else {
            return discard(path, "not a checkpoint");
        };
        if record.digest != digest {
            return discard(path, &format!("names layer {}", record.digest));
        }
        if record.offset == 0 || record.offset >= declared || record.offset % 512 != 0 {
            let why = format!("offset {} is no entry boundary", record.offset);
            return discard(path, &why);
        }
        let Some(hash) = HashState::from_hex(&record.sha256_state) else {
            return discard(path, "its hash state is not one");
        };
        if !staging.is_dir() {
            return discard(path, "its staging tree is gone");
        }
        Some(Checkpoint {
            offset: record.offset,
            hash,
            made: record.made,
        })
    }

    /// Writes the checkpoint for layer `digest` to `path`: a new file, synced, renamed over
    /// the last one, so a crash leaves one whole checkpoint or the one before.
    fn save(&self, path: &Path, digest: &str) -> std::io::Result<()> {
        let record = Record {
            digest: digest.into(),
            offset: self.offset,
            sha256_state: self.hash.to_hex(),
            made: self.made.clone(),
        };
        let tmp = path.with_extension("checkpoint.tmp");
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&serde_json::to_vec(&record).map_err(std::io::Error::other)?)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    }
}

fn discard(path: &Path, why: &str) -> Option<Checkpoint> {
    tracing::warn!(path = %path.display(), why, "not resuming from a download checkpoint");
    let _ = std::fs::remove_file(path);
    None
}

/// The stream an unpacker reads, shared with the [`Checkpoints`] that mark it.
pub(crate) struct Shared<'a>(pub(crate) &'a RefCell<BlobReader>);

impl Read for Shared<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().read(buf)
    }
}

/// Takes a checkpoint of an unpack into `staging` every `every` bytes or so. Making one
/// durable — a sync of the staging tree, then the record — runs on a thread of its own, so
/// the unpack never waits for the disk: what it writes after the boundary meanwhile is not
/// in the record, and a resumed pull prunes it. One is made at a time, in order; a boundary
/// reached while one is still being made is passed over for the next. Dropping this waits
/// for the one being made, so none is written after the unpack's end.
pub(crate) struct Checkpoints<'a> {
    stream: &'a RefCell<BlobReader>,
    /// Where this unpack's tar starts in the layer.
    base: u64,
    staging: PathBuf,
    file: PathBuf,
    digest: String,
    every: u64,
    /// The offset of the last checkpoint taken (or where the stream started).
    last: u64,
    writing: Option<std::thread::JoinHandle<()>>,
}

impl<'a> Checkpoints<'a> {
    /// Checkpoints of layer `digest`'s unpack into `staging`, read from `stream` (which
    /// starts at `base`), kept in `file`.
    pub(crate) fn new(
        stream: &'a RefCell<BlobReader>,
        base: u64,
        staging: &Path,
        file: &Path,
        digest: &str,
        every: u64,
    ) -> Self {
        Checkpoints {
            stream,
            base,
            staging: staging.to_path_buf(),
            file: file.to_path_buf(),
            digest: digest.to_string(),
            every: every.max(1),
            last: base,
            writing: None,
        }
    }

    fn wait(&mut self) {
        if let Some(writing) = self.writing.take() {
            let _ = writing.join();
        }
    }
}

impl Drop for Checkpoints<'_> {
    fn drop(&mut self) {
        self.wait();
    }
}

impl Boundaries for Checkpoints<'_> {
    fn ended(&mut self, offset: u64) {
        let offset = self.base + offset;
        if offset - self.last >= self.every {
            self.stream.borrow_mut().mark(offset);
        }
    }

    fn before_next(&mut self, made: &Made) {
        let Some((offset, hash)) = self.stream.borrow_mut().state_at_mark() else {
            return;
        };
        if self.writing.as_ref().is_some_and(|w| !w.is_finished()) {
            return;
        }
        self.wait();
        self.last = offset;
        let checkpoint = Checkpoint {
            offset,
            hash,
            made: made.clone(),
        };
        let (staging, file, digest) =
            (self.staging.clone(), self.file.clone(), self.digest.clone());
        self.writing = Some(std::thread::spawn(move || {
            // The files the record lists are on disk before it is.
            let saved = durable(&staging)
                .map_err(|e| e.to_string())
                .and_then(|()| checkpoint.save(&file, &digest).map_err(|e| e.to_string()));
            // Only resuming is lost; the unpack goes on.
            if let Err(e) = saved {
                tracing::warn!(path = %file.display(), "a download checkpoint was not written: {e}");
            }
        }));
    }
}

/// A plugin payload's tree built from its layer's stream, in the staging directory a
/// cut-off download resumes in (see `resume`).
pub(crate) struct Build {
    pub(crate) cache: NodeCache,
    pub(crate) name: PayloadName,
    pub(crate) digest: String,
    pub(crate) reference: String,
    pub(crate) staging: PathBuf,
    pub(crate) checkpoint_file: PathBuf,
    /// What the last pull left, if it can be resumed from.
    pub(crate) checkpoint: Option<Checkpoint>,
    pub(crate) limits: UnpackLimits,
    pub(crate) every: u64,
}

impl Build {
    /// Unpacks the stream into the staging tree — going on from the checkpoint when the
    /// registry honoured its range, else from an emptied tree — then, once the whole layer
    /// matched its digest, syncs the tree and renames it into place.
    pub(crate) fn run(self, reader: BlobReader) -> Result<(PathBuf, Verified)> {
        let cache = self.cache.clone();
        let mut proof = None;
        let mut reader = Some(reader);
        let tree = cache.build_tree(&self.digest, &self.staging.clone(), |staging| {
            let reader = reader.take().expect("the tree is built once");
            let start = reader.start();
            let made = match self.checkpoint {
                Some(c) if start > 0 && start == c.offset => {
                    payload::prune(staging, &c.made).map_err(|e| Error::cache(staging, e))?;
                    c.made
                }
                _ => {
                    self.cache.discard_staging(&self.digest)?;
                    std::fs::DirBuilder::new()
                        .mode(0o755)
                        .create(staging)
                        .map_err(|e| Error::cache(staging, e))?;
                    Made::default()
                }
            };
            let stream = RefCell::new(reader);
            let mut points = Checkpoints::new(
                &stream,
                start,
                staging,
                &self.checkpoint_file,
                &self.digest,
                self.every,
            );
            let unpacked = payload::unpack_from(
                &self.name,
                Shared(&stream),
                staging,
                self.limits,
                made,
                &mut points,
            );
            // No checkpoint is written after this.
            drop(points);
            // Wrong bytes are reported as such, whatever the unpacking made of them.
            proof = Some(stream.into_inner().verify()?);
            unpacked.map_err(|source| Error::UnsafePayload {
                reference: self.reference,
                source,
            })?;
            let _ = std::fs::remove_file(&self.checkpoint_file);
            durable(staging)
        })?;
        let proof = match (proof, reader) {
            (Some(p), _) => p,
            // Made by another process first: the stream is still checked whole.
            (None, Some(r)) => r.verify()?,
            (None, None) => unreachable!("a failed build returned its error"),
        };
        Ok((tree, proof))
    }
}
