//! Errors, each naming the reference and the reason.

/// An artifact operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The reference does not parse.
    #[error("{reference}: invalid reference: {reason}")]
    InvalidReference {
        /// The reference as given.
        reference: String,
        /// Why.
        reason: String,
    },
    /// A digest was required (node agents pull by digest only).
    #[error(
        "{reference}: not pinned; nodes pull only by digest (repo@sha256:...), resolve the tag first"
    )]
    NotPinned {
        /// The reference.
        reference: String,
    },
    /// The registry could not be reached. Retryable.
    #[error("{reference}: registry unavailable (retryable): {detail}")]
    Unavailable {
        /// The reference.
        reference: String,
        /// Transport detail.
        detail: String,
    },
    /// Credentials are missing or wrong.
    #[error("{reference}: not authorized: {detail}")]
    Unauthorized {
        /// The reference.
        reference: String,
        /// Detail, including which credentials were tried.
        detail: String,
    },
    /// The tag, digest or repository does not exist.
    #[error("{reference}: not found in the registry")]
    NotFound {
        /// The reference.
        reference: String,
    },
    /// Content does not hash to its digest.
    #[error("{reference}: {what} digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        /// The reference.
        reference: String,
        /// `manifest`, `layer`, `cached blob`.
        what: String,
        /// Digest asked for.
        expected: String,
        /// Digest of what arrived.
        actual: String,
    },
    /// The artifact is not a wasm plugin artifact.
    #[error("{reference}: {what} has media type {media_type:?}, expected {expected}")]
    WrongMediaType {
        /// The reference.
        reference: String,
        /// `manifest`, `config`, `layer`.
        what: String,
        /// What was found.
        media_type: String,
        /// What is accepted.
        expected: String,
    },
    /// The manifest is malformed or has the wrong shape (e.g. several layers).
    #[error("{reference}: invalid artifact: {reason}")]
    InvalidArtifact {
        /// The reference.
        reference: String,
        /// Why.
        reason: String,
    },
    /// Any other registry error.
    #[error("{reference}: registry error: {detail}")]
    Registry {
        /// The reference.
        reference: String,
        /// Detail.
        detail: String,
    },
    /// Credentials or CA files could not be read.
    #[error("{path}: {reason}")]
    Config {
        /// File.
        path: String,
        /// Why.
        reason: String,
    },
    /// The node cache failed.
    #[error("plugin cache {path}")]
    Cache {
        /// Path involved.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A blob is larger than the pull limit; nothing was allocated for it.
    #[error("{reference}: the {what} is {size} bytes; the limit is {limit}")]
    TooLarge {
        /// The reference.
        reference: String,
        /// `layer`.
        what: String,
        /// Declared (or received so far) size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The pull did not finish within its deadline (a stalled or trickling registry).
    #[error("{reference}: the pull did not finish within {seconds:.0}s")]
    Deadline {
        /// The reference.
        reference: String,
        /// The deadline.
        seconds: f64,
    },
    /// The node cache's filesystem has no room for a payload (what staging it keeps) with
    /// the free-space floor kept; nothing was fetched.
    #[error(
        "{reference}: payload {payload} ({size} bytes) needs {needed} bytes in {path} ({keeps}) with {floor} left free; {available} are free"
    )]
    NoRoom {
        /// The reference.
        reference: String,
        /// The payload's name.
        payload: String,
        /// What staging it keeps.
        keeps: crate::cache::Keeps,
        /// Its layer's size.
        size: u64,
        /// Bytes it still needs.
        needed: u64,
        /// Bytes free now.
        available: u64,
        /// Bytes that must stay free.
        floor: u64,
        /// The cache's root.
        path: String,
    },
    /// Staging the payload would take the node cache past its quota, after what no package
    /// on the node refers to was collected.
    #[error(
        "{reference}: payload {payload} ({size} bytes) needs {needed} bytes in the node cache, which holds {used} of its {quota}-byte quota (what no package on the node refers to was collected first); raise the chart's nodeCache.quota or remove packages from the node"
    )]
    OverQuota {
        /// The reference.
        reference: String,
        /// The payload's name.
        payload: String,
        /// Its layers' size.
        size: u64,
        /// Bytes it still needs.
        needed: u64,
        /// Bytes the cache holds now.
        used: u64,
        /// The quota.
        quota: u64,
    },
    /// A payload's tar holds an entry a payload may not (a link, a device, an escape, a
    /// setuid bit, more than its limits); nothing of it is used.
    #[error("{reference}: {source}")]
    UnsafePayload {
        /// The reference.
        reference: String,
        /// Which payload, which entry, why.
        #[source]
        source: crate::payload::Unsafe,
    },
    /// A cached file did not match its digest; it was moved aside.
    #[error("cached {digest} is corrupt (hashes to {actual}); moved aside")]
    CacheCorrupt {
        /// Expected digest.
        digest: String,
        /// What it hashed to.
        actual: String,
    },
}

impl Error {
    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Unavailable { .. }
                | Error::CacheCorrupt { .. }
                | Error::Deadline { .. }
                | Error::NoRoom { .. }
                | Error::OverQuota { .. }
        )
    }

    pub(crate) fn cache(path: &std::path::Path, source: std::io::Error) -> Self {
        Error::Cache {
            path: path.display().to_string(),
            source,
        }
    }
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
