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
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::watcher;
use nodewright_hostops::{HostOps, NodeIdentity, SimHost};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::kubelet_api::{self, LogDirs};
use crate::proctree::{descendants, kill_all, kill_group};

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
    let registered = api.get(&spec.name).await?;
    let taints: Vec<_> = registered
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != "node.kubernetes.io/not-ready")
        .collect();
    api.patch(
        &spec.name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"taints": taints}})),
    )
    .await
    .with_context(|| format!("untaint node {}", spec.name))?;
    let (control, _) = watch::channel(Control::Run);
    Ok(SimNode {
        spec,
        host,
        control,
    })
}

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

async fn watch_pods(inner: Arc<Inner>) {
    let api: Api<Pod> = Api::all(inner.client.clone());
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(event) = stream.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
            Ok(watcher::Event::Delete(p)) => {
                if let Some((_, tx)) = p
                    .metadata
                    .uid
                    .as_ref()
                    .and_then(|u| inner.pods.lock().expect("pods lock").remove(u))
                {
                    let _ = tx.send(Control::Delete(0));
                }
                continue;
            }
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "pod watch error (retrying)");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        if inner.node(&node).is_none() {
            continue;
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let deleting = pod.metadata.deletion_timestamp.is_some();
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .unwrap_or(30)
            .max(0) as u64;
        let known = inner
            .pods
            .lock()
            .expect("pods lock")
            .get(&uid)
            .map(|(_, tx)| tx.clone());
        match known {
            Some(tx) if deleting => {
                let _ = tx.send(Control::Delete(grace));
            }
            Some(_) => {}
            None => {
                let phase = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default();
                if deleting || phase == "Succeeded" || phase == "Failed" {
                    if deleting {
                        finish_delete(&inner.client, &pod).await;
                    }
                    continue;
                }
                let (tx, rx) = watch::channel(Control::Run);
                inner
                    .pods
                    .lock()
                    .expect("pods lock")
                    .insert(uid, (node.clone(), tx));
                tokio::spawn(run_pod(inner.clone(), pod, node, rx));
            }
        }
    }
}

async fn finish_delete(client: &Client, pod: &Pod) {
    let api: Api<Pod> = Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    );
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    let _ = api
        .delete(pod.metadata.name.as_deref().unwrap_or_default(), &dp)
        .await;
}

/// One container's observed state.
#[derive(Clone, Debug, Default)]
struct ContainerRun {
    name: String,
    image: String,
    restarts: i32,
    state: Value,
    last_state: Value,
    running: bool,
    exit: Option<i32>,
}

fn pod_status(containers: &[ContainerRun], started: &str) -> Value {
    let all_done = containers.iter().all(|c| !c.running && c.exit.is_some());
    let phase = if !all_done {
        "Running"
    } else if containers.iter().all(|c| c.exit == Some(0)) {
        "Succeeded"
    } else {
        "Failed"
    };
    let ready = containers.iter().all(|c| c.running);
    let cond = |t: &str, ok: bool| json!({"type": t, "status": if ok { "True" } else { "False" }, "lastTransitionTime": now()});
    json!({"status": {
        "phase": phase,
        "startTime": started,
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "conditions": [cond("PodScheduled", true), cond("Initialized", true), cond("ContainersReady", ready), cond("Ready", ready)],
        "containerStatuses": containers.iter().map(|c| json!({
            "name": c.name, "image": c.image, "imageID": format!("sim://{}", c.image),
            "containerID": format!("sim://{}", c.name), "ready": c.running, "started": c.running,
            "restartCount": c.restarts, "state": c.state, "lastState": c.last_state,
        })).collect::<Vec<_>>(),
    }})
}

