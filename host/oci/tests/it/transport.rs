//! Against a real registry: how the client reaches it — plain HTTP only when listed as
//! insecure, basic auth, a token service, TLS with its CA and no fallback, size limits and
//! the pull deadline.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use nodewright_oci::{Credentials, Error, NodeCache, Puller, Registry, RegistryConfig};
use nodewright_testregistry::TestRegistry;
use support::*;

#[tokio::test(flavor = "multi_thread")]
async fn registry_down_is_a_retryable_error() {
    nodewright_testregistry::require!(Registry);
    let mut reg = TestRegistry::start();
    let registry = Registry::new(config(&reg));
    reg.stop();
    let reference = format!("{}/plugins/sysctl:1.0.0", reg.host());
    let err = registry.resolve(&reference).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    assert!(err.is_retryable());
    assert!(
        err.to_string().starts_with(&reference),
        "the error names the reference: {err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_http_is_used_only_for_registries_listed_as_insecure() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let registry = Registry::new(RegistryConfig::default());
    let err = registry
        .resolve(&format!("{}/plugins/x:1", reg.host()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Unavailable { .. } | Error::Registry { .. }),
        "HTTPS to an HTTP registry must fail, not downgrade: {err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn basic_auth_with_and_without_credentials() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start_with_auth("author", "s3cret");
    let reference = format!("{}/plugins/sysctl:1", reg.host());
    let bytes = nodewright_artifacts::read(nodewright_artifacts::SYSCTL);

    let anonymous = Registry::new(config(&reg));
    let err = anonymous
        .push(&reference, &bytes, info(), &|_| {})
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err}");

    let wrong = Registry::new(RegistryConfig {
        credentials: Credentials::Basic {
            username: "author".into(),
            password: "nope".into(),
        },
        ..config(&reg)
    });
    assert!(matches!(
        wrong.resolve(&reference).await.unwrap_err(),
        Error::Unauthorized { .. }
    ));

    let basic = Registry::new(RegistryConfig {
        credentials: Credentials::Basic {
            username: "author".into(),
            password: "s3cret".into(),
        },
        ..config(&reg)
    });
    let pushed = basic
        .push(&reference, &bytes, info(), &|_| {})
        .await
        .unwrap();

    // The same credentials from a docker config.json.
    let dir = tempfile::tempdir().unwrap();
    let docker = dir.path().join("config.json");
    std::fs::write(
        &docker,
        format!(
            r#"{{"auths": {{"{}": {{"auth": "YXV0aG9yOnMzY3JldA=="}}}}}}"#,
            reg.host()
        ),
    )
    .unwrap();
    let from_file = Registry::new(RegistryConfig {
        credentials: Credentials::DockerConfig(docker),
        ..config(&reg)
    });
    assert_eq!(
        from_file.resolve(&reference).await.unwrap(),
        pushed.manifest_digest
    );
    let cache = tempfile::tempdir().unwrap();
    let pulled = Puller::new(from_file, NodeCache::open(cache.path()).unwrap())
        .pull_pinned(&pushed.pinned, &|_| {})
        .await
        .unwrap();
    assert_eq!(pulled.bytes, bytes);
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_registries_need_their_ca_and_never_fall_back_to_http() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start_tls();
    let reference = format!("{}/plugins/sysctl:1", reg.host());
    let bytes = nodewright_artifacts::read(nodewright_artifacts::SYSCTL);
    // Unknown issuer: refused, no downgrade.
    let untrusted = Registry::new(RegistryConfig::default());
    let err = untrusted
        .push(&reference, &bytes, info(), &|_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Unavailable { .. } | Error::Registry { .. }),
        "{err}"
    );
    // With the registry's CA bundle it works.
    let trusted = Registry::new(RegistryConfig {
        ca_bundles: [(reg.host().to_string(), reg.ca_file().into())].into(),
        ..Default::default()
    });
    let pushed = trusted
        .push(&reference, &bytes, info(), &|_| {})
        .await
        .unwrap();
    assert_eq!(
        trusted.resolve(&reference).await.unwrap(),
        pushed.manifest_digest
    );
    // A CA bundle for another registry does not help this one.
    let other = Registry::new(RegistryConfig {
        ca_bundles: [("elsewhere:443".to_string(), reg.ca_file().into())].into(),
        ..Default::default()
    });
    assert!(other.resolve(&reference).await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_layer_declared_larger_than_the_limit_is_refused_before_allocating() {
    nodewright_testregistry::require!(Registry);
    use nodewright_oci::artifact::Descriptor;
    let reg = TestRegistry::start();
    let registry = Registry::new(config(&reg));
    let sysctl = nodewright_artifacts::read(nodewright_artifacts::SYSCTL);
    let pushed = push(
        &registry,
        &format!("{}/plugins/sysctl:1.0.0", reg.host()),
        &sysctl,
    )
    .await;
    // A manifest claiming a 2^62-byte layer: refused from the declaration alone (allocating
    // for it would abort the process).
    let bomb = Descriptor::new("application/wasm", pushed.layer_digest.clone(), 1 << 62);
    let err = registry
        .fetch_blob(pushed.pinned.as_str(), &bomb)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::TooLarge { size, .. } if size == 1 << 62),
        "{err}"
    );
    // A layer that is larger than its declaration is cut off, not read to the end.
    let short = Descriptor {
        size: 100,
        ..bomb.clone()
    };
    let err = registry
        .fetch_blob(pushed.pinned.as_str(), &short)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::TooLarge { .. } | Error::DigestMismatch { .. }),
        "{err}"
    );
    // A tighter bound (a signature payload's) refuses a real layer over it, also before
    // a byte is fetched.
    let real = Descriptor {
        size: sysctl.len() as i64,
        ..bomb.clone()
    };
    assert!(matches!(
        registry
            .fetch_blob_within(pushed.pinned.as_str(), &real, 1024)
            .await
            .unwrap_err(),
        Error::TooLarge { limit: 1024, .. }
    ));
    let negative = Descriptor { size: -1, ..bomb };
    assert!(matches!(
        registry
            .fetch_blob(pushed.pinned.as_str(), &negative)
            .await
            .unwrap_err(),
        Error::InvalidArtifact { .. }
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_registry_hits_the_pull_deadline() {
    // Accepts connections and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let _hold = std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
        }
    });
    let limits = nodewright_oci::PullLimits {
        deadline: std::time::Duration::from_secs(1),
        ..Default::default()
    };
    let registry = Registry::new(RegistryConfig {
        insecure: vec![host.clone()],
        limits,
        ..Default::default()
    });
    let err = registry
        .resolve(&format!("{host}/plugins/x:1"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Deadline { .. }), "{err}");
    assert!(err.is_retryable());
    let cache = tempfile::tempdir().unwrap();
    let puller = Puller::new(registry, NodeCache::open(cache.path()).unwrap());
    let pinned = format!("{host}/plugins/x@sha256:{}", "a".repeat(64));
    assert!(matches!(
        puller
            .pull_pinned(&pin(&pinned), &|_| {})
            .await
            .unwrap_err(),
        Error::Deadline { .. }
    ));
}

