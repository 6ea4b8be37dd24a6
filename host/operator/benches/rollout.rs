//! 100-node rollouts on the local cluster, measured: `cargo bench -p nodewright-operator
//! --bench rollout` (or `-- NODES` for another size).
//!
//! Two scenarios on a fresh cluster each, both with `interruptionBudget: 25%`: a package with
//! no interrupt (sysctl: apply, config) and one that needs a reboot (kernel-module: plan,
//! cordon, drain, apply, config, reboot, post-interrupt). Printed per scenario:
//!
//! - wall time from apply to the CR reporting complete;
//! - the Job/pod latency floor: per batch, the longest node chain of Job durations (created →
//!   succeeded, as this process's watch saw them), summed over batches — the wall time an
//!   operator that reacted instantly would get with the same Jobs;
//! - operator-added latency: on each node, a Job's success → the next Job's creation
//!   (p50/p95/max), the part the operator's loop contributes;
//! - API writes per node-stage (the operator's `nodewright_api_writes_total` over the number
//!   of Jobs), and events per node-stage;
//! - the operator's peak and final RSS.
//!
//! Times come from a Job watch in this process (millisecond resolution; the API's own
//! timestamps are whole seconds), on a shared 2-core machine: expect noise.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use nodewright_api::keys;
use nodewright_api::v1alpha1::{NodeWright, Status};
use nodewright_localcluster::{Binaries, Cluster, NS, Operator};
use serde_json::{Value, json};