/// Rewrites `value` when it starts with one of the mount paths. The termination-message
/// path (always last in `mounts`, and distinctive) is also replaced inside strings, so
/// `sh -c '... > /dev/termination-log'` works.
fn rewrite(value: &str, mounts: &[(String, PathBuf)]) -> String {
    if let Some((term, file)) = mounts.last()
        && term.starts_with("/dev/")
        && value.contains(term.as_str())
        && value != term
    {
        return value.replace(term.as_str(), &file.display().to_string());
    }
    for (from, to) in mounts {
        if value == from {
            return to.display().to_string();
        }
        if let Some(rest) = value.strip_prefix(from.as_str())
            && rest.starts_with('/')
        {
            return format!("{}{rest}", to.display());
        }
        // `--flag=/mount/path` forms.
        if let Some((flag, v)) = value.split_once('=')
            && (v == from || v.starts_with(&format!("{from}/")))
        {
            return format!("{flag}={}", rewrite(v, mounts));
        }
    }
    value.to_string()
}

async fn run_pod(inner: Arc<Inner>, pod: Pod, node: String, control: watch::Receiver<Control>) {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(inner.client.clone(), &ns);
    let started = now();
    let policy = spec
        .restart_policy
        .clone()
        .unwrap_or_else(|| "Always".into());
    let pod_dir = inner.work.join(&uid);
    let _ = std::fs::create_dir_all(&pod_dir);
    inner
        .logs
        .lock()
        .expect("log dirs lock")
        .insert(format!("{ns}/{name}"), pod_dir.clone());
    let Some(sim) = inner.node(&node) else { return };
    let node_root = sim.spec.root.clone();
    let host_mounts: HashMap<String, PathBuf> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            v.host_path.as_ref().map(|h| {
                (
                    v.name.clone(),
                    node_root.join(h.path.trim_start_matches('/')),
                )
            })
        })
        .collect();

    let runs = Arc::new(Mutex::new(
        spec.containers
            .iter()
            .map(|c| ContainerRun {
                name: c.name.clone(),
                image: c.image.clone().unwrap_or_default(),
                ..Default::default()
            })
            .collect::<Vec<_>>(),
    ));
    let (changed_tx, mut changed_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut handles = Vec::new();
    for (i, container) in spec.containers.iter().enumerate() {
        let mut mounts: Vec<(String, PathBuf)> = container
            .volume_mounts
            .iter()
            .flatten()
            .filter_map(|m| {
                host_mounts
                    .get(&m.name)
                    .map(|p| (m.mount_path.trim_end_matches('/').to_string(), p.clone()))
            })
            .collect();
        let term_path = container
            .termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into());
        let term_file = pod_dir.join(format!("{}.termination-log", container.name));
        mounts.push((term_path, term_file.clone()));
        let ctx = ContainerCtx {
            container: container.clone(),
            index: i,
            policy: policy.clone(),
            mounts,
            term_file,
            log_file: pod_dir.join(format!("{}.log", container.name)),
            env: pod_env(&pod, &node, &node_root),
            cwd: pod_dir.clone(),
            fallback_to_logs: container.termination_message_policy.as_deref()
                == Some("FallbackToLogsOnError"),
        };
        handles.push(tokio::spawn(run_container(
            ctx,
            runs.clone(),
            changed_tx.clone(),
            control.clone(),
            sim.control.subscribe(),
        )));
    }
    drop(changed_tx);
    // Write status whenever a container changes; stop when all container loops end.
    while changed_rx.recv().await.is_some() {
        let status = pod_status(&runs.lock().expect("runs lock"), &started);
        if let Err(e) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            tracing::debug!(pod = %name, error = %e, "status update failed");
        }
    }
    for h in handles {
        let _ = h.await;
    }
    inner.pods.lock().expect("pods lock").remove(&uid);
    let stopped = !matches!(*control.borrow(), Control::Run);
    if stopped {
        finish_delete(&inner.client, &pod).await;
    }
}

fn pod_env(pod: &Pod, node: &str, root: &Path) -> Vec<(String, String)> {
    vec![
        ("NODEWRIGHT_SIM_ROOT".into(), root.display().to_string()),
        ("NODEWRIGHT_SIM_NODE".into(), node.into()),
        (
            "POD_NAME".into(),
            pod.metadata.name.clone().unwrap_or_default(),
        ),
        (
            "POD_NAMESPACE".into(),
            pod.metadata.namespace.clone().unwrap_or_default(),
        ),
    ]
}

