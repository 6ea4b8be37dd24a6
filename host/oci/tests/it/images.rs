//! Payloads from existing container images against the real registry: an index narrowed to
//! this node's platform, gzip layers applied in order with their whiteouts, a path taken
//! from the image, and images a node cannot use refused naming why.

use crate::support::*;

use std::path::PathBuf;

use nodewright_api::payload::{ImagePayload, PayloadName};
use nodewright_oci::{Blob, NodeCache, Puller, Registry, sha256_digest};
use nodewright_testregistry::TestRegistry;
use nodewright_testregistry::image::{GZIP_LAYER, OCI_MANIFEST, gzip_layer};
use serde_json::json;

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";

fn descriptor(media_type: &str, bytes: &[u8]) -> serde_json::Value {
    json!({"mediaType": media_type, "digest": sha256_digest(bytes), "size": bytes.len()})
}

/// Pushes an image of `layers` (media type, bytes) to `repo@digest`; its manifest's digest.
async fn push_image(
    registry: &Registry,
    repo: &str,
    layers: &[(&str, Vec<u8>)],
) -> (String, Vec<u8>) {
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#
            .to_vec();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
        "layers": layers.iter().map(|(t, b)| descriptor(t, b)).collect::<Vec<_>>(),
    }))
    .unwrap();
    let digest = sha256_digest(&manifest);
    let mut blobs = vec![Blob {
        what: "config",
        bytes: config,
    }];
    blobs.extend(layers.iter().map(|(_, b)| Blob {
        what: "layer",
        bytes: b.clone(),
    }));
    registry
        .push_manifest(
            &format!("{repo}@{digest}"),
            &blobs,
            manifest.clone(),
            OCI_MANIFEST,
            &|_| {},
        )
        .await
        .unwrap();
    (digest, manifest)
}

/// An index of `(architecture, manifest)` pushed to `repo:tag`; the pinned reference.
async fn push_index(registry: &Registry, repo: &str, images: &[(&str, Vec<u8>)]) -> String {
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": images.iter().map(|(arch, m)| {
            let mut d = descriptor(OCI_MANIFEST, m);
            d["platform"] = json!({"os": "linux", "architecture": arch});
            d
        }).collect::<Vec<_>>(),
    }))
    .unwrap();
    let (pinned, _) = registry
        .push_manifest(&format!("{repo}:560"), &[], index, OCI_INDEX, &|_| {})
        .await
        .unwrap();
    pinned
}

fn payload(name: &str, image: &str, path: &str) -> ImagePayload {
    ImagePayload {
        name: PayloadName::parse(name).unwrap(),
        image: image.parse().unwrap(),
        path: ImagePayload::image_path(path).unwrap(),
    }
}

