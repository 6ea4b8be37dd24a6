//! The pull side's HTTP: every request a pull makes, each with a bound on its body.
//!
//! oci-client reads a manifest, a token or an error response whole before anything can look
//! at its size, so a registry — or its token service, or anything between them and the node
//! — answering with a gigabyte would have it held in memory. So nothing on the pull path
//! goes through oci-client but its reference parsing: the token dance (distribution's
//! bearer-token flow, or basic credentials, or none), manifests and blobs are plain GETs
//! here, each refusing a declared length over its bound and stopping at the bound while
//! reading. Registries refuse to store manifests over 4 MiB (distribution's limit); a
//! token response is a small JSON object.

use std::time::{Duration, Instant};

use http_auth::ChallengeParser;
use oci_client::Reference;
use oci_client::secrets::RegistryAuth;

use crate::error::{Error, Result};
use crate::registry::{Clients, Registry};

/// The largest manifest accepted (what distribution itself accepts).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// The largest token-service response accepted.
pub const MAX_TOKEN_BYTES: u64 = 64 << 10;

/// Bytes of an error response kept for the message.
const MAX_ERROR_BODY: usize = 4 << 10;

/// How long a token lives when its service does not say (distribution's default), and how
/// much sooner it is fetched again.
const TOKEN_LIFETIME: Duration = Duration::from_secs(60);
const TOKEN_MARGIN: Duration = Duration::from_secs(10);

/// What a pull request carries.
#[derive(Clone, Debug)]
pub(crate) enum Credential {
    /// A token from the registry's token service, and when to fetch a new one.
    Bearer(String, Instant),
    /// The configured user and password, sent as they are.
    Basic(String, String),
    /// Nothing.
    Anonymous,
}

/// A token service's answer (distribution's token spec: `token`, or OAuth's
/// `access_token`).
#[derive(serde::Deserialize)]
struct TokenResponse {
    token: Option<String>,
    access_token: Option<String>,
    expires_in: Option<u64>,
}

/// What the response body is, for its bound and its errors.
#[derive(Clone, Copy)]
pub(crate) struct Body<'a> {
    /// `manifest`, `layer`, `token`.
    pub what: &'a str,
    /// The most bytes read.
    pub limit: u64,
}

/// Reads `response` to at most `body.limit` bytes, refusing a declared length past it
/// before reading and stopping as soon as the bound is passed.
async fn read_within(
    reference: &str,
    mut response: reqwest::Response,
    body: Body<'_>,
) -> Result<Vec<u8>> {
    let too_large = |size: u64| Error::TooLarge {
        reference: reference.into(),
        what: body.what.into(),
        size,
        limit: body.limit,
    };
    if let Some(length) = response.content_length()
        && length > body.limit
    {
        return Err(too_large(length));
    }
    let capacity = response.content_length().unwrap_or(0).min(body.limit);
    let mut out = Vec::with_capacity(capacity as usize);
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let size = (out.len() + chunk.len()) as u64;
                if size > body.limit {
                    return Err(too_large(size));
                }
                out.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(out),
            Err(e) => {
                return Err(Error::Unavailable {
                    reference: reference.into(),
                    detail: format!("reading the {}: {e}", body.what),
                });
            }
        }
    }
}

/// The error a non-success response stands for, with the start of its body.
async fn refusal(reference: &str, url: &str, mut response: reqwest::Response) -> Error {
    let status = response.status();
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
    match status.as_u16() {
        404 => Error::NotFound { reference },
        401 | 403 => Error::Unauthorized { reference, detail },
        code if code >= 500 => Error::Unavailable { reference, detail },
        _ => Error::Registry { reference, detail },
    }
}

/// The bearer challenge in a `WWW-Authenticate` header: (realm, service).
fn bearer_challenge(header: &reqwest::header::HeaderValue) -> Option<(String, Option<String>)> {
    let text = header.to_str().ok()?;
    ChallengeParser::new(text).flatten().find_map(|c| {
        if !c.scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let param = |name: &str| {
            c.params
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.to_unescaped())
        };
        Some((param("realm")?, param("service")))
    })
}