/// A registry that answers every manifest request with an endless body, announced or
/// chunked: the client stops at the manifest bound instead of holding the body. With
/// `token`, it asks for a bearer token instead, and its token service's answer is the
/// endless body.
fn hostile_registry(announce: bool, token: bool) -> String {
    use std::io::Write;
    serve(move |host, request, stream| {
        if token && request.line.starts_with("GET /v2/ ") {
            let challenge = format!(
                "HTTP/1.1 401 Unauthorized\r\nwww-authenticate: Bearer realm=\"http://{host}/token\",service=\"hostile\"\r\ncontent-length: 0\r\n\r\n"
            );
            return stream.write_all(challenge.as_bytes()).is_ok();
        }
        let endless = if token {
            request.line.contains("/token?")
        } else {
            request.line.contains("/manifests/")
        };
        if !endless {
            return stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .is_ok();
        }
        let head = if announce {
            "HTTP/1.1 200 OK\r\ncontent-type: application/vnd.oci.image.manifest.v1+json\r\ncontent-length: 1610612736\r\n\r\n"
        } else {
            "HTTP/1.1 200 OK\r\ncontent-type: application/vnd.oci.image.manifest.v1+json\r\ntransfer-encoding: chunked\r\n\r\n"
        };
        if stream.write_all(head.as_bytes()).is_err() {
            return false;
        }
        let chunk = vec![b' '; 64 << 10];
        // 1.5 GiB at most; the client hangs up long before.
        for _ in 0..24_576 {
            let ok = if announce {
                stream.write_all(&chunk)
            } else {
                stream
                    .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .and_then(|()| stream.write_all(&chunk))
                    .and_then(|()| stream.write_all(b"\r\n"))
            };
            if ok.is_err() {
                return false;
            }
        }
        false
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_manifest_body_past_the_bound_is_refused_before_it_is_held() {
    for announce in [true, false] {
        let host = hostile_registry(announce, false);
        let registry = Registry::new(RegistryConfig {
            insecure: vec![host.clone()],
            ..Default::default()
        });
        let pinned = format!("{host}/plugins/x@sha256:{}", "a".repeat(64));
        let err = registry.fetch_manifest(&pinned).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::TooLarge { ref what, limit, .. }
                    if what == "manifest" && limit == nodewright_oci::MAX_MANIFEST_BYTES
            ),
            "announced={announce}: {err}"
        );
        // The signature tag is fetched the same way.
        let tagged = format!("{host}/plugins/x:sha256-{}.sig", "a".repeat(64));
        let err = registry
            .fetch_tagged(&tagged, &["application/vnd.oci.image.manifest.v1+json"])
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::TooLarge { .. }),
            "announced={announce}: {err}"
        );
    }
}

