//! Against a real registry (Debian's docker-registry on loopback): push, resolve, pull by
//! digest, run; tag moves; outages; tampering; wrong artifacts; basic auth.

use crate::support;

use std::sync::Arc;

use nodewright_api::grants::{Capabilities, GrantSet, GrantSource};
use nodewright_api::pinned::PinnedRef;
use nodewright_engine::{Engine, EngineConfig, RunStage, SandboxLimits, StageContext};
use nodewright_hostops::{NodeIdentity, SimHost};
use nodewright_oci::{Error, NodeCache, Puller, Registry};
use nodewright_testregistry::TestRegistry;
use support::*;

#[tokio::test(flavor = "multi_thread")]
async fn push_resolve_pull_by_digest_run() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let registry = Registry::new(config(&reg));
    let sysctl = nodewright_artifacts::read(nodewright_artifacts::SYSCTL);
    let reference = format!("{}/plugins/sysctl:1.0.0", reg.host());
    let pushed = push(&registry, &reference, &sysctl).await;
    assert_eq!(
        pushed.pinned.as_str(),
        format!("{}/plugins/sysctl@{}", reg.host(), pushed.manifest_digest)
    );
    assert_eq!(
        registry.resolve(&reference).await.unwrap(),
        pushed.manifest_digest
    );

    let cache_dir = tempfile::tempdir().unwrap();
    let puller = Puller::new(registry, NodeCache::open(cache_dir.path()).unwrap());
    let pulled = puller.pull_pinned(&pushed.pinned, &|_| {}).await.unwrap();
    assert_eq!(pulled.bytes, sysctl);
    assert!(!pulled.from_cache);
    assert_eq!(pulled.layer_digest, pushed.layer_digest);
    let again = puller.pull_pinned(&pushed.pinned, &|_| {}).await.unwrap();
    assert!(again.from_cache, "second pull is served by the node cache");

    // The stored manifest is the CNCF wasm layout.
    let (_, manifest) = puller
        .registry()
        .fetch_manifest(pushed.pinned.as_str())
        .await
        .unwrap();
    assert_eq!(
        manifest.artifact_type.as_deref(),
        Some("application/vnd.wasm.config.v0+json")
    );
    assert_eq!(manifest.layers[0].media_type, "application/wasm");

    // And it runs.
    let engine = Engine::new(EngineConfig {
        cache_dir: Some(puller.cache().code_dir()),
        ..Default::default()
    })
    .unwrap();
    let plugin = engine.load(&pulled.bytes).unwrap();
    let (caps, _) =
        Capabilities::from_flags(&["files=/etc/sysctl.d:rw", "sysctl=vm.swappiness"]).unwrap();
    let grants = Arc::new(GrantSet::parse(&caps, false, GrantSource::Flags).unwrap());
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("proc/sys/vm")).unwrap();
    std::fs::write(root.path().join("proc/sys/vm/swappiness"), "60").unwrap();
    let host = Arc::new(SimHost::new(root.path(), NodeIdentity::default()).unwrap());
    let report = engine
        .prepare(&plugin, &grants)
        .unwrap()
        .run(
            RunStage::Apply,
            StageContext::new("n", "tuning", "1").with_config("vm.swappiness", "10"),
            host,
            grants,
            &SandboxLimits::default(),
        )
        .await
        .unwrap();
    assert!(report.result.is_ok(), "{:?}", report.result);
    assert_eq!(
        std::fs::read_to_string(root.path().join("proc/sys/vm/swappiness")).unwrap(),
        "10"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_moved_tag_does_not_change_what_a_pinned_digest_pulls() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let registry = Registry::new(config(&reg));
    let reference = format!("{}/plugins/thing:stable", reg.host());
    let first = push(
        &registry,
        &reference,
        &nodewright_artifacts::read(nodewright_artifacts::SYSCTL),
    )
    .await;
    let resolved = registry.resolve(&reference).await.unwrap();
    let second = push(
        &registry,
        &reference,
        &nodewright_artifacts::read(nodewright_artifacts::FILES),
    )
    .await;
    assert_ne!(first.manifest_digest, second.manifest_digest);
    assert_eq!(
        registry.resolve(&reference).await.unwrap(),
        second.manifest_digest,
        "the tag moved"
    );
    let cache = tempfile::tempdir().unwrap();
    let puller = Puller::new(registry, NodeCache::open(cache.path()).unwrap());
    let pinned = format!("{}/plugins/thing@{resolved}", reg.host());
    let pulled = puller.pull_pinned(&pin(&pinned), &|_| {}).await.unwrap();
    assert_eq!(
        pulled.bytes,
        nodewright_artifacts::read(nodewright_artifacts::SYSCTL)
    );
    // A tag is not a pinned reference: pulls cannot be asked for one.
    let err = reference.parse::<PinnedRef>().unwrap_err();
    assert!(err.reason.contains("not pinned"), "{err}");
    // Resolving pins it to the digest the tag names now.
    assert_eq!(
        puller.registry().pinned(&reference).await.unwrap().digest(),
        second.manifest_digest,
        "pinned to where the tag points"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tampered_and_corrupted_content_is_refused() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let registry = Registry::new(config(&reg));
    let bytes = nodewright_artifacts::read(nodewright_artifacts::SYSCTL);
    let pushed = push(
        &registry,
        &format!("{}/plugins/sysctl:1", reg.host()),
        &bytes,
    )
    .await;

    // A digest the registry does not have.
    let cache = tempfile::tempdir().unwrap();
    let puller = Puller::new(registry, NodeCache::open(cache.path()).unwrap());
    let missing = format!("{}/plugins/sysctl@sha256:{}", reg.host(), "0".repeat(64));
    assert!(matches!(
        puller
            .pull_pinned(&pin(&missing), &|_| {})
            .await
            .unwrap_err(),
        Error::NotFound { .. }
    ));

    // A corrupted node-cache blob is refused and fetched again.
    puller.pull_pinned(&pushed.pinned, &|_| {}).await.unwrap();
    let cached = cache
        .path()
        .join("blobs/sha256")
        .join(pushed.layer_digest.trim_start_matches("sha256:"));
    std::fs::write(&cached, b"corrupted on disk").unwrap();
    let healed = puller.pull_pinned(&pushed.pinned, &|_| {}).await.unwrap();
    assert!(!healed.from_cache);
    assert_eq!(healed.bytes, bytes);
    assert_eq!(std::fs::read(&cached).unwrap(), bytes);

    // A blob tampered with inside the registry is refused.
    let blob = reg.blob_path(&pushed.layer_digest);
    let mut evil = bytes.clone();
    evil[100] ^= 0xff;
    std::fs::write(&blob, &evil).unwrap();
    let fresh = tempfile::tempdir().unwrap();
    let puller = Puller::new(
        Registry::new(config(&reg)),
        NodeCache::open(fresh.path()).unwrap(),
    );
    let err = puller
        .pull_pinned(&pushed.pinned, &|_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::DigestMismatch { what, .. } if what == "layer"),
        "{err}"
    );
    assert!(err.to_string().contains(pushed.pinned.as_str()), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_media_type_is_refused_naming_the_reference() {
    nodewright_testregistry::require!(Registry);
    use oci_client::client::{ClientConfig, ClientProtocol};
    let reg = TestRegistry::start();
    // A container image layer pushed with the plain OCI client.
    let client = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..Default::default()
    });
    let reference: oci_client::Reference = format!("{}/images/app:1", reg.host()).parse().unwrap();
    let auth = oci_client::secrets::RegistryAuth::Anonymous;
    client
        .auth(&reference, &auth, oci_client::RegistryOperation::Push)
        .await
        .unwrap();
    let layer = b"not a tarball".to_vec();
    let config_blob = b"{}".to_vec();
    let (ld, cd) = (
        nodewright_oci::sha256_digest(&layer),
        nodewright_oci::sha256_digest(&config_blob),
    );
    client
        .push_blob(&reference, layer.clone(), &ld)
        .await
        .unwrap();
    client
        .push_blob(&reference, config_blob.clone(), &cd)
        .await
        .unwrap();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config_blob.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ld, "size": layer.len()}],
    });
    let body = serde_json::to_vec(&manifest).unwrap();
    client
        .push_manifest_raw(
            &reference,
            body.clone(),
            "application/vnd.oci.image.manifest.v1+json"
                .parse()
                .unwrap(),
        )
        .await
        .unwrap();
    let pinned = format!(
        "{}/images/app@{}",
        reg.host(),
        nodewright_oci::sha256_digest(&body)
    );
    let cache = tempfile::tempdir().unwrap();
    let puller = Puller::new(
        Registry::new(config(&reg)),
        NodeCache::open(cache.path()).unwrap(),
    );
    let err = puller
        .pull_pinned(&pin(&pinned), &|_| {})
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WrongMediaType { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with(&pinned) && text.contains("application/vnd.oci.image.config.v1+json"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn layers_that_are_not_plugins_fail_the_world_check() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let registry = Registry::new(config(&reg));
    let core = b"\0asm\x01\0\0\0".to_vec();
    let a = push(&registry, &format!("{}/plugins/core:1", reg.host()), &core).await;
    let b = push(
        &registry,
        &format!("{}/plugins/other:1", reg.host()),
        &nodewright_artifacts::read(nodewright_artifacts::WRONG_WORLD),
    )
    .await;
    let cache = tempfile::tempdir().unwrap();
    let puller = Puller::new(registry, NodeCache::open(cache.path()).unwrap());
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let pulled = puller.pull_pinned(&a.pinned, &|_| {}).await.unwrap();
    assert!(matches!(
        engine.load(&pulled.bytes).unwrap_err(),
        nodewright_engine::Error::CoreModule
    ));
    let pulled = puller.pull_pinned(&b.pinned, &|_| {}).await.unwrap();
    let err = engine.load(&pulled.bytes).unwrap_err();
    assert!(
        matches!(&err, nodewright_engine::Error::WrongWorld(m) if m.contains("does not export nodewright:plugin/stages@0.1.0")),
        "{err}"
    );
}
