//! An end-to-end environment: a fresh control plane, simulated nodes, a real registry with
//! the first-party plugins pushed, and the real operator binary running against it (agents
//! in the Jobs are the real `nodewright-agent`).

#![allow(dead_code, reason = "each scenario binary uses part of the harness")]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use nodewright_api::keys;
use nodewright_api::v1alpha1::{NodeState, NodeWright, Status};
use nodewright_hostops::{HostAction, SimHost};
use nodewright_oci::{Registry, RegistryConfig};
use nodewright_testcluster::{ControlPlane, NodeSpec, SimKubelet};
use nodewright_testsupport::TestRegistry;
use serde_json::{Value, json};

/// The operator's Job namespace in every scenario.
pub const NS: &str = "nodewright";

/// `target/<profile>/<name>`: the binaries built beside this test.
fn sibling_binary(name: &str) -> PathBuf {
    let operator = PathBuf::from(env!("CARGO_BIN_EXE_nodewright-operator"));
    let path = operator.with_file_name(name);
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        if !path.exists() {
            // `cargo test --workspace` builds it; a single-crate run may not have.
            let release = operator.parent().and_then(Path::file_name).is_some_and(|p| p == "release");
            let mut cmd = Command::new(env!("CARGO"));
            cmd.args(["build", "-p", "nodewright-agent", "--bin", "nodewright-agent"]);
            if release {
                cmd.arg("--release");
            }
            assert!(cmd.status().expect("cargo build the agent").success(), "building nodewright-agent failed");
        }
    });
    path
}

/// One scenario's world.
pub struct E2e {
    pub cp: ControlPlane,
    pub client: Client,
    pub sim: SimKubelet,
    pub registry: TestRegistry,
    pub nodes: Vec<String>,
    operator: Option<Child>,
    operator_log: PathBuf,
    work: tempfile::TempDir,
}

