//! How oci-client's errors map onto ours: which are the registry's refusals, which are
//! transport failures worth a retry, which say the artifact is not a plugin.

use crate::artifact::OCI_MANIFEST;
use crate::error::Error;

impl Error {
    /// Classifies an oci-client error for `reference`.
    // Long on purpose: one arm per oci-client error, the classification table itself.
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
                    expected: OCI_MANIFEST.into(),
                }
            }
            other => Error::Registry {
                reference,
                detail: other.to_string(),
            },
        }
    }
}
