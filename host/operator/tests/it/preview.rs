//! End to end: `kubectl apply --dry-run=server` of a NodeWright answered with a preview of
//! its rollout (admission warnings), which the rollout then bears out — and the dry run
//! itself writes nothing.

use crate::common;
use crate::trust::start_with_webhook;

use std::time::Duration;

use common::E2e;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use nodewright_api::v1alpha1::{
    InterruptType, NodeWrightPreview, PreviewPhase, PreviewReport, PreviewStatus, Status,
};
use nodewright_hostops::HostAction;
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

/// A fleet of two packages on mixed nodes: `driver` (reboot) and `tools` (no interrupt: the
/// rollout, as NodeWright's, applies it without a plan), each planned by a read-only command
/// that finds its file on the host.
fn fleet(e: &E2e, driver: &str) -> Value {
    e.script(
        "/usr/local/bin/install-driver",
        "mkdir -p etc && echo on > etc/driver",
    );
    e.script("/usr/local/bin/driver-ok", "test -f etc/driver");
    e.script(
        "/usr/local/bin/install-tools",
        "mkdir -p etc && echo on > etc/tools",
    );
    e.script("/usr/local/bin/tools-ok", "test -f etc/tools");
    let package = |name: &str, version: &str, interrupt: Value| {
        let mut p = json!({
            "version": version, "plugin": e.plugin("shell"),
            "capabilities": {"commands": [
                {"path": format!("/usr/local/bin/install-{name}")},
                {"path": format!("/usr/local/bin/{name}-ok"), "readOnly": true}
            ]},
            "configMap": {"apply": format!("/usr/local/bin/install-{name}"),
                          "plan": format!("/usr/local/bin/{name}-ok"),
                          "interrupt": if interrupt.is_null() { "none" } else { "reboot" }}
        });
        if !interrupt.is_null() {
            p["interrupt"] = interrupt;
        }
        p
    };
    json!({
        "interruptionBudget": {"count": 5},
        "packages": {
            "driver": package("driver", driver, json!({"type": "reboot"})),
            "tools": package("tools", "1.0.0", Value::Null),
        }
    })
}

/// Creates a NodeWrightPreview of NodeWright `fleet` with `spec` and waits for its report.
async fn preview_of(e: &E2e, id: &str, spec: Value) -> PreviewStatus {
    let api: Api<NodeWrightPreview> = Api::all(e.client.clone());
    let p: NodeWrightPreview = serde_json::from_value(json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWrightPreview",
        "metadata": {"name": id},
        "spec": {"nodewright": "fleet", "spec": spec}
    }))
    .unwrap();
    api.create(&PostParams::default(), &p).await.unwrap();
    e.wait(&format!("preview {id} ready"), ROLLOUT, || async {
        let s = api.get(id).await.ok()?.status?;
        assert_ne!(s.phase, Some(PreviewPhase::Failed), "{}", s.message);
        (s.phase == Some(PreviewPhase::Ready)).then_some(s)
    })
    .await
}

/// Where each reported node ends, what ran on it and what it went through.
fn outcome<'a>(report: &'a PreviewReport, node: &str) -> &'a nodewright_api::v1alpha1::Outcome {
    let line = report.nodes.iter().find(|n| n.name == node).unwrap();
    &report.groups[line.group].outcome
}

