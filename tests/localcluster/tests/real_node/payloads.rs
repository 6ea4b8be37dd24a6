//! Phase 5 of the real-node test: a driver package whose files travel as payloads, as an
//! admin would roll one out. The plugin artifact carries a 200 MiB kernel module (generated
//! here) as its own payload; the firmware comes from a vendor's two-layer image whose
//! upper layer whites out the old blob. The node runs the old module, in use: the `driver`
//! plugin installs the new one, `depmod`s and — the old one being busy — has the node
//! rebooted, after which `post-interrupt` loads it. The node's `modprobe`/`depmod` are the
//! harness's shims over the node's own /sys/module and /lib/modules, never the machine's.

use std::io::Write as _;
use std::time::Instant;

use kube::api::Api;
use nodewright_api::payload::PayloadName;
use nodewright_api::v1alpha1::NodeWright;
use nodewright_localcluster::real::RealCluster;
use nodewright_oci::{PayloadFile, Registry, RegistryConfig};
use nodewright_testregistry::image::{TestImage, gzip_layer};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::{NODE, apply_when_served, cr, wait_complete};

/// The generated module's size: the floor for a payload worth staging.
const MODULE_BYTES: usize = 200 << 20;
const NEW: &str = "560.35.03";
const OLD: &str = "550.54.14";

/// Writes a module file as a driver ships one — ELF magic, `body` bytes that do not
/// compress, its modinfo `version=` last — and returns its SHA-256.
fn write_module(path: &std::path::Path, version: &str, body: usize) -> String {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut hash = Sha256::new();
    let mut put = |bytes: &[u8]| {
        hash.update(bytes);
        out.write_all(bytes).unwrap();
    };
    put(b"\x7fELF");
    // xorshift64: fast, and nothing in it reads as a modinfo entry.
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut chunk = vec![0u8; 1 << 16];
    let mut left = body;
    while left > 0 {
        for word in chunk.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(chunk.len());
        put(&chunk[..n]);
        left -= n;
    }
    put(format!("\0version={version}\0").as_bytes());
    out.flush().unwrap();
    format!("sha256:{}", hex::encode(hash.finalize()))
}

