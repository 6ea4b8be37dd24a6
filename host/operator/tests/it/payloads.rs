//! End to end: a package with payloads — the `driver` plugin, its module taken from a
//! vendor's multi-layer driver image, and a payload of the plugin's own — staged on every
//! node before it is cordoned, then rolled out from the staged copies alone.

use std::time::{Duration, Instant};

use crate::common;
use crate::specs;

use common::E2e;
use nodewright_api::payload::PayloadName;
use nodewright_api::v1alpha1::Status;
use nodewright_hostops::HostAction;
use nodewright_oci::{PayloadFile, Registry, RegistryConfig};
use nodewright_testregistry::image::{TestImage, gzip_layer};
use serde_json::json;
use specs::*;

const NODES: [&str; 2] = ["p1", "p2"];

/// A module file as a driver ships one: ELF magic, a body, and its modinfo `version=`.
fn module(version: &str, body: usize) -> Vec<u8> {
    let mut m = b"\x7fELF".to_vec();
    m.extend(std::iter::repeat_n(0x5a, body));
    m.extend_from_slice(format!("\0version={version}\0").as_bytes());
    m
}

#[tokio::test(flavor = "multi_thread")]
async fn payloads_are_staged_on_every_node_before_its_cordon_and_the_rollout_needs_no_registry_after()
 {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("p1", &[]), ("p2", &[])]).await;

    // The module comes from the vendor's driver image, as it is: two layers, the upper one
    // replacing the module and whiting out the old firmware.
    let registry = Registry::new(RegistryConfig {
        insecure: vec![e.registry.host().into()],
        ..Default::default()
    });
    let new = module("560.35.03", 4 << 20);
    let layers = [
        gzip_layer(&[
            ("opt/nvidia/nvidia.ko", &module("550.54.14", 1 << 20)),
            ("opt/nvidia/gsp-550.bin", b"old firmware"),
            ("etc/os-release", b"vendor base"),
        ]),
        gzip_layer(&[
            ("opt/nvidia/nvidia.ko", &new),
            ("opt/nvidia/.wh.gsp-550.bin", b""),
        ]),
    ];
    let image = format!("{}/vendor/nvidia-driver:560.35.03", e.registry.host());
    nodewright_localcluster::push_image(&registry, &image, &TestImage::new(layers.to_vec()))
        .await
        .unwrap();
    // The plugin carries a payload of its own too (its notes): both are staged.
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("NOTES"), "560.35.03 for kernels 6.x\n").unwrap();
    let packed = tempfile::tempdir().unwrap();
    let payload = PayloadFile::pack(
        PayloadName::parse("notes").unwrap(),
        src.path(),
        packed.path().join("notes.tar"),
    )
    .unwrap();
    let payload_bytes = std::fs::metadata(packed.path().join("notes.tar"))
        .unwrap()
        .len()
        + layers.iter().map(|l| l.len() as u64).sum::<u64>();
    let reference = format!("{}/plugins/gpu-driver:560.35.3", e.registry.host());
    registry
        .push_package(
            &reference,
            &nodewright_artifacts::read(nodewright_artifacts::DRIVER),
            Default::default(),
            &[payload],
            &|_| {},
        )
        .await
        .unwrap();

    // Each node runs the old module, held by a workload: replacing it takes a reboot.
    for n in NODES {
        let release = e.read_host_file(n, "/proc/sys/kernel/osrelease").unwrap();
        std::fs::create_dir_all(e.host_path(n, &format!("/lib/modules/{}", release.trim())))
            .unwrap();
        e.host_file(
            n,
            "/proc/modules",
            "nvidia 57540608 12 - Live 0x0000000000000000\n",
        );
        e.host_file(n, "/sys/module/nvidia/initstate", "live\n");
        e.host_file(n, "/sys/module/nvidia/refcnt", "12\n");
        e.host_file(n, "/sys/module/nvidia/version", "550.54.14\n");
        // What an earlier package left in the node cache, two hours ago: no package refers
        // to it, so the prestage collects it.
        let cache = e.host_path(n, "/var/lib/nodewright/plugins");
        let stale = "e".repeat(64);
        let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
        for (dir, file) in [("trees/sha256", None), ("blobs/sha256", Some("old layer"))] {
            let path = cache.join(dir).join(&stale);
            std::fs::create_dir_all(cache.join(dir)).unwrap();
            match file {
                Some(body) => std::fs::write(&path, body).unwrap(),
                None => {
                    std::fs::create_dir(&path).unwrap();
                    std::fs::write(path.join("old.ko"), "old").unwrap();
                }
            }
            std::fs::File::open(&path)
                .unwrap()
                .set_modified(two_hours_ago)
                .unwrap();
        }
    }

    let (watcher, seen) = nodewright_localcluster::watch_staging(e.client.clone(), "gpu", &NODES);

    e.start_operator(&[]);
    let applied = Instant::now();
    e.apply(cr(
        "gpu",
        json!({
            "interruptionBudget": {"count": 1},
            "prestage": "all",
            "packages": {"nvidia-driver": {
                "version": "560.35.3", "plugin": reference,
                "interrupt": {"type": "reboot"},
                "capabilities": {
                    "files": [{"path": "/lib/modules", "access": "readWrite"}, {"path": "/sys/module", "access": "read"}],
                    "kernelModules": ["nvidia"]
                },
                "payloads": [{"name": "driver", "image": image, "path": "/opt/nvidia"}],
                "configMap": {"module": "nvidia", "payload": "driver"}
            }}
        }),
    ))
    .await;

    // `all`: both nodes stage at the start, the one outside the first batch too.
    e.wait("both nodes staged", LIMIT, || async {
        let seen = seen.lock().unwrap();
        (seen.values().filter(|s| s.staged.is_some()).count() == NODES.len()).then_some(())
    })
    .await;
    let staged_in = applied.elapsed();
    // From here on nothing may need the registry: the stages run from the node cache.
    e.registry_down();
    e.wait_complete("gpu", LIMIT).await;
    let completed_in = applied.elapsed();
    watcher.abort();

    let seen = std::mem::take(&mut *seen.lock().unwrap());
    for n in NODES {
        let seen = seen.get(n).cloned().unwrap_or_default();
        let (staged_at, mark) = seen.staged.expect("staged");
        assert_eq!(mark.bytes, payload_bytes, "{n}: the payload's size");
        let cordoned_at = seen.cordoned.expect("the reboot cordons the node");
        assert!(
            staged_at < cordoned_at,
            "{n}: cordoned {:?} before its payload was staged",
            staged_at.duration_since(cordoned_at)
        );
        assert_eq!(e.node_status("gpu", n).await, Some(Status::Complete));
        // The module installed from the payload, byte for byte, and the new one loaded
        // after the reboot.
        let release = e.read_host_file(n, "/proc/sys/kernel/osrelease").unwrap();
        let installed = e.host_path(
            n,
            &format!("/lib/modules/{}/updates/nvidia.ko", release.trim()),
        );
        assert_eq!(std::fs::read(installed).unwrap(), new, "{n}");
        let journal = e.journal(n);
        assert!(
            journal
                .iter()
                .any(|a| matches!(a, HostAction::Rebooted { .. })),
            "{n}: {journal:?}"
        );
        assert_eq!(
            e.read_host_file(n, "/sys/module/nvidia/version").as_deref(),
            Some("560.35.03\n"),
            "{n}"
        );
        let trees =
            nodewright_localcluster::payload_trees(&e.host_path(n, "/var/lib/nodewright/plugins"));
        assert_eq!(
            trees,
            [vec!["NOTES".to_string()], vec!["nvidia.ko".to_string()]],
            "{n}: the plugin's payload and the image's /opt/nvidia, its old firmware whited out — the stale tree collected"
        );
        let stale_blob = e.host_path(
            n,
            &format!(
                "/var/lib/nodewright/plugins/blobs/sha256/{}",
                "e".repeat(64)
            ),
        );
        assert!(
            !stale_blob.exists(),
            "{n}: the stale blob was not collected"
        );
    }
    let resolved = e.nodewright("gpu").await.status.unwrap().resolved_payloads;
    assert!(
        resolved["nvidia-driver/driver"].starts_with(&format!(
            "{}/vendor/nvidia-driver@sha256:",
            e.registry.host()
        )),
        "{resolved:?}"
    );
    let events = e.events("p2").await;
    assert!(
        events.iter().any(|(r, m)| r == "Staged"
            && m.contains("staged 2 payload(s) of 1 plugin(s) and 1 image(s)")),
        "{events:?}"
    );
    eprintln!(
        "payload {payload_bytes} bytes: both nodes staged {staged_in:?} after the apply, rollout complete after {completed_in:?}"
    );
}
