//! Manifests fetched with a bound on the body.
//!
//! oci-client reads a manifest response whole before anything can look at its size, so a
//! registry — or anything between it and the node — answering with a gigabyte would have
//! it held in memory. Registries refuse to store manifests over 4 MiB (distribution's
//! limit), so nodewright refuses to read more than that: it asks oci-client only for the
//! registry's bearer token (none for basic auth or anonymous access), makes the GET
//! itself, refuses a declared length over the bound and stops reading at it.

use oci_client::Reference;
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;

use crate::error::{Error, Result};
use crate::registry::Registry;

/// The largest manifest accepted (what distribution itself accepts).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// Bytes of an error response kept for the message.
const MAX_ERROR_BODY: usize = 4 << 10;

impl Registry {
    /// The raw manifest `r` names, accepting `media_types`, read to at most
    /// [`MAX_MANIFEST_BYTES`]. Errors name `reference`.
    pub(crate) async fn manifest_body(
        &self,
        reference: &str,
        r: &Reference,
        media_types: &[&str],
    ) -> Result<Vec<u8>> {
        use oci_client::RegistryOperation;
        let registry = r.resolve_registry();
        let clients = self.clients(registry)?;
        let auth = self.auth_for(registry)?;
        let transport = |e: reqwest::Error| Error::from_oci(reference, e.into());
        let token = clients
            .oci
            .auth(r, &auth, RegistryOperation::Pull)
            .await
            .map_err(|e: OciDistributionError| Error::from_oci(reference, e))?;
        let at = r
            .digest()
            .or(r.tag())
            .ok_or_else(|| Error::InvalidReference {
                reference: reference.into(),
                reason: "names neither a tag nor a digest".into(),
            })?;
        let url = format!(
            "{}://{registry}/v2/{}/manifests/{at}",
            clients.scheme,
            r.repository()
        );
        let mut request = clients
            .http
            .get(&url)
            .header(reqwest::header::ACCEPT, media_types.join(", "));
        request = match (token, &auth) {
            (Some(token), _) => request.bearer_auth(token),
            (None, RegistryAuth::Basic(user, password)) => request.basic_auth(user, Some(password)),
            (None, _) => request,
        };
        let mut response = request.send().await.map_err(transport)?;
        let status = response.status();
        if !status.is_success() {
            let mut body = Vec::new();
            while body.len() < MAX_ERROR_BODY {
                match response.chunk().await {
                    Ok(Some(c)) => body.extend_from_slice(&c),
                    _ => break,
                }
            }
            body.truncate(MAX_ERROR_BODY);
            let detail = format!(
                "{url} answered {status}: {}",
                String::from_utf8_lossy(&body).trim()
            );
            let reference = reference.to_string();
            return Err(match status.as_u16() {
                404 => Error::NotFound { reference },
                401 | 403 => Error::Unauthorized { reference, detail },
                code if code >= 500 => Error::Unavailable { reference, detail },
                _ => Error::Registry { reference, detail },
            });
        }
        let too_large = |size: u64| Error::TooLarge {
            reference: reference.into(),
            what: "manifest".into(),
            size,
            limit: MAX_MANIFEST_BYTES,
        };
        if let Some(length) = response.content_length()
            && length > MAX_MANIFEST_BYTES
        {
            return Err(too_large(length));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            let size = (body.len() + chunk.len()) as u64;
            if size > MAX_MANIFEST_BYTES {
                return Err(too_large(size));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}
