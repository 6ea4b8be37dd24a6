//! The Helm chart installed on the local cluster, and the operator run exactly as the chart's
//! Deployment would run it: its rendered arguments, authenticated as the chart's
//! ServiceAccount (a TokenRequest token), so a verb missing from the chart's RBAC fails the
//! rollout. The webhook configuration is the chart's own: the apiserver reaches the
//! operator through the chart's webhook Service (an EndpointSlice routes it to this
//! machine's address) and verifies the certificate against the Service's DNS name. The test
//! cluster has no scheduler or image pulls, so two things differ from a real install, each
//! said where it happens: the Deployment is applied with zero replicas and the operator
//! runs as a local process with exactly the rendered arguments; listener addresses and the
//! agent backend are local ones, set through the chart's `extraArgs`.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::NS;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use nodewright_api::v1alpha1::{NodeWright, Status};
use nodewright_localcluster::{Binaries, Cluster, Operator};
use serde_json::{Value, json};

/// The chart rendered with `values` (`key=value` pairs for `--set`).
fn render(values: &[String]) -> Vec<Value> {
    let args: Vec<&str> = values.iter().flat_map(|v| ["--set", v.as_str()]).collect();
    nodewright_testcluster::render_chart(NS, &args).unwrap()
}

/// The operator's arguments as the rendered Deployment passes them.
fn rendered_args(docs: &[Value]) -> Vec<String> {
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the chart renders a Deployment");
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// The operator's long flags, from its own `--help`.
fn operator_flags() -> Vec<String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodewright-operator"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let mut flags: Vec<String> = help
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("--"))
        .map(|w| {
            w.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .filter(|f| !f.is_empty())
        .collect();
    flags.sort();
    flags.dedup();
    flags
}

/// Every operator flag is a chart value: with every optional value set, the rendered
/// Deployment passes each flag but those a pod gets otherwise (its identity comes from
/// `POD_NAME`, its node from `NODE_NAME`) or that exist for tests (the simulated backend and its agent command), and
/// `extraArgs` reaches those too, last, so they replace a rendered value.
#[test]
fn every_operator_flag_is_a_chart_value() {
    nodewright_testregistry::require!(Helm);
    let flags = operator_flags();
    assert!(
        flags.len() > 20 && flags.contains(&"reapply-on-reboot".to_string()),
        "{flags:?}"
    );
    let docs = render(&[
        "registry=registry.example.com/nodewright".into(),
        "agent.serviceAccount=nodewright-agent".into(),
        "insecureRegistries[0]=registry.local:5000".into(),
        "webhook.extraHosts[0]=nodewright.example.com".into(),
        "reapplyOnReboot=true".into(),
        "restartAllServices={containerd.service,kubelet.service}".into(),
        "imagePullSecrets[0]=agent-pull".into(),
        "pluginRegistries.secrets[0]=fleet-login".into(),
        "pluginRegistries.packageSecrets={team-login,fleet-login}".into(),
        "pluginRegistries.caBundles[0].registry=registry.corp.example:5000".into(),
        "pluginRegistries.caBundles[0].configMap=corp-ca".into(),
        "nodeCache.quota=50Gi".into(),
    ]);
    let args = rendered_args(&docs);
    let not_chart_values = [
        "help",
        "version",
        "identity",
        "node-name",
        "pod-name",
        "agent-backend",
        "agent-command",
    ];
    let missing: Vec<&String> = flags
        .iter()
        .filter(|f| !not_chart_values.contains(&f.as_str()))
        .filter(|f| !args.iter().any(|a| a.starts_with(&format!("--{f}="))))
        .collect();
    assert!(
        missing.is_empty(),
        "flags with no chart value: {missing:?}\nrendered: {args:?}"
    );
    assert!(
        args.contains(&"--restart-all-services=containerd.service,kubelet.service".into())
            && args.contains(&"--reapply-on-reboot=true".into()),
        "{args:?}"
    );
    let pod = &docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"];
    assert!(
        args.contains(&"--registry-ca=registry.corp.example:5000=corp-ca/ca.crt".into())
            && args.contains(&"--registry-secret=fleet-login".into())
            && args.contains(&"--image-pull-secret=agent-pull".into()),
        "{args:?}"
    );
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "agent-pull"}]));
    // The operator may read the registry Secrets and CA ConfigMaps it is given, by name,
    // and no others.
    let role = docs
        .iter()
        .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == "nw-operator")
        .expect("the operator's Role (release nw)");
    let named = |resource: &str| -> Vec<Value> {
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["resources"] == json!([resource]) && r["verbs"] == json!(["get"]))
            .map(|r| r["resourceNames"].clone())
            .collect()
    };
    assert!(
        named("secrets").contains(&json!(["fleet-login", "team-login"])),
        "{role}"
    );
    assert_eq!(named("configmaps"), [json!(["corp-ca"])], "{role}");
    assert_eq!(
        pod["containers"][0]["env"][1],
        json!({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
        "the Lease identity is the pod's name"
    );
    assert_eq!(
        pod["containers"][0]["env"][2],
        json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}),
        "a replica knows its node, to see it fenced"
    );

    let extra = rendered_args(&render(&[
        "registry=registry.example.com/nodewright".into(),
        "extraArgs={--resync-seconds=5,--agent-backend=sim}".into(),
    ]));
    assert_eq!(
        extra[extra.len() - 2..],
        ["--resync-seconds=5", "--agent-backend=sim"],
        "extraArgs come last"
    );
}