pub(crate) async fn a_driver_from_payloads(c: &RealCluster, operator: &str) {
    let work = tempfile::tempdir().unwrap();
    let registry = Registry::new(RegistryConfig {
        insecure: vec![c.registry.host().into()],
        ..Default::default()
    });
    // The vendor's firmware image, as published: the upper layer replaces the old blob
    // with the new one and whites the old one out.
    let layers = vec![
        gzip_layer(&[
            ("opt/nvidia/firmware/gsp-550.bin", b"old firmware"),
            ("etc/os-release", b"vendor base"),
        ]),
        gzip_layer(&[
            ("opt/nvidia/firmware/gsp-560.bin", b"new firmware"),
            ("opt/nvidia/firmware/.wh.gsp-550.bin", b""),
        ]),
    ];
    let layer_bytes: u64 = layers.iter().map(|l| l.len() as u64).sum();
    let firmware = "vendor/nvidia-firmware:560.35.03";
    nodewright_localcluster::push_image(
        &registry,
        &format!("{}/{firmware}", c.registry.host()),
        &TestImage::new(layers),
    )
    .await
    .unwrap();
    // The plugin artifact with the module as its payload `driver`.
    let src = work.path().join("driver");
    std::fs::create_dir(&src).unwrap();
    let module_digest = write_module(&src.join("nvidia.ko"), NEW, MODULE_BYTES);
    let tar = work.path().join("driver.tar");
    let payload = PayloadFile::pack(PayloadName::parse("driver").unwrap(), &src, tar.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::remove_dir_all(&src).unwrap();
    let payload_bytes = payload.size;
    let package = "plugins/gpu-driver:560.35.3";
    registry
        .push_package(
            &format!("{}/{package}", c.registry.host()),
            &nodewright_artifacts::read(nodewright_artifacts::DRIVER),
            Default::default(),
            &[payload],
            &|_| {},
        )
        .await
        .unwrap();
    std::fs::remove_file(&tar).unwrap();

    // The node runs the old module, held by a workload.
    c.node().load_module("nvidia", OLD, 3).unwrap();
    let boots = c.node().boots();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let release = release.trim();

    let (watcher, seen) = nodewright_localcluster::watch_staging(c.client.clone(), "gpu", &[NODE]);

    let applied = Instant::now();
    apply_when_served(
        c,
        operator,
        cr(
            "gpu",
            json!({"packages": {"nvidia-driver": {
                "version": "560.35.3",
                "plugin": format!("{}/{package}", c.node_registry),
                "interrupt": {"type": "reboot"},
                "capabilities": {
                    "files": [{"path": "/lib/modules", "access": "readWrite"}, {"path": "/sys/module", "access": "read"}],
                    "kernelModules": ["nvidia"]
                },
                "payloads": [{"name": "firmware", "image": format!("{}/{firmware}", c.node_registry), "path": "/opt/nvidia/firmware"}],
                "configMap": {"module": "nvidia", "payload": "driver"}
            }}}),
        ),
    )
    .await;
    wait_complete(c, "gpu").await;
    watcher.abort();
    eprintln!(
        "step 5: {} MiB of payload staged, installed, rebooted and loaded in {:.1} s",
        payload_bytes >> 20,
        applied.elapsed().as_secs_f64()
    );

    // Staged before the cordon: the download was not downtime.
    let seen = seen.lock().unwrap().remove(NODE).unwrap_or_default();
    let (staged_at, mark) = seen.staged.expect("the node was never marked staged");
    let cordoned_at = seen.cordoned.expect("the reboot cordons the node");
    assert!(
        staged_at < cordoned_at,
        "cordoned before its payloads were staged"
    );
    assert_eq!(
        mark.bytes,
        payload_bytes + layer_bytes,
        "both payloads staged"
    );
    // The module installed byte for byte (its digest the payload's), the machine's own
    // /lib/modules untouched; one reboot; the new module loaded after it.
    let installed = c
        .node()
        .host_path(&format!("/lib/modules/{release}/updates/nvidia.ko"));
    let mut hash = Sha256::new();
    std::io::copy(&mut std::fs::File::open(&installed).unwrap(), &mut hash).unwrap();
    assert_eq!(
        format!("sha256:{}", hex::encode(hash.finalize())),
        module_digest
    );
    assert!(
        !std::path::Path::new(&format!("/lib/modules/{release}/updates/nvidia.ko")).exists(),
        "the module landed on the machine"
    );
    assert_eq!(c.node().boots(), boots + 1, "exactly one reboot");
    let sys = c.node().host_path("/sys/module/nvidia");
    assert_eq!(
        std::fs::read_to_string(sys.join("version")).unwrap(),
        format!("{NEW}\n")
    );
    assert_eq!(
        std::fs::read_to_string(sys.join("initstate")).unwrap(),
        "live\n"
    );
    // What the node's modprobe and depmod were asked: the module listed, the busy old one
    // never unloaded (the reboot swapped it), the new one loaded once.
    let calls: Vec<String> = c
        .node()
        .kmod_calls()
        .into_iter()
        .filter(|l| l.ends_with(" nvidia") || l.starts_with("depmod"))
        .collect();
    assert_eq!(
        calls,
        [
            format!("depmod -a -- {release}"),
            "modprobe -- nvidia".into()
        ],
        "the module flow on the node"
    );
    // The node cache: the plugin's payload and the image's firmware directory, its old
    // blob whited out.
    let trees =
        nodewright_localcluster::payload_trees(&c.node().host_path("/var/lib/nodewright/plugins"));
    assert_eq!(
        trees,
        [
            vec!["gsp-560.bin".to_string()],
            vec!["nvidia.ko".to_string()]
        ]
    );
    let resolved = Api::<NodeWright>::all(c.client.clone())
        .get("gpu")
        .await
        .unwrap()
        .status
        .unwrap()
        .resolved_payloads;
    assert!(
        resolved["nvidia-driver/firmware"].starts_with(&format!(
            "{}/vendor/nvidia-firmware@sha256:",
            c.node_registry
        )),
        "{resolved:?}"
    );
}
