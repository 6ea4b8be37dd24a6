//! The rollout benchmark's `payload` scenario: what staging ahead (`prestage`) saves a
//! node's cordoned time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use nodewright_localcluster::Binaries;
use serde_json::json;

use super::{fleet, nodewright, packages, until_complete};

/// `payload`: the reboot package carrying a payload of `mib` MiB, rolled out on a fresh
/// cluster once with `prestage: none` (each node's first stage after its cordon downloads
/// it) and once with `all` (every node stages it before any is cordoned); prints, for each,
/// the wall time and each node's cordoned time (cordon to uncordon, as a node watch in
/// this process saw them): mean and max.
pub(super) async fn payload(
    bins: &Binaries,
    nodes: usize,
    budget: u32,
    mib: u64,
) -> anyhow::Result<()> {
    for prestage in ["none", "all"] {
        let work = tempfile::tempdir()?;
        let (cluster, op, port) = fleet(bins, work.path(), nodes).await?;
        let reference = format!(
            "{}/plugins/kernel-module-payload:1.0.0",
            cluster.registry.host()
        );
        let packed = payload_file(work.path(), mib)?;
        let registry = nodewright_oci::Registry::new(nodewright_oci::RegistryConfig {
            insecure: vec![cluster.registry.host().into()],
            ..Default::default()
        });
        registry
            .push_package(
                &reference,
                &nodewright_artifacts::read(nodewright_artifacts::KERNEL_MODULE),
                Default::default(),
                &[packed],
                &|_| {},
            )
            .await?;
        let cordons: Cordons = Arc::default();
        let watch = tokio::spawn(watch_cordons(cluster.client.clone(), cordons.clone()));
        let mut packages = packages(&cluster, true, 1);
        packages["driver"]["plugin"] = json!(reference);
        let mut cr = nodewright("payload", budget, packages);
        cr["spec"]["prestage"] = json!(prestage);
        cluster.apply(&cr).await?;
        let (wall, _, _) = until_complete(&cluster, &op, port, "payload").await?;
        watch.abort();
        let held: Vec<f64> = cordons
            .lock()
            .unwrap()
            .values()
            .filter_map(|(on, off)| Some(off.as_ref()?.duration_since(*on.as_ref()?).as_secs_f64()))
            .collect();
        anyhow::ensure!(
            held.len() == nodes,
            "{} of {nodes} nodes seen cordoned and released",
            held.len()
        );
        let mean = held.iter().sum::<f64>() / held.len() as f64;
        let max = held.iter().copied().fold(0.0, f64::max);
        println!(
            "payload {nodes:>5} nodes, {mib} MiB payload, reboot, budget {budget}%, prestage {prestage:<4}: wall {wall:>7.1} s  cordoned per node: mean {mean:>5.1} s, max {max:>5.1} s"
        );
        drop(op);
    }
    Ok(())
}

/// Each node's first cordon and the uncordon after it, as a watch saw them.
type Cordons = Arc<Mutex<BTreeMap<String, (Option<Instant>, Option<Instant>)>>>;

async fn watch_cordons(client: kube::Client, cordons: Cordons) {
    let api: Api<Node> = Api::all(client);
    let mut stream = std::pin::pin!(
        watcher(api, watcher::Config::default())
            .applied_objects()
            .default_backoff()
    );
    while let Some(Ok(node)) = stream.next().await {
        let now = Instant::now();
        let name = node.metadata.name.clone().unwrap_or_default();
        let cordoned = node.spec.and_then(|s| s.unschedulable) == Some(true);
        let mut cordons = cordons.lock().unwrap();
        let c = cordons.entry(name).or_default();
        if cordoned {
            c.0.get_or_insert(now);
        } else if c.0.is_some() {
            c.1.get_or_insert(now);
        }
    }
}

/// A payload `module` of `mib` MiB of incompressible bytes, packed under `dir`.
fn payload_file(dir: &std::path::Path, mib: u64) -> anyhow::Result<nodewright_oci::PayloadFile> {
    let src = dir.join("payload");
    std::fs::create_dir_all(&src)?;
    let mut bytes = vec![0u8; (mib as usize) << 20];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for word in bytes.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes());
    }
    std::fs::write(src.join("module.bin"), &bytes)?;
    Ok(nodewright_oci::PayloadFile::pack(
        nodewright_api::payload::PayloadName::parse("module")?,
        &src,
        dir.join("module.tar"),
    )?)
}