struct ContainerCtx {
    container: Container,
    index: usize,
    policy: String,
    mounts: Vec<(String, PathBuf)>,
    term_file: PathBuf,
    log_file: PathBuf,
    env: Vec<(String, String)>,
    cwd: PathBuf,
    fallback_to_logs: bool,
}

impl ContainerCtx {
    /// Present while the container is not running: the kubelet endpoint ends a follow on it.
    fn ended_file(&self) -> PathBuf {
        self.cwd.join(format!("{}.ended", self.container.name))
    }
}

impl ContainerCtx {
    fn field_ref(&self, path: &str) -> Option<String> {
        let find = |k: &str| {
            self.env
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        match path {
            "metadata.name" => find("POD_NAME"),
            "metadata.namespace" => find("POD_NAMESPACE"),
            "spec.nodeName" => find("NODEWRIGHT_SIM_NODE"),
            "status.hostIP" | "status.podIP" => Some("127.0.0.1".into()),
            _ => None,
        }
    }

    fn command(&self) -> Option<tokio::process::Command> {
        let mut argv: Vec<String> = self.container.command.clone().unwrap_or_default();
        argv.extend(self.container.args.clone().unwrap_or_default());
        let (program, args) = argv.split_first()?;
        let mut cmd = tokio::process::Command::new(rewrite(program, &self.mounts));
        cmd.args(args.iter().map(|a| rewrite(a, &self.mounts)));
        cmd.env_clear().env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        for e in self.container.env.iter().flatten() {
            let value = match (&e.value, &e.value_from) {
                (Some(v), _) => Some(v.clone()),
                (None, Some(from)) => from
                    .field_ref
                    .as_ref()
                    .and_then(|f| self.field_ref(&f.field_path)),
                (None, None) => Some(String::new()),
            };
            if let Some(v) = value {
                cmd.env(&e.name, rewrite(&v, &self.mounts));
            }
        }
        cmd.current_dir(&self.cwd)
            .stdin(Stdio::null())
            .process_group(0);
        Some(cmd)
    }
}

/// A container's exit code as Kubernetes reports it: the code, or 128 + the signal.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(9))
}

fn terminated(code: i32, message: String, started: &str) -> Value {
    json!({"terminated": {
        "exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
        "message": message, "startedAt": started, "finishedAt": now(),
    }})
}

