//! Simulated nodes: a process "kubelet" that really runs pods' commands.
//!
//! For each [`NodeSpec`] it registers a `Node` (labels, capacity, `bootID`, a `Ready`
//! condition, the apiserver's initial not-ready taint lifted) whose host is a scratch
//! directory, and heartbeats as a kubelet does: a Lease renewed every 10 s, the status
//! reported every 5 minutes and on change. For every pod bound to one
//! of its nodes (`spec.nodeName`) it runs each container's command as a local process:
//!
//! - the environment is the container's literal `env` plus `fieldRef`s (name, namespace,
//!   uid, node name), and `NODEWRIGHT_SIM_ROOT`/`NODEWRIGHT_SIM_NODE`;
//! - a `hostPath` volume's mount path, and the container's `terminationMessagePath`, are
//!   rewritten in arguments and env values to the node's scratch root and a per-container
//!   file, so the process sees "the host" where the pod spec says it is;
//! - status is real: phase, container states, exit codes, termination messages (with
//!   `FallbackToLogsOnError`), restart counts under the pod's `restartPolicy`;
//! - deletion honours the grace period (SIGTERM to the process group, then SIGKILL), kills
//!   every process the container started (as a runtime does), then finishes the delete;
//! - containers without a command are workload "sleepers": running until deleted;
//! - container logs (stdout and stderr) are served to the apiserver's `pods/log` through a
//!   kubelet endpoint every node advertises (`kubelet_api`).
//!
//! A reboot (requested through the simulated host's `reboot-requested` file, as the agent's
//! host-ops seam does, or by [`SimKubelet::reboot`]) marks the node NotReady, kills every
//! process on it, gives the host a new boot ID (in the Node status and the scratch root),
//! marks it Ready again and restarts containers per their restart policy.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use nodewright_hostops::{HostOps, NodeIdentity, SimHost};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::kubelet_api::{self, LogDirs};

/// A node to simulate.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// Node name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// The node's scratch root (its `/`).
    pub root: PathBuf,
}

impl NodeSpec {
    /// A node named `name` rooted at `base/name`.
    pub fn new(name: &str, base: &Path) -> Self {
        NodeSpec {
            name: name.into(),
            labels: BTreeMap::new(),
            root: base.join(name),
        }
    }

    /// Adds a label.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Control {
    Run,
    /// Stop for deletion, SIGKILL after this many seconds.
    Delete(u64),
    /// The node is rebooting: kill now, restart (per policy) when it is back.
    Reboot,
}

struct SimNode {
    spec: NodeSpec,
    host: SimHost,
    control: watch::Sender<Control>,
    /// Container processes running on it: a reboot changes the boot ID only once none is
    /// (no process may see the boot that ends it).
    live: Arc<std::sync::atomic::AtomicUsize>,
}

struct Inner {
    client: Client,
    /// Nodes may join and leave while the kubelet runs.
    nodes: std::sync::RwLock<HashMap<String, Arc<SimNode>>>,
    /// Running pods by uid: their node and their control channel.
    pods: Mutex<HashMap<String, (String, watch::Sender<Control>)>>,
    /// The kubelet endpoint's port, advertised by every node.
    kubelet_port: u16,
    /// Where each pod's container logs are, for the kubelet endpoint.
    logs: LogDirs,
    work: PathBuf,
}

/// The simulated kubelet for a set of nodes. Dropping it stops every pod process.
pub struct SimKubelet {
    inner: Arc<Inner>,
    /// Background tasks by node ("" for the kubelet-wide ones).
    tasks: HashMap<String, Vec<tokio::task::JoinHandle<()>>>,
    _work: tempfile::TempDir,
}

impl std::fmt::Debug for SimKubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimKubelet")
            .field("nodes", &self.inner.names())
            .finish()
    }
}

impl Inner {
    fn node(&self, name: &str) -> Option<Arc<SimNode>> {
        self.nodes.read().expect("nodes lock").get(name).cloned()
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .nodes
            .read()
            .expect("nodes lock")
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }
}

/// Registers `spec` as a Ready node advertising the kubelet endpoint on `kubelet_port`.
async fn register(client: &Client, spec: NodeSpec, kubelet_port: u16) -> Result<SimNode> {
    let api: Api<Node> = Api::all(client.clone());
    std::fs::create_dir_all(&spec.root)?;
    let host = SimHost::new(
        &spec.root,
        NodeIdentity {
            name: spec.name.clone(),
            labels: spec.labels.clone().into_iter().collect(),
        },
    )?;
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": spec.name, "labels": spec.labels},
        "spec": {}
    });
    api.patch(
        &spec.name,
        &PatchParams::apply("nodewright-sim-kubelet").force(),
        &Patch::Apply(&node),
    )
    .await
    .with_context(|| format!("register node {}", spec.name))?;
    let boot = host.node_info().boot_id;
    let mut status = node_status(&spec, &boot, true);
    status["status"]["daemonEndpoints"] = json!({"kubeletEndpoint": {"Port": kubelet_port}});
    api.patch_status(&spec.name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    // The apiserver taints a new node not-ready; with no node-lifecycle controller in
    // the test control plane, the kubelet side lifts it once the node reports Ready.
    lift_not_ready(&api, api.get(&spec.name).await?)
        .await
        .with_context(|| format!("untaint node {}", spec.name))?;
    let (control, _) = watch::channel(Control::Run);
    Ok(SimNode {
        spec,
        host,
        control,
        live: Arc::default(),
    })
}

