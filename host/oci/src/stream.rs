//! A payload-sized blob streamed from the registry straight into what consumes it.
//!
//! The download loop (async) hands each chunk to a consumer on a blocking thread: the
//! cache's verifier for a blob kept as a blob, or the unpacker that builds a payload's tree
//! as the bytes arrive. What an interrupted pull resumes from is one of two things
//! ([`Resume`]): a blob kept as a blob is also appended to its `.partial` file, which is the
//! blob once whole, and a resumed pull reads that file's bytes again through the hash; a
//! payload's tree keeps no copy of the bytes at all — its unpacker takes checkpoints (the
//! stream's offset and the hash's state at a boundary between tar entries, see `resume`) and
//! a resumed pull restores the hash and asks for the rest. Either way every byte is hashed
//! once and written to the cache once. What the consumer builds is committed only with a
//! [`Verified`] token, which only [`BlobReader::verify`] makes — after the whole blob was
//! hashed and matched its digest — so nothing made from wrong bytes is ever kept.

use std::io::{Read, Seek as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::artifact::Descriptor;
use crate::digest::{HashState, Hashing};
use crate::error::{Error, Result};
use crate::registry::{Registry, parse_reference};

/// Chunks in flight between the download and its consumer (each at most a few hundred
/// KiB): enough to keep both busy, bounded so a slow disk throttles the download.
const IN_FLIGHT: usize = 32;

/// What the download hands its consumer.
enum Piece {
    Chunk(Bytes),
    /// The body ended at its declared size.
    End,
}

/// Where an interrupted download of a blob goes on from.
pub(crate) enum Resume<'a> {
    /// Every byte is also appended to this file (for a blob kept as a blob, the file that
    /// becomes it): a pull resumes from the file's length, reading its bytes again first.
    Copy(&'a Path),
    /// No copy of the bytes is kept: the consumer takes checkpoints, and a pull resumes
    /// from the last one's offset with the hash's state there.
    Checkpoint(Option<(u64, HashState)>),
}

/// The bytes of a blob as they arrive: a kept copy's prefix, if any, then the chunks.
/// A read after the download stopped short is an error, never an early end.
struct Incoming {
    prefix: Option<std::io::Take<std::fs::File>>,
    rx: mpsc::Receiver<Piece>,
    chunk: Bytes,
    ended: bool,
}

impl Read for Incoming {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(prefix) = &mut self.prefix {
            let n = prefix.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
        }
        while self.chunk.is_empty() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Piece::Chunk(c)) => self.chunk = c,
                Some(Piece::End) => self.ended = true,
                None => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the download stopped before the blob's end",
                    ));
                }
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}

/// Where a download goes on: from byte `have` of its `declared` bytes, appending to `copy`
/// (its path and the file) when it keeps one.
struct Partial<'a> {
    copy: Option<(&'a Path, std::fs::File)>,
    have: u64,
    declared: u64,
}

/// Proof that a blob was read whole and matched its digest: what a consumer needs to
/// commit anything it made of the bytes.
#[derive(Debug)]
pub(crate) struct Verified(());

/// A consumer's reader over one blob: every byte hashed as it is read.
pub(crate) struct BlobReader {
    inner: Hashing<Incoming>,
    reference: String,
    digest: String,
    /// The kept copy, removed when the bytes turn out wrong.
    partial: Option<PathBuf>,
    /// Where the consumer's bytes start in the blob.
    start: u64,
    /// An offset to stop a read at, and take the hash's state there.
    mark: Option<u64>,
    taken: Option<(u64, HashState)>,
}

impl Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut len = buf.len();
        if let Some(mark) = self.mark {
            let at = self.inner.size;
            if at == mark {
                self.taken = Some((at, self.inner.state()));
                self.mark = None;
            } else if at < mark {
                len = len.min(usize::try_from(mark - at).unwrap_or(usize::MAX));
            }
        }
        self.inner.read(&mut buf[..len])
    }
}

