//! Rollouts on the local cluster, measured: `cargo bench -p nodewright-operator --bench
//! rollout -- [NODES] [--budget PERCENT] [--scenarios idle,plain,reboot,payload,preview] [--packages N]
//! [--payload-mib MIB]` (default: 100 nodes, 25 %, `plain,reboot`, one package, 100 MiB).
//!
//! `payload` rolls the reboot package out carrying a payload, once with `prestage: none` and
//! once with `all`, and prints each node's cordoned time (mean and max) beside the wall time.
//!
//! `plain` rolls out `--packages` packages (1 to 5) with no interrupt (sysctl: apply,
//! config, each package its own sysctl), `reboot` one that
//! needs a reboot (kernel-module: plan, cordon, drain, apply, config, reboot,
//! post-interrupt), each on a fresh cluster. Printed per rollout:
//!
//! - wall time from apply to the CR reporting complete;
//! - the Job/pod latency floor: per batch, the longest node chain of Job durations (created →
//!   succeeded, as this process's watch saw them), summed over batches — the wall time an
//!   operator that reacted instantly would get with the same Jobs;
//! - operator-added latency: on each node, a Job's success → the next Job's creation
//!   (p50/p95/max), the part the operator's loop contributes;
//! - API writes per node-stage (the operator's `nodewright_api_writes_total` over the number
//!   of Jobs; the refused or failed ones too), events per node-stage, and the highest
//!   one-second rate of writes and events;
//! - the planner's actions per node-stage by kind, the passes and their mean time, and the
//!   operator's most frequent warnings: where the writes and the added latency come from;
//! - the operator's RSS idle, at its peak mid-rollout, and its RSS and CPU once idle after.
//!
//! `preview` asks a NodeWrightPreview of the reboot package and `--packages` (at least 2)
//! sysctl packages, and prints the time to its report, the plan Jobs it ran, the operator's
//! peak RSS and how long the report takes to render (see `rollout/preview.rs`).
//!
//! `idle` starts the operator on a fleet whose NodeWright is already complete everywhere
//! (each node carries the state a finished rollout leaves) and measures its RSS and CPU
//! over a minute with nothing to do: what a large, settled fleet costs. With thousands of
//! nodes set `NODEWRIGHT_SIM_HEARTBEAT_SECONDS` (simulated nodes renew their Lease every
//! 10 s by default, as kubelets do) so the control plane on this machine is not what limits
//! the run.
//!
//! Times come from a Job watch in this process (millisecond resolution; the API's own
//! timestamps are whole seconds), on a shared 2-core machine: expect noise.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use nodewright_api::keys;
use nodewright_api::v1alpha1::{NodeWright, Status};
use nodewright_localcluster::{Binaries, Cluster, NS, Operator};
use serde_json::{Value, json};

// The `payload` and `preview` scenarios: files of their own (benches/ holds one file per
// bench target).
#[path = "rollout/payload.rs"]
mod payload;
#[path = "rollout/preview.rs"]
mod preview;

#[derive(Debug, Default, Clone)]
struct Seen {
    node: String,
    package: String,
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

/// CPU seconds (user + system) the process has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let ticks: f64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}

/// What the operator did over a window: its RSS at the end, its share of one core, and
/// how many passes it ran (and their total time).
#[derive(Debug)]
struct Settled {
    rss_kib: u64,
    cpu_percent: f64,
    passes: f64,
    pass_seconds: f64,
    /// API write requests per second over the window.
    requests_per_s: f64,
}

/// The operator over `window`, doing whatever it does.
async fn settle(pid: u32, port: u16, window: Duration) -> Settled {
    let count = "nodewright_reconcile_duration_seconds_count";
    let sum = "nodewright_reconcile_duration_seconds_sum";
    let requests = "nodewright_api_requests_total";
    let (cpu0, n0, t0, r0) = (
        cpu_seconds(pid),
        scrape(port, count).await,
        scrape(port, sum).await,
        scrape(port, requests).await,
    );
    tokio::time::sleep(window).await;
    Settled {
        requests_per_s: (scrape(port, requests).await - r0) / window.as_secs_f64(),
        rss_kib: rss_kib(pid),
        cpu_percent: (cpu_seconds(pid) - cpu0) / window.as_secs_f64() * 100.0,
        passes: scrape(port, count).await - n0,
        pass_seconds: scrape(port, sum).await - t0,
    }
}

impl std::fmt::Display for Settled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {} MiB, CPU {:.1}% of a core, {} passes ({:.2} s in passes), {:.2} API writes/s",
            self.rss_kib / 1024,
            self.cpu_percent,
            self.passes,
            self.pass_seconds,
            self.requests_per_s
        )
    }
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

