//! The Helm chart, rendered by a real `helm` (built from its Go module) and checked: the
//! objects are what the operator needs, RBAC is the documented least privilege, and every
//! rendered object is accepted by the real apiserver (server-side dry run).

use std::collections::BTreeMap;
use std::process::Command;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use nodewright_testcluster::{ControlPlane, chart_dir, helm_binary, render_chart};
use serde_json::Value;

fn chart() -> String {
    chart_dir().display().to_string()
}

/// Renders with the registry set (the chart names no default images) plus `extra`.
fn render(extra: &[&str]) -> Vec<Value> {
    let args: Vec<&str> = ["--set", "registry=registry.example.com/nodewright"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    render_chart("nodewright-system", &args).unwrap()
}

fn by_kind(docs: &[Value]) -> BTreeMap<String, Vec<&Value>> {
    let mut m: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for d in docs {
        m.entry(d["kind"].as_str().unwrap().to_string())
            .or_default()
            .push(d);
    }
    m
}

#[test]
fn helm_lint_passes() {
    nodewright_testregistry::require!(Helm);
    let out = Command::new(helm_binary().unwrap())
        .args([
            "lint",
            &chart(),
            "--set",
            "registry=registry.example.com/nodewright",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn images_come_from_the_registry_the_admin_names_and_never_from_a_default() {
    nodewright_testregistry::require!(Helm);
    let err = render_chart("nodewright-system", &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("set registry") && err.contains("cargo xtask publish"),
        "{err}"
    );
    let image = |docs: &[Value]| {
        let d = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        let agent = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a.as_str()?.strip_prefix("--agent-image="))
            .next()
            .unwrap()
            .to_string();
        (c["image"].as_str().unwrap().to_string(), agent)
    };
    assert_eq!(
        image(&render(&[])),
        (
            "registry.example.com/nodewright/operator:0.1.0".into(),
            "registry.example.com/nodewright/agent:0.1.0".into()
        )
    );
    let digest = format!("sha256:{}", "a".repeat(64));
    let pinned = render(&[
        "--set",
        &format!("image.digest={digest}"),
        "--set",
        "agent.image.repository=other.example/agent",
        "--set",
        "agent.image.tag=9",
    ]);
    assert_eq!(
        image(&pinned),
        (
            format!("registry.example.com/nodewright/operator@{digest}"),
            "other.example/agent:9".into()
        )
    );
}

#[test]
fn rendered_objects_are_what_the_operator_needs() {
    nodewright_testregistry::require!(Helm);
    let docs = render(&[]);
    let kinds = by_kind(&docs);
    for k in [
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "ValidatingWebhookConfiguration",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.contains_key(k), "chart renders no {k}");
    }
    let mut crds: Vec<&str> = kinds["CustomResourceDefinition"]
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    let mut want = nodewright_api::crdgen::CRD_NAMES.to_vec();
    crds.sort();
    want.sort();
    assert_eq!(crds, want);

    let deploy = kinds["Deployment"][0];
    let spec = &deploy["spec"]["template"]["spec"];
    assert_eq!(deploy["spec"]["replicas"], 2);
    assert_eq!(spec["serviceAccountName"], "nw-operator");
    let args: Vec<&str> = spec["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for want in [
        "--leader-elect=true",
        "--job-backoff-limit=3",
        "--job-stage-timeout=1h",
        "--job-ttl-seconds-after-finished=3600",
        "--webhook-config=nw-operator-validation",
    ] {
        assert!(args.contains(&want), "missing {want} in {args:?}");
    }
    assert_eq!(
        spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"],
        true
    );
    // Its own drains leave it in place (they leave pods that tolerate the cordon).
    assert!(
        spec["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["key"] == "node.kubernetes.io/unschedulable"),
        "{spec}"
    );

    let webhook = kinds["ValidatingWebhookConfiguration"][0];
    for hook in webhook["webhooks"].as_array().unwrap() {
        assert_eq!(hook["failurePolicy"], "Fail", "the webhook fails closed");
        assert_eq!(
            hook["clientConfig"]["service"]["namespace"],
            "nodewright-system"
        );
    }
    let ops = &webhook["webhooks"][1]["rules"][0]["operations"];
    assert!(
        ops.as_array().unwrap().contains(&Value::from("DELETE")),
        "policy deletion is checked"
    );

    // Least privilege: exactly these cluster-wide grants, nothing with a wildcard.
    let role = kinds["ClusterRole"]
        .iter()
        .find(|r| r["metadata"]["name"] == "nw-operator")
        .unwrap();
    let mut grants: Vec<String> = Vec::new();
    for rule in role["rules"].as_array().unwrap() {
        for res in rule["resources"].as_array().unwrap() {
            let verbs: Vec<&str> = rule["verbs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            assert!(!verbs.contains(&"*") && res != "*", "wildcard in {rule}");
            grants.push(format!("{}:{}", res.as_str().unwrap(), verbs.join(",")));
        }
    }
    assert_eq!(
        grants,
        [
            "nodewrights:get,list,watch,patch",
            "nodewrights/status:patch",
            "nodewrightpreviews:get,list,watch,delete",
            "nodewrightpreviews/status:patch",
            "deploymentpolicies:get,list,watch",
            "plugintrustpolicies:get,list,watch",
            "nodes:get,list,watch,patch",
            "pods:get,list,watch,delete",
            "pods/eviction:create",
            "poddisruptionbudgets:get,list,watch",
            "jobs:get,list,watch,create,delete,deletecollection",
            "events:create,patch",
            "subjectaccessreviews:create",
            "validatingwebhookconfigurations:get,patch",
        ]
    );
    // The grant roles an admin binds to NodeWright authors: the verb the webhook asks about, nothing more.
    for name in ["nodewright-grant-all", "nodewright-grant-files"] {
        let r = kinds["ClusterRole"]
            .iter()
            .find(|r| r["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no ClusterRole {name}"));
        for rule in r["rules"].as_array().unwrap() {
            assert_eq!(
                rule["verbs"],
                serde_json::json!(["grant"]),
                "{name}: {rule}"
            );
            assert_eq!(
                rule["resources"],
                serde_json::json!(["capabilities"]),
                "{name}: {rule}"
            );
        }
    }
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "ClusterRole" && d.to_string().contains("secrets")),
        "secrets are namespaced only"
    );
}

/// `values.schema.json` makes Helm refuse a value the chart does not read, or one of the
/// wrong shape, naming it, instead of installing with the default silently.
#[test]
fn a_mistyped_or_malformed_value_is_refused_naming_it() {
    nodewright_testregistry::require!(Helm);
    for (set, named) in [
        ("jobs.backofLimit=5", "backofLimit"),
        ("replica=3", "replica"),
        ("webhook.failurePolicy=Ignor", "/webhook/failurePolicy"),
        ("sandbox.maxMemory=lots", "/sandbox/maxMemory"),
        ("image.digest=sha256:abc", "/image/digest"),
        (
            "restartAllServices={systemd-reboot}",
            "/restartAllServices/0",
        ),
        ("extraArgs={resync-seconds=5}", "/extraArgs/0"),
    ] {
        let err = render_chart(
            "nodewright-system",
            &[
                "--set",
                "registry=registry.example.com/nodewright",
                "--set",
                set,
            ],
        )
        .map(|_| ())
        .expect_err(set)
        .to_string();
        assert!(
            err.contains("schema") && err.contains(named),
            "--set {set}: {err}"
        );
    }
    // Every default passes its own schema, and so do the values the docs show.
    render(&[
        "--set",
        "jobs.stageTimeout=0",
        "--set",
        "podDisruptionBudget.minAvailable=50%",
        "--set",
        "image.tag=1.2",
    ]);
}

/// The replicas prefer different nodes and a PodDisruptionBudget keeps one through other
/// tools' drains; an admin's own affinity replaces the default preference, and one replica
/// gets no budget that would block every drain of its node.
#[test]
fn replicas_spread_over_nodes_and_keep_one_through_drains() {
    nodewright_testregistry::require!(Helm);
    let docs = render(&[]);
    let kinds = by_kind(&docs);
    let pdb = kinds["PodDisruptionBudget"][0];
    let pod = &kinds["Deployment"][0]["spec"]["template"];
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        pod["metadata"]["labels"]
    );
    let term = &pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(
        term["labelSelector"]["matchLabels"],
        pod["metadata"]["labels"]
    );

    let one = render(&[
        "--set",
        "replicas=1",
        "--set",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
        "--set",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    ]);
    let kinds = by_kind(&one);
    assert!(
        !kinds.contains_key("PodDisruptionBudget"),
        "one replica, no budget"
    );
    let affinity = &kinds["Deployment"][0]["spec"]["template"]["spec"]["affinity"];
    assert!(
        affinity.get("podAntiAffinity").is_none() && affinity.get("nodeAffinity").is_some(),
        "{affinity}"
    );
}

/// The CRD upgrade hook: only on `helm upgrade` (never on rollback, install or uninstall),
/// carrying exactly the chart's CRDs, run by an account that may write only those CRDs and
/// is deleted with the hook; off with `crds.upgrade=false`.
#[test]
fn the_crd_upgrade_hook_runs_on_upgrade_only_with_the_charts_crds() {
    nodewright_testregistry::require!(Helm);
    let docs = render(&[]);
    let hooks: Vec<&Value> = docs
        .iter()
        .filter(|d| d["metadata"]["annotations"].get("helm.sh/hook").is_some())
        .collect();
    let kinds: Vec<&str> = hooks.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ConfigMap",
            "ClusterRole",
            "ClusterRoleBinding",
            "Job"
        ]
    );
    for h in &hooks {
        let a = &h["metadata"]["annotations"];
        assert_eq!(a["helm.sh/hook"], "pre-upgrade", "{}", h["kind"]);
        assert_eq!(
            a["helm.sh/hook-delete-policy"],
            "before-hook-creation,hook-succeeded"
        );
    }
    let of = |kind: &str| *hooks.iter().find(|h| h["kind"] == kind).unwrap();
    let data = of("ConfigMap")["data"].as_object().unwrap();
    let mut carried: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(chart_dir().join("crds")).unwrap() {
        let path = entry.unwrap().path();
        let key = path.file_name().unwrap().to_str().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(data[key], text.as_str(), "{key} carried byte for byte");
        let yaml: Value = serde_yaml_ng::from_str(&text).unwrap();
        carried.push(yaml["metadata"]["name"].as_str().unwrap().to_string());
    }
    assert_eq!(data.len(), carried.len());
    let rules = of("ClusterRole")["rules"].as_array().unwrap();
    let mut names: Vec<String> = rules[0]["resourceNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    names.sort();
    carried.sort();
    assert_eq!(names, carried, "it may write exactly the chart's CRDs");
    assert_eq!(rules[0]["verbs"], serde_json::json!(["get", "patch"]));
    assert!(
        rules
            .iter()
            .all(|r| r["resources"] == serde_json::json!(["customresourcedefinitions"]))
    );
    let job = &of("Job")["spec"]["template"]["spec"];
    assert_eq!(
        job["containers"][0]["args"],
        serde_json::json!(["apply-crds", "--dir=/crds", "--chart-version=0.1.0"])
    );
    assert_eq!(
        job["containers"][0]["image"],
        "registry.example.com/nodewright/operator:0.1.0"
    );

    let off = render(&["--set", "crds.upgrade=false"]);
    assert!(
        !off.iter()
            .any(|d| d["metadata"]["annotations"].get("helm.sh/hook").is_some())
    );
}

