//! Payloads against the real registry: pushed as layers of the plugin's manifest, pulled to
//! disk and unpacked into read-only trees, refused when the bytes are wrong (resuming: resume.rs).

use crate::support::*;

use std::path::Path;

use nodewright_api::payload::PayloadName;
use nodewright_oci::payload::pack;
use nodewright_oci::{
    Error, NodeCache, PayloadFile, Pulled, PulledPayload, Puller, Pushed, Registry,
};
use nodewright_testregistry::TestRegistry;

/// A driver-like payload directory (a module of `size` bytes and a nested file) and a
/// single firmware file, written under `dir`.
fn sources(dir: &Path, size: usize) -> (std::path::PathBuf, std::path::PathBuf) {
    let driver = dir.join("driver");
    std::fs::create_dir_all(driver.join("lib/modules")).unwrap();
    let module: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(driver.join("lib/modules/nvidia.ko"), module).unwrap();
    std::fs::write(driver.join("VERSION"), b"560.35.03\n").unwrap();
    let firmware = dir.join("gsp.bin");
    std::fs::write(&firmware, b"firmware blob").unwrap();
    (driver, firmware)
}

fn payloads(driver: &Path, firmware: &Path) -> Vec<(PayloadName, Vec<u8>)> {
    [("driver", driver), ("firmware", firmware)]
        .into_iter()
        .map(|(name, path)| {
            let name = PayloadName::parse(name).unwrap();
            let tar = pack(&name, path).unwrap();
            (name, tar)
        })
        .collect()
}

pub async fn push_with(
    registry: &Registry,
    reference: &str,
    p: Vec<(PayloadName, Vec<u8>)>,
) -> Pushed {
    let sysctl = nodewright_artifacts::read(nodewright_artifacts::SYSCTL);
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PayloadFile> = p
        .into_iter()
        .map(|(name, tar)| {
            let path = dir.path().join(format!("{name}.tar"));
            std::fs::write(&path, &tar).unwrap();
            PayloadFile {
                name,
                path,
                digest: nodewright_oci::sha256_digest(&tar),
                size: tar.len() as u64,
            }
        })
        .collect();
    registry
        .push_package(reference, &sysctl, info(), &files, &|_| {})
        .await
        .expect("push")
}

pub async fn try_stage(puller: &Puller, pulled: &Pulled) -> Result<Vec<PulledPayload>, Error> {
    puller
        .stage_payloads(&pulled.reference, &pulled.payloads, &|_| {})
        .await
}

async fn stage(puller: &Puller, pulled: &Pulled) -> Vec<PulledPayload> {
    try_stage(puller, pulled).await.expect("staged")
}