/// Resolving a tag reads the manifest within the same bound (no unbounded fallback after a
/// `HEAD` without a digest header), and a token service's answer is bounded too: nothing
/// on the pull path reads a body whole.
#[tokio::test(flavor = "multi_thread")]
async fn tags_and_tokens_are_read_within_their_bounds() {
    for announce in [true, false] {
        let host = hostile_registry(announce, false);
        let registry = Registry::new(RegistryConfig {
            insecure: vec![host.clone()],
            ..Default::default()
        });
        let err = registry
            .resolve(&format!("{host}/plugins/x:1.0.0"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::TooLarge { ref what, .. } if what == "manifest"),
            "announced={announce}: {err}"
        );

        let host = hostile_registry(announce, true);
        let registry = Registry::new(RegistryConfig {
            insecure: vec![host.clone()],
            ..Default::default()
        });
        let pinned = format!("{host}/plugins/x@sha256:{}", "a".repeat(64));
        for err in [
            registry.fetch_manifest(&pinned).await.unwrap_err(),
            registry
                .resolve(&format!("{host}/plugins/x:1.0.0"))
                .await
                .unwrap_err(),
        ] {
            assert!(
                matches!(
                    err,
                    Error::TooLarge { ref what, limit, .. }
                        if what == "token" && limit == nodewright_oci::MAX_TOKEN_BYTES
                ),
                "announced={announce}: {err}"
            );
        }
    }
}

/// A registry behind a token service, as Docker Hub, GHCR and Harbor are: `/v2/` answers
/// 401 with a bearer challenge; the token service wants the configured basic credentials
/// and the repository's pull scope; manifests need the token. Counts token requests.
fn token_registry(manifest: &'static [u8]) -> (String, Arc<AtomicUsize>) {
    use std::io::Write;
    let tokens = Arc::new(AtomicUsize::new(0));
    let counted = tokens.clone();
    let host = serve(move |host, request, stream| {
        // "user:secret"
        let basic = request.has("authorization: basic dxnlcjpzzwnyzxq=");
        let (status, extra, body): (&str, String, &[u8]) = if request
            .line
            .starts_with("GET /token?scope=repository%3Aplugins%2Fx%3Apull&service=reg ")
            && basic
        {
            counted.fetch_add(1, Ordering::SeqCst);
            (
                "200 OK",
                String::new(),
                br#"{"token": "t1", "expires_in": 300}"#,
            )
        } else if request.line.contains("/v2/plugins/x/manifests/")
            && request.has("authorization: bearer t1")
        {
            let kind = "content-type: application/vnd.oci.image.manifest.v1+json\r\n";
            ("200 OK", kind.into(), manifest)
        } else {
            let challenge = format!(
                "www-authenticate: Bearer realm=\"http://{host}/token\",service=\"reg\"\r\n"
            );
            ("401 Unauthorized", challenge, b"{}")
        };
        let head = format!(
            "HTTP/1.1 {status}\r\n{extra}content-length: {}\r\n\r\n",
            body.len()
        );
        stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(body))
            .is_ok()
    });
    (host, tokens)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_service_is_asked_once_with_the_credentials_and_its_token_is_used() {
    let manifest: &[u8] = br#"{"schemaVersion": 2}"#;
    let (host, tokens) = token_registry(manifest);
    let registry = Registry::new(RegistryConfig {
        insecure: vec![host.clone()],
        credentials: Credentials::Basic {
            username: "user".into(),
            password: "secret".into(),
        },
        ..Default::default()
    });
    let tag = format!("{host}/plugins/x:1.0.0");
    let digest = registry.resolve(&tag).await.unwrap();
    assert_eq!(digest, nodewright_oci::sha256_digest(manifest));
    assert_eq!(registry.resolve(&tag).await.unwrap(), digest);
    assert_eq!(
        tokens.load(Ordering::SeqCst),
        1,
        "the token is reused while it lives"
    );

    // Without the credentials the token service refuses, and the error says so.
    let anonymous = Registry::new(RegistryConfig {
        insecure: vec![host.clone()],
        ..Default::default()
    });
    let err = anonymous.resolve(&tag).await.unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err}");
}
