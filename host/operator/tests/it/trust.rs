//! End to end: plugin trust and who may grant what, on the real apiserver with the
//! operator's webhook, a real registry holding the signatures, and users authenticated by
//! client certificates.

use crate::common;

use std::time::Duration;

use common::E2e;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodewright_api::pinned::PinnedRef;
use nodewright_api::trust::PluginTrustPolicy;
use nodewright_api::v1alpha1::{NodeWright, NodeWrightPreview, Status};
use nodewright_oci::{Registry, RegistryConfig};
use nodewright_trust::keys::KeyPair;
use nodewright_trust::signatures;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);

fn registry(e: &E2e) -> Registry {
    Registry::new(RegistryConfig {
        insecure: vec![e.registry.host().into()],
        ..Default::default()
    })
}

/// `plugin` pinned.
async fn pinned(e: &E2e, plugin: &str) -> PinnedRef {
    let r = registry(e);
    nodewright_oci::pin(plugin, &r.resolve(plugin).await.unwrap()).unwrap()
}

async fn sign(e: &E2e, plugin: &str, key: &KeyPair) {
    signatures::attach(&registry(e), &pinned(e, plugin).await, key)
        .await
        .unwrap();
}

fn tuning(name: &str, plugin: &str, version: &str) -> Value {
    json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright",
        "metadata": {"name": name},
        "spec": {"packages": {"tuning": {
            "version": version, "plugin": plugin,
            "capabilities": {"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}], "sysctl": ["vm.swappiness"]},
            "configMap": {"vm.swappiness": "10"}
        }}}
    })
}

/// A policy trusting `platform` (files under /etc, any sysctl, power) and `app` (only
/// /etc/app and units app-*).
fn trust_policy(mode: &str, platform: &KeyPair, app: &KeyPair) -> PluginTrustPolicy {
    serde_json::from_value(json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "PluginTrustPolicy",
        "metadata": {"name": "signed-plugins"},
        "spec": {"mode": mode, "signers": [
            {"name": "platform", "publicKey": platform.public().to_pem(), "mayGrant": {
                "files": [{"path": "/etc", "access": "readWrite"}], "sysctl": ["*"], "power": true}},
            {"name": "app", "publicKey": app.public().to_pem(), "mayGrant": {
                "files": [{"path": "/etc/app", "access": "readWrite"}], "services": ["app-*"]}}
        ]}
    }))
    .unwrap()
}

async fn set_policy(e: &E2e, policy: &PluginTrustPolicy) {
    Api::<PluginTrustPolicy>::all(e.client.clone())
        .patch(
            "signed-plugins",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(policy),
        )
        .await
        .unwrap();
}

/// The apiserver's refusal of creating `nw` as `client`, or None when it was admitted.
async fn refusal(client: &Client, nw: &Value) -> Option<String> {
    let nw: NodeWright = serde_json::from_value(nw.clone()).unwrap();
    match Api::<NodeWright>::all(client.clone())
        .create(&PostParams::default(), &nw)
        .await
    {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(s.message),
        Err(e) => panic!("create failed for another reason: {e}"),
    }
}

/// Starts the operator serving the webhook, registered with the apiserver, and waits for its
/// CA and for it to accept connections.
pub async fn start_with_webhook(e: &mut E2e) {
    let port = nodewright_testregistry::free_port();
    let flags = e.cluster.admission(port).await.unwrap();
    e.start_operator(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    e.wait("the operator injects its CA", WAIT, || {
        e.cluster.webhook_ca()
    })
    .await;
    // A restarted operator finds its CA injected already: wait for it to serve too.
    e.wait("the operator serves its webhook", WAIT, || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(drop)
    })
    .await;
}

/// The chart's example grant ClusterRoles, a role to edit NodeWrights, and bindings:
/// `alice` may grant files only, `bob` everything.
async fn users(e: &E2e) -> (Client, Client) {
    for doc in nodewright_testcluster::render_chart(
        "nodewright",
        &["--set", "registry=registry.example.com/nodewright"],
    )
    .unwrap()
    {
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        if doc["kind"] == "ClusterRole" && name.starts_with("nodewright-grant-") {
            e.cluster.apply(&doc).await.unwrap();
        }
    }
    e.cluster
        .apply(&json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "nodewright-editor"},
            "rules": [{"apiGroups": ["nodewright.io"], "resources": ["nodewrights", "nodewrightpreviews"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]
        }))
        .await
        .unwrap();
    for (binding, user, role) in [
        ("alice-edit", "alice", "nodewright-editor"),
        ("alice-files", "alice", "nodewright-grant-files"),
        ("bob-edit", "bob", "nodewright-editor"),
        ("bob-all", "bob", "nodewright-grant-all"),
    ] {
        e.cluster
            .apply(&json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": binding},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
            }))
            .await
            .unwrap();
    }
    (
        e.cluster
            .cp
            .user_client("alice", &["team-a"])
            .await
            .unwrap(),
        e.cluster
            .cp
            .user_client("bob", &["platform"])
            .await
            .unwrap(),
    )
}

