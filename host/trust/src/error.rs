//! What a signing or verification step reports when it fails.

/// A signing or verification step failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A key could not be made, read or opened.
    #[error("{0}")]
    Key(String),
    /// A signature (or its storage) is malformed.
    #[error("{0}")]
    Signature(String),
    /// The registry failed.
    #[error(transparent)]
    Registry(#[from] nodewright_oci::Error),
}
