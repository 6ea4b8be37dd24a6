//! End to end: the operator's validating admission webhook, called by the real apiserver.
//!
//! The test cluster has no Service routing, so the webhook configuration reaches the
//! operator by URL (`https://127.0.0.1:<port>`); the operator adds 127.0.0.1 to its
//! self-managed certificate (`--webhook-host`) and injects the CA exactly as it does for the
//! chart's Service-based configuration.

use crate::common;

use std::time::Duration;

use common::{E2e, NS};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use nodewright_api::v1alpha1::{DeploymentPolicy, NodeWright};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

fn nodewright(e: &E2e, name: &str, extra: Value) -> NodeWright {
    let mut v = json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright",
        "metadata": {"name": name},
        "spec": {"packages": {"tuning": {
            "version": "1.0.0", "plugin": e.plugin("sysctl"),
            "capabilities": {"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}], "sysctl": ["vm.swappiness"]},
            "configMap": {"vm.swappiness": "10"},
            "uninstall": {"enabled": true}
        }}}
    });
    if let (Some(spec), Value::Object(extra)) = (v["spec"].as_object_mut(), extra) {
        spec.extend(extra);
    }
    serde_json::from_value(v).unwrap()
}

fn policy(name: &str) -> DeploymentPolicy {
    serde_json::from_value(json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "DeploymentPolicy",
        "metadata": {"name": name},
        "spec": {"default": {"budget": {"count": 1}, "strategy": {"fixed": {}}}}
    }))
    .unwrap()
}

/// The apiserver's refusal text for a create, or None when it was admitted.
async fn create_refusal<K>(api: &Api<K>, obj: &K) -> Option<String>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(s.message),
        Err(e) => panic!("create failed for another reason: {e}"),
    }
}

