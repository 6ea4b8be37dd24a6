//! Content digests: `sha256:<hex>`, the only algorithm accepted.

use sha2::{Digest, Sha256};

/// `sha256:<hex>` of bytes.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
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
