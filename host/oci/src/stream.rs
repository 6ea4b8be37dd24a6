//! A payload-sized blob streamed from the registry straight into what consumes it.
//!
//! The download loop (async) appends each chunk to the blob's `.partial` file — kept only so
//! that an interrupted pull resumes with a range request — and hands the same chunk to a
//! consumer on a blocking thread: the cache's verifier for a blob kept as a blob, or the
//! unpacker that builds a payload's tree as the bytes arrive. The consumer reads the
//! partial file's kept prefix first, then the chunks, through one hash: every byte is
//! hashed once, and a payload's bytes are written to the cache once more (its tree), with
//! no second pass over a stored blob. What the consumer builds is committed only with a
//! [`Verified`] token, which only [`BlobReader::verify`] makes — after the whole blob was
//! hashed and matched its digest — so nothing made from wrong bytes is ever kept.

use std::io::{Read, Seek as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::artifact::Descriptor;
use crate::digest::Hashing;
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

/// The bytes of a blob as they arrive: the partial file's kept prefix, then the chunks.
/// A read after the download stopped short is an error, never an early end.
struct Incoming {
    prefix: std::io::Take<std::fs::File>,
    rx: mpsc::Receiver<Piece>,
    chunk: Bytes,
    ended: bool,
}

impl Read for Incoming {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.prefix.read(buf)?;
        if n > 0 || buf.is_empty() {
            return Ok(n);
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

/// The partial file a download appends to: `have` of its `declared` bytes already there.
struct Partial<'a> {
    path: &'a Path,
    file: std::fs::File,
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
    partial: PathBuf,
}

impl Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf)
    }
}

impl BlobReader {
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
            let _ = std::fs::remove_file(&self.partial);
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
    /// The bytes also go to `partial`, so an interrupted pull resumes: a `partial` left by
    /// one is continued with a range request when the registry honours it (its bytes read
    /// again first, through the same hash), started over when it does not, and only read
    /// when it is already whole. On a body past its size, or wrong bytes, `partial` is
    /// removed; on a transport error it is kept for the next try (and that error wins over
    /// what the consumer made of a stream cut short).
    pub(crate) async fn stream_blob<T: Send + 'static>(
        &self,
        pinned: &str,
        descriptor: &Descriptor,
        partial: &Path,
        consume: impl FnOnce(BlobReader) -> Result<(T, Verified)> + Send + 'static,
    ) -> Result<T> {
        let declared = self.payload_size(pinned, descriptor)?;
        let r = parse_reference(pinned)?;
        let cache_error = |e: std::io::Error| Error::cache(partial, e);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(partial)
            .map_err(cache_error)?;
        let mut have = file.metadata().map_err(cache_error)?.len();
        if have > declared {
            file.set_len(0).map_err(cache_error)?;
            have = 0;
        }
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
                file.set_len(0).map_err(cache_error)?;
                have = 0;
            }
            file.seek(std::io::SeekFrom::Start(have))
                .map_err(cache_error)?;
            response = Some(got);
        }
        let prefix = std::fs::File::open(partial).map_err(cache_error)?;
        let (tx, rx) = mpsc::channel(IN_FLIGHT);
        let reader = BlobReader {
            inner: Hashing::new(Incoming {
                prefix: prefix.take(have),
                rx,
                chunk: Bytes::new(),
                ended: false,
            }),
            reference: pinned.into(),
            digest: descriptor.digest.clone(),
            partial: partial.to_path_buf(),
        };
        let consumer = tokio::task::spawn_blocking(move || consume(reader));
        let downloaded = match response {
            None => Ok(()),
            Some(response) => {
                let to = Partial {
                    path: partial,
                    file,
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
            path: partial.display().to_string(),
            source: std::io::Error::other(e),
        })?;
        downloaded?;
        consumed.map(|(out, Verified(()))| out)
    }
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
        self.stream_blob(pinned, descriptor, partial, move |reader| {
            let verified = reader.verify()?;
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| Error::cache(&path, e))?;
            Ok(((), verified))
        })
        .await
    }
}

/// The download loop of [`Registry::stream_blob`]: each chunk appended to `file` (from
/// byte `have` on), then handed to the consumer. A consumer that stopped (it failed) ends
/// the download early: its error is the one reported.
async fn download(
    pinned: &str,
    descriptor: &Descriptor,
    mut response: reqwest::Response,
    to: Partial<'_>,
    tx: &mpsc::Sender<Piece>,
) -> Result<()> {
    let Partial {
        path: partial,
        mut file,
        have,
        declared,
    } = to;
    let mut got = have;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                got += chunk.len() as u64;
                if got > declared {
                    let _ = std::fs::remove_file(partial);
                    return Err(Error::TooLarge {
                        reference: pinned.into(),
                        what: "layer (past its declared size)".into(),
                        size: got,
                        limit: declared,
                    });
                }
                // Page-cache writes of one chunk: short enough to do in place.
                file.write_all(&chunk)
                    .map_err(|e| Error::cache(partial, e))?;
                if tx.send(Piece::Chunk(chunk)).await.is_err() {
                    return Ok(());
                }
            }
            Ok(None) => break,
            Err(e) => {
                return Err(Error::Unavailable {
                    reference: pinned.into(),
                    detail: format!(
                        "reading layer {} stopped at {got} of {declared} bytes (kept; the next pull resumes): {e}",
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
                "layer {} ended at {got} of {declared} bytes (kept; the next pull resumes)",
                descriptor.digest
            ),
        });
    }
    Ok(())
}