fn files(root: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                stack.push(r);
            } else {
                out.push((r.display().to_string(), std::fs::read(e.path()).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_multi_layer_image_becomes_one_tree_for_this_platform_with_its_whiteouts() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let registry = Registry::new(config(&reg));
    let repo = format!("{}/nvidia/driver", reg.host());
    let base = gzip_layer(&[
        ("etc/os-release", b"debian"),
        ("opt/nvidia/nvidia.ko", b"\x7fELF 550\0version=550.54.14\0"),
        ("opt/nvidia/firmware/gsp-550.bin", b"old firmware"),
    ]);
    let update = gzip_layer(&[
        ("opt/nvidia/nvidia.ko", b"\x7fELF 560\0version=560.35.03\0"),
        ("opt/nvidia/firmware/.wh.gsp-550.bin", b""),
        ("opt/nvidia/firmware/gsp-560.bin", b"new firmware"),
    ]);
    let (_, ours) = push_image(
        &registry,
        &repo,
        &[(GZIP_LAYER, base.clone()), (GZIP_LAYER, update.clone())],
    )
    .await;
    let (_, other) = push_image(
        &registry,
        &repo,
        &[(GZIP_LAYER, gzip_layer(&[("wrong", b"arch")]))],
    )
    .await;
    let other_arch = if nodewright_oci::this_architecture() == "s390x" {
        "riscv64"
    } else {
        "s390x"
    };
    let pinned = push_index(
        &registry,
        &repo,
        &[
            (other_arch, other),
            (nodewright_oci::this_architecture(), ours),
        ],
    )
    .await;

    let cache_dir = tempfile::tempdir().unwrap();
    let puller = Puller::new(
        Registry::new(config(&reg)),
        NodeCache::open(cache_dir.path()).unwrap(),
    );
    let staged = puller
        .stage_image(&payload("driver", &pinned, "/opt/nvidia"), &|_| {})
        .await
        .unwrap();
    assert!(!staged.from_cache);
    assert_eq!(staged.size, (base.len() + update.len()) as u64);
    assert_eq!(
        files(&staged.tree),
        [
            ("firmware/gsp-560.bin".to_string(), b"new firmware".to_vec()),
            (
                "nvidia.ko".to_string(),
                b"\x7fELF 560\0version=560.35.03\0".to_vec()
            ),
        ],
        "the upper layer's module, the whited-out firmware gone, nothing outside /opt/nvidia"
    );
    // Again: the tree from the cache, nothing fetched.
    let again = puller
        .stage_image(&payload("driver", &pinned, "/opt/nvidia"), &|_| {})
        .await
        .unwrap();
    assert!(again.from_cache);
    assert_eq!(again.tree, staged.tree);
    // The whole image is another tree, made from the cached layers.
    let whole = puller
        .stage_image(&payload("rootfs", &pinned, "/"), &|_| {})
        .await
        .unwrap();
    assert!(whole.from_cache, "its layers were there");
    assert_ne!(whole.tree, staged.tree);
    assert_eq!(
        std::fs::read(whole.tree.join("etc/os-release")).unwrap(),
        b"debian"
    );

    // Garbage collection follows the pinned index to this platform's image: the payload a
    // package refers to keeps its tree and layers; the other tree of the same image goes.
    let keep = nodewright_oci::Keep {
        manifests: [pin_digest(&pinned)].into(),
        images: [payload("driver", &pinned, "/opt/nvidia")].into(),
        grace: std::time::Duration::ZERO,
    };
    let report = puller.cache().gc(&keep).unwrap();
    assert!(staged.tree.is_dir(), "{report:?}");
    assert!(!whole.tree.exists(), "{report:?}");
    assert_eq!(report.trees_removed, 1);
    let again = puller
        .stage_image(&payload("driver", &pinned, "/opt/nvidia"), &|_| {})
        .await
        .unwrap();
    assert!(again.from_cache, "kept: {report:?}");
    // Within the grace period nothing goes, referred to or not; past it, everything
    // nothing refers to.
    let nothing = nodewright_oci::Keep {
        grace: std::time::Duration::from_secs(3600),
        ..Default::default()
    };
    assert!(puller.cache().gc(&nothing).unwrap().removed.is_empty());
    assert!(staged.tree.is_dir());
    let report = puller.cache().gc(&nodewright_oci::Keep::default()).unwrap();
    assert!(!staged.tree.exists());
    assert!(
        report.freed >= (base.len() + update.len()) as u64,
        "{report:?}"
    );
    assert!(
        std::fs::read_dir(cache_dir.path().join("blobs/sha256"))
            .unwrap()
            .next()
            .is_none(),
        "every layer collected"
    );
}

/// The digest of a pinned reference (`repo@sha256:...`).
fn pin_digest(pinned: &str) -> String {
    pinned.rsplit_once('@').unwrap().1.to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_a_node_cannot_use_is_refused_naming_why() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let registry = Registry::new(config(&reg));
    let repo = format!("{}/vendor/tools", reg.host());
    let cache_dir = tempfile::tempdir().unwrap();
    let puller = Puller::new(
        Registry::new(config(&reg)),
        NodeCache::open(cache_dir.path()).unwrap(),
    );

    // Only another platform.
    let (_, m) = push_image(
        &registry,
        &repo,
        &[(GZIP_LAYER, gzip_layer(&[("a", b"a")]))],
    )
    .await;
    let pinned = push_index(&registry, &repo, &[("s390x", m)]).await;
    let err = puller
        .image_layers(&pinned.parse().unwrap())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("no linux/{}", nodewright_oci::this_architecture()))
            && err.contains("linux/s390x"),
        "{err}"
    );

    // A zstd layer.
    let zstd = "application/vnd.oci.image.layer.v1.tar+zstd";
    let (digest, _) = push_image(
        &registry,
        &repo,
        &[(zstd, b"(\xb5/\xfd not really".to_vec())],
    )
    .await;
    let err = puller
        .stage_image(&payload("tools", &format!("{repo}@{digest}"), "/"), &|_| {})
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(zstd) && err.contains("plain or gzip"), "{err}");
    assert!(
        std::fs::read_dir(cache_dir.path().join("trees/sha256"))
            .unwrap()
            .next()
            .is_none(),
        "nothing staged"
    );

    // A layer that escapes the image's root.
    let mut evil = Vec::new();
    let mut h = tar::Header::new_gnu();
    let name = b"../../etc/cron.d/x";
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_size(1);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    evil.extend_from_slice(h.as_bytes());
    evil.extend_from_slice(&[b'x'; 512]);
    evil.extend_from_slice(&[0; 1024]);
    let tar_layer = "application/vnd.oci.image.layer.v1.tar";
    let (digest, _) = push_image(&registry, &repo, &[(tar_layer, evil)]).await;
    let err = puller
        .stage_image(&payload("tools", &format!("{repo}@{digest}"), "/"), &|_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(&err, nodewright_oci::Error::UnsafePayload { source, .. }
            if source.refusal == nodewright_oci::payload::Refusal::Escapes),
        "{err}"
    );
}