/// The sysctls the `plain` packages set, one each (every simulated node has them).
const SYSCTLS: [&str; 5] = [
    "vm.swappiness",
    "vm.dirty_ratio",
    "vm.dirty_background_ratio",
    "vm.vfs_cache_pressure",
    "vm.overcommit_ratio",
];

/// The packages of a rollout: one reboot package, or `count` (1 to 5) sysctl packages,
/// each setting a sysctl of its own.
fn packages(cluster: &Cluster, reboot: bool, count: usize) -> Value {
    if reboot {
        return json!({"driver": {
            "version": "1.0.0", "plugin": cluster.plugin("kernel-module"), "interrupt": {"type": "reboot"},
            "capabilities": {"files": [{"path": "/etc/modules-load.d", "access": "readWrite"}, {"path": "/etc/modprobe.d", "access": "readWrite"}], "kernelModules": ["nvidia"]},
            "configMap": {"modules": "nvidia", "options.nvidia": "NVreg_EnableMSI=1"}
        }});
    }
    let plugin = cluster.plugin("sysctl");
    let all: serde_json::Map<String, Value> = SYSCTLS[..count]
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let name = if i == 0 { "tuning".to_string() } else { format!("tuning-{}", i + 1) };
            (name, json!({
                "version": "1.0.0", "plugin": plugin,
                "capabilities": {"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}], "sysctl": [key]},
                "configMap": {*key: "10"}
            }))
        })
        .collect();
    Value::Object(all)
}