#[tokio::test(flavor = "multi_thread")]
async fn payloads_travel_in_the_manifest_and_land_as_read_only_trees() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let registry = Registry::new(config(&reg));
    let src = tempfile::tempdir().unwrap();
    let (driver, firmware) = sources(src.path(), 3 << 20);
    let reference = format!("{}/plugins/driver:1.0.0", reg.host());
    let pushed = push_with(&registry, &reference, payloads(&driver, &firmware)).await;

    let cache_dir = tempfile::tempdir().unwrap();
    let puller = Puller::new(registry, NodeCache::open(cache_dir.path()).unwrap());
    let listed = puller.pull_pinned(&pushed.pinned, &|_| {}).await.unwrap();
    assert!(!listed.from_cache);
    assert!(
        std::fs::read_dir(cache_dir.path().join("trees/sha256"))
            .unwrap()
            .next()
            .is_none(),
        "pulling the component lists the payloads and fetches none of them"
    );
    let pulled = stage(&puller, &listed).await;
    assert!(pulled.iter().all(|p| !p.from_cache));
    let names: Vec<&str> = pulled.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["driver", "firmware"]);
    let tree = &pulled[0].tree;
    assert_eq!(
        std::fs::read(tree.join("lib/modules/nvidia.ko")).unwrap(),
        std::fs::read(driver.join("lib/modules/nvidia.ko")).unwrap()
    );
    assert_eq!(
        std::fs::read(pulled[1].tree.join("gsp.bin")).unwrap(),
        b"firmware blob"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(tree.join("VERSION"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o444, "payload files are read-only");
    assert!(
        !std::fs::read_dir(cache_dir.path().join("blobs/sha256"))
            .unwrap()
            .any(|e| e.unwrap().path().extension().is_some()),
        "no partial download left"
    );
    for p in &pulled {
        let hex = p.digest.trim_start_matches("sha256:");
        assert!(
            !cache_dir.path().join("blobs/sha256").join(hex).exists(),
            "{}: a payload stays as its tree, not a blob beside it",
            p.name
        );
    }

    let again = puller.pull_pinned(&pushed.pinned, &|_| {}).await.unwrap();
    assert!(again.from_cache);
    let again = stage(&puller, &again).await;
    assert!(
        again.iter().all(|p| p.from_cache),
        "payloads are served by the node cache"
    );
    let trees = |s: &[PulledPayload]| s.iter().map(|p| p.tree.clone()).collect::<Vec<_>>();
    assert_eq!(trees(&again), trees(&pulled));

    // The manifest digest covers every payload byte.
    std::fs::write(driver.join("VERSION"), b"560.35.04\n").unwrap();
    let changed = push_with(puller.registry(), &reference, payloads(&driver, &firmware)).await;
    assert_ne!(changed.manifest_digest, pushed.manifest_digest);
    assert_eq!(
        changed.layer_digest, pushed.layer_digest,
        "the component is the same"
    );
    let next = puller.pull_pinned(&changed.pinned, &|_| {}).await.unwrap();
    let next = stage(&puller, &next).await;
    assert!(
        next[1].from_cache,
        "an unchanged payload is not fetched again"
    );
    assert_eq!(
        next[1].tree, pulled[1].tree,
        "an unchanged payload is one copy"
    );
    assert_ne!(next[0].tree, pulled[0].tree);

    // Collected with the last manifest that names them.
    let keep = nodewright_oci::Keep {
        manifests: [changed.manifest_digest.clone()].into(),
        ..Default::default()
    };
    puller.cache().gc(&keep).unwrap();
    assert!(!pulled[0].tree.exists(), "the old driver tree is collected");
    assert!(next[0].tree.exists() && next[1].tree.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_bytes_for_a_payload_are_never_used() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let registry = Registry::new(config(&reg));
    let src = tempfile::tempdir().unwrap();
    let (driver, firmware) = sources(src.path(), 1 << 20);
    let p = payloads(&driver, &firmware);
    let tar = p[0].1.clone();
    let pushed = push_with(&registry, &format!("{}/plugins/driver:1", reg.host()), p).await;
    let (_, manifest) = registry
        .fetch_manifest(pushed.pinned.as_str())
        .await
        .unwrap();
    let layer = manifest.layers[1].clone();
    assert_eq!(layer.digest, nodewright_oci::sha256_digest(&tar));

    // The registry serving other bytes for the payload: refused, no tree, no blob and
    // nothing to resume from kept. (A download cut off part way: resume.rs.)
    let mut evil = tar.clone();
    let at = evil.len() / 3;
    evil[at] ^= 0xff;
    std::fs::write(reg.blob_path(&layer.digest), &evil).unwrap();
    let third = tempfile::tempdir().unwrap();
    let puller = Puller::new(
        Registry::new(config(&reg)),
        NodeCache::open(third.path()).unwrap(),
    );
    let listed = puller.pull_pinned(&pushed.pinned, &|_| {}).await.unwrap();
    let err = try_stage(&puller, &listed).await.unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
    let hex = layer.digest.trim_start_matches("sha256:");
    let trees: Vec<_> = std::fs::read_dir(third.path().join("trees/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        !trees.iter().any(|t| t.to_string_lossy().contains(hex)),
        "nothing unpacked from wrong bytes: {trees:?}"
    );
    assert!(
        !third
            .path()
            .join("blobs/sha256")
            .join(layer.digest.trim_start_matches("sha256:"))
            .exists()
    );
    assert!(
        std::fs::read_dir(third.path().join("blobs/sha256"))
            .unwrap()
            .all(|e| e.unwrap().path().extension().is_none()),
        "nothing kept to resume from wrong bytes"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payload_past_the_limit_is_refused_before_a_byte_is_fetched() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let registry = Registry::new(config(&reg));
    let src = tempfile::tempdir().unwrap();
    let (driver, firmware) = sources(src.path(), 64 << 10);
    let pushed = push_with(
        &registry,
        &format!("{}/plugins/driver:1", reg.host()),
        payloads(&driver, &firmware),
    )
    .await;
    let mut small = config(&reg);
    small.limits.max_payload_bytes = 4096;
    let cache_dir = tempfile::tempdir().unwrap();
    let puller = Puller::new(
        Registry::new(small),
        NodeCache::open(cache_dir.path()).unwrap(),
    );
    let listed = puller.pull_pinned(&pushed.pinned, &|_| {}).await.unwrap();
    let err = try_stage(&puller, &listed).await.unwrap_err();
    assert!(matches!(err, Error::TooLarge { limit: 4096, .. }), "{err}");

    // No room on the node for the payload and the floor: refused before a byte is
    // fetched, naming the payload, its size and the free space; retryable (the node's).
    let mut full = config(&reg);
    full.limits.min_free_bytes = u64::MAX / 4;
    let puller = Puller::new(
        Registry::new(full),
        NodeCache::open(cache_dir.path()).unwrap(),
    );
    let err = try_stage(&puller, &listed).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, Error::NoRoom { payload, .. } if payload == "driver, firmware")
            && text.contains("are free")
            && err.is_retryable(),
        "{text}"
    );
    assert!(
        std::fs::read_dir(cache_dir.path().join("blobs/sha256"))
            .unwrap()
            .all(|e| e.unwrap().path().extension().is_none()),
        "no partial file for a refused payload"
    );

    // A node cache quota the payloads would pass (the cache holds the plugin already):
    // refused the same way, naming what the cache holds and its quota; under a quota they
    // fit, staged.
    let quota = |bytes: u64| {
        let mut c = config(&reg);
        c.limits.cache_quota = Some(bytes);
        Puller::new(Registry::new(c), NodeCache::open(cache_dir.path()).unwrap())
    };
    let err = try_stage(&quota(64 << 10), &listed).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, Error::OverQuota { payload, quota, used, .. }
            if payload == "driver, firmware" && *quota == 64 << 10 && *used > 0)
            && text.contains("nodeCache.quota")
            && err.is_retryable(),
        "{text}"
    );
    assert!(
        std::fs::read_dir(cache_dir.path().join("trees/sha256"))
            .unwrap()
            .next()
            .is_none(),
        "nothing staged over the quota"
    );
    try_stage(&quota(64 << 20), &listed)
        .await
        .expect("within the quota");
}

