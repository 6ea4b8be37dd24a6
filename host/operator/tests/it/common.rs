//! An end-to-end environment: a fresh control plane, simulated nodes, a real registry with
//! the first-party plugins pushed, and the real operator binary running against it (agents
//! in the Jobs are the real `nodewright-agent`).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use nodewright_api::keys;
use nodewright_api::node_state::NodeState;
use nodewright_api::v1alpha1::{NodeWright, Status};
use nodewright_hostops::{HostAction, SimHost};
use nodewright_localcluster::{Binaries, Cluster, Operator};
use serde_json::{Value, json};

pub use nodewright_localcluster::NS;

/// One scenario's world: a fresh local cluster and, when started, the operator.
pub struct E2e {
    pub cluster: Cluster,
    bins: Binaries,
    operator: Option<Operator>,
    operator_log: PathBuf,
    work: tempfile::TempDir,
}

impl std::ops::Deref for E2e {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

impl E2e {
    /// A control plane with `nodes` (name, labels), CRDs installed, plugins pushed.
    pub async fn start(nodes: &[(&str, &[(&str, &str)])]) -> E2e {
        let work = tempfile::tempdir().unwrap();
        let defs: Vec<(String, Vec<(String, String)>)> = nodes
            .iter()
            .map(|(n, labels)| {
                (
                    n.to_string(),
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                )
            })
            .collect();
        let cluster = Cluster::start(work.path(), &defs)
            .await
            .expect("local cluster");
        static BINS: OnceLock<Binaries> = OnceLock::new();
        let bins = BINS
            .get_or_init(|| {
                Binaries::in_dir(
                    Path::new(env!("CARGO_BIN_EXE_nodewright-operator"))
                        .parent()
                        .expect("a profile directory"),
                )
                .expect("operator and agent binaries")
            })
            .clone();
        let operator_log = work.path().join("operator.log");
        E2e {
            cluster,
            bins,
            operator: None,
            operator_log,
            work,
        }
    }

    /// Starts the operator binary (again) with the harness's flags plus `extra`.
    pub fn start_operator(&mut self, extra: &[&str]) {
        let rust_log = std::env::var("E2E_OPERATOR_LOG")
            .unwrap_or_else(|_| "info,nodewright_operator=debug,kube=warn".into());
        let cache = self.work.path().join("operator-cache");
        self.operator = Some(
            Operator::start(
                &self.cluster,
                &self.bins,
                &cache,
                &self.operator_log,
                &rust_log,
                extra,
            )
            .expect("start the operator"),
        );
    }