#[tokio::test(flavor = "multi_thread")]
async fn a_preview_runs_the_plans_and_foretells_the_rollout_node_for_node() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let nodes = ["n1", "n2", "n3", "n4", "n5"];
    let mut e = E2e::start(&nodes.map(|n| (n, &[][..]))).await;
    start_with_webhook(&mut e).await;
    // n1 has both, n3 the driver only, n2 and n5 neither; n4 carries a taint nothing
    // tolerates; n5 runs a pod a disruption budget protects.
    for (node, file) in [
        ("n1", "/etc/driver"),
        ("n1", "/etc/tools"),
        ("n3", "/etc/driver"),
    ] {
        e.host_file(node, file, "on\n");
    }
    e.patch_node(
        "n4",
        json!({"spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}}),
    )
    .await;
    e.workload_pod("n2", "web", json!({"app": "web"})).await;
    e.workload_pod("n5", "db", json!({"app": "db"})).await;
    e.pdb("db", json!({"app": "db"})).await;

    let spec = fleet(&e, "1.0.0");
    let status = preview_of(&e, "fleet-1", spec.clone()).await;
    let report = status.report.clone().unwrap();
    let text = report.to_string();
    // Both packages' plans ran on the four nodes the rollout reaches (n4 never is) — the
    // tools' for the report only — and wrote nothing.
    assert_eq!((status.plans.wanted, status.plans.done), (8, 8), "{text}");
    for n in nodes {
        // The host saw the read-only plan commands run, and nothing else.
        let journal = e.journal(n);
        assert!(
            journal
                .iter()
                .all(|a| matches!(a, HostAction::Exec { path, .. } if path.ends_with("-ok"))),
            "{n}: {journal:?}"
        );
        let node = e.node(n).await;
        let marks = node.metadata.annotations.unwrap_or_default();
        assert!(
            !marks.keys().any(|k| k.starts_with("nodewright.io/")),
            "{n}: {marks:?}"
        );
        assert!(
            !node.spec.unwrap_or_default().unschedulable.unwrap_or(false),
            "{n}"
        );
    }
    assert_eq!(e.read_host_file("n2", "/etc/driver"), None);
    assert!(!e.exists("fleet").await);
    let jobs = e.jobs().await;
    assert!(
        jobs.iter().all(|j| {
            let labels = j.metadata.labels.clone().unwrap_or_default();
            labels.get("nodewright.io/managed").map(String::as_str) == Some("preview")
                && labels.get("nodewright.io/stage").map(String::as_str) == Some("plan")
        }),
        "only the preview's plan Jobs: {jobs:?}"
    );
    let s = &report.summary;
    assert_eq!(
        (s.nodes, s.change, s.converged, s.blocked),
        (5, 4, 0, 1),
        "{text}"
    );
    assert_eq!((s.refused, s.unfinished), (1, 1), "{text}");
    // What holds it is named: n4's taint, n5's drain.
    let held = |what: &str| report.blockers.iter().any(|b| b.contains(what));
    assert!(held("n4 (untolerated taints: dedicated)"), "{text}");
    assert!(held("DrainBlocked (PodDisruptionBudget)"), "{text}");
    let n5 = report.nodes.iter().find(|n| n.name == "n5").unwrap();
    assert_eq!(n5.refused, ["default/db"], "{text}");
    assert_eq!(
        (n5.compartment.as_deref(), n5.batch.is_some()),
        (Some("__default__"), true),
        "the compartment and batch its work starts in: {text}"
    );
    assert!(outcome(&report, "n5").cordoned, "{text}");
    assert_eq!(
        report
            .nodes
            .iter()
            .find(|n| n.name == "n2")
            .unwrap()
            .evicted,
        ["default/web"]
    );
    let n3 = outcome(&report, "n3");
    let plans: Vec<(&str, bool, bool)> = n3
        .plans
        .iter()
        .map(|p| (p.package.as_str(), p.converged, p.report_only))
        .collect();
    assert_eq!(
        plans,
        [("driver", true, false), ("tools", false, true)],
        "{text}"
    );
    assert!(n3.plans[1].changes[0].contains("install-tools"), "{text}");
    assert!(
        text.contains("tools: 1 change(s) (the rollout applies it without a plan)"),
        "{text}"
    );
    assert!(!n3.cordoned && n3.interrupts.is_empty(), "{text}");
    let n2 = outcome(&report, "n2");
    assert!(n2.cordoned && !n2.plans[0].converged, "{text}");
    assert!(n2.plans[0].changes[0].contains("install-driver"), "{text}");

    // The rollout then does what the preview said, node by node.
    e.apply(json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright",
        "metadata": {"name": "fleet"}, "spec": spec
    }))
    .await;
    let held = outcome(&report, "n5").ends;
    e.wait("n1-n3 complete, n4 blocked, n5 held", ROLLOUT, || async {
        let mut all = Vec::new();
        for n in nodes {
            all.push(e.node_status("fleet", n).await);
        }
        let drain = e.condition("fleet", "DrainBlocked").await;
        (all == [
            Some(Status::Complete),
            Some(Status::Complete),
            Some(Status::Complete),
            Some(Status::Blocked),
            held,
        ] && drain.is_some_and(|c| c.0 == "True"))
        .then_some(())
    })
    .await;
    // n5 is held as foretold: cordoned, its protected pod still there, not rebooted.
    assert!(e.pod_exists("db").await);
    assert!(
        e.node("n5")
            .await
            .spec
            .unwrap()
            .unschedulable
            .unwrap_or(false)
    );
    assert_eq!(e.reboots("n5"), 0);
    for n in ["n1", "n2", "n3", "n4"] {
        let o = outcome(&report, n);
        assert_eq!(e.node_status("fleet", n).await, o.ends, "{n}: {text}");
        let reboots = o
            .interrupts
            .iter()
            .filter(|k| **k == InterruptType::Reboot)
            .count();
        assert_eq!(e.reboots(n), reboots, "{n}: {text}");
        for package in ["driver", "tools"] {
            let applied = e.journal(n).iter().any(|a| {
                matches!(a, HostAction::Exec { path, .. } if *path == format!("/usr/local/bin/install-{package}"))
            });
            let foretold = o.stages.iter().any(|s| *s == format!("{package}:apply"));
            assert_eq!(applied, foretold, "{n} {package}: {text}");
        }
    }
    assert!(!e.pod_exists("web").await, "web was evicted, as foretold");
    // The budget lifted, n5 finishes (so the fleet is whole for the edit below).
    Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
        e.client.clone(),
        "default",
    )
    .delete("db", &Default::default())
    .await
    .unwrap();
    e.wait("n5 complete", ROLLOUT, || async {
        (e.node_status("fleet", "n5").await == Some(Status::Complete)).then_some(())
    })
    .await;

    // The history outlives its leader: once the leader has kept it (the driver applied on
    // n2 and n5, web's eviction), a new leader starts from it.
    let maps = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
        e.client.clone(),
        nodewright_localcluster::NS,
    );
    e.wait("the leader keeps its history", ROLLOUT, || async {
        let kept = maps.get_opt("nodewright-operator-history").await.ok()??;
        let text = kept.data?.remove("history.json")?;
        let v: Value = serde_json::from_str(&text).unwrap();
        (v["stages"]["driver:apply"]["count"].as_u64() >= Some(2)
            && v["evictions"]["count"].as_u64() >= Some(1))
        .then_some(())
    })
    .await;
    e.kill_operator();
    start_with_webhook(&mut e).await;

    // A version bump of `driver`: only the diff is foretold — the driver upgraded and its
    // reboot on the four nodes, `tools` untouched. The rollout upgrades without a plan; the
    // preview's plan of the new version (report only) finds the hosts as it wants them.
    let bumped = preview_of(&e, "fleet-2", fleet(&e, "1.1.0")).await;
    let report = bumped.report.unwrap();
    assert_eq!(bumped.plans.wanted, 4, "{report}");
    // Timed now — by a new leader — from the Jobs and evictions the rollout ran (before
    // it, no Job had been seen).
    assert!(
        report.summary.takes_seconds.is_some()
            && report.assumed.iter().any(|a| a.contains("mean over"))
            && report
                .assumed
                .iter()
                .any(|a| a.contains("pods seen leaving")),
        "{report}"
    );
    assert!(
        status
            .report
            .as_ref()
            .unwrap()
            .summary
            .takes_seconds
            .is_none(),
        "{text}"
    );
    let plans = &outcome(&report, "n2").plans;
    assert!(
        plans.len() == 1
            && plans[0].package == "driver"
            && plans[0].converged
            && plans[0].report_only,
        "{report}"
    );
    assert_eq!(report.summary.change, 4, "{report}");
    for g in &report.groups {
        let o = &g.outcome;
        assert!(
            o.stages.iter().all(|s| s.starts_with("driver:")),
            "{report}"
        );
    }
    assert!(
        outcome(&report, "n1")
            .stages
            .contains(&"driver:upgrade".to_string()),
        "{report}"
    );

    // A finished preview goes when its TTL ends, its plan Jobs with it (owned).
    let api: Api<NodeWrightPreview> = Api::all(e.client.clone());
    let mut short: NodeWrightPreview = api.get("fleet-2").await.unwrap();
    short.metadata = kube::api::ObjectMeta {
        name: Some("fleet-3".into()),
        ..Default::default()
    };
    short.status = None;
    short.spec.ttl_seconds_after_finished = Some(1);
    api.create(&PostParams::default(), &short).await.unwrap();
    e.wait("fleet-3 deleted after its TTL", ROLLOUT, || async {
        api.get_opt("fleet-3")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}
