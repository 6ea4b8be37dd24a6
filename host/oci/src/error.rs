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
            Error::Unavailable { .. } | Error::CacheCorrupt { .. } | Error::Deadline { .. }
        )
    }

    pub(crate) fn cache(path: &std::path::Path, source: std::io::Error) -> Self {
        Error::Cache {
            path: path.display().to_string(),
            source,
        }
    }

    /// Classifies an oci-client error for `reference`.
    pub(crate) fn from_oci(reference: &str, e: oci_client::errors::OciDistributionError) -> Self {
        use oci_client::errors::OciDistributionError as E;
        let reference = reference.to_string();
        match e {
            E::RequestError(re) if re.is_connect() || re.is_timeout() || re.is_request() => {
                let mut detail = re.to_string();
                let mut src = std::error::Error::source(&re);
                while let Some(s) = src {
                    detail.push_str(": ");
                    detail.push_str(&s.to_string());
                    src = s.source();
                }
                if detail.contains("InvalidContentType") || detail.contains("wrong version number")
                {
                    detail.push_str(
                        " (the registry may serve plain HTTP: list it as insecure to allow that)",
                    );
                }
                Error::Unavailable { reference, detail }
            }
            E::UnauthorizedError { url } => Error::Unauthorized {
                reference,
                detail: format!("{url} answered 401"),
            },
            E::AuthenticationFailure(detail) => Error::Unauthorized { reference, detail },
            E::ImageManifestNotFoundError(_) => Error::NotFound { reference },
            E::ServerError { code: 404, .. } => Error::NotFound { reference },
            E::ServerError {
                code: 401 | 403,
                url,
                ..
            } => Error::Unauthorized {
                reference,
                detail: format!("{url} refused the credentials"),
            },
            E::ServerError { code, url, message } if code >= 500 => Error::Unavailable {
                reference,
                detail: format!("{url} answered {code}: {message}"),
            },
            E::RegistryError { envelope, url } => {
                let text = envelope.to_string();
                if [
                    "MANIFEST_UNKNOWN",
                    "BLOB_UNKNOWN",
                    "NAME_UNKNOWN",
                    "manifest unknown",
                    "blob unknown",
                    "repository name not known",
                ]
                .iter()
                .any(|c| text.contains(c))
                {
                    Error::NotFound { reference }
                } else if text.contains("UNAUTHORIZED") || text.contains("DENIED") {
                    Error::Unauthorized {
                        reference,
                        detail: format!("{url}: {text}"),
                    }
                } else {
                    Error::Registry {
                        reference,
                        detail: format!("{url}: {text}"),
                    }
                }
            }
            E::DigestError(d) => Error::Registry {
                reference,
                detail: format!("digest check failed: {d}"),
            },
            E::IncompatibleLayerMediaTypeError(m) | E::UnsupportedMediaTypeError(m) => {
                Error::WrongMediaType {
                    reference,
                    what: "manifest".into(),
                    media_type: m,
                    expected: crate::artifact::OCI_MANIFEST.into(),
                }
            }
            other => Error::Registry {
                reference,
                detail: other.to_string(),
            },
        }
    }
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