    /// Kills the operator (SIGKILL: no chance to tidy up).
    pub fn kill_operator(&mut self) {
        if let Some(op) = self.operator.take() {
            op.kill();
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
        let tail: Vec<&str> = log
            .lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!(
            "--- operator log (tail) ---\n{}\n--- control plane ---\n{}",
            tail.join("\n"),
            self.cp.logs()
        )
    }

    /// NodeWright statuses, node annotations and Jobs, for failure messages.
    pub async fn cluster_state(&self) -> String {
        let mut out = String::from("--- cluster state ---\n");
        for nw in Api::<NodeWright>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            out.push_str(&format!(
                "NodeWright {}: {}\n",
                nw.metadata.name.unwrap_or_default(),
                serde_json::to_string(&nw.status).unwrap_or_default()
            ));
        }
        for n in Api::<Node>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            let unsched = n
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false);
            out.push_str(&format!(
                "Node {} unschedulable={unsched} annotations={:?}\n",
                n.metadata.name.unwrap_or_default(),
                n.metadata.annotations.unwrap_or_default()
            ));
        }
        for j in self.jobs().await {
            out.push_str(&format!(
                "Job {} status={}\n",
                j.metadata.name.unwrap_or_default(),
                serde_json::to_string(&j.status).unwrap_or_default()
            ));
        }
        out
    }

    /// Creates a NodeWright from JSON.
    pub async fn apply(&self, nw: Value) {
        let nw: NodeWright = serde_json::from_value(nw).expect("a NodeWright");
        let api: Api<NodeWright> = Api::all(self.client.clone());
        api.patch(
            nw.metadata.name.as_deref().unwrap(),
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&nw),
        )
        .await
        .unwrap();
    }

    /// Merge-patches a NodeWright.
    pub async fn patch(&self, name: &str, patch: Value) {
        Api::<NodeWright>::all(self.client.clone())
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
    }

    pub async fn nodewright(&self, name: &str) -> NodeWright {
        Api::<NodeWright>::all(self.client.clone())
            .get(name)
            .await
            .unwrap()
    }

    pub async fn node(&self, name: &str) -> Node {
        Api::<Node>::all(self.client.clone())
            .get(name)
            .await
            .unwrap()
    }

    pub async fn state(&self, cr: &str, node: &str) -> NodeState {
        let n = self.node(node).await;
        NodeState::read(node, &n.metadata.annotations.unwrap_or_default(), cr).unwrap()
    }

    pub async fn node_status(&self, cr: &str, node: &str) -> Option<Status> {
        self.nodewright(cr)
            .await
            .status
            .and_then(|s| s.node_status.get(node).copied())
    }

    /// A condition of a CR: (status, reason, message).
    pub async fn condition(&self, cr: &str, kind: &str) -> Option<(String, String, String)> {
        let c = self
            .nodewright(cr)
            .await
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == kind)?;
        Some((c.status, c.reason, c.message))
    }

    /// Every event's (reason, note) regarding an object named `name`.
    pub async fn events(&self, name: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for ns in ["default", NS] {
            let evs = Api::<Event>::namespaced(self.client.clone(), ns)
                .list(&ListParams::default())
                .await
                .unwrap();
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
        SimHost::journal(&self.sim.root(node))
    }

    /// Puts an executable script at `path` (absolute, inside the node) on every node.
    pub fn script(&self, path: &str, body: &str) {
        for n in &self.nodes {
            let local = self.host_path(n, path);
            std::fs::create_dir_all(local.parent().unwrap()).unwrap();
            std::fs::write(&local, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&local, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
    }

    /// Writes a file under a node's root.
    pub fn host_file(&self, node: &str, path: &str, content: &str) {
        self.cluster.host_file(node, path, content).unwrap();
    }

    pub fn read_host_file(&self, node: &str, path: &str) -> Option<String> {
        std::fs::read_to_string(self.host_path(node, path)).ok()
    }

    /// Waits until `check` returns Some, polling; panics with diagnostics after `timeout`.
    pub async fn wait<T, F, Fut>(&self, what: &str, timeout: Duration, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        match nodewright_localcluster::poll(timeout, check).await {
            Some(v) => v,
            None => panic!(
                "timed out after {timeout:?} waiting for {what}\n{}\n{}",
                self.cluster_state().await,
                self.diagnostics()
            ),
        }
    }

    /// Waits for the CR to report `complete` for its current generation.
    pub async fn wait_complete(&self, cr: &str, timeout: Duration) {
        self.wait(&format!("{cr} complete"), timeout, || async {
            let nw = self.nodewright(cr).await;
            let status = nw.status?;
            (status.status? == Status::Complete
                && status.observed_generation >= nw.metadata.generation)
                .then_some(())
        })
        .await
    }

    /// Creates a PodDisruptionBudget in `default`.
    pub async fn pdb(&self, name: &str, selector: Value) {
        let pdb: k8s_openapi::api::policy::v1::PodDisruptionBudget =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"minAvailable": 1, "selector": {"matchLabels": selector}}})).unwrap();
        Api::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &pdb)
            .await
            .unwrap();
    }

    /// Deletes a pod in `default` at once.
    pub async fn delete_pod(&self, name: &str) {
        let dp = kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        let _ = Api::<Pod>::namespaced(self.client.clone(), "default")
            .delete(name, &dp)
            .await;
    }

    /// Merge-patches a node.
    pub async fn patch_node(&self, name: &str, patch: Value) {
        Api::<Node>::all(self.client.clone())
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
    }

    /// Reboots the simulated host recorded.
    pub fn reboots(&self, node: &str) -> usize {
        self.journal(node)
            .iter()
            .filter(|a| matches!(a, HostAction::RebootRequested { .. }))
            .count()
    }

    /// Our Jobs.
    pub async fn jobs(&self) -> Vec<Job> {
        Api::<Job>::namespaced(self.client.clone(), NS)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }

    /// Creates a workload pod on `node` (owned by an inert ReplicaSet).
    pub async fn workload_pod(&self, node: &str, name: &str, labels: Value) {
        self.cluster.workload_pod(node, name, labels).await.unwrap();
    }

    /// Adds a simulated node while the cluster runs.
    pub async fn add_node(&mut self, name: &str, labels: &[(&str, &str)]) {
        let spec = labels.iter().fold(
            nodewright_testcluster::NodeSpec::new(name, &self.work.path().join("nodes")),
            |s, (k, v)| s.label(k, v),
        );
        self.cluster
            .sim
            .add_node(spec)
            .await
            .expect("add a simulated node");
        self.cluster.nodes.push(name.to_string());
    }

    /// Removes a simulated node from the cluster (processes stopped, Node deleted).
    pub async fn remove_node(&mut self, name: &str) {
        self.cluster
            .sim
            .remove_node(name)
            .await
            .expect("remove a simulated node");
        self.cluster.nodes.retain(|n| n != name);
    }

    /// Takes the registry down (its port refuses connections).
    pub fn registry_down(&mut self) {
        self.cluster.registry.stop();
    }

    /// Brings the registry back at the same address with the same content.
    pub fn registry_up(&mut self) {
        self.cluster.registry.restart();
    }

    /// Creates or updates a DeploymentPolicy.
    pub async fn policy(&self, name: &str, spec: Value) {
        self.cluster
            .apply(&json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": name}, "spec": spec}))
            .await
            .expect("apply a DeploymentPolicy");
    }

    /// Deletes a NodeWright (its finalizer decides when it is gone).
    pub async fn delete(&self, cr: &str) {
        Api::<NodeWright>::all(self.client.clone())
            .delete(cr, &kube::api::DeleteParams::default())
            .await
            .unwrap();
    }

    /// Whether a NodeWright still exists.
    pub async fn exists(&self, cr: &str) -> bool {
        Api::<NodeWright>::all(self.client.clone())
            .get_opt(cr)
            .await
            .unwrap()
            .is_some()
    }

    /// A NodeWright's Jobs (by label), and the pods they made.
    pub async fn cr_jobs(&self, cr: &str) -> (Vec<Job>, Vec<Pod>) {
        let lp = ListParams::default().labels(&format!("{}={cr}", keys::job::CR));
        let jobs = Api::<Job>::namespaced(self.client.clone(), NS)
            .list(&lp)
            .await
            .unwrap()
            .items;
        let pods = Api::<Pod>::namespaced(self.client.clone(), NS)
            .list(&lp)
            .await
            .unwrap()
            .items;
        (jobs, pods)
    }

    pub async fn pod_exists(&self, name: &str) -> bool {
        Api::<Pod>::namespaced(self.client.clone(), "default")
            .get_opt(name)
            .await
            .unwrap()
            .is_some()
    }
}

