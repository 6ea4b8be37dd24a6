//! What the cluster-verb test shares: the cluster with the operator, running the CLI
//! against it, and waiting on what the operator does; its sections run in order on one
//! cluster (starting one costs more than all the verbs).

#![allow(dead_code, reason = "not every section uses every helper")]

pub mod preview;
pub mod read;
pub mod running;
pub mod state;

use std::process::Command;
use std::time::Duration;

use kube::api::Api;
use nodewright_api::v1alpha1::{NodeWright, Status};
use nodewright_hostops::{HostAction, SimHost};
use nodewright_localcluster::{Cluster, Operator};
use serde_json::{Value, json};

pub struct Env {
    pub cluster: Cluster,
    pub _operator: Operator,
    pub work: tempfile::TempDir,
}

/// Runs `nodewright args…` against the cluster: (success, stdout, stderr).
pub fn cli(env: &Env, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nodewright"))
        .args(args)
        .env("KUBECONFIG", env.cluster.cp.kubeconfig())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn ok(env: &Env, args: &[&str]) -> String {
    let (success, out, err) = cli(env, args);
    assert!(
        success,
        "nodewright {args:?} failed\n{out}\n{err}\n--- operator log ---\n{}",
        std::fs::read_to_string(env.work.path().join("operator.log")).unwrap_or_default()
    );
    out
}

pub fn refused(env: &Env, args: &[&str]) -> String {
    let (success, out, err) = cli(env, args);
    assert!(
        !success,
        "nodewright {args:?} should have been refused\n{out}"
    );
    err
}

pub async fn wait<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    nodewright_localcluster::poll(Duration::from_secs(180), check)
        .await
        .unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// `node update-state n1` on tools' `tool` entry of `version`.
pub fn update_state<'a>(
    version: &'a str,
    stage: &'a str,
    state: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "node",
        "update-state",
        "n1",
        "--cr",
        "tools",
        "--package",
        "tool",
        "--version",
        version,
        "--stage",
        stage,
        "--state",
        state,
    ];
    args.extend_from_slice(extra);
    args
}

pub async fn status(env: &Env, cr: &str) -> Option<Status> {
    Api::<NodeWright>::all(env.cluster.client.clone())
        .get(cr)
        .await
        .ok()?
        .status?
        .status
}

pub async fn complete(env: &Env, cr: &str) {
    wait(&format!("{cr} complete"), || async {
        (status(env, cr).await == Some(Status::Complete)).then_some(())
    })
    .await;
}

pub fn runs(env: &Env, node: &str) -> usize {
    lines(env, node, "/etc/runs")
}

pub fn lines(env: &Env, node: &str, path: &str) -> usize {
    std::fs::read_to_string(env.cluster.host_path(node, path))
        .unwrap_or_default()
        .lines()
        .count()
}

pub fn reboots(env: &Env, node: &str) -> usize {
    SimHost::journal(&env.cluster.sim.root(node))
        .iter()
        .filter(|a| matches!(a, HostAction::RebootRequested { .. }))
        .count()
}

pub fn script(env: &Env, path: &str, body: &str) {
    for n in &env.cluster.nodes {
        let local = env.cluster.host_path(n, path);
        std::fs::create_dir_all(local.parent().unwrap()).unwrap();
        std::fs::write(&local, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&local, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
}

pub fn shell_cr(env: &Env, name: &str, command: &str, extra: Value) -> Value {
    let mut spec = json!({"packages": {"tool": {
        "version": "1.0.0", "plugin": env.cluster.plugin("shell"),
        "capabilities": {"commands": [{"path": command}]},
        "configMap": {"apply": command}
    }}});
    if let (Some(s), Value::Object(extra)) = (spec.as_object_mut(), extra) {
        s.extend(extra);
    }
    json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": name}, "spec": spec})
}

/// The row of `node` in `node list -o json`.
pub fn row(v: &Value, node: &str) -> Value {
    v.as_array()
        .unwrap()
        .iter()
        .find(|r| r["node"] == node)
        .cloned()
        .unwrap()
}