#[derive(Debug, Default, Clone)]
struct Seen {
    node: String,
    created: Option<Instant>,
    done: Option<Instant>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

async fn scrape(port: u16, metric: &str) -> f64 {
    let Ok((_, body)) = nodewright_localcluster::http_get(port, "/metrics").await else {
        return f64::NAN;
    };
    body.lines()
        .filter(|l| l.starts_with(metric))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn package(cluster: &Cluster, reboot: bool) -> Value {
    if reboot {
        json!({"driver": {
            "version": "1.0.0", "plugin": cluster.plugin("kernel-module"), "interrupt": {"type": "reboot"},
            "capabilities": {"files": [{"path": "/etc/modules-load.d", "access": "readWrite"}, {"path": "/etc/modprobe.d", "access": "readWrite"}], "kernelModules": ["nvidia"]},
            "configMap": {"modules": "nvidia", "options.nvidia": "NVreg_EnableMSI=1"}
        }})
    } else {
        json!({"tuning": {
            "version": "1.0.0", "plugin": cluster.plugin("sysctl"),
            "capabilities": {"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}], "sysctl": ["vm.swappiness"]},
            "configMap": {"vm.swappiness": "10"}
        }})
    }
}

async fn scenario(bins: &Binaries, nodes: usize, reboot: bool) -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let defs: Vec<(String, Vec<(String, String)>)> =
        (0..nodes).map(|i| (format!("n{i:03}"), vec![])).collect();
    let cluster = Cluster::start(work.path(), &defs).await?;
    for (n, _) in &defs {
        cluster.host_file(n, "/proc/sys/vm/swappiness", "60")?;
        cluster.host_file(n, "/proc/modules", "nvidia 0 0 - Live 0x0\n")?;
    }
    let port = nodewright_testregistry::free_port();
    let op = Operator::start(
        &cluster,
        bins,
        &work.path().join("cache"),
        &work.path().join("operator.log"),
        "info,kube=warn",
        &[&format!("--metrics-addr=127.0.0.1:{port}")],
    )?;

    let seen: Arc<Mutex<HashMap<String, Seen>>> = Arc::default();
    let watch = tokio::spawn({
        let seen = seen.clone();
        let api: Api<Job> = Api::namespaced(cluster.client.clone(), NS);
        async move {
            let mut stream = std::pin::pin!(
                watcher(api, watcher::Config::default())
                    .applied_objects()
                    .default_backoff()
            );
            while let Some(Ok(job)) = stream.next().await {
                let now = Instant::now();
                let name = job.metadata.name.clone().unwrap_or_default();
                let mut seen = seen.lock().unwrap();
                let s = seen.entry(name).or_default();
                s.node = job
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(keys::job::NODE))
                    .cloned()
                    .unwrap_or_default();
                s.created.get_or_insert(now);
                if s.done.is_none()
                    && job.status.as_ref().and_then(|st| st.succeeded).unwrap_or(0) > 0
                {
                    s.done = Some(now);
                }
            }
        }
    });

    let name = if reboot { "reboot" } else { "no-interrupt" };
    let cr = json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": name},
                    "spec": {"interruptionBudget": {"percent": 25}, "packages": package(&cluster, reboot)}});
    // Idle: caches synced, nothing to do yet.
    let ready = Instant::now();
    while !nodewright_localcluster::http_get(port, "/readyz")
        .await
        .is_ok_and(|(status, _)| status == 200)
    {
        anyhow::ensure!(
            ready.elapsed() < Duration::from_secs(60),
            "the operator never became ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (rss0, mut peak) = (rss_kib(op.pid()), 0);
    let started = Instant::now();
    cluster.apply(&cr).await?;
    let nws: Api<NodeWright> = Api::all(cluster.client.clone());
    loop {
        peak = peak.max(rss_kib(op.pid()));
        let st = nws.get(name).await?.status;
        if st.as_ref().and_then(|s| s.status) == Some(Status::Complete) {
            break;
        }
        if st.as_ref().and_then(|s| s.status) == Some(Status::Erroring)
            || started.elapsed() > Duration::from_secs(1800)
        {
            anyhow::bail!("{name}: did not complete: {st:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let wall = started.elapsed().as_secs_f64();
    let writes = scrape(port, "nodewright_api_writes_total").await;
    let events = scrape(port, "nodewright_actions_total{action=\"event\"}").await;
    let rss_end = rss_kib(op.pid());
    watch.abort();

    let seen = seen.lock().unwrap().clone();
    let mut by_node: BTreeMap<String, Vec<Seen>> = BTreeMap::new();
    for s in seen
        .into_values()
        .filter(|s| s.created.is_some() && s.done.is_some())
    {
        by_node.entry(s.node.clone()).or_default().push(s);
    }
    let jobs: usize = by_node.values().map(Vec::len).sum();
    let mut gaps = Vec::new();
    let mut chains: Vec<(Instant, f64)> = Vec::new();
    for list in by_node.values_mut() {
        list.sort_by_key(|s| s.created);
        let chain: f64 = list
            .iter()
            .map(|s| (s.done.unwrap() - s.created.unwrap()).as_secs_f64())
            .sum();
        chains.push((list[0].created.unwrap(), chain));
        for w in list.windows(2) {
            gaps.push(
                w[1].created
                    .unwrap()
                    .saturating_duration_since(w[0].done.unwrap())
                    .as_secs_f64()
                    * 1000.0,
            );
        }
    }
    chains.sort_by_key(|c| c.0);
    let batch = nodes.div_ceil(4).max(1);
    let floor: f64 = chains
        .chunks(batch)
        .map(|b| b.iter().map(|c| c.1).fold(0.0, f64::max))
        .sum();
    gaps.sort_by(f64::total_cmp);
    println!(
        "{name:<13} {nodes:>4} nodes  wall {wall:>6.1} s  floor {floor:>6.1} s  ({:.2}x)  jobs {jobs:>4}  added latency p50 {:>5.0} ms  p95 {:>5.0} ms  max {:>5.0} ms  writes/node-stage {:.2}  events/node-stage {:.2}  operator RSS idle {} MiB peak {} MiB end {} MiB",
        wall / floor,
        percentile(&gaps, 0.5),
        percentile(&gaps, 0.95),
        gaps.last().copied().unwrap_or(f64::NAN),
        writes / jobs as f64,
        events / jobs as f64,
        rss0 / 1024,
        peak / 1024,
        rss_end / 1024,
    );
    drop(op);
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let nodes: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100);
    let exe = std::env::current_exe()?;
    // benches live in target/<profile>/deps; the binaries one level up.
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>");
    let bins = Binaries::in_dir(dir)?;
    for reboot in [false, true] {
        scenario(&bins, nodes, reboot).await?;
    }
    Ok(())
}
