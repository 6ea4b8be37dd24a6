//! Signatures against a real registry (Debian's docker-registry), and with the real
//! `cosign` CLI (built from its Go module) in both directions.

use std::path::Path;
use std::process::Command;

use nodewright_api::pinned::PinnedRef;
use nodewright_oci::{NodeCache, Puller, Registry, RegistryConfig};
use nodewright_testregistry::TestRegistry;
use nodewright_testregistry::setup::Need;
use nodewright_trust::keys::{KeyPair, PublicKey};
use nodewright_trust::{Verifier, signatures};

fn registry(reg: &TestRegistry) -> Registry {
    Registry::new(RegistryConfig {
        insecure: vec![reg.host().into()],
        ..Default::default()
    })
}

async fn pushed(r: &Registry, reg: &TestRegistry, name: &str, bytes: &[u8]) -> PinnedRef {
    r.push(
        &format!("{}/plugins/{name}:1.0.0", reg.host()),
        bytes,
        Default::default(),
        &|_| {},
    )
    .await
    .unwrap()
    .pinned
}

fn sysctl() -> Vec<u8> {
    nodewright_artifacts::read(nodewright_artifacts::SYSCTL)
}

fn keys(pairs: &[(&str, &KeyPair)]) -> Vec<(String, PublicKey)> {
    pairs
        .iter()
        .map(|(n, k)| (n.to_string(), k.public()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn sign_then_verify_and_every_way_it_must_not() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let r = registry(&reg);
    let pinned = pushed(&r, &reg, "sysctl", &sysctl()).await;
    let digest = pinned.digest().to_string();
    let (platform, app, stranger) = (
        KeyPair::generate(),
        KeyPair::generate(),
        KeyPair::generate(),
    );

    // Missing signature: nothing verifies.
    assert!(
        signatures::signatures(&r, &pinned)
            .await
            .unwrap()
            .is_empty()
    );
    let v = Verifier::new(8);
    assert!(
        v.signers(&r, &pinned, &keys(&[("platform", &platform)]))
            .await
            .unwrap()
            .is_empty()
    );

    // Signed: the right key verifies, a wrong key does not.
    signatures::attach(&r, &pinned, &platform).await.unwrap();
    assert_eq!(
        v.signers(&r, &pinned, &keys(&[("platform", &platform)]))
            .await
            .unwrap(),
        ["platform"]
    );
    assert!(
        v.signers(&r, &pinned, &keys(&[("stranger", &stranger)]))
            .await
            .unwrap()
            .is_empty(),
        "wrong key"
    );
    assert_eq!(
        v.remembered(),
        1,
        "a positive answer is remembered, a negative one is not"
    );

    // A second signer adds a layer beside the first; both verify.
    signatures::attach(&r, &pinned, &app).await.unwrap();
    assert_eq!(signatures::signatures(&r, &pinned).await.unwrap().len(), 2);
    // The same verifier sees the new signer at once, though it remembered platform's.
    let both = v
        .signers(
            &r,
            &pinned,
            &keys(&[("platform", &platform), ("app", &app)]),
        )
        .await
        .unwrap();
    assert_eq!(both, ["platform", "app"]);
    assert_eq!(v.remembered(), 2);

    // A signature for another digest does not count for this one: replay this plugin's
    // signature manifest (valid signatures, by trusted keys) under another artifact's
    // signature tag in the same repository.
    let other = r
        .push(
            &format!("{}/plugins/sysctl:evil", reg.host()),
            &nodewright_artifacts::read(nodewright_artifacts::FILES),
            Default::default(),
            &|_| {},
        )
        .await
        .unwrap()
        .pinned;
    replay_signatures(&r, &pinned, &other).await;
    let replayed = signatures::signatures(&r, &other).await.unwrap();
    assert_eq!(
        replayed.len(),
        2,
        "the replayed signatures are there, and each verifies as a signature"
    );
    let both = keys(&[("platform", &platform), ("app", &app)]);
    assert!(
        Verifier::new(8)
            .signers(&r, &other, &both)
            .await
            .unwrap()
            .is_empty(),
        "but they sign {digest}, not the other digest"
    );
    assert_eq!(
        signatures::verified_by(&replayed, &digest, &both),
        ["platform", "app"]
    );
}

/// A signature manifest listing more layers than are ever read is refused before any is
/// fetched (a registry could otherwise list thousands of 100 MiB "signatures").
#[tokio::test(flavor = "multi_thread")]
async fn a_signature_manifest_past_the_layer_bound_is_refused() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let r = registry(&reg);
    let key = KeyPair::generate();
    let pinned = pushed(&r, &reg, "many", &sysctl()).await;
    signatures::attach(&r, &pinned, &key).await.unwrap();
    let sig_ref = signatures::signature_reference(&pinned);
    let raw = r
        .fetch_tagged(&sig_ref, &["application/vnd.oci.image.manifest.v1+json"])
        .await
        .unwrap()
        .unwrap();
    let mut manifest: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    let layer = manifest["layers"][0].clone();
    manifest["layers"] = serde_json::Value::Array(vec![layer; signatures::MAX_SIGNATURES + 1]);
    r.push_manifest(
        &sig_ref,
        &[],
        serde_json::to_vec(&manifest).unwrap(),
        "application/vnd.oci.image.manifest.v1+json",
        &|_| {},
    )
    .await
    .unwrap();
    let err = signatures::signatures(&r, &pinned).await.unwrap_err();
    assert!(err.to_string().contains("at most 64 are read"), "{err}");
}

/// Copies the signature manifest of `from` (and its blobs) to the signature tag of `to`.
async fn replay_signatures(r: &Registry, from: &PinnedRef, to: &PinnedRef) {
    let raw = r
        .fetch_tagged(
            &signatures::signature_reference(from),
            &["application/vnd.oci.image.manifest.v1+json"],
        )
        .await
        .unwrap()
        .unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    let mut blobs = Vec::new();
    for d in std::iter::once(&manifest["config"]).chain(manifest["layers"].as_array().unwrap()) {
        let descriptor = serde_json::from_value(d.clone()).unwrap();
        blobs.push(nodewright_oci::Blob {
            what: "replayed",
            bytes: r.fetch_blob(from.as_str(), &descriptor).await.unwrap(),
        });
    }
    r.push_manifest(
        &signatures::signature_reference(to),
        &blobs,
        raw,
        "application/vnd.oci.image.manifest.v1+json",
        &|_| {},
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn any_of_with_a_minimum_counts_verified_signers() {
    nodewright_testregistry::require!(Registry);
    use nodewright_api::trust::{AnyOf, PluginTrustPolicySpec, Requirement, Signer};
    use nodewright_trust::policy::{self, Finding};
    let reg = TestRegistry::start();
    let r = registry(&reg);
    let pinned = pushed(&r, &reg, "sysctl", &sysctl()).await;
    let (a, b, c) = (
        KeyPair::generate(),
        KeyPair::generate(),
        KeyPair::generate(),
    );
    let signer = |name: &str, k: &KeyPair| Signer {
        name: name.into(),
        public_key: Some(k.public().to_pem()),
        ..Default::default()
    };
    let spec = PluginTrustPolicySpec {
        signers: vec![signer("a", &a), signer("b", &b), signer("c", &c)],
        require: Some(Requirement {
            all_of: vec![],
            any_of: Some(AnyOf {
                signers: vec!["a".into(), "b".into(), "c".into()],
                minimum: 2,
            }),
        }),
        ..Default::default()
    };
    assert!(nodewright_api::trust::validate(&spec).is_empty());
    let all = keys(&[("a", &a), ("b", &b), ("c", &c)]);
    let package = nodewright_api::v1alpha1::Package {
        version: "1".into(),
        plugin: pinned.to_string(),
        ..Default::default()
    };
    let judge = |verified: Vec<String>| policy::check(&spec, "p", &pinned, &package, &verified);

    assert!(matches!(
        &judge(Verifier::new(8).signers(&r, &pinned, &all).await.unwrap())[..],
        [Finding::Unsigned { .. }]
    ));
    signatures::attach(&r, &pinned, &c).await.unwrap();
    let one = Verifier::new(8).signers(&r, &pinned, &all).await.unwrap();
    assert_eq!(one, ["c"]);
    assert!(
        matches!(&judge(one)[..], [Finding::Requirement { required, .. }] if required == "2 of a, b, c")
    );
    signatures::attach(&r, &pinned, &a).await.unwrap();
    let two = Verifier::new(8).signers(&r, &pinned, &all).await.unwrap();
    assert_eq!(two, ["a", "c"]);
    assert_eq!(judge(two), vec![], "two of three: trusted");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tampered_layer_is_caught_after_the_signature_checks_out() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let r = registry(&reg);
    let bytes = sysctl();
    let pushed = r
        .push(
            &format!("{}/plugins/sysctl:1.0.0", reg.host()),
            &bytes,
            Default::default(),
            &|_| {},
        )
        .await
        .unwrap();
    let key = KeyPair::generate();
    signatures::attach(&r, &pushed.pinned, &key).await.unwrap();
    // The signature covers the manifest digest; the manifest names the layer digest.
    assert_eq!(
        Verifier::new(4)
            .signers(&r, &pushed.pinned, &keys(&[("k", &key)]))
            .await
            .unwrap(),
        ["k"]
    );
    let blob = reg.blob_path(&pushed.layer_digest);
    let mut evil = std::fs::read(&blob).unwrap();
    evil[100] ^= 0xff;
    std::fs::write(&blob, evil).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let err = Puller::new(registry(&reg), NodeCache::open(cache.path()).unwrap())
        .pull_pinned(&pushed.pinned, &|_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(err, nodewright_oci::Error::DigestMismatch { .. }),
        "{err}"
    );
}

fn cosign() -> Option<std::path::PathBuf> {
    if !nodewright_testregistry::setup::ready(&[Need::Registry, Need::Cosign]) {
        return None;
    }
    Some(nodewright_testregistry::cosign_binary().unwrap_or_else(|e| panic!("cosign: {e:#}")))
}

fn run_cosign(bin: &Path, dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(bin)
        .args(args)
        .current_dir(dir)
        .env("COSIGN_PASSWORD", "interop")
        .env("HOME", dir)
        .env("TUF_ROOT", dir.join("tuf"))
        .output()
        .expect("run cosign")
}

#[tokio::test(flavor = "multi_thread")]
async fn cosign_and_nodewright_read_each_others_keys_and_signatures() {
    nodewright_testregistry::require!(Registry);
    let Some(cosign) = cosign() else { return };
    let reg = TestRegistry::start();
    let r = registry(&reg);
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--allow-insecure-registry", "--allow-http-registry"];

    // cosign's key pair, cosign's signature: nodewright verifies it, and opens the key.
    let out = run_cosign(
        &cosign,
        dir.path(),
        &["generate-key-pair", "--output-key-prefix", "theirs"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = KeyPair::from_encrypted_pem(
        &std::fs::read_to_string(dir.path().join("theirs.key")).unwrap(),
        b"interop",
    )
    .unwrap();
    let their_pub =
        PublicKey::from_pem(&std::fs::read_to_string(dir.path().join("theirs.pub")).unwrap())
            .unwrap();
    assert_eq!(theirs.public(), their_pub);
    let a = pushed(&r, &reg, "sysctl", &sysctl()).await;
    let mut args = vec![
        "sign",
        "--key",
        "theirs.key",
        "--tlog-upload=false",
        "--yes",
    ];
    args.extend(flags);
    args.push(a.as_str());
    let out = run_cosign(&cosign, dir.path(), &args);
    assert!(
        out.status.success(),
        "cosign sign: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names = Verifier::new(4)
        .signers(&r, &a, &[("cosign".into(), their_pub.clone())])
        .await
        .unwrap();
    assert_eq!(names, ["cosign"], "nodewright verifies a cosign signature");

    // nodewright's key pair and signature: cosign verifies them.
    let ours = KeyPair::generate();
    std::fs::write(
        dir.path().join("ours.key"),
        ours.to_encrypted_pem(b"interop").unwrap(),
    )
    .unwrap();
    std::fs::write(dir.path().join("ours.pub"), ours.public().to_pem()).unwrap();
    let b = pushed(
        &r,
        &reg,
        "files",
        &nodewright_artifacts::read(nodewright_artifacts::FILES),
    )
    .await;
    signatures::attach(&r, &b, &ours).await.unwrap();
    let mut args = vec!["verify", "--key", "ours.pub", "--insecure-ignore-tlog"];
    args.extend(flags);
    args.push(b.as_str());
    let out = run_cosign(&cosign, dir.path(), &args);
    assert!(
        out.status.success(),
        "cosign verify of a nodewright signature: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // And cosign signs with nodewright's key file.
    let mut args = vec!["sign", "--key", "ours.key", "--tlog-upload=false", "--yes"];
    args.extend(flags);
    args.push(a.as_str());
    let out = run_cosign(&cosign, dir.path(), &args);
    assert!(
        out.status.success(),
        "cosign sign with a nodewright key: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names = Verifier::new(4)
        .signers(
            &r,
            &a,
            &[("cosign".into(), their_pub), ("ours".into(), ours.public())],
        )
        .await
        .unwrap();
    assert_eq!(names, ["cosign", "ours"]);
    // A wrong key fails cosign's verify too.
    let mut args = vec!["verify", "--key", "theirs.pub", "--insecure-ignore-tlog"];
    args.extend(flags);
    args.push(b.as_str());
    assert!(!run_cosign(&cosign, dir.path(), &args).status.success());
}