async fn ca_bundle(e: &E2e) -> Option<Vec<u8>> {
    let vwc = Api::<ValidatingWebhookConfiguration>::all(e.client.clone())
        .get("nodewright")
        .await
        .unwrap();
    let bundles: Vec<_> = vwc
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|w| w.client_config.ca_bundle.map(|b| b.0))
        .collect();
    (bundles.iter().all(|b| b.is_some()) && bundles.windows(2).all(|w| w[0] == w[1]))
        .then(|| bundles[0].clone().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_webhook_validates_with_cluster_rules_and_fails_closed() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("n1", &[])]).await;
    e.host_file("n1", "/proc/sys/vm/swappiness", "60");
    let (port, metrics) = (
        nodewright_testregistry::free_port(),
        nodewright_testregistry::free_port(),
    );
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(e.client.clone());
    vwcs.create(
        &PostParams::default(),
        &serde_json::from_value(nodewright_localcluster::webhook_config("nodewright", port))
            .unwrap(),
    )
    .await
    .unwrap();
    let flags = [
        format!("--webhook-addr=127.0.0.1:{port}"),
        "--webhook-host=127.0.0.1".into(),
        format!("--metrics-addr=127.0.0.1:{metrics}"),
    ];
    e.start_operator(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let ca = e
        .wait("the operator injects its CA", WAIT, || async {
            ca_bundle(&e).await
        })
        .await;
    assert!(String::from_utf8_lossy(&ca).contains("BEGIN CERTIFICATE"));
    let secret = Api::<Secret>::namespaced(e.client.clone(), NS)
        .get("nodewright-webhook-cert")
        .await
        .unwrap();
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(
        secret.data.unwrap()["ca.crt"].0,
        ca,
        "the injected CA is the Secret's"
    );

    let nws: Api<NodeWright> = Api::all(e.client.clone());
    let policies: Api<DeploymentPolicy> = Api::all(e.client.clone());

    // A field rule the CRD schema cannot express: a dependency cycle.
    let mut cyclic = nodewright(&e, "cyclic", json!({}));
    let mut other = cyclic.spec.packages["tuning"].clone();
    other.depends_on.insert("tuning".into(), "1.0.0".into());
    cyclic
        .spec
        .packages
        .get_mut("tuning")
        .unwrap()
        .depends_on
        .insert("other".into(), "1.0.0".into());
    cyclic.spec.packages.insert("other".into(), other);
    let refusal = create_refusal(&nws, &cyclic)
        .await
        .expect("a cycle is refused");
    assert!(
        refusal.contains("denied the request") && refusal.contains("dependency cycle"),
        "{refusal}"
    );

    // A referenced policy must exist — and counts the moment it does.
    let canary = nodewright(&e, "canary", json!({"deploymentPolicy": "rollout"}));
    let refusal = create_refusal(&nws, &canary)
        .await
        .expect("a missing policy is refused");
    assert!(
        refusal.contains("spec.deploymentPolicy") && refusal.contains("\"rollout\" does not exist"),
        "{refusal}"
    );
    assert_eq!(create_refusal(&policies, &policy("rollout")).await, None);
    assert_eq!(
        create_refusal(&nws, &canary).await,
        None,
        "admitted once the policy exists"
    );

    // A policy in use cannot be deleted; an unused one can.
    let refusal = match policies.delete("rollout", &DeleteParams::default()).await {
        Err(kube::Error::Api(s)) => s.message,
        other => panic!("deleting a policy in use was not refused: {other:?}"),
    };
    assert!(refusal.contains("in use by NodeWright canary"), "{refusal}");
    assert_eq!(create_refusal(&policies, &policy("spare")).await, None);
    policies
        .delete("spare", &DeleteParams::default())
        .await
        .expect("an unused policy can be deleted");

    // An update may not drop an uninstallable package a node still has (the rule reads the
    // nodes' state annotations, written by the rollout).
    e.wait_complete("canary", Duration::from_secs(180)).await;
    let drop_it = json!({"spec": {"packages": {"tuning": null, "other": {"version": "1.0.0", "plugin": e.plugin("sysctl")}}}});
    let refusal = match nws
        .patch("canary", &PatchParams::default(), &Patch::Merge(&drop_it))
        .await
    {
        Err(kube::Error::Api(s)) => s.message,
        other => panic!("dropping an installed uninstallable package was admitted: {other:?}"),
    };
    assert!(
        refusal.contains("spec.packages.tuning") && refusal.contains("n1"),
        "{refusal}"
    );

    // Metrics count the verdicts.
    let text = common::http_get(metrics, "/metrics").await;
    assert!(text.contains("nodewright_admission_reviews_total{kind=\"NodeWright\",operation=\"CREATE\",verdict=\"denied\"}"), "{text}");
    assert!(text.contains("nodewright_admission_reviews_total{kind=\"DeploymentPolicy\",operation=\"DELETE\",verdict=\"allowed\"} 1"), "{text}");
    assert_eq!(common::http_get(metrics, "/readyz").await, "ok");

    // Fail closed: with the operator gone nothing is admitted.
    e.kill_operator();
    let refusal = create_refusal(&nws, &nodewright(&e, "while-down", json!({})))
        .await
        .expect("refused while the webhook is down");
    assert!(refusal.contains("failed calling webhook"), "{refusal}");

    // A restart reuses the stored certificate: the CA in the configuration is unchanged.
    e.start_operator(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    e.wait("admitted again after the restart", WAIT, || async {
        create_refusal(&nws, &nodewright(&e, "after-restart", json!({})))
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(
        ca_bundle(&e).await,
        Some(ca),
        "the restart kept the certificate"
    );

    // Someone (a helm upgrade) blanks the bundle: the operator puts it back.
    let mut vwc = vwcs.get("nodewright").await.unwrap();
    for w in vwc.webhooks.iter_mut().flatten() {
        w.client_config.ca_bundle = None;
    }
    vwcs.replace("nodewright", &PostParams::default(), &vwc)
        .await
        .unwrap();
    e.wait("the bundle is re-injected", WAIT, || async {
        ca_bundle(&e).await
    })
    .await;
}