impl E2e {
    /// A control plane with `nodes` (name, labels), CRDs installed, plugins pushed.
    pub async fn start(nodes: &[(&str, &[(&str, &str)])]) -> E2e {
        let cp = tokio::task::spawn_blocking(ControlPlane::start).await.unwrap().expect("control plane");
        let client = cp.client().await.unwrap();
        install_crds(&client).await;
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap()).await.unwrap();
        let work = tempfile::tempdir().unwrap();
        let specs: Vec<NodeSpec> = nodes
            .iter()
            .map(|(name, labels)| labels.iter().fold(NodeSpec::new(name, &work.path().join("nodes")), |s, (k, v)| s.label(k, v)))
            .collect();
        let sim = SimKubelet::start(client.clone(), specs).await.unwrap();
        let registry = TestRegistry::start();
        let reg = Registry::new(RegistryConfig { insecure: vec![registry.host().into()], ..Default::default() });
        for (name, path) in nodewright_artifacts::PLUGINS {
            reg.push(&format!("{}/plugins/{name}:1.0.0", registry.host()), &nodewright_artifacts::read(path), Default::default(), &|_| {}).await.unwrap();
        }
        let operator_log = work.path().join("operator.log");
        E2e { cp, client, sim, registry, nodes: nodes.iter().map(|(n, _)| n.to_string()).collect(), operator: None, operator_log, work }
    }

    /// `registry/plugins/<name>:1.0.0`.
    pub fn plugin(&self, name: &str) -> String {
        format!("{}/plugins/{name}:1.0.0", self.registry.host())
    }

    /// Starts the operator binary (again) with the harness's flags plus `extra`.
    pub fn start_operator(&mut self, extra: &[&str]) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.operator_log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_nodewright-operator"))
            .env("KUBECONFIG", self.cp.kubeconfig())
            .env("RUST_LOG", std::env::var("E2E_OPERATOR_LOG").unwrap_or_else(|_| "info,nodewright_operator=debug,kube=warn".into()))
            .args(["--namespace", NS, "--agent-backend", "sim", "--agent-image", "nodewright/agent:test", "--resync-seconds", "5"])
            .arg(format!("--agent-command={}", sibling_binary("nodewright-agent").display()))
            .arg(format!("--insecure-registry={}", self.registry.host()))
            .arg(format!("--plugin-cache-dir={}", self.work.path().join("operator-cache").display()))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the operator");
        self.operator = Some(child);
    }

    /// Kills the operator (SIGKILL: no chance to tidy up).
    pub fn kill_operator(&mut self) {
        if let Some(mut c) = self.operator.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The operator's log so far.
    pub fn operator_log(&self) -> String {
        std::fs::read_to_string(&self.operator_log).unwrap_or_default()
    }

    /// Where to look when something failed.
    pub fn diagnostics(&self) -> String {
        let log = self.operator_log();
        if let Ok(keep) = std::env::var("E2E_KEEP_LOG") {
            let _ = std::fs::write(keep, &log);
        }
        let tail: Vec<&str> = log.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect();
        format!("--- operator log (tail) ---\n{}\n--- control plane ---\n{}", tail.join("\n"), self.cp.logs())
    }

    /// NodeWright statuses, node annotations and Jobs, for failure messages.
    pub async fn cluster_state(&self) -> String {
        let mut out = String::from("--- cluster state ---\n");
        for nw in Api::<NodeWright>::all(self.client.clone()).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
            out.push_str(&format!("NodeWright {}: {}\n", nw.metadata.name.unwrap_or_default(), serde_json::to_string(&nw.status).unwrap_or_default()));
        }
        for n in Api::<Node>::all(self.client.clone()).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
            let unsched = n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
            out.push_str(&format!("Node {} unschedulable={unsched} annotations={:?}\n", n.metadata.name.unwrap_or_default(), n.metadata.annotations.unwrap_or_default()));
        }
        for j in self.jobs().await {
            out.push_str(&format!("Job {} status={}\n", j.metadata.name.unwrap_or_default(), serde_json::to_string(&j.status).unwrap_or_default()));
        }
        out
    }

    /// Creates a NodeWright from JSON.
    pub async fn apply(&self, nw: Value) {
        let nw: NodeWright = serde_json::from_value(nw).expect("a NodeWright");
        let api: Api<NodeWright> = Api::all(self.client.clone());
        api.patch(nw.metadata.name.as_deref().unwrap(), &PatchParams::apply("e2e").force(), &Patch::Apply(&nw)).await.unwrap();
    }

    /// Merge-patches a NodeWright.
    pub async fn patch(&self, name: &str, patch: Value) {
        Api::<NodeWright>::all(self.client.clone()).patch(name, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    }

    pub async fn nodewright(&self, name: &str) -> NodeWright {
        Api::<NodeWright>::all(self.client.clone()).get(name).await.unwrap()
    }

    pub async fn node(&self, name: &str) -> Node {
        Api::<Node>::all(self.client.clone()).get(name).await.unwrap()
    }

    pub async fn state(&self, cr: &str, node: &str) -> NodeState {
        let n = self.node(node).await;
        n.metadata.annotations.unwrap_or_default().get(&keys::node_state(cr)).map(|s| serde_json::from_str(s).unwrap()).unwrap_or_default()
    }

    pub async fn node_status(&self, cr: &str, node: &str) -> Option<Status> {
        self.nodewright(cr).await.status.and_then(|s| s.node_status.get(node).copied())
    }

    /// A condition of a CR: (status, reason, message).
    pub async fn condition(&self, cr: &str, kind: &str) -> Option<(String, String, String)> {
        let c = self.nodewright(cr).await.status?.conditions.into_iter().find(|c| c.type_ == kind)?;
        Some((c.status, c.reason, c.message))
    }

    /// Every event's (reason, note) regarding an object named `name`.
    pub async fn events(&self, name: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for ns in ["default", NS] {
            let evs = Api::<Event>::namespaced(self.client.clone(), ns).list(&ListParams::default()).await.unwrap();
            for e in evs.items {
                if e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name) {
                    out.push((e.reason.unwrap_or_default(), e.note.unwrap_or_default()));
                }
            }
        }
        out
    }

    /// The simulated host's recorded effects on `node`.
    pub fn journal(&self, node: &str) -> Vec<HostAction> {
        SimHost::journal(self.sim.root(node))
    }

    /// Puts an executable script at `path` (absolute, inside the node) on every node.
    pub fn script(&self, path: &str, body: &str) {
        for n in &self.nodes {
            let local = self.sim.root(n).join(path.trim_start_matches('/'));
            std::fs::create_dir_all(local.parent().unwrap()).unwrap();
            std::fs::write(&local, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&local, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        }
    }

    /// Writes a file under a node's root.
    pub fn host_file(&self, node: &str, path: &str, content: &str) {
        let local = self.sim.root(node).join(path.trim_start_matches('/'));
        std::fs::create_dir_all(local.parent().unwrap()).unwrap();
        std::fs::write(local, content).unwrap();
    }

    pub fn read_host_file(&self, node: &str, path: &str) -> Option<String> {
        std::fs::read_to_string(self.sim.root(node).join(path.trim_start_matches('/'))).ok()
    }

    /// Waits until `check` returns Some, polling; panics with diagnostics after `timeout`.
    pub async fn wait<T, F, Fut>(&self, what: &str, timeout: Duration, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let start = Instant::now();
        loop {
            if let Some(v) = check().await {
                return v;
            }
            if start.elapsed() > timeout {
                panic!("timed out after {timeout:?} waiting for {what}\n{}\n{}", self.cluster_state().await, self.diagnostics());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits for the CR to report `complete` for its current generation.
    pub async fn wait_complete(&self, cr: &str, timeout: Duration) {
        self.wait(&format!("{cr} complete"), timeout, || async {
            let nw = self.nodewright(cr).await;
            let status = nw.status?;
            (status.status? == Status::Complete && status.observed_generation >= nw.metadata.generation).then_some(())
        })
        .await
    }

    /// Creates a PodDisruptionBudget in `default`.
    pub async fn pdb(&self, name: &str, selector: Value) {
        let pdb: k8s_openapi::api::policy::v1::PodDisruptionBudget =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"minAvailable": 1, "selector": {"matchLabels": selector}}})).unwrap();
        Api::namespaced(self.client.clone(), "default").create(&PostParams::default(), &pdb).await.unwrap();
    }

    /// Deletes a pod in `default` at once.
    pub async fn delete_pod(&self, name: &str) {
        let dp = kube::api::DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
        let _ = Api::<Pod>::namespaced(self.client.clone(), "default").delete(name, &dp).await;
    }

    /// Merge-patches a node.
    pub async fn patch_node(&self, name: &str, patch: Value) {
        Api::<Node>::all(self.client.clone()).patch(name, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    }

    /// Reboots the simulated host recorded.
    pub fn reboots(&self, node: &str) -> usize {
        self.journal(node).iter().filter(|a| matches!(a, HostAction::RebootRequested { .. })).count()
    }

    /// Our Jobs.
    pub async fn jobs(&self) -> Vec<Job> {
        Api::<Job>::namespaced(self.client.clone(), NS).list(&ListParams::default()).await.unwrap().items
    }

    /// Creates a plain workload pod on `node` (owned by a ReplicaSet-like owner if `managed`).
    pub async fn workload_pod(&self, node: &str, name: &str, labels: Value) {
        // A real (inert: no ReplicaSet controller runs here) owner, so the garbage collector
        // leaves the pod alone and drains see a managed pod.
        let sets: Api<k8s_openapi::api::apps::v1::ReplicaSet> = Api::namespaced(self.client.clone(), "default");
        let owner = match sets.get_opt("workload").await.unwrap() {
            Some(rs) => rs,
            None => {
                let rs = serde_json::from_value(json!({
                    "metadata": {"name": "workload"},
                    "spec": {"replicas": 0, "selector": {"matchLabels": {"owner": "workload"}},
                             "template": {"metadata": {"labels": {"owner": "workload"}}, "spec": {"containers": [{"name": "c", "image": "sleeper"}]}}}
                }))
                .unwrap();
                sets.create(&PostParams::default(), &rs).await.unwrap()
            }
        };
        let uid = owner.metadata.uid.clone().unwrap();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels, "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "workload", "uid": uid, "controller": true}]},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "sleeper"}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }

    pub async fn pod_exists(&self, name: &str) -> bool {
        Api::<Pod>::namespaced(self.client.clone(), "default").get_opt(name).await.unwrap().is_some()
    }
}

impl Drop for E2e {
    fn drop(&mut self) {
        self.kill_operator();
    }
}

async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, yaml) in nodewright_api::crdgen::generated() {
        let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&yaml).unwrap();
        crds.patch(crd.metadata.name.as_deref().unwrap(), &PatchParams::apply("e2e").force(), &Patch::Apply(&crd)).await.unwrap();
    }
    for name in ["nodewrights.nodewright.io", "deploymentpolicies.nodewright.io"] {
        let start = Instant::now();
        loop {
            let c = crds.get(name).await.unwrap();
            if c.status.and_then(|s| s.conditions).unwrap_or_default().iter().any(|c| c.type_ == "Established" && c.status == "True") {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "{name} not established");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // The API discovery cache of a fresh client may not know the kinds yet; give it a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
}