/// A reboot package whose apply waits for `release-apply` under the node's root and whose
/// post-interrupt waits for `release-post`; each writes a mark when it gets through.
pub fn held_reboot_package(e: &E2e, version: &str) -> Value {
    e.script("/usr/local/bin/hold-apply", "while [ ! -f release-apply ]; do sleep 0.1; done; mkdir -p etc && echo installed > etc/driver");
    e.script(
        "/usr/local/bin/hold-post",
        "while [ ! -f release-post ]; do sleep 0.1; done; echo verified > etc/driver-verified",
    );
    json!({
        "version": version, "plugin": e.plugin("shell"), "interrupt": {"type": "reboot"},
        "capabilities": {"commands": [{"path": "/usr/local/bin/hold-apply"}, {"path": "/usr/local/bin/hold-post"}]},
        "configMap": {"apply": "/usr/local/bin/hold-apply", "post-interrupt": "/usr/local/bin/hold-post", "interrupt": "reboot"}
    })
}

pub fn release(e: &E2e, node: &str, what: &str) {
    e.host_file(node, &format!("/release-{what}"), "");
}

/// GET over plain HTTP/1.1 from a local listener (the operator's metrics port); the body.
pub async fn http_get(port: u16, path: &str) -> String {
    nodewright_localcluster::http_get(port, path)
        .await
        .expect("GET from the operator")
        .1
}

/// The metric names documented in docs/operator.md's tables (first column, backquoted).
pub fn documented_metrics() -> Vec<String> {
    let doc =
        std::fs::read_to_string(nodewright_testregistry::workspace().join("docs/operator.md"))
            .unwrap();
    doc.lines()
        .filter_map(|l| {
            l.strip_prefix("| `nodewright_")?
                .split('`')
                .next()
                .map(|n| format!("nodewright_{n}"))
        })
        .collect()
}
