//! Plugins in a private registry: a login and an internal CA, given to the operator and its
//! agents as a Secret and a ConfigMap (the chart's `pluginRegistries`, a NodeWright's
//! `spec.imagePullSecret`).

use crate::common;

use std::time::Duration;

use common::{E2e, NS};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use nodewright_api::v1alpha1::Status;
use nodewright_oci::{Credentials, Registry, RegistryConfig};
use nodewright_testregistry::TestRegistry;
use serde_json::json;

const MINUTES: Duration = Duration::from_secs(180);

/// Pull refused without the login (the reason names the registry's answer and the field to
/// set), and the rollout goes on by itself once the NodeWright names a Secret holding it:
/// the operator reads the Secret and the CA through the API, the agent pod mounts them (the
/// node's own pull, into its empty cache, can succeed no other way).
#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_behind_a_login_and_a_private_ca_needs_its_secret() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("n1", &[])]).await;
    let private =
        tokio::task::spawn_blocking(|| TestRegistry::start_tls_with_auth("fleet", "s3cret"))
            .await
            .unwrap();
    let host = private.host().to_string();
    let reference = format!("{host}/plugins/sysctl:1.0.0");
    Registry::new(RegistryConfig {
        ca_bundles: [(host.clone(), private.ca_file().into())].into(),
        credentials: Credentials::Basic {
            username: "fleet".into(),
            password: "s3cret".into(),
        },
        ..Default::default()
    })
    .push(
        &reference,
        &nodewright_artifacts::read(nodewright_artifacts::SYSCTL),
        Default::default(),
        &|_| {},
    )
    .await
    .unwrap();
    let ca: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "corp-ca", "namespace": NS},
        "data": {"ca.crt": std::fs::read_to_string(private.ca_file()).unwrap()}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(e.client.clone(), NS)
        .create(&PostParams::default(), &ca)
        .await
        .unwrap();
    e.host_file("n1", "/proc/sys/vm/swappiness", "60");
    e.start_operator(&[&format!("--registry-ca={host}=corp-ca")]);

    let mut nw = json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright",
        "metadata": {"name": "private"},
        "spec": {"packages": {"tuning": {
            "version": "1.0.0", "plugin": reference,
            "capabilities": {"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}], "sysctl": ["vm.swappiness"]},
            "configMap": {"vm.swappiness": "15"}
        }}}
    });
    e.apply(nw.clone()).await;
    let message = plugins_not_ready(&e, "the pull refused without a login", "ResolveFailed").await;
    assert!(
        message.contains("spec.packages.tuning.plugin") && message.contains(&host),
        "{message}"
    );
    assert!(
        message.contains("401 Unauthorized") && message.contains("spec.imagePullSecret"),
        "the registry's refusal is quoted, with what to set: {message}"
    );
    assert!(e.jobs().await.is_empty(), "nothing started on a node");

    // Naming a Secret that does not exist yet: the condition says which and where.
    nw["spec"]["imagePullSecret"] = json!("fleet-login");
    e.apply(nw.clone()).await;
    let message = plugins_not_ready(&e, "the missing Secret named", "RegistryAccess").await;
    assert!(
        message.contains("spec.imagePullSecret")
            && message.contains(&format!("secret {NS}/fleet-login")),
        "{message}"
    );

    // The Secret arrives, with a wrong password: the registry's refusal again.
    let secrets = Api::<Secret>::namespaced(e.client.clone(), NS);
    let login = |password: &str| -> Secret {
        let auth = base64_of(&format!("fleet:{password}"));
        serde_json::from_value(json!({
            "metadata": {"name": "fleet-login", "namespace": NS},
            "type": "kubernetes.io/dockerconfigjson",
            "stringData": {".dockerconfigjson": json!({"auths": {host.clone(): {"auth": auth}}}).to_string()}
        }))
        .unwrap()
    };
    secrets
        .create(&PostParams::default(), &login("wrong"))
        .await
        .unwrap();
    let message = plugins_not_ready(&e, "the wrong login refused", "ResolveFailed").await;
    assert!(message.contains("401 Unauthorized"), "{message}");

    // The Secret rotated, nothing else changed (same generation): the rollout goes on by
    // itself, the agent pulling with the login too.
    let generation = e.nodewright("private").await.metadata.generation;
    secrets
        .replace("fleet-login", &PostParams::default(), &login("s3cret"))
        .await
        .unwrap();
    e.wait_complete("private", MINUTES).await;
    assert_eq!(e.node_status("private", "n1").await, Some(Status::Complete));
    assert_eq!(
        e.nodewright("private").await.metadata.generation,
        generation
    );
    assert_eq!(
        e.read_host_file("n1", "/proc/sys/vm/swappiness").as_deref(),
        Some("15")
    );
}

/// Waits until `PluginsReady` gives `reason`; its message.
async fn plugins_not_ready(e: &E2e, what: &str, reason: &str) -> String {
    let (_, _, message) = e
        .wait(what, MINUTES, || async {
            e.condition("private", "PluginsReady")
                .await
                .filter(|(_, r, _)| r == reason)
        })
        .await;
    message
}

fn base64_of(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}
