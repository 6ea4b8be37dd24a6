//! End to end: `kubectl apply --dry-run=server` of a NodeWright answered with a preview of
//! its rollout (admission warnings), which the rollout then bears out — and the dry run
//! itself writes nothing.

use crate::common;
use crate::trust::start_with_webhook;

use std::time::Duration;

use common::E2e;
use kube::api::{Patch, PatchParams, PostParams};
use nodewright_api::v1alpha1::Status;
use serde_json::{Value, json};

const ROLLOUT: Duration = Duration::from_secs(180);

/// A driver package whose plan asks for a reboot (the shell plugin's `interrupt` key),
/// rolled out one node at a time.
fn driver(e: &E2e, version: &str) -> Value {
    e.script(
        "/usr/local/bin/install-driver",
        "mkdir -p etc && echo installed > etc/driver",
    );
    json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright",
        "metadata": {"name": "driver"},
        "spec": {
            "interruptionBudget": {"count": 1},
            "packages": {"driver": {
                "version": version, "plugin": e.plugin("shell"), "interrupt": {"type": "reboot"},
                "capabilities": {"commands": [{"path": "/usr/local/bin/install-driver"}]},
                "configMap": {"apply": "/usr/local/bin/install-driver", "interrupt": "reboot"}
            }}
        }
    })
}

/// The warnings the apiserver returns for a server-side dry run: a create of `nw`, or a
/// merge patch of the live one with its spec.
async fn dry_run(e: &E2e, nw: &Value, existing: bool) -> Vec<String> {
    let request = kube::core::Request::new("/apis/nodewright.io/v1alpha1/nodewrights");
    let http = if existing {
        let pp = PatchParams {
            dry_run: true,
            ..Default::default()
        };
        let patch = Patch::Merge(json!({"spec": nw["spec"]}));
        request.patch("driver", &pp, &patch)
    } else {
        let pp = PostParams {
            dry_run: true,
            ..Default::default()
        };
        request.create(&pp, serde_json::to_vec(nw).unwrap())
    }
    .unwrap();
    let response = e
        .client
        .send(http.map(kube::client::Body::from))
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    // `299 - "text"`, the text's quotes escaped.
    response
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| {
            let v = String::from_utf8_lossy(v.as_bytes());
            let text = v.split_once(" \"").map_or(&*v, |(_, t)| t);
            text.trim_end_matches('"').replace("\\\"", "\"")
        })
        .filter(|w| w.starts_with("nodewright preview") || w.starts_with("  "))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_side_dry_run_previews_the_rollout_it_then_does() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("n1", &[]), ("n2", &[])]).await;

    start_with_webhook(&mut e).await;
    e.workload_pod("n1", "web-1", json!({"app": "web"})).await;
    e.workload_pod("n2", "web-2", json!({"app": "web"})).await;

    let nw = driver(&e, "1.0.0");
    let preview = dry_run(&e, &nw, false).await;
    let text = preview.join("\n");
    assert_eq!(
        preview[0],
        "nodewright preview of driver: 2 nodes: 2 change (2 reboot), 0 converged, 0 blocked",
        "{text}"
    );
    assert!(
        preview[1].starts_with("  2 pods evicted, 2 batches"),
        "{text}"
    );
    assert!(
        preview
            .iter()
            .any(|l| l.starts_with("  2 node(s), cordon+drain, reboot, ")
                && l.ends_with(" -> complete: n1, n2")),
        "{text}"
    );
    assert!(preview.iter().all(|l| l.len() <= 120), "{text}");
    // Nothing happened: no NodeWright, no Job, no mark on a node.
    assert!(!e.exists("driver").await);
    assert!(e.jobs().await.is_empty());
    for n in ["n1", "n2"] {
        let node = e.node(n).await;
        let marks = node.metadata.annotations.unwrap_or_default();
        assert!(
            !marks.keys().any(|k| k.starts_with("nodewright.io/")),
            "{n}: {marks:?}"
        );
        assert!(!node.spec.unwrap_or_default().unschedulable.unwrap_or(false));
    }

    // What the preview said is what the rollout does: each node drained of its pod and
    // rebooted once, one at a time, both complete.
    e.apply(nw.clone()).await;
    e.wait_complete("driver", ROLLOUT).await;
    for (n, pod) in [("n1", "web-1"), ("n2", "web-2")] {
        assert_eq!(e.reboots(n), 1, "{n}");
        assert!(!e.pod_exists(pod).await, "{pod} was evicted");
        assert_eq!(e.node_status("driver", n).await, Some(Status::Complete));
    }

    // The same spec again: nothing to do. A version bump: every node changes again.
    let same = dry_run(&e, &nw, true).await;
    assert_eq!(
        same[0],
        "nodewright preview of driver: 2 nodes: 0 change, 2 converged, 0 blocked",
        "{}",
        same.join("\n")
    );
    let bumped = dry_run(&e, &driver(&e, "1.0.1"), true).await;
    assert_eq!(
        bumped[0],
        "nodewright preview of driver: 2 nodes: 2 change (2 reboot), 0 converged, 0 blocked",
        "{}",
        bumped.join("\n")
    );
    assert_eq!(
        e.nodewright("driver").await.spec.packages["driver"].version,
        "1.0.0",
        "a dry run changes nothing"
    );
}