impl Registry {
    /// What requests for `r`'s repository carry: a cached token while it lives, else the
    /// registry's answer to an unauthenticated `GET /v2/` decides.
    async fn credential(
        &self,
        reference: &str,
        clients: &Clients,
        r: &Reference,
    ) -> Result<Credential> {
        let registry = r.resolve_registry();
        let key = (registry.to_string(), r.repository().to_string());
        if let Some(Credential::Bearer(token, until)) = self.tokens().get(&key)
            && Instant::now() < *until
        {
            return Ok(Credential::Bearer(token.clone(), *until));
        }
        let basic = || match self.auth_for(registry) {
            Ok(RegistryAuth::Basic(user, password)) => Ok(Credential::Basic(user, password)),
            Ok(_) => Ok(Credential::Anonymous),
            Err(e) => Err(e),
        };
        let transport = |e: reqwest::Error| Error::from_oci(reference, e.into());
        let ping = format!("{}://{registry}/v2/", clients.scheme);
        let answer = clients.http.get(&ping).send().await.map_err(transport)?;
        let challenge = answer
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(bearer_challenge);
        drop(answer);
        let Some((realm, service)) = challenge else {
            return basic();
        };
        let scope = format!("repository:{}:pull", r.repository());
        let mut query = vec![("scope", scope.as_str())];
        if let Some(service) = &service {
            query.push(("service", service));
        }
        let mut request = clients.http.get(&realm).query(&query);
        if let Credential::Basic(user, password) = basic()? {
            request = request.basic_auth(user, Some(password));
        }
        let response = request.send().await.map_err(transport)?;
        if !response.status().is_success() {
            return Err(refusal(reference, &realm, response).await);
        }
        let body = Body {
            what: "token",
            limit: MAX_TOKEN_BYTES,
        };
        let raw = read_within(reference, response, body).await?;
        let parsed: TokenResponse = serde_json::from_slice(&raw).map_err(|e| Error::Registry {
            reference: reference.into(),
            detail: format!("the token service at {realm} answered with no token: {e}"),
        })?;
        let Some(token) = parsed.token.or(parsed.access_token) else {
            return Err(Error::Registry {
                reference: reference.into(),
                detail: format!("the token service at {realm} answered with no token"),
            });
        };
        let lifetime = parsed
            .expires_in
            .map_or(TOKEN_LIFETIME, Duration::from_secs);
        let until = Instant::now() + lifetime.saturating_sub(TOKEN_MARGIN);
        let credential = Credential::Bearer(token, until);
        self.tokens().insert(key, credential.clone());
        Ok(credential)
    }

    /// `GET /v2/<repository>/<path>` (`manifests/<tag or digest>`, `blobs/<digest>`) for
    /// `r`, accepting `accept`, its body read within `body`. Errors name `reference`.
    pub(crate) async fn get_within(
        &self,
        reference: &str,
        r: &Reference,
        path: &str,
        accept: Option<&str>,
        body: Body<'_>,
    ) -> Result<Vec<u8>> {
        let response = self.get_response(reference, r, path, accept, None).await?;
        read_within(reference, response, body).await
    }

    /// The successful response to `GET /v2/<repository>/<path>`, its body unread; from
    /// byte `from` on when given (`Range`; the caller reads the status to see whether the
    /// registry honoured it). Errors name `reference`.
    pub(crate) async fn get_response(
        &self,
        reference: &str,
        r: &Reference,
        path: &str,
        accept: Option<&str>,
        from: Option<u64>,
    ) -> Result<reqwest::Response> {
        let clients = self.clients(r.resolve_registry())?;
        let credential = self.credential(reference, &clients, r).await?;
        let url = format!(
            "{}://{}/v2/{}/{path}",
            clients.scheme,
            r.resolve_registry(),
            r.repository()
        );
        let mut request = clients.http.get(&url);
        if let Some(accept) = accept {
            request = request.header(reqwest::header::ACCEPT, accept);
        }
        if let Some(from) = from {
            request = request.header(reqwest::header::RANGE, format!("bytes={from}-"));
        }
        request = match credential {
            Credential::Bearer(token, _) => request.bearer_auth(token),
            Credential::Basic(user, password) => request.basic_auth(user, Some(password)),
            Credential::Anonymous => request,
        };
        let response = request
            .send()
            .await
            .map_err(|e| Error::from_oci(reference, e.into()))?;
        if !response.status().is_success() {
            return Err(refusal(reference, &url, response).await);
        }
        Ok(response)
    }

    /// The raw manifest `r` names, accepting `media_types`, read to at most
    /// [`MAX_MANIFEST_BYTES`]. Errors name `reference`.
    pub(crate) async fn manifest_body(
        &self,
        reference: &str,
        r: &Reference,
        media_types: &[&str],
    ) -> Result<Vec<u8>> {
        let at = r
            .digest()
            .or(r.tag())
            .ok_or_else(|| Error::InvalidReference {
                reference: reference.into(),
                reason: "names neither a tag nor a digest".into(),
            })?;
        let body = Body {
            what: "manifest",
            limit: MAX_MANIFEST_BYTES,
        };
        let accept = media_types.join(", ");
        self.get_within(
            reference,
            r,
            &format!("manifests/{at}"),
            Some(&accept),
            body,
        )
        .await
    }
}