/// A fresh cluster of `nodes` simulated nodes (hosts as the packages expect) and the
/// operator on it, ready, with its metrics on a port of its own.
async fn fleet(
    bins: &Binaries,
    work: &std::path::Path,
    nodes: usize,
) -> anyhow::Result<(Cluster, Operator, u16)> {
    let defs: Vec<(String, Vec<(String, String)>)> =
        (0..nodes).map(|i| (format!("n{i:05}"), vec![])).collect();
    let cluster = Cluster::start(work, &defs).await?;
    for (n, _) in &defs {
        for key in SYSCTLS {
            cluster.host_file(n, &format!("/proc/sys/{}", key.replace('.', "/")), "60")?;
        }
        cluster.host_file(n, "/proc/modules", "nvidia 0 0 - Live 0x0\n")?;
        cluster.host_file(n, "/sys/module/nvidia/initstate", "live\n")?;
    }
    let port = nodewright_testregistry::free_port();
    let op = Operator::start(
        &cluster,
        bins,
        &work.join("cache"),
        &work.join("operator.log"),
        "info,kube=warn",
        &[
            &format!("--metrics-addr=127.0.0.1:{port}"),
            // The operator's own default (the test harness resyncs every 5 s).
            "--resync-seconds=30",
        ],
    )?;
    let ready = Instant::now();
    while !nodewright_localcluster::http_get(port, "/readyz")
        .await
        .is_ok_and(|(status, _)| status == 200)
    {
        anyhow::ensure!(
            ready.elapsed() < Duration::from_secs(300),
            "the operator never became ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((cluster, op, port))
}

/// Waits for NodeWright `name` to report complete, sampling the operator's RSS and its
/// write rate (writes and events) once a second; returns (wall s, peak RSS KiB, peak
/// writes per second).
async fn until_complete(
    cluster: &Cluster,
    op: &Operator,
    port: u16,
    name: &str,
) -> anyhow::Result<(f64, u64, f64)> {
    let nws: Api<NodeWright> = Api::all(cluster.client.clone());
    let started = Instant::now();
    let (mut peak, mut peak_rate) = (0, 0.0f64);
    let written = async || scrape(port, "nodewright_api_requests_total").await;
    let (mut last, mut last_at) = (written().await, Instant::now());
    loop {
        peak = peak.max(rss_kib(op.pid()));
        if last_at.elapsed() >= Duration::from_secs(1) {
            let now = written().await;
            peak_rate = peak_rate.max((now - last) / last_at.elapsed().as_secs_f64());
            (last, last_at) = (now, Instant::now());
        }
        let st = nws.get(name).await?.status;
        if st.as_ref().and_then(|s| s.status) == Some(Status::Complete) {
            return Ok((started.elapsed().as_secs_f64(), peak, peak_rate));
        }
        if st.as_ref().and_then(|s| s.status) == Some(Status::Erroring)
            || started.elapsed() > Duration::from_secs(3600)
        {
            anyhow::bail!("{name}: did not complete: {st:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn nodewright(name: &str, budget: u32, packages: Value) -> Value {
    json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": name},
           "spec": {"interruptionBudget": {"percent": budget}, "packages": packages}})
}

/// A rollout from nothing to complete, with its floor and the operator's cost.
async fn rollout(
    bins: &Binaries,
    nodes: usize,
    budget: u32,
    reboot: bool,
    count: usize,
) -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let (cluster, op, port) = fleet(bins, work.path(), nodes).await?;
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
                let label = |key: &str| {
                    job.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(key))
                        .cloned()
                        .unwrap_or_default()
                };
                s.node = label(keys::job::NODE);
                s.package = label(keys::job::PACKAGE);
                s.created.get_or_insert(now);
                if s.done.is_none()
                    && job.status.as_ref().and_then(|st| st.succeeded).unwrap_or(0) > 0
                {
                    s.done = Some(now);
                }
            }
        }
    });

    let name = if reboot { "reboot" } else { "plain" };
    let rss0 = rss_kib(op.pid());
    cluster
        .apply(&nodewright(name, budget, packages(&cluster, reboot, count)))
        .await?;
    let (wall, peak, peak_rate) = until_complete(&cluster, &op, port, name).await?;
    let writes = scrape(port, "nodewright_api_writes_total").await;
    let refused = scrape(port, "nodewright_api_write_failures_total").await;
    let passes = scrape(port, "nodewright_reconcile_duration_seconds_count").await;
    let in_passes = scrape(port, "nodewright_reconcile_duration_seconds_sum").await;
    let events = scrape(port, "nodewright_actions_total{action=\"event\"}").await;
    let actions = actions_by_kind(port).await;
    watch.abort();
    let after = settle(op.pid(), port, Duration::from_secs(60)).await;

    let seen = seen.lock().unwrap().clone();
    // A node's packages run side by side, each its stages in order (an interrupt Job is
    // labelled with the package it serves): a node's floor is its longest package chain.
    let mut by_node: BTreeMap<String, BTreeMap<String, Vec<Seen>>> = BTreeMap::new();
    for s in seen
        .into_values()
        .filter(|s| s.created.is_some() && s.done.is_some())
    {
        by_node
            .entry(s.node.clone())
            .or_default()
            .entry(s.package.clone())
            .or_default()
            .push(s);
    }
    let jobs: usize = by_node
        .values()
        .flat_map(|p| p.values())
        .map(Vec::len)
        .sum();
    let mut gaps = Vec::new();
    let mut chains: Vec<(Instant, f64)> = Vec::new();
    for packages in by_node.values_mut() {
        let mut first: Option<Instant> = None;
        let mut longest = 0.0f64;
        for list in packages.values_mut() {
            list.sort_by_key(|s| s.created);
            let chain: f64 = list
                .iter()
                .map(|s| (s.done.unwrap() - s.created.unwrap()).as_secs_f64())
                .sum();
            longest = longest.max(chain);
            let created = list[0].created.unwrap();
            first = Some(first.map_or(created, |f| f.min(created)));
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
        if let Some(first) = first {
            chains.push((first, longest));
        }
    }
    chains.sort_by_key(|c| c.0);
    let batch = (nodes * budget as usize).div_ceil(100).max(1);
    let floor: f64 = chains
        .chunks(batch)
        .map(|b| b.iter().map(|c| c.1).fold(0.0, f64::max))
        .sum();
    gaps.sort_by(f64::total_cmp);
    println!(
        "{name:<6} {nodes:>5} nodes x {count} pkg, budget {budget}%: wall {wall:>7.1} s  floor {floor:>7.1} s  ({:.2}x)  jobs {jobs:>5}  added latency p50 {:>5.0} ms  p95 {:>5.0} ms  max {:>6.0} ms",
        wall / floor,
        percentile(&gaps, 0.5),
        percentile(&gaps, 0.95),
        gaps.last().copied().unwrap_or(f64::NAN),
    );
    println!(
        "         writes/node-stage {:.2} (refused or failed {:.2})  events/node-stage {:.2}  peak writes+events {peak_rate:.0}/s  operator RSS idle {} MiB, peak {} MiB; the minute after: {after}",
        writes / jobs as f64,
        refused / jobs as f64,
        events / jobs as f64,
        rss0 / 1024,
        peak / 1024,
    );
    let profile: Vec<String> = actions
        .iter()
        .map(|(kind, n)| format!("{kind} {:.2}", n / jobs as f64))
        .collect();
    println!(
        "         planner actions per node-stage: {}; {passes:.0} passes, {:.0} ms each on average ({:.0} % of the wall time)",
        profile.join(", "),
        in_passes / passes * 1000.0,
        in_passes / wall * 100.0,
    );
    for (n, warning) in warnings(&work.path().join("operator.log")) {
        println!("         {n:>6} x {warning}");
    }
    drop(op);
    Ok(())
}

