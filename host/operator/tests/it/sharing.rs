//! End to end: two NodeWrights holding one cordon, and a disrupted attempt that is not
//! counted against `backoffLimit`.

use crate::common;

use std::time::Duration;

use common::{E2e, NS};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams, ListParams};
use nodewright_api::keys;
use nodewright_api::v1alpha1::Status;
use serde_json::{Value, json};

const MINUTES: Duration = Duration::from_secs(180);

/// A shell package whose apply blocks until `release` exists on the node, then installs.
/// `interrupt`: the spec's interrupt (null for none) and what the plugin reports.
fn held_package(e: &E2e, name: &str, release: &str, interrupt: Value, reports: &str) -> Value {
    let install = format!("/usr/local/bin/install-{name}");
    e.script(&install, &format!("while [ ! -f {release} ]; do sleep 0.2; done; mkdir -p etc && echo installed >> etc/{name}"));
    let mut p = json!({
        "version": "1.0.0", "plugin": e.plugin("shell"),
        "capabilities": {"commands": [{"path": install}]},
        "configMap": {"apply": install, "interrupt": reports}
    });
    if !interrupt.is_null() {
        p["interrupt"] = interrupt;
    }
    p
}

fn nodewright(name: &str, priority: u32, packages: Value) -> Value {
    json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": name},
           "spec": {"priority": priority, "packages": packages}})
}

async fn cordon_marks(e: &E2e, node: &str) -> (bool, bool, bool) {
    let n = e.node(node).await;
    let ann = n.metadata.annotations.unwrap_or_default();
    (
        n.spec.and_then(|s| s.unschedulable).unwrap_or(false),
        ann.contains_key(&keys::cordon("slow")),
        ann.contains_key(&keys::cordon("urgent")),
    )
}

async fn agent_pods(e: &E2e, node: &str) -> Vec<Pod> {
    let pods = Api::<Pod>::namespaced(e.client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    pods.into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_nodewrights_share_a_cordon_and_the_node_stays_cordoned_until_both_finish() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("r1", &[])]).await;
    e.start_operator(&[]);
    // `slow` cordons r1 and then waits inside its apply.
    e.apply(nodewright("slow", 200, json!({"driver": held_package(&e, "driver", "etc/go", json!({"type": "reboot"}), "reboot")}))).await;
    e.wait(
        "slow holds the cordon with its apply running",
        MINUTES,
        || async {
            let (cordoned, slow, _) = cordon_marks(&e, "r1").await;
            (cordoned && slow && !agent_pods(&e, "r1").await.is_empty()).then_some(())
        },
    )
    .await;
    // A NodeWright that runs before it (lower priority value) takes the node meanwhile: it
    // shares the cordon, restarts a service and finishes.
    e.host_file("r1", "/etc/go-urgent", "");
    e.apply(nodewright("urgent", 100, json!({"tools": held_package(&e, "tools", "etc/go-urgent", json!({"type": "service", "services": ["containerd.service"]}), "services:containerd.service")}))).await;
    e.wait("urgent holds a cordon mark of its own", MINUTES, || async {
        cordon_marks(&e, "r1").await.2.then_some(())
    })
    .await;
    e.wait_complete("urgent", MINUTES).await;
    let (cordoned, slow, urgent) = cordon_marks(&e, "r1").await;
    assert!(
        cordoned && slow && !urgent,
        "urgent released its mark, slow still holds the node: cordoned={cordoned} slow={slow} urgent={urgent}"
    );
    assert_ne!(e.node_status("slow", "r1").await, Some(Status::Complete));
    assert!(
        e.journal("r1")
            .iter()
            .any(|a| a.to_string() == "systemctl restart containerd.service"),
        "urgent's service restart ran"
    );

    // Released, `slow` finishes with its reboot and only then is the node uncordoned.
    e.host_file("r1", "/etc/go", "");
    e.wait_complete("slow", MINUTES).await;
    assert_eq!(
        cordon_marks(&e, "r1").await,
        (false, false, false),
        "uncordoned once both finished"
    );
    assert_eq!(e.reboots("r1"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_evicted_attempt_is_not_counted_against_the_backoff_limit() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("n1", &[])]).await;
    // No retries at all: one counted failure would park the node.
    e.start_operator(&["--job-backoff-limit=0"]);
    e.apply(nodewright(
        "tools",
        200,
        json!({"tools": held_package(&e, "tools", "etc/go", Value::Null, "none")}),
    ))
    .await;
    let pod = e
        .wait("the apply attempt is running", MINUTES, || async {
            agent_pods(&e, "n1")
                .await
                .into_iter()
                .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        })
        .await;
    let name = pod.metadata.name.clone().unwrap();
    Api::<Pod>::namespaced(e.client.clone(), NS)
        .evict(&name, &EvictParams::default())
        .await
        .expect("evict the agent pod");
    // The same Job replaces the disrupted pod instead of failing, and counts no failure.
    let job_of = |p: &Pod| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("job-name"))
            .cloned()
    };
    let job = job_of(&pod).expect("an agent pod belongs to a Job");
    e.wait("a replacement attempt runs", MINUTES, || async {
        agent_pods(&e, "n1")
            .await
            .into_iter()
            .any(|p| {
                p.metadata.name.as_deref() != Some(&name)
                    && job_of(&p) == Some(job.clone())
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .then_some(())
    })
    .await;
    let status = e
        .jobs()
        .await
        .into_iter()
        .find(|j| j.metadata.name.as_deref() == Some(&job))
        .and_then(|j| j.status)
        .expect("the Job is still there");
    assert_eq!(
        status.failed.unwrap_or(0),
        0,
        "the eviction was not counted: {status:?}"
    );
    e.host_file("n1", "/etc/go", "");
    e.wait_complete("tools", MINUTES).await;
    // Exactly once: the evicted attempt's command died with its container (the simulated
    // kubelet, like a runtime, kills everything the container started).
    assert_eq!(
        e.read_host_file("n1", "/etc/tools").as_deref(),
        Some("installed\n"),
        "exactly the replacement attempt installed"
    );
}