/// Removes the `node.kubernetes.io/not-ready` taint from `node`, as the node-lifecycle
/// controller would, and nothing else. The taints are written against the resourceVersion
/// `node` was read at, and read again after a conflict, so a taint another writer added
/// since (the operator's runtime-required taint on a joining node) is kept rather than
/// overwritten with the list read before it.
pub async fn lift_not_ready(api: &Api<Node>, mut node: Node) -> Result<()> {
    let name = node
        .metadata
        .name
        .clone()
        .context("a node without a name")?;
    for _ in 0..CONFLICTS {
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        if !taints.iter().any(|t| t.key == NOT_READY) {
            return Ok(());
        }
        let kept: Vec<_> = taints.into_iter().filter(|t| t.key != NOT_READY).collect();
        let body = json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "spec": {"taints": kept},
        });
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(body))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => node = api.get(&name).await?,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("node {name}: not-ready taint still not lifted after {CONFLICTS} conflicts")
}

const NOT_READY: &str = "node.kubernetes.io/not-ready";

/// How many conflicting writes [`lift_not_ready`] reads again after before it gives up.
const CONFLICTS: usize = 20;

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn node_status(spec: &NodeSpec, boot_id: &str, ready: bool) -> Value {
    let condition = json!({
        "type": "Ready",
        "status": if ready { "True" } else { "False" },
        "reason": if ready { "KubeletReady" } else { "Rebooting" },
        "message": if ready { "simulated node is ready" } else { "simulated node is rebooting" },
        "lastHeartbeatTime": now(),
        "lastTransitionTime": now(),
    });
    json!({
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "conditions": [condition],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": spec.name}],
            "nodeInfo": {
                "machineID": spec.name, "systemUUID": spec.name, "bootID": boot_id,
                "kernelVersion": "6.1.0-nodewright-sim", "osImage": "nodewright simulated node",
                "containerRuntimeVersion": "sim://1", "kubeletVersion": crate::KUBERNETES_VERSION,
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"
            }
        }
    })
}

impl SimKubelet {
    /// Registers `nodes` and starts running their pods.
    pub async fn start(client: Client, nodes: Vec<NodeSpec>) -> Result<Self> {
        let work = tempfile::Builder::new()
            .prefix("nodewright-simkubelet-")
            .tempdir()?;
        let logs = LogDirs::default();
        let (kubelet_port, endpoint) = kubelet_api::start(logs.clone()).await?;
        let mut sims = HashMap::new();
        for spec in nodes {
            sims.insert(
                spec.name.clone(),
                Arc::new(register(&client, spec, kubelet_port).await?),
            );
        }
        let inner = Arc::new(Inner {
            client,
            nodes: std::sync::RwLock::new(sims),
            pods: Mutex::default(),
            kubelet_port,
            logs,
            work: work.path().to_path_buf(),
        });
        let mut tasks = HashMap::from([(
            "".to_string(),
            vec![endpoint, tokio::spawn(watch_pods(inner.clone()))],
        )]);
        for name in inner.names() {
            tasks.insert(
                name.clone(),
                vec![tokio::spawn(node_loop(inner.clone(), name))],
            );
        }
        Ok(SimKubelet {
            inner,
            tasks,
            _work: work,
        })
    }

    /// Registers another node while the kubelet runs; its pods start like the others'.
    pub async fn add_node(&mut self, spec: NodeSpec) -> Result<()> {
        let name = spec.name.clone();
        let node = register(&self.inner.client, spec, self.inner.kubelet_port).await?;
        self.inner
            .nodes
            .write()
            .expect("nodes lock")
            .insert(name.clone(), Arc::new(node));
        self.tasks.insert(
            name.clone(),
            vec![tokio::spawn(node_loop(self.inner.clone(), name))],
        );
        Ok(())
    }