async fn run_container(
    ctx: ContainerCtx,
    runs: Arc<Mutex<Vec<ContainerRun>>>,
    changed: tokio::sync::mpsc::UnboundedSender<()>,
    mut pod_control: watch::Receiver<Control>,
    mut node_control: watch::Receiver<Control>,
) {
    let set = |f: &dyn Fn(&mut ContainerRun)| {
        f(&mut runs.lock().expect("runs lock")[ctx.index]);
        let _ = changed.send(());
    };
    loop {
        // Wait out a reboot in progress.
        loop {
            let rebooting = *node_control.borrow() == Control::Reboot;
            if !rebooting {
                break;
            }
            if node_control.changed().await.is_err() {
                return;
            }
        }
        let _ = std::fs::remove_file(&ctx.term_file);
        let _ = std::fs::remove_file(ctx.ended_file());
        let started = now();
        let child = match ctx.command() {
            None => None,
            Some(mut cmd) => {
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&ctx.log_file)
                    .ok();
                if let Some(log) = log {
                    cmd.stdout(log.try_clone().map(Stdio::from).unwrap_or(Stdio::null()))
                        .stderr(Stdio::from(log));
                }
                match cmd.spawn() {
                    Ok(c) => Some(c),
                    Err(e) => {
                        let msg = format!("cannot start: {e}");
                        set(&|c| {
                            c.running = false;
                            c.exit = Some(127);
                            c.state = terminated(127, msg.clone(), &started);
                        });
                        if ctx.policy == "Never" {
                            return;
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        set(&|c| c.restarts += 1);
                        continue;
                    }
                }
            }
        };
        set(&|c| {
            c.running = true;
            c.exit = None;
            c.state = json!({"running": {"startedAt": started}});
        });
        let pid = child.as_ref().and_then(|c| c.id());
        // Wait for the process (or forever, for a sleeper) or a control change.
        let mut child = child;
        let outcome: (i32, Control) = loop {
            let wait = async {
                match child.as_mut() {
                    Some(c) => c.wait().await.ok().map(exit_code),
                    None => futures::future::pending().await,
                }
            };
            tokio::select! {
                code = wait => break (code.unwrap_or(137), Control::Run),
                _ = pod_control.changed() => {
                    let now_control = *pod_control.borrow();
                    if let Control::Delete(grace) = now_control {
                        let Some(pid) = pid else { break (0, Control::Delete(grace)) };
                        // Known before the main process goes (its orphans lose the link).
                        let tree = descendants(pid);
                        kill_group(pid, "-TERM");
                        let c = child.as_mut().expect("child with pid");
                        let code = match tokio::time::timeout(Duration::from_secs(grace), c.wait()).await {
                            Ok(Ok(s)) => exit_code(s),
                            _ => {
                                kill_group(pid, "-KILL");
                                let _ = c.wait().await;
                                137
                            }
                        };
                        // Whatever it started goes with the container.
                        kill_all(pid, &tree);
                        break (code, Control::Delete(grace));
                    }
                }
                _ = node_control.changed() => {
                    let rebooting = *node_control.borrow() == Control::Reboot;
                    if rebooting {
                        if let Some(pid) = pid {
                            kill_all(pid, &descendants(pid));
                            let _ = child.as_mut().expect("child").wait().await;
                        }
                        break (137, Control::Reboot);
                    }
                }
            }
        };
        let (code, why) = outcome;
        let mut message = std::fs::read_to_string(&ctx.term_file).unwrap_or_default();
        if message.is_empty() && code != 0 && ctx.fallback_to_logs {
            let log = std::fs::read_to_string(&ctx.log_file).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            message = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
        }
        if why == Control::Reboot && message.is_empty() {
            message = "killed by a node reboot".into();
        }
        let state = terminated(code, message, &started);
        // Ends a `kubectl logs -f` of this run (the kubelet endpoint watches for it).
        let _ = std::fs::write(ctx.ended_file(), "");
        let restart = match why {
            Control::Delete(_) => false,
            Control::Run | Control::Reboot => {
                ctx.policy == "Always" || (ctx.policy == "OnFailure" && code != 0)
            }
        };
        set(&|c| {
            c.running = false;
            c.exit = Some(code);
            if restart {
                c.last_state = state.clone();
                c.state = json!({"waiting": {"reason": "CrashLoopBackOff"}});
            } else {
                c.state = state.clone();
            }
        });
        if !restart {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        set(&|c| c.restarts += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_are_rewritten_in_arguments() {
        let mounts = vec![
            ("/host".to_string(), PathBuf::from("/tmp/n1")),
            (
                "/dev/termination-log".to_string(),
                PathBuf::from("/tmp/p/t"),
            ),
        ];
        assert_eq!(rewrite("/host", &mounts), "/tmp/n1");
        assert_eq!(rewrite("/host/etc/x", &mounts), "/tmp/n1/etc/x");
        assert_eq!(rewrite("/hostile", &mounts), "/hostile");
        assert_eq!(rewrite("--root=/host/var", &mounts), "--root=/tmp/n1/var");
        assert_eq!(
            rewrite("--termination-log=/dev/termination-log", &mounts),
            "--termination-log=/tmp/p/t"
        );
        assert_eq!(
            rewrite("echo x > /dev/termination-log", &mounts),
            "echo x > /tmp/p/t"
        );
    }
}