/// Mirrors NodeWright's chart tests of its scheduling values: `affinity`, `nodeSelector`,
/// `tolerations` and `resources` reach the operator's pod exactly as given (a set
/// `affinity` replaces the default spread); the CRD-upgrade hook's pod is placed by the same
/// `nodeSelector` and `tolerations`, so it can run wherever the operator can.
#[test]
fn scheduling_and_resource_values_reach_the_pods_as_given() {
    nodewright_testregistry::require!(Helm);
    let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "role", "operator": "In", "values": ["infra"]}]}]
    }}});
    let tolerations = json!([{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}]);
    let resources =
        json!({"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}});
    let set_json = [
        format!("affinity={affinity}"),
        format!("tolerations={tolerations}"),
        format!("resources={resources}"),
    ];
    let mut args = vec![
        "--set",
        "registry=registry.example.com/nodewright",
        "--set",
        "nodeSelector.role=infra",
    ];
    for v in &set_json {
        args.extend(["--set-json", v.as_str()]);
    }
    let docs = nodewright_testcluster::render_chart(NS, &args).unwrap();
    let pod_of = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} rendered"))["spec"]["template"]["spec"]
            .clone()
    };
    let operator = pod_of("Deployment");
    assert_eq!(operator["affinity"], affinity);
    assert_eq!(operator["nodeSelector"], json!({"role": "infra"}));
    assert_eq!(operator["tolerations"], tolerations);
    assert_eq!(operator["containers"][0]["resources"], resources);
    let hook = pod_of("Job");
    assert_eq!(hook["nodeSelector"], json!({"role": "infra"}));
    assert_eq!(hook["tolerations"], tolerations);

    // Unset: the default spread and the cordon toleration.
    let defaults = pod_of_default();
    assert!(
        defaults["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            .is_array(),
        "{defaults}"
    );
    assert_eq!(
        defaults["tolerations"][0]["key"],
        "node.kubernetes.io/unschedulable"
    );
}