    /// Takes a node out of the cluster as a cloud provider would: its processes stop at
    /// once, its heartbeats end, and its Node object is deleted (its pods are left to the
    /// control plane). Its root stays on disk for inspection.
    pub async fn remove_node(&mut self, name: &str) -> Result<()> {
        for t in self.tasks.remove(name).unwrap_or_default() {
            t.abort();
        }
        let stopped: Vec<watch::Sender<Control>> = {
            let mut pods = self.inner.pods.lock().expect("pods lock");
            let uids: Vec<String> = pods
                .iter()
                .filter(|(_, (n, _))| n == name)
                .map(|(u, _)| u.clone())
                .collect();
            uids.into_iter()
                .filter_map(|u| pods.remove(&u).map(|(_, tx)| tx))
                .collect()
        };
        for tx in stopped {
            let _ = tx.send(Control::Delete(0));
        }
        self.inner.nodes.write().expect("nodes lock").remove(name);
        let api: Api<Node> = Api::all(self.inner.client.clone());
        api.delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("delete node {name}"))?;
        Ok(())
    }

    /// The names of the nodes, sorted.
    pub fn nodes(&self) -> Vec<String> {
        self.inner.names()
    }

    /// The scratch root of `node`.
    pub fn root(&self, node: &str) -> PathBuf {
        self.inner
            .node(node)
            .map(|n| n.spec.root.clone())
            .unwrap_or_else(|| panic!("no simulated node {node}"))
    }

    /// Current boot ID of `node`.
    pub fn boot_id(&self, node: &str) -> String {
        self.inner
            .node(node)
            .map(|n| n.host.node_info().boot_id)
            .unwrap_or_default()
    }

    /// Reboots `node` now (as if its host asked to).
    pub async fn reboot(&self, node: &str) -> Result<String> {
        reboot(&self.inner, node).await
    }
}

impl Drop for SimKubelet {
    fn drop(&mut self) {
        for t in self.tasks.values().flatten() {
            t.abort();
        }
        for (_, tx) in self.inner.pods.lock().expect("pods lock").values() {
            let _ = tx.send(Control::Delete(0));
        }
    }
}

/// How often a node reports its status when nothing changed: a kubelet's default
/// `nodeStatusReportFrequency`. Its liveness between reports is the Lease.
const STATUS_REPORT: Duration = Duration::from_secs(300);

/// Heartbeats — a Lease renewed every 10 s and the Node status every 5 minutes, as a
/// kubelet does — and reboots requested through the host.
async fn node_loop(inner: Arc<Inner>, name: String) {
    let api: Api<Node> = Api::all(inner.client.clone());
    let leases: Api<Lease> = Api::namespaced(inner.client.clone(), "kube-node-lease");
    // A kubelet renews its Lease every 10 s; a scale benchmark of thousands of simulated
    // nodes may space the renewals out (`NODEWRIGHT_SIM_HEARTBEAT_SECONDS`) so the control
    // plane on this machine is not what it measures.
    let heartbeat = std::env::var("NODEWRIGHT_SIM_HEARTBEAT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_secs);
    // Kubelets start at different moments; nodes made together must not beat together.
    let phase = |period: Duration| {
        let spread = fnv(&name) % period.as_millis().max(1) as u64;
        tokio::time::Instant::now() + Duration::from_millis(spread)
    };
    let mut beat = tokio::time::interval_at(phase(heartbeat), heartbeat);
    let mut report = tokio::time::interval_at(phase(STATUS_REPORT), STATUS_REPORT);
    let mut poll = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = beat.tick() => {
                let Some(n) = inner.node(&name) else { return };
                if *n.control.borrow() == Control::Run
                    && let Err(e) = renew(&leases, &name, heartbeat).await
                {
                    tracing::debug!(node = %name, "lease renewal: {e}");
                }
            }
            _ = report.tick() => {
                let Some(n) = inner.node(&name) else { return };
                if *n.control.borrow() == Control::Run {
                    let _ = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&node_status(&n.spec, &n.host.node_info().boot_id, true))).await;
                }
            }
            _ = poll.tick() => {
                let Some(n) = inner.node(&name) else { return };
                if SimHost::reboot_requested(&n.spec.root).is_some()
                    && let Err(e) = reboot(&inner, &name).await
                {
                    tracing::warn!(node = %name, error = %e, "simulated reboot failed");
                }
            }
        }
    }
}

/// Renews the node's Lease in `kube-node-lease`, made on the first renewal.
async fn renew(leases: &Api<Lease>, name: &str, every: Duration) -> Result<()> {
    let renewed = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ");
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": (every.as_secs() * 4).max(40),
            "renewTime": renewed.to_string(),
        }
    });
    leases
        .patch(
            name,
            &PatchParams::apply("nodewright-sim-kubelet").force(),
            &Patch::Apply(&lease),
        )
        .await?;
    Ok(())
}

/// FNV-1a: a stable spread of nodes over a period.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

async fn reboot(inner: &Arc<Inner>, name: &str) -> Result<String> {
    let node = inner
        .node(name)
        .with_context(|| format!("no simulated node {name}"))?;
    let api: Api<Node> = Api::all(inner.client.clone());
    let old = node.host.node_info().boot_id;
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&node_status(&node.spec, &old, false)),
    )
    .await?;
    node.control.send_replace(Control::Reboot);
    // Every container is killed before the boot ID changes, as a real reboot ends every
    // process first: after a fixed wait, a slow container could read the new boot ID.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while node.live.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "node {name}: containers still running 30 s into its reboot"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let boot = node.host.reboot()?;
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&node_status(&node.spec, &boot, true)),
    )
    .await?;
    node.control.send_replace(Control::Run);
    Ok(boot)
}

mod pods;

use pods::watch_pods;