fn files_package(e: &E2e, name: &str, reboot: bool) -> Value {
    let mut package = json!({
        "version": "1.0.0", "plugin": e.plugin("files"),
        "capabilities": {"files": [{"path": "/etc/app", "access": "readWrite"}]}
    });
    if reboot {
        package["interrupt"] = json!({"type": "reboot"});
    }
    json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": name}, "spec": {"packages": {"app": package}}})
}

#[tokio::test(flavor = "multi_thread")]
async fn grants_need_rbac_and_plugins_need_trusted_signatures() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("n1", &[])]).await;
    e.host_file("n1", "/proc/sys/vm/swappiness", "60");
    start_with_webhook(&mut e).await;

    // Who may grant what: alice may grant files, not power; bob may grant both.
    let (alice, bob) = users(&e).await;
    assert_eq!(
        refusal(&alice, &files_package(&e, "alice-files", false)).await,
        None,
        "files is alice's to grant"
    );
    let refused = refusal(&alice, &files_package(&e, "alice-reboot", true))
        .await
        .expect("alice may not grant power");
    assert!(
        refused.contains("user \"alice\" may not grant \"power\"")
            && refused.contains("app (interrupt.type: reboot)")
            && refused.contains("resourceName \"power\""),
        "{refused}"
    );
    // A dry run — the preview — of what alice may not grant shows her that blocker.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let err = Api::<NodeWright>::all(alice.clone())
        .create(
            &dry,
            &serde_json::from_value(files_package(&e, "alice-reboot", true)).unwrap(),
        )
        .await
        .expect_err("alice's preview of a reboot package");
    assert!(err.to_string().contains("may not grant \"power\""), "{err}");
    // So does a NodeWrightPreview of it: refused at its admission, for her.
    let spec = files_package(&e, "alice-reboot", true)["spec"].clone();
    let preview = json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWrightPreview",
        "metadata": {"name": "alice-reboot"}, "spec": {"nodewright": "alice-reboot", "spec": spec}
    });
    let err = Api::<NodeWrightPreview>::all(alice.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(preview).unwrap(),
        )
        .await
        .expect_err("alice's NodeWrightPreview of a reboot package");
    assert!(err.to_string().contains("may not grant \"power\""), "{err}");
    assert_eq!(
        refusal(&bob, &files_package(&e, "bob-reboot", true)).await,
        None,
        "bob may grant power"
    );
    // An update that changes a package asks again; one that changes nothing does not.
    let nws = Api::<NodeWright>::all(alice.clone());
    let err = nws
        .patch(
            "bob-reboot",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"packages": {"app": {"version": "1.0.1"}}}})),
        )
        .await
        .expect_err("alice changing bob's reboot package");
    assert!(err.to_string().contains("may not grant \"power\""), "{err}");
    nws.patch(
        "bob-reboot",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
    )
    .await
    .expect("a label is not a grant");
    for name in ["alice-files", "bob-reboot"] {
        e.delete(name).await;
    }

    // Trust: under an enforced policy an unsigned plugin is refused at admission.
    let (platform, app) = (KeyPair::generate(), KeyPair::generate());
    set_policy(&e, &trust_policy("enforce", &platform, &app)).await;
    let sysctl = e.plugin("sysctl");
    let refused = refusal(&e.client, &tuning("tune", &sysctl, "1.0.0"))
        .await
        .expect("an unsigned plugin under enforce");
    assert!(
        refused.contains("spec.packages.tuning.plugin")
            && refused.contains("is not signed by a trusted signer (platform, app)"),
        "{refused}"
    );

    // Signed by app, who may not be granted /etc/sysctl.d or sysctl: refused, naming both.
    sign(&e, &sysctl, &app).await;
    let refused = refusal(&e.client, &tuning("tune", &sysctl, "1.0.0"))
        .await
        .expect("grants beyond app's allowance");
    assert!(
        refused.contains("grant files {path: \"/etc/sysctl.d\", access: readWrite} is beyond what its signers (app) may be granted")
            && refused.contains("grant sysctl \"vm.swappiness\""),
        "{refused}"
    );

    // Also signed by platform: admitted, rolled out, the signers recorded.
    sign(&e, &sysctl, &platform).await;
    assert_eq!(
        refusal(&e.client, &tuning("tune", &sysctl, "1.0.0")).await,
        None
    );
    e.wait_complete("tune", WAIT).await;
    assert_eq!(
        e.read_host_file("n1", "/proc/sys/vm/swappiness").as_deref(),
        Some("10")
    );
    let status = e.nodewright("tune").await.status.unwrap();
    assert_eq!(
        status.plugin_signers["tuning"],
        ["platform", "app"],
        "{status:?}"
    );
    assert!(status.resolved_plugins["tuning"].contains("@sha256:"));

    // An invalid policy is refused by the webhook, naming the field.
    let mut bad = trust_policy("enforce", &platform, &app);
    bad.metadata.name = Some("bad".into());
    bad.spec.signers[1].public_key =
        Some("-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n".into());
    let err = Api::<PluginTrustPolicy>::all(e.client.clone())
        .create(&PostParams::default(), &bad)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("spec.signers[1].publicKey: not an ECDSA P-256 public key"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operator_catches_a_tag_moved_to_an_unsigned_digest() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    // No webhook here: the operator is the last line (a webhook that was down, or a tag
    // moved after admission).
    let mut e = E2e::start(&[("n1", &[])]).await;
    e.host_file("n1", "/proc/sys/vm/swappiness", "60");
    e.start_operator(&[]);
    let (platform, app) = (KeyPair::generate(), KeyPair::generate());
    set_policy(&e, &trust_policy("enforce", &platform, &app)).await;
    let r = registry(&e);
    let tag = format!("{}/plugins/tuning:stable", e.registry.host());
    let wasm = nodewright_artifacts::read(nodewright_artifacts::SYSCTL);
    let signed = r
        .push(&tag, &wasm, Default::default(), &|_| {})
        .await
        .unwrap()
        .pinned;
    signatures::attach(&r, &signed, &platform).await.unwrap();
    e.apply(tuning("tune", &tag, "1.0.0")).await;
    e.wait_complete("tune", WAIT).await;
    assert_eq!(
        e.nodewright("tune").await.status.unwrap().plugin_signers["tuning"],
        ["platform"]
    );

    // The tag moves to another digest (the same code, re-pushed), unsigned; a new version
    // resolves it again.
    let info = nodewright_oci::artifact::ComponentInfo {
        target: Some("moved".into()),
        ..Default::default()
    };
    let moved = r.push(&tag, &wasm, info, &|_| {}).await.unwrap().pinned;
    assert_ne!(moved, signed);
    let jobs_before = e.jobs().await.len();
    e.patch("tune", json!({"spec": {"packages": {"tuning": {"version": "1.0.1", "configMap": {"vm.swappiness": "20"}}}}})).await;
    let (status, reason, message) = e
        .wait("PluginsReady=False", WAIT, || async {
            e.condition("tune", "PluginsReady")
                .await
                .filter(|c| c.0 == "False")
        })
        .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "SignatureMissing"),
        "{message}"
    );
    assert!(
        message.contains(moved.as_str()) && message.contains("not signed by a trusted signer"),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(e.jobs().await.len(), jobs_before, "no node touched");
    let state = e.state("tune", "n1").await;
    assert!(
        state.contains_key("tuning|1.0.0") && !state.contains_key("tuning|1.0.1"),
        "{state:?}"
    );
    assert_eq!(
        e.read_host_file("n1", "/proc/sys/vm/swappiness").as_deref(),
        Some("10")
    );

    // Warn mode: rolled out, the finding reported.
    set_policy(&e, &trust_policy("warn", &platform, &app)).await;
    let (_, reason, message) = e
        .wait("PluginsReady=True with warnings", WAIT, || async {
            e.condition("tune", "PluginsReady")
                .await
                .filter(|c| c.0 == "True")
        })
        .await;
    assert_eq!(reason, "ResolvedWithTrustWarnings", "{message}");
    assert!(
        message.contains("PluginTrustPolicy signed-plugins") && message.contains("not signed"),
        "{message}"
    );
    e.wait_complete("tune", WAIT).await;
    assert_eq!(
        e.read_host_file("n1", "/proc/sys/vm/swappiness").as_deref(),
        Some("20")
    );
    assert_eq!(
        e.nodewright("tune").await.status.unwrap().status,
        Some(Status::Complete)
    );
}