/// The operator's pod as the chart renders it with no scheduling values.
fn pod_of_default() -> Value {
    render(&["registry=registry.example.com/nodewright".into()])
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment")["spec"]["template"]["spec"]
        .clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_chart_installed_operator_rolls_out_with_the_charts_rbac() {
    nodewright_testregistry::require!(ControlPlane, Registry, Helm);
    let work = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(work.path(), &[("n1".to_string(), vec![])])
        .await
        .unwrap();
    cluster
        .host_file("n1", "/proc/sys/vm/swappiness", "60")
        .unwrap();
    let (webhook, metrics) = (
        nodewright_testregistry::free_port(),
        nodewright_testregistry::free_port(),
    );
    let ip = nodewright_localcluster::host_ip().unwrap();
    let bins = Binaries::in_dir(
        Path::new(env!("CARGO_BIN_EXE_nodewright-operator"))
            .parent()
            .unwrap(),
    )
    .unwrap();
    let registry = cluster.registry.host();
    // What differs from a real install goes in through the chart's own `extraArgs`: local
    // listener addresses and cache, the simulated agent backend, a short resync. They come
    // after the rendered flags and replace those values.
    let extra = [
        format!("--metrics-addr=127.0.0.1:{metrics}"),
        format!("--webhook-addr={ip}:{webhook}"),
        format!(
            "--plugin-cache-dir={}",
            work.path().join("operator-cache").display()
        ),
        "--agent-backend=sim".into(),
        format!("--agent-command={}", bins.agent.display()),
        "--resync-seconds=5".into(),
    ];
    let mut values = vec![
        "replicas=0".to_string(),
        format!("registry={registry}/nodewright"),
        format!("insecureRegistries[0]={registry}"),
    ];
    values.extend(
        extra
            .iter()
            .enumerate()
            .map(|(i, a)| format!("extraArgs[{i}]={a}")),
    );
    let docs = render(&values);
    let args = rendered_args(&docs);

    // An object from before the install: the chart's CRDs must take over the served ones
    // (the same version here: no older release exists yet) without losing it.
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

    // Install: the chart's CRDs go over the ones already served (an upgrade in place), then
    // everything else, as rendered.
    let mut webhook_service = None;
    // Hooks are Helm's to run at their moment (the CRD upgrade at `helm upgrade`), not part
    // of an install.
    let installed = docs
        .iter()
        .filter(|d| d["metadata"]["annotations"].get("helm.sh/hook").is_none());
    for doc in installed {
        if doc["kind"] == "ValidatingWebhookConfiguration" {
            let service = &doc["webhooks"][0]["clientConfig"]["service"];
            webhook_service = Some((
                service["name"].as_str().unwrap().to_string(),
                service["namespace"].as_str().unwrap().to_string(),
            ));
        }
        cluster.apply(doc).await.unwrap_or_else(|e| {
            panic!(
                "{} {} rejected: {e:#}",
                doc["kind"], doc["metadata"]["name"]
            )
        });
    }
    // The Service's endpoint: the operator process, listening on this machine's address.
    let (service, namespace) = webhook_service.expect("the chart renders a webhook configuration");
    cluster
        .route_service(&namespace, &service, "webhook", ip, webhook)
        .await
        .unwrap();
    for crd in nodewright_api::crdgen::CRD_NAMES {
        let crd = Api::<CustomResourceDefinition>::all(cluster.client.clone())
            .get(crd)
            .await
            .unwrap();
        let status = crd.status.unwrap_or_default();
        let established = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        assert!(
            established,
            "{:?} established after the upgrade",
            crd.metadata.name
        );
        assert_eq!(
            status.stored_versions.unwrap_or_default(),
            ["v1alpha1"],
            "one stored version: nothing to migrate"
        );
    }
    let nws: Api<NodeWright> = Api::all(cluster.client.clone());
    assert_eq!(
        nws.get("tuning")
            .await
            .expect("the object from before the install reads as a NodeWright")
            .spec
            .packages
            .len(),
        1
    );
    let sa = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .and_then(|d| d["spec"]["template"]["spec"]["serviceAccountName"].as_str())
        .unwrap();

    // The chart's ServiceAccount, and nothing more.
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(cluster.client.clone(), NS)
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .expect("a token");
    let mut kubeconfig: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(cluster.cp.kubeconfig()).unwrap())
            .unwrap();
    kubeconfig["users"][0]["user"] = serde_yaml_ng::from_str(&format!("token: {token}")).unwrap();
    let sa_kubeconfig = work.path().join("operator.kubeconfig");
    std::fs::write(
        &sa_kubeconfig,
        serde_yaml_ng::to_string(&kubeconfig).unwrap(),
    )
    .unwrap();

    let log = work.path().join("operator.log");
    let _operator = Operator::start_with(
        &bins.operator,
        &sa_kubeconfig,
        &args,
        &log,
        "info,kube=warn",
    )
    .unwrap();
    let diag = || std::fs::read_to_string(&log).unwrap_or_default();

    // The webhook answers once the operator has made its certificate and injected the CA:
    // an invalid NodeWright is refused with the field at fault.
    let bad: NodeWright = serde_json::from_value(json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": "bad"},
        "spec": {"deploymentPolicy": "missing", "packages": {"tuning": {"version": "1.0.0", "plugin": cluster.plugin("sysctl")}}}
    }))
    .unwrap();
    let start = std::time::Instant::now();
    let refusal = loop {
        match nws.create(&PostParams::default(), &bad).await {
            Err(kube::Error::Api(s)) if s.message.contains("denied the request") => {
                break s.message;
            }
            Ok(_) => panic!("an invalid NodeWright was admitted"),
            Err(_) => {}
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the webhook never answered\n{}",
            diag()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        refusal.contains("spec.deploymentPolicy") && refusal.contains("does not exist"),
        "{refusal}"
    );

    // The rollout of the object from before the install completes: Jobs, node patches,
    // status, events, the finalizer — all through the chart's RBAC.
    let start = std::time::Instant::now();
    while nws
        .get("tuning")
        .await
        .unwrap()
        .status
        .and_then(|s| s.status)
        != Some(Status::Complete)
    {
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "the chart-installed operator did not complete the rollout\n{}",
            diag()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        std::fs::read_to_string(cluster.host_path("n1", "/proc/sys/vm/swappiness")).unwrap(),
        "10"
    );
    // The leader keeps its stage history beside its Lease, by the chart's RBAC.
    let maps = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(cluster.client.clone(), NS);
    let start = std::time::Instant::now();
    loop {
        let kept = maps.get_opt("nw-operator-history").await.unwrap();
        if let Some(text) = kept
            .and_then(|m| m.data)
            .and_then(|mut d| d.remove("history.json"))
        {
            assert!(text.contains("\"tuning:"), "{text}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the stage history was not kept\n{}",
            diag()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let log_text = diag();
    assert!(
        !log_text.contains("forbidden"),
        "an RBAC refusal in the operator log:\n{log_text}"
    );
    let text = common::http_get(metrics, "/metrics").await;
    assert!(
        text.contains("nodewright_leader 1"),
        "the chart's leader election took the Lease\n{text}"
    );
}
