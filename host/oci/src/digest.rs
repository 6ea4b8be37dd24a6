//! Content digests: `sha256:<hex>`, the only algorithm accepted.

use sha2_resumable::digest::common::hazmat::SerializableState as _;
use sha2_resumable::{Digest, Sha256};

/// `sha256:<hex>` of bytes.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// `sha256:<hex>` of what `hasher` has seen.
pub(crate) fn finish(hasher: Sha256) -> String {
    format!("sha256:{}", hex::encode(hasher.finalize()))
}

/// A reader or writer that hashes and counts what passes through it: the digest of a
/// stream (a blob as it is unpacked, a tar as it is written) without holding it.
pub(crate) struct Hashing<T> {
    pub(crate) inner: T,
    hasher: Sha256,
    /// Bytes passed through.
    pub(crate) size: u64,
}

/// A hash part way through a stream, as bytes to keep: SHA-256's chaining values, the
/// blocks counted, and the bytes of the block not yet complete (the crate's own
/// serialisation). What a download checkpoint restores to go on hashing from its offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HashState(Vec<u8>);

impl HashState {
    /// The state as hex, for a checkpoint file.
    pub(crate) fn to_hex(&self) -> String {
        hex::encode(&self.0)
    }

    /// A state read back from [`HashState::to_hex`]; `None` when it is not one.
    pub(crate) fn from_hex(text: &str) -> Option<Self> {
        let bytes = hex::decode(text).ok()?;
        Self::hasher(&bytes).map(|_| HashState(bytes))
    }

    fn hasher(bytes: &[u8]) -> Option<Sha256> {
        Sha256::deserialize(bytes.try_into().ok()?).ok()
    }
}

impl<T> Hashing<T> {
    pub(crate) fn new(inner: T) -> Self {
        Hashing {
            inner,
            hasher: Sha256::new(),
            size: 0,
        }
    }

    /// Goes on hashing from `state`, taken after `size` bytes of the stream.
    pub(crate) fn resume(inner: T, state: &HashState, size: u64) -> Self {
        let hasher = HashState::hasher(&state.0).expect("a HashState is a valid state");
        Hashing {
            inner,
            hasher,
            size,
        }
    }

    /// The hash as it stands, to resume from with [`Hashing::resume`].
    pub(crate) fn state(&self) -> HashState {
        HashState(self.hasher.serialize().to_vec())
    }

    /// `sha256:<hex>` of what passed, and the inner reader or writer.
    pub(crate) fn finish(self) -> (String, T) {
        (finish(self.hasher), self.inner)
    }

    fn saw(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
    }
}

impl<R: std::io::Read> std::io::Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.saw(&buf[..n]);
        Ok(n)
    }
}

impl<W: std::io::Write> std::io::Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.saw(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Splits `sha256:<64 hex>`; anything else is not a digest we accept.
pub fn parse_digest(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then_some(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests() {
        let d = sha256_digest(b"");
        assert_eq!(
            d,
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert!(parse_digest(&d).is_some());
        assert!(parse_digest("sha256:ABC").is_none());
        assert!(parse_digest("sha512:00").is_none());
        assert!(
            parse_digest("sha256:../../etc/passwd0000000000000000000000000000000000000000000000")
                .is_none()
        );
    }

    /// A hash stopped anywhere (inside a block too), kept as hex and resumed, ends at the
    /// digest of the whole stream; a state that is not one is refused.
    #[test]
    fn a_hash_resumes_from_its_kept_state() {
        use std::io::Read as _;
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
        for at in [0, 1, 63, 64, 512, 4_097, 10_000] {
            let mut first = Hashing::new(&data[..at]);
            std::io::copy(&mut first, &mut std::io::sink()).unwrap();
            let kept = HashState::from_hex(&first.state().to_hex()).expect("a kept state");
            let mut rest = Hashing::resume(&data[at..], &kept, at as u64);
            let mut tail = Vec::new();
            rest.read_to_end(&mut tail).unwrap();
            assert_eq!(rest.size, data.len() as u64);
            assert_eq!(rest.finish().0, sha256_digest(&data), "stopped at {at}");
        }
        assert!(HashState::from_hex("00").is_none());
        assert!(HashState::from_hex("not hex").is_none());
    }
}
