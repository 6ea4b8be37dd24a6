//! Reading: status in every output form, as a kubectl plugin, version, node and package status, logs.

use std::path::Path;
use std::process::Command;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::{Value, json};

use super::*;

pub async fn verbs(env: &Env) {
    // status: the overview, one NodeWright per node, JSON.
    let out = ok(env, &["status"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("tools") && l.contains("complete") && l.contains("2/2")),
        "{out}"
    );
    let out = ok(env, &["status", "tools"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("n1") && l.contains("config/complete")),
        "{out}"
    );
    let v: Value = serde_json::from_str(&ok(env, &["status", "tools", "-o", "json"])).unwrap();
    assert_eq!(v["summary"]["status"], "complete");
    assert_eq!(v["nodes"].as_array().unwrap().len(), 2);
    assert!(refused(env, &["status", "nope"]).contains("NodeWright \"nope\" not found"));

    // The other output forms: YAML for scripts, wide with generations and packages.
    let y = ok(env, &["status", "tools", "-o", "yaml"]);
    assert!(
        y.contains("status: complete") && y.contains("node: n1"),
        "{y}"
    );
    let w = ok(env, &["status", "-o", "wide"]);
    assert!(
        w.lines().next().unwrap().contains("OBSERVED/GEN")
            && w.lines()
                .any(|l| l.starts_with("tools") && l.contains("1/1") && l.contains("tool:1.0.0")),
        "{w}"
    );

    // The same binary as a kubectl plugin, found by kubectl on the PATH.
    let kubectl = nodewright_testcluster::ktest_binary().unwrap();
    let plugin_dir = Path::new(env!("CARGO_BIN_EXE_kubectl-nodewright"))
        .parent()
        .unwrap();
    let out = Command::new(&kubectl)
        .args(["kubectl", "nodewright", "status", "tools"])
        .env("KUBECONFIG", env.cluster.cp.kubeconfig())
        .env(
            "PATH",
            format!(
                "{}:{}",
                plugin_dir.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && stdout
                .lines()
                .any(|l| l.starts_with("n1") && l.contains("config/complete")),
        "kubectl nodewright status tools:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let help = Command::new(env!("CARGO_BIN_EXE_kubectl-nodewright"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("Usage: kubectl nodewright"),
        "help names the kubectl form"
    );

    // version: the CLI, the cluster, the served API, the operator's Deployment (a
    // zero-replica stand-in here: the operator runs as a local process) and its leader.
    assert_eq!(
        ok(env, &["version", "--client-only"]).trim(),
        format!("client:   nodewright {}", env!("CARGO_PKG_VERSION"))
    );
    env.cluster
        .apply(&json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "nodewright-operator", "namespace": "nodewright", "labels": {"app.kubernetes.io/name": "nodewright"}},
                       "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "op"}},
                                "template": {"metadata": {"labels": {"app": "op"}}, "spec": {"containers": [{"name": "operator", "image": "registry.example/nodewright-operator:0.1.0"}]}}}}))
        .await
        .unwrap();
    let out = ok(env, &["version"]);
    for want in [
        "server:   Kubernetes v1.36.3",
        "api:      nodewrights.nodewright.io v1alpha1 (storage)",
        "api:      deploymentpolicies.nodewright.io v1alpha1 (storage)",
        "operator: nodewright-operator registry.example/nodewright-operator:0.1.0 (0/0 ready)",
    ] {
        assert!(out.lines().any(|l| l == want), "{want:?} in\n{out}");
    }
    assert!(
        out.lines()
            .any(|l| l.starts_with("leader:   ") && l.contains("(Lease nw-cli-test, renewed")),
        "the operator's Lease holder, found by its label under a name of its own:\n{out}"
    );

    // node list / status.
    let v: Value = serde_json::from_str(&ok(env, &["node", "list", "-o", "json"])).unwrap();
    assert_eq!(row(&v, "n1")["nodewrights"]["tools"], "complete");
    assert_eq!(row(&v, "n1")["ignored"], false);
    let w = ok(env, &["node", "list", "-o", "wide"]);
    let boot = Api::<Node>::all(env.cluster.client.clone())
        .get("n1")
        .await
        .unwrap()
        .status
        .unwrap()
        .node_info
        .unwrap()
        .boot_id;
    assert!(
        w.lines().any(|l| l.starts_with("n1")
            && l.contains("True")
            && l.contains(&boot)
            && l.contains("complete")),
        "{w}"
    );
    let out = ok(env, &["node", "status", "n2"]);
    assert!(
        out.lines().any(|l| l.starts_with("tools")
            && l.contains("n2")
            && l.contains("tool")
            && l.contains("complete")),
        "{out}"
    );

    // package status / logs.
    let v: Value = serde_json::from_str(&ok(
        env,
        &["package", "status", "tools", "tool", "-o", "json"],
    ))
    .unwrap();
    assert_eq!(
        v.as_array()
            .unwrap()
            .iter()
            .filter(|r| r["state"] == "complete")
            .count(),
        2,
        "{v}"
    );
    assert!(refused(env, &["package", "status", "tools", "nope"]).contains("it has: tool"));
    let out = ok(env, &["package", "logs", "tools", "tool", "--node", "n1"]);
    assert!(out.contains("config/complete"), "{out}");
}
