//! Content digests: `sha256:<hex>`, the only algorithm accepted.

use sha2::{Digest, Sha256};

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

impl<T> Hashing<T> {
    pub(crate) fn new(inner: T) -> Self {
        Hashing {
            inner,
            hasher: Sha256::new(),
            size: 0,
        }
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
}