impl BlobReader {
    /// The offset in the blob of the first byte this reader gives: where a checkpoint the
    /// registry honoured left the stream, else 0.
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    /// Asks for the hash's state at `offset` of the blob (not yet read): no read goes past
    /// it, and the first read from it takes the state ([`BlobReader::state_at_mark`]).
    pub(crate) fn mark(&mut self, offset: u64) {
        self.mark = Some(offset);
        self.taken = None;
    }

    /// The offset marked and the hash's state there, once the stream got that far.
    pub(crate) fn state_at_mark(&mut self) -> Option<(u64, HashState)> {
        self.taken.take()
    }

    /// Reads what is left (a consumer may stop early), then checks the digest. Wrong bytes
    /// remove the partial file (the next pull starts over) and are
    /// [`Error::DigestMismatch`], whatever the consumer made of them.
    pub(crate) fn verify(mut self) -> Result<Verified> {
        let drained = std::io::copy(&mut self.inner, &mut std::io::sink());
        let (actual, _) = self.inner.finish();
        if let Err(e) = drained {
            return Err(Error::Unavailable {
                reference: self.reference,
                detail: format!("layer {}: {e}", self.digest),
            });
        }
        if actual != self.digest {
            if let Some(partial) = &self.partial {
                let _ = std::fs::remove_file(partial);
            }
            return Err(Error::DigestMismatch {
                reference: self.reference,
                what: "layer".into(),
                expected: self.digest,
                actual,
            });
        }
        Ok(Verified(()))
    }
}

impl Registry {
    /// Streams the payload-sized blob `descriptor` of `pinned` into `consume`, run on a
    /// blocking thread: never more than a few chunks in memory, the declared size checked
    /// against the payload limit before the request and against the bytes as they come.
    /// An interrupted pull goes on from where `resume` says, with a range request when the
    /// registry honours it, from the start when it does not (the consumer's
    /// [`BlobReader::start`] says which); a [`Resume::Copy`] file is only read when it is
    /// already whole. On a body past its size, or wrong bytes, a copy is removed; on a
    /// transport error it is kept for the next try (and that error wins over what the
    /// consumer made of a stream cut short).
    pub(crate) async fn stream_blob<T: Send + 'static>(
        &self,
        pinned: &str,
        descriptor: &Descriptor,
        resume: Resume<'_>,
        consume: impl FnOnce(BlobReader) -> Result<(T, Verified)> + Send + 'static,
    ) -> Result<T> {
        let declared = self.payload_size(pinned, descriptor)?;
        let r = parse_reference(pinned)?;
        let (mut copy, mut have, mut state) = match resume {
            Resume::Copy(partial) => {
                let (file, have) = open_copy(partial, declared)?;
                (Some((partial, file)), have, None)
            }
            Resume::Checkpoint(Some((offset, state))) if offset < declared => {
                (None, offset, Some(state))
            }
            Resume::Checkpoint(_) => (None, 0, None),
        };
        let mut response = None;
        if have < declared {
            let path = format!("blobs/{}", descriptor.digest);
            let range = (have > 0).then_some(have);
            let got = match self.get_response(pinned, &r, &path, None, range).await {
                // A range the registry cannot serve: start over.
                Err(Error::Registry { detail, .. })
                    if range.is_some() && detail.contains("416") =>
                {
                    self.get_response(pinned, &r, &path, None, None).await?
                }
                other => other?,
            };
            if have > 0 && got.status() == reqwest::StatusCode::PARTIAL_CONTENT {
                tracing::info!(digest = %descriptor.digest, bytes = have, "resuming an interrupted download");
            } else {
                have = 0;
                state = None;
            }
            if let Some((partial, file)) = &mut copy {
                let error = |e| Error::cache(partial, e);
                file.set_len(have).map_err(error)?;
                file.seek(std::io::SeekFrom::Start(have)).map_err(error)?;
            }
            response = Some(got);
        }
        let (partial, prefix) = match &copy {
            Some((partial, _)) => {
                let prefix = std::fs::File::open(partial).map_err(|e| Error::cache(partial, e))?;
                (Some(partial.to_path_buf()), Some(prefix.take(have)))
            }
            None => (None, None),
        };
        let (tx, rx) = mpsc::channel(IN_FLIGHT);
        let incoming = Incoming {
            prefix,
            rx,
            chunk: Bytes::new(),
            ended: false,
        };
        let reader = BlobReader {
            inner: match &state {
                Some(state) => Hashing::resume(incoming, state, have),
                None => Hashing::new(incoming),
            },
            reference: pinned.into(),
            digest: descriptor.digest.clone(),
            partial,
            start: if copy.is_some() { 0 } else { have },
            mark: None,
            taken: None,
        };
        let consumer = tokio::task::spawn_blocking(move || consume(reader));
        let downloaded = match response {
            None => Ok(()),
            Some(response) => {
                let to = Partial {
                    copy,
                    have,
                    declared,
                };
                download(pinned, descriptor, response, to, &tx).await
            }
        };
        // The end is said only after a whole body; anything else closes the channel short,
        // and the consumer's next read fails.
        if downloaded.is_ok() {
            let _ = tx.send(Piece::End).await;
        }
        drop(tx);
        let consumed = consumer.await.map_err(|e| Error::Cache {
            path: descriptor.digest.clone(),
            source: std::io::Error::other(e),
        })?;
        downloaded?;
        consumed.map(|(out, Verified(()))| out)
    }
}