/// Two processes on one node staging the same payload at once (two packages, or two
/// NodeWrights' prestages, sharing a layer): one downloads it, the other waits and takes
/// the tree it left — never two writers on one partial file.
#[tokio::test(flavor = "multi_thread")]
async fn a_layer_staged_twice_at_once_is_downloaded_once() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let registry = Registry::new(config(&reg));
    let src = tempfile::tempdir().unwrap();
    let (driver, firmware) = sources(src.path(), 24 << 20);
    let reference = format!("{}/plugins/driver:1.0.0", reg.host());
    push_with(&registry, &reference, payloads(&driver, &firmware)).await;
    let cache_dir = tempfile::tempdir().unwrap();
    let puller = || {
        Puller::new(
            Registry::new(config(&reg)),
            NodeCache::open(cache_dir.path()).unwrap(),
        )
    };
    let (a, b) = (puller(), puller());
    let pinned =
        nodewright_oci::pin(&reference, &registry.resolve(&reference).await.unwrap()).unwrap();
    let (pa, pb) = (
        a.pull_pinned(&pinned, &|_| {}).await.unwrap(),
        b.pull_pinned(&pinned, &|_| {}).await.unwrap(),
    );
    let (sa, sb) = tokio::join!(stage(&a, &pa), stage(&b, &pb));
    for (x, y) in sa.iter().zip(&sb) {
        assert_eq!(x.tree, y.tree, "{}: one tree", x.name);
        assert_eq!(
            u8::from(x.from_cache) + u8::from(y.from_cache),
            1,
            "{}: downloaded by exactly one of them",
            x.name
        );
    }
    assert_eq!(
        std::fs::read(sa[0].tree.join("lib/modules/nvidia.ko")).unwrap(),
        std::fs::read(driver.join("lib/modules/nvidia.ko")).unwrap()
    );
}