/// The operator's warnings (refused writes and the like), most frequent first, with names
/// and numbers folded so that one kind of warning counts as one.
fn warnings(log: &std::path::Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for line in text.lines().filter(|l| l.contains("WARN")) {
        let message = line.split_once("WARN").map_or(line, |(_, m)| m);
        let folded: String = message
            .split_whitespace()
            .map(|w| {
                if w.chars().any(|c| c.is_ascii_digit()) {
                    "#"
                } else {
                    w
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
        *kinds.entry(folded.chars().take(160).collect()).or_default() += 1;
    }
    let mut kinds: Vec<(usize, String)> = kinds.into_iter().map(|(k, n)| (n, k)).collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.0));
    kinds.truncate(4);
    kinds
}

/// The planner's actions so far, by kind (`nodewright_actions_total`): where the writes go.
async fn actions_by_kind(port: u16) -> Vec<(String, f64)> {
    let Ok((_, body)) = nodewright_localcluster::http_get(port, "/metrics").await else {
        return Vec::new();
    };
    body.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("nodewright_actions_total{action=\"")?;
            let (kind, value) = rest.split_once("\"} ")?;
            Some((kind.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// A settled fleet: the NodeWright complete on every node before the operator looks.
async fn idle(bins: &Binaries, nodes: usize, count: usize) -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let (cluster, op, port) = fleet(bins, work.path(), nodes).await?;
    let empty = settle(op.pid(), port, Duration::from_secs(30)).await;
    let packages = packages(&cluster, false, count);
    let spec: nodewright_api::v1alpha1::NodeWrightSpec =
        serde_json::from_value(json!({"packages": packages}))?;
    let mut state = nodewright_api::node_state::NodeState::new();
    for (name, p) in &spec.packages {
        let mut e = nodewright_api::node_state::PackageStatus::new(
            name,
            &p.version,
            nodewright_api::node_state::Stage::Config,
            1,
        );
        e.state = nodewright_api::node_state::State::Complete;
        e.config = nodewright_planner::packages::config_digests(p);
        state.insert(nodewright_api::node_state::state_key(name, &p.version), e);
    }
    let nodes_api: Api<Node> = Api::all(cluster.client.clone());
    let patch =
        json!({"metadata": {"annotations": {keys::node_state("settled"): state.annotation()}}});
    futures::stream::iter(cluster.nodes.clone())
        .map(|n| {
            let (api, patch) = (nodes_api.clone(), patch.clone());
            async move {
                api.patch(&n, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    cluster.apply(&nodewright("settled", 10, packages)).await?;
    let (wall, _, _) = until_complete(&cluster, &op, port, "settled").await?;
    // The first pass over a settled fleet still writes what the seeded state lacks (each
    // node's status label and annotation); idle is measured once that has stopped.
    // Quiet means no write for 15 s running (a long first pass plans before it writes).
    let quiet = Instant::now();
    let (mut last, mut still) = (scrape(port, "nodewright_api_requests_total").await, 0);
    while still < 3 && quiet.elapsed() < Duration::from_secs(600) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = scrape(port, "nodewright_api_requests_total").await;
        still = if now == last { still + 1 } else { 0 };
        last = now;
    }
    let quiet = quiet.elapsed().as_secs_f64();
    let settled = settle(op.pid(), port, Duration::from_secs(60)).await;
    println!(
        "idle   {nodes:>5} nodes x {count} pkg: a NodeWright complete everywhere (reported complete {wall:.1} s after apply, writes quiet {quiet:.0} s after that), over 60 s: {settled}; with no NodeWright, over 30 s: {empty}",
    );
    drop(op);
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nodes: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(100);
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let budget: u32 = flag("--budget").map_or(Ok(25), |b| b.parse())?;
    let scenarios = flag("--scenarios").unwrap_or_else(|| "plain,reboot".into());
    let count: usize = flag("--packages").map_or(Ok(1), |n| n.parse())?;
    anyhow::ensure!(
        (1..=SYSCTLS.len()).contains(&count),
        "--packages is 1 to {}",
        SYSCTLS.len()
    );
    let exe = std::env::current_exe()?;
    // benches live in target/<profile>/deps; the binaries one level up.
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>");
    let bins = Binaries::in_dir(dir)?;
    for scenario in scenarios.split(',') {
        match scenario {
            "idle" => idle(&bins, nodes, count).await?,
            "plain" => rollout(&bins, nodes, budget, false, count).await?,
            "reboot" => rollout(&bins, nodes, budget, true, 1).await?,
            "payload" => {
                let mib = flag("--payload-mib").map_or(Ok(100), |m| m.parse())?;
                payload::payload(&bins, nodes, budget, mib).await?
            }
            "preview" => preview::preview(&bins, nodes, count.max(2)).await?,
            other => {
                anyhow::bail!("unknown scenario {other:?} (idle, plain, reboot, payload, preview)")
            }
        }
    }
    Ok(())
}