/// The copy a [`Resume::Copy`] download appends to, and how many of its bytes to keep: all
/// of them unless it is longer than the blob (then none).
fn open_copy(partial: &Path, declared: u64) -> Result<(std::fs::File, u64)> {
    let error = |e| Error::cache(partial, e);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(partial)
        .map_err(error)?;
    let have = file.metadata().map_err(error)?.len();
    if have > declared {
        file.set_len(0).map_err(error)?;
        return Ok((file, 0));
    }
    Ok((file, have))
}

impl Registry {
    /// Fetches a payload-sized blob into `partial` ([`Registry::stream_blob`] with a
    /// consumer that only verifies): on success `partial` holds exactly the blob, synced to
    /// disk, for the cache to rename into place.
    pub async fn fetch_blob_to_file(
        &self,
        pinned: &str,
        descriptor: &Descriptor,
        partial: &Path,
    ) -> Result<()> {
        let path = partial.to_path_buf();
        self.stream_blob(pinned, descriptor, Resume::Copy(partial), move |reader| {
            let verified = reader.verify()?;
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| Error::cache(&path, e))?;
            Ok(((), verified))
        })
        .await
    }
}

/// The download loop of [`Registry::stream_blob`]: each chunk appended to the copy, if one
/// is kept (from byte `have` on), then handed to the consumer. A consumer that stopped (it
/// failed) ends the download early: its error is the one reported.
async fn download(
    pinned: &str,
    descriptor: &Descriptor,
    mut response: reqwest::Response,
    to: Partial<'_>,
    tx: &mpsc::Sender<Piece>,
) -> Result<()> {
    let Partial {
        mut copy,
        have,
        declared,
    } = to;
    let mut got = have;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                got += chunk.len() as u64;
                if got > declared {
                    if let Some((partial, _)) = &copy {
                        let _ = std::fs::remove_file(partial);
                    }
                    return Err(Error::TooLarge {
                        reference: pinned.into(),
                        what: "layer (past its declared size)".into(),
                        size: got,
                        limit: declared,
                    });
                }
                // Page-cache writes of one chunk: short enough to do in place.
                if let Some((partial, file)) = &mut copy {
                    file.write_all(&chunk)
                        .map_err(|e| Error::cache(partial, e))?;
                }
                if tx.send(Piece::Chunk(chunk)).await.is_err() {
                    return Ok(());
                }
            }
            Ok(None) => break,
            Err(e) => {
                return Err(Error::Unavailable {
                    reference: pinned.into(),
                    detail: format!(
                        "reading layer {} stopped at {got} of {declared} bytes (the next pull resumes from what was kept): {e}",
                        descriptor.digest
                    ),
                });
            }
        }
    }
    if got < declared {
        return Err(Error::Unavailable {
            reference: pinned.into(),
            detail: format!(
                "layer {} ended at {got} of {declared} bytes (the next pull resumes from what was kept)",
                descriptor.digest
            ),
        });
    }
    Ok(())
}
