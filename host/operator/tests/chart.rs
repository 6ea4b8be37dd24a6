//! The Helm chart installed on the local cluster, and the operator run exactly as the chart's
//! Deployment would run it: its rendered arguments, authenticated as the chart's
//! ServiceAccount (a TokenRequest token), so a verb missing from the chart's RBAC fails the
//! rollout. The test cluster has no scheduler, Service routing or image pulls, so three
//! things differ from a real install, each said where it happens: the Deployment is applied
//! with zero replicas and the operator runs as a local process; listener addresses and the
//! agent backend are local ones; the webhook configuration reaches the operator by URL.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::NS;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use nodewright_api::v1alpha1::{NodeWright, Status};
use nodewright_e2e::{Binaries, Cluster, Operator};
use serde_json::{Value, json};

fn render(registry: &str) -> Vec<Value> {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/chart/nodewright");
    let out = Command::new(nodewright_testcluster::helm_binary().expect("helm"))
        .args(["template", "nw", &chart.display().to_string(), "--namespace", NS, "--include-crds", "--kube-version", "1.36.3"])
        .args(["--set", "replicas=0", "--set", &format!("insecureRegistries[0]={registry}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    serde_yaml_ng::Deserializer::from_str(&String::from_utf8(out.stdout).unwrap())
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// The operator's arguments from the rendered Deployment, with the local differences.
fn operator_args(deployment: &Value, bins: &Binaries, work: &Path, webhook: u16, metrics: u16) -> Vec<String> {
    let local = ["--metrics-addr=", "--webhook-addr=", "--plugin-cache-dir="];
    let mut args: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .filter(|a| !local.iter().any(|l| a.starts_with(l)))
        .collect();
    args.extend([
        format!("--metrics-addr=127.0.0.1:{metrics}"),
        format!("--webhook-addr=127.0.0.1:{webhook}"),
        "--webhook-host=127.0.0.1".into(),
        format!("--plugin-cache-dir={}", work.join("operator-cache").display()),
        "--agent-backend=sim".into(),
        format!("--agent-command={}", bins.agent.display()),
        "--resync-seconds=5".into(),
    ]);
    args
}

#[tokio::test(flavor = "multi_thread")]
async fn the_chart_installed_operator_rolls_out_with_the_charts_rbac() {
    let work = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(work.path(), &[("n1".to_string(), vec![])]).await.unwrap();
    cluster.host_file("n1", "/proc/sys/vm/swappiness", "60").unwrap();
    let (webhook, metrics) = (nodewright_testsupport::free_port(), nodewright_testsupport::free_port());
    let docs = render(cluster.registry.host());

    // Install: the chart's CRDs go over the ones already served (an upgrade in place), then
    // everything else. The webhook configuration points at the operator by URL here.
    let mut deployment = None;
    for mut doc in docs {
        if doc["kind"] == "ValidatingWebhookConfiguration" {
            for hook in doc["webhooks"].as_array_mut().unwrap() {
                let path = hook["clientConfig"]["service"]["path"].as_str().unwrap().to_string();
                hook["clientConfig"] = json!({"url": format!("https://127.0.0.1:{webhook}{path}")});
            }
        }
        if doc["kind"] == "Deployment" {
            deployment = Some(doc.clone());
        }
        cluster.apply(&doc).await.unwrap_or_else(|e| panic!("{} {} rejected: {e:#}", doc["kind"], doc["metadata"]["name"]));
    }
    let deployment = deployment.expect("the chart renders a Deployment");
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap();

    // The chart's ServiceAccount, and nothing more.
    let request = TokenRequest { spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }), ..Default::default() };
    let token = Api::<ServiceAccount>::namespaced(cluster.client.clone(), NS).create_token_request(sa, &PostParams::default(), &request).await.unwrap().status.and_then(|s| s.token).expect("a token");
    let mut kubeconfig: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(cluster.cp.kubeconfig()).unwrap()).unwrap();
    kubeconfig["users"][0]["user"] = serde_yaml_ng::from_str(&format!("token: {token}")).unwrap();
    let sa_kubeconfig = work.path().join("operator.kubeconfig");
    std::fs::write(&sa_kubeconfig, serde_yaml_ng::to_string(&kubeconfig).unwrap()).unwrap();

    let bins = Binaries::in_dir(Path::new(env!("CARGO_BIN_EXE_nodewright-operator")).parent().unwrap()).unwrap();
    let log = work.path().join("operator.log");
    let _operator = Operator::start_with(&bins.operator, &sa_kubeconfig, &operator_args(&deployment, &bins, work.path(), webhook, metrics), &log, "info,kube=warn").unwrap();
    let diag = || std::fs::read_to_string(&log).unwrap_or_default();

    // The webhook answers once the operator has made its certificate and injected the CA:
    // an invalid NodeWright is refused with the field at fault.
    let nws: Api<NodeWright> = Api::all(cluster.client.clone());
    let bad: NodeWright = serde_json::from_value(json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": "bad"},
        "spec": {"deploymentPolicy": "missing", "packages": {"tuning": {"version": "1.0.0", "plugin": cluster.plugin("sysctl")}}}
    }))
    .unwrap();
    let start = std::time::Instant::now();
    let refusal = loop {
        match nws.create(&PostParams::default(), &bad).await {
            Err(kube::Error::Api(s)) if s.message.contains("denied the request") => break s.message,
            Ok(_) => panic!("an invalid NodeWright was admitted"),
            Err(_) => {}
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the webhook never answered\n{}", diag());
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(refusal.contains("spec.deploymentPolicy") && refusal.contains("does not exist"), "{refusal}");

    // A rollout completes: Jobs, node patches, status, events, the finalizer — all through
    // the chart's RBAC.
    cluster
        .apply(&json!({
            "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": "tuning"},
            "spec": {"packages": {"tuning": {
                "version": "1.0.0", "plugin": cluster.plugin("sysctl"),
                "capabilities": {"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}], "sysctl": ["vm.swappiness"]},
                "configMap": {"vm.swappiness": "10"}
            }}}
        }))
        .await
        .unwrap();
    let start = std::time::Instant::now();
    while nws.get("tuning").await.unwrap().status.and_then(|s| s.status) != Some(Status::Complete) {
        assert!(start.elapsed() < Duration::from_secs(180), "the chart-installed operator did not complete the rollout\n{}", diag());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(std::fs::read_to_string(cluster.host_path("n1", "/proc/sys/vm/swappiness")).unwrap(), "10");
    let log_text = diag();
    assert!(!log_text.contains("forbidden"), "an RBAC refusal in the operator log:\n{log_text}");
    let text = common::http_get(metrics, "/metrics").await;
    assert!(text.contains("nodewright_leader 1"), "the chart's leader election took the Lease\n{text}");
}