/// Monitoring objects are off by default (they need the Prometheus Operator's CRDs); on, the
/// ServiceMonitor selects the metrics Service and nothing else, and the PrometheusRule carries
/// exactly the shipped rule file, runbook links prefixed when asked.
#[test]
fn monitoring_objects_render_the_shipped_rules_when_asked() {
    nodewright_testregistry::require!(Helm);
    let kinds = by_kind(&render(&[])).into_keys().collect::<Vec<_>>();
    assert!(
        !kinds.contains(&"ServiceMonitor".to_string())
            && !kinds.contains(&"PrometheusRule".to_string()),
        "{kinds:?}"
    );
    let docs = render(&[
        "--set",
        "monitoring.serviceMonitor.enabled=true",
        "--set",
        "monitoring.serviceMonitor.labels.release=prom",
        "--set",
        "monitoring.prometheusRule.enabled=true",
        "--set",
        "monitoring.runbookBaseUrl=https://docs.example.com/nodewright/",
    ]);
    let kinds = by_kind(&docs);
    let monitor = kinds["ServiceMonitor"][0];
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    let selected: Vec<&str> = kinds["Service"]
        .iter()
        .filter(|svc| {
            selector
                .iter()
                .all(|(k, v)| &svc["metadata"]["labels"][k] == v)
        })
        .map(|svc| svc["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(selected, ["nw-operator-metrics"]);
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");

    let shipped = std::fs::read_to_string(chart_dir().join("files/alerts.yaml"))
        .unwrap()
        .replace(
            "runbook_url: \"docs/",
            "runbook_url: \"https://docs.example.com/nodewright/docs/",
        );
    let shipped: Value = serde_yaml_ng::from_str(&shipped).unwrap();
    assert_eq!(kinds["PrometheusRule"][0]["spec"], shipped);
    assert!(
        shipped
            .to_string()
            .contains("https://docs.example.com/nodewright/docs/operations.md#runbook-"),
        "the links were prefixed"
    );
}

#[test]
fn values_switch_the_webhook_and_set_job_defaults() {
    nodewright_testregistry::require!(Helm);
    let docs = render(&[
        "--set",
        "webhook.enabled=false",
        "--set",
        "jobs.backoffLimit=5",
        "--set",
        "insecureRegistries={registry.local:5000}",
        "--set",
        "healthGates.secrets={prom-token}",
        "--set",
        "nodeCache.quota=20Gi",
    ]);
    let kinds = by_kind(&docs);
    // The gate Secrets named, read-only.
    let role = kinds["Role"][0]["rules"].to_string();
    assert!(
        role.contains(r#""resourceNames":["prom-token"],"resources":["secrets"],"verbs":["get"]"#),
        "{role}"
    );
    assert!(!kinds.contains_key("ValidatingWebhookConfiguration"));
    let args =
        kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains("--job-backoff-limit=5")
            && args.contains("--insecure-registry=registry.local:5000")
            && args.contains("--node-cache-quota=20Gi")
            && !args.contains("--webhook-addr"),
        "{args}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rendered_objects_are_accepted_by_the_apiserver() {
    nodewright_testregistry::require!(Helm, ControlPlane, Registry);
    let docs = render(&[]);
    let client = ControlPlane::shared().client().await.unwrap();
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let _ = ns
        .create(
            &Default::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "nodewright-system"}}))
                .unwrap(),
        )
        .await;
    // CRDs first, for real, so later objects' kinds resolve.
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    for doc in &docs {
        let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
        let t = obj.types.clone().unwrap();
        let (group, version) = t
            .api_version
            .split_once('/')
            .unwrap_or(("", &t.api_version));
        let gvk = kube::core::GroupVersionKind::gvk(group, version, &t.kind);
        let (ar, caps) = discovery
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("apiserver does not serve {gvk:?}"));
        let api: Api<DynamicObject> = if caps.scope == Scope::Cluster {
            Api::all_with(client.clone(), &ar)
        } else {
            Api::namespaced_with(client.clone(), "nodewright-system", &ar)
        };
        let mut pp = PatchParams::apply("nodewright-chart-test").force();
        pp.dry_run = t.kind != "CustomResourceDefinition";
        api.patch(
            obj.metadata.name.as_deref().unwrap(),
            &pp,
            &Patch::Apply(&obj),
        )
        .await
        .unwrap_or_else(|e| panic!("{} {:?} rejected: {e}", t.kind, obj.metadata.name));
    }
}
