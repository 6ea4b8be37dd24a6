//! End to end, everyday changes in the middle of a rollout: a version bump under a
//! DeploymentPolicy, deleting the NodeWright, nodes leaving the selector, nodes joining
//! and leaving the cluster, and the registry going away and coming back. Stages are held
//! by host scripts that wait for a release file, so each change lands exactly where the
//! scenario wants it.

use crate::common;

use std::time::Duration;

use common::{E2e, held_reboot_package, release};
use nodewright_api::keys;
use nodewright_api::v1alpha1::Status;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(240);

fn cr(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": name}, "spec": spec})
}

/// Nodes with a running (not yet finished) Job of `cr` at `stage`.
async fn running_at(e: &E2e, cr: &str, stage: &str) -> Vec<String> {
    let (jobs, _) = e.cr_jobs(cr).await;
    let mut nodes: Vec<String> = jobs
        .iter()
        .filter(|j| {
            j.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(keys::job::STAGE))
                .is_some_and(|s| s == stage)
        })
        .filter(|j| j.status.as_ref().and_then(|s| s.active).unwrap_or(0) > 0)
        .filter_map(|j| j.metadata.labels.as_ref()?.get(keys::job::NODE).cloned())
        .collect();
    nodes.sort();
    nodes
}

/// `Err` naming what of `cr` is still on `node`: a per-CR annotation, a Karpenter mark, the
/// cordon, a Job or a pod.
async fn holds_nothing(e: &E2e, cr: &str, node: &str) -> Result<(), String> {
    let n = e.node(node).await;
    let annotations = n.metadata.annotations.unwrap_or_default();
    for key in nodewright_api::node_state::keys(cr)
        .iter()
        .map(String::as_str)
        .chain([
            keys::KARPENTER_DO_NOT_DISRUPT,
            keys::KARPENTER_DO_NOT_REPAIR,
            keys::KARPENTER_OWNED,
        ])
    {
        if annotations.contains_key(key) {
            return Err(format!("{node} carries {key}"));
        }
    }
    if n.spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return Err(format!("{node} is cordoned"));
    }
    let (jobs, pods) = e.cr_jobs(cr).await;
    let on = |labels: Option<&std::collections::BTreeMap<String, String>>| {
        labels
            .and_then(|l| l.get(keys::job::NODE))
            .is_some_and(|n| n == node)
    };
    if jobs.iter().any(|j| on(j.metadata.labels.as_ref()))
        || pods.iter().any(|p| on(p.metadata.labels.as_ref()))
    {
        return Err(format!("{node} still has a Job or pod of {cr}"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_bump_mid_rollout_under_a_policy_reaches_every_node() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let names = ["v1", "v2", "v3", "v4", "v5", "v6"];
    let nodes: Vec<(&str, &[(&str, &str)])> = names.iter().map(|n| (*n, &[][..])).collect();
    let mut e = E2e::start(&nodes).await;
    e.start_operator(&[]);
    e.policy(
        "pairs",
        json!({"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}}),
    )
    .await;
    let pkg = held_reboot_package(&e, "1.0.0");
    e.apply(cr(
        "drivers",
        json!({"deploymentPolicy": "pairs", "packages": {"driver": pkg}}),
    ))
    .await;
    // The first batch gets through; the second holds in apply.
    let first = e
        .wait("the first batch in apply", LIMIT, || async {
            Some(running_at(&e, "drivers", "apply").await).filter(|n| n.len() == 2)
        })
        .await;
    for n in &first {
        release(&e, n, "apply");
        release(&e, n, "post");
    }
    let second = e
        .wait("the second batch in apply", LIMIT, || async {
            Some(running_at(&e, "drivers", "apply").await)
                .filter(|n| n.len() == 2 && n.iter().all(|x| !first.contains(x)))
        })
        .await;
    for n in &first {
        e.wait(&format!("{n} complete"), LIMIT, || async {
            (e.node_status("drivers", n).await == Some(Status::Complete)).then_some(())
        })
        .await;
    }
    // 2 done, 2 at work, 2 untouched: the version moves.
    e.patch(
        "drivers",
        json!({"spec": {"packages": {"driver": {"version": "2.0.0"}}}}),
    )
    .await;
    for n in names {
        release(&e, n, "apply");
        release(&e, n, "post");
    }
    e.wait_complete("drivers", LIMIT).await;
    for n in names {
        let st = e.state("drivers", n).await;
        assert!(
            st.contains_key("driver|2.0.0"),
            "{n} is not on 2.0.0: {st:?}"
        );
        let node = e.node(n).await;
        let annotations = node.metadata.annotations.unwrap_or_default();
        assert!(
            !node.spec.and_then(|s| s.unschedulable).unwrap_or(false),
            "{n} still cordoned"
        );
        for key in [
            keys::cordon("drivers").as_str(),
            keys::KARPENTER_DO_NOT_DISRUPT,
            keys::KARPENTER_OWNED,
        ] {
            assert!(!annotations.contains_key(key), "{n} still carries {key}");
        }
    }
    let untouched: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !first.contains(&n.to_string()) && !second.contains(&n.to_string()))
        .collect();
    assert_eq!(untouched.len(), 2);
    let status = e.nodewright("drivers").await.status.unwrap();
    let comp = &status.compartment_statuses["__default__"];
    let batch = comp.batch_state.as_ref().unwrap();
    assert!(
        batch.completed_nodes + batch.failed_nodes <= comp.matched,
        "{batch:?}"
    );
    assert_eq!(status.complete_nodes.as_deref(), Some("6/6"));
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_nodewright_mid_rollout_stops_its_jobs_then_releases_its_nodes() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("d1", &[]), ("d2", &[]), ("d3", &[])]).await;
    e.start_operator(&[]);
    // d1's drain is held by a PodDisruptionBudget.
    e.workload_pod("d1", "guarded", json!({"app": "guarded"}))
        .await;
    e.pdb("guarded", json!({"app": "guarded"})).await;
    let pkg = held_reboot_package(&e, "1.0.0");
    // d3 gets through apply and its reboot, then holds in post-interrupt.
    release(&e, "d3", "apply");
    e.apply(cr(
        "wipe",
        json!({"interruptionBudget": {"count": 3}, "packages": {"driver": pkg}}),
    ))
    .await;
    e.wait("d2 in apply and d3 in post-interrupt", LIMIT, || async {
        let apply = running_at(&e, "wipe", "apply").await;
        let post = running_at(&e, "wipe", "post-interrupt").await;
        (apply == ["d2"] && post == ["d3"]).then_some(())
    })
    .await;
    e.wait("d1's drain blocked", LIMIT, || async {
        e.node("d1")
            .await
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(&keys::drain_blocked("wipe"))
            .then_some(())
    })
    .await;
    e.delete("wipe").await;
    e.wait("the NodeWright gone", LIMIT, || async {
        (!e.exists("wipe").await).then_some(())
    })
    .await;
    // The finalizer went last: by then no Job and no pod of it is left, and every node
    // is released.
    let (jobs, pods) = e.cr_jobs("wipe").await;
    assert!(
        jobs.is_empty() && pods.is_empty(),
        "left running: {} Jobs, {} pods",
        jobs.len(),
        pods.len()
    );
    for n in ["d1", "d2", "d3"] {
        let left = holds_nothing(&e, "wipe", n).await;
        assert!(
            left.is_ok()
                || left
                    .as_ref()
                    .is_err_and(|m| m.contains(&keys::node_state("wipe"))),
            "{left:?}"
        );
    }
    // The held stages never finished: they were stopped, not left to run.
    assert!(e.read_host_file("d2", "/etc/driver").is_none());
    assert!(e.read_host_file("d3", "/etc/driver-verified").is_none());
    assert!(
        e.pod_exists("guarded").await,
        "the protected pod was never evicted"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn nodes_leaving_the_selector_are_stopped_and_released() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("s1", &[("pool", "gpu")]), ("s2", &[("pool", "gpu")])]).await;
    e.start_operator(&[]);
    let pkg = held_reboot_package(&e, "1.0.0");
    e.apply(cr("gpus", json!({"nodeSelectors": {"matchLabels": {"pool": "gpu"}}, "interruptionBudget": {"count": 1}, "packages": {"driver": pkg}}))).await;
    e.wait("s1 in apply", LIMIT, || async {
        (running_at(&e, "gpus", "apply").await == ["s1"]).then_some(())
    })
    .await;
    assert_eq!(
        e.node("s2")
            .await
            .metadata
            .annotations
            .unwrap_or_default()
            .get(&keys::node_status("gpus"))
            .map(String::as_str),
        Some("waiting")
    );
    // Both leave the pool: s1 in the middle of its apply, s2 before it started.
    e.patch_node("s1", json!({"metadata": {"labels": {"pool": null}}}))
        .await;
    e.patch_node("s2", json!({"metadata": {"labels": {"pool": null}}}))
        .await;
    for n in ["s1", "s2"] {
        e.wait(&format!("{n} released"), LIMIT, || async {
            holds_nothing(&e, "gpus", n).await.ok()
        })
        .await;
    }
    assert!(
        e.read_host_file("s1", "/etc/driver").is_none(),
        "the held apply was stopped"
    );
    assert!(e.events("s1").await.iter().any(|(r, _)| r == "Released"));
    // And nothing comes back for them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(holds_nothing(&e, "gpus", "s1").await, Ok(()));
}

#[tokio::test(flavor = "multi_thread")]
async fn nodes_joining_and_leaving_and_a_registry_outage_do_not_stall_a_rollout() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("j1", &[]), ("j2", &[])]).await;
    e.start_operator(&[]);
    e.host_file("j1", "/proc/sys/vm/swappiness", "60");
    e.host_file("j2", "/proc/sys/vm/swappiness", "60");
    let tuning = |e: &E2e, value: &str| {
        json!({
            "version": "1.0.0", "plugin": e.plugin("sysctl"), "configMap": {"vm.swappiness": value},
            "capabilities": {"sysctl": ["vm.swappiness"], "files": [{"path": "/etc/sysctl.d", "access": "readWrite"}]}
        })
    };
    e.apply(cr(
        "tune",
        json!({"packages": {"tuning": tuning(&e, "10")}}),
    ))
    .await;
    e.wait_complete("tune", LIMIT).await;
    // The registry goes away: a new node still gets its package from... nowhere yet.
    e.registry_down();
    e.add_node("j3", &[]).await;
    e.host_file("j3", "/proc/sys/vm/swappiness", "60");
    e.remove_node("j2").await;
    e.wait("j3 waiting on the registry", LIMIT, || async {
        let st = e.state("tune", "j3").await;
        st.values()
            .any(|p| p.message.contains("[host]"))
            .then_some(())
    })
    .await;
    // Back at the same address: the rollout finishes on the nodes that exist.
    e.registry_up();
    e.wait_complete("tune", LIMIT).await;
    assert_eq!(
        e.read_host_file("j3", "/proc/sys/vm/swappiness").as_deref(),
        Some("10")
    );
    let status = e.nodewright("tune").await.status.unwrap();
    assert_eq!(
        status.node_status.keys().cloned().collect::<Vec<_>>(),
        ["j1", "j3"],
        "the removed node is not counted"
    );
}

/// Mirrors NodeWright's `auto-taint-new-nodes`: a node joining the cluster is tainted
/// `nodewright.io=runtime-required:NoSchedule` by the one runtime-required NodeWright that
/// asks for it (`autoTaintNewNodes`, here the second of two), so no workload lands before
/// the node's runtime packages; the taint is lifted once every runtime-required NodeWright
/// is complete there.
#[tokio::test(flavor = "multi_thread")]
async fn a_joining_node_is_tainted_until_its_runtime_packages_are_in() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("r1", &[])]).await;
    let hold = "while [ ! -f release-base ]; do sleep 0.1; done; mkdir -p etc && touch etc/base";
    e.script("/usr/local/bin/base", hold);
    e.script("/usr/local/bin/gpu", "mkdir -p etc && touch etc/gpu");
    release(&e, "r1", "base");
    e.start_operator(&[]);
    let package = |e: &E2e, cmd: &str| {
        json!({"version": "1.0.0", "plugin": e.plugin("shell"),
               "capabilities": {"commands": [{"path": cmd}]}, "configMap": {"apply": cmd}})
    };
    e.apply(cr(
        "base",
        json!({"priority": 100, "runtimeRequired": true, "packages": {"base": package(&e, "/usr/local/bin/base")}}),
    ))
    .await;
    e.apply(cr(
        "gpu",
        json!({"priority": 200, "runtimeRequired": true, "autoTaintNewNodes": true,
               "packages": {"gpu": package(&e, "/usr/local/bin/gpu")}}),
    ))
    .await;
    e.wait_complete("base", LIMIT).await;
    e.wait_complete("gpu", LIMIT).await;

    e.add_node("r2", &[]).await;
    e.script("/usr/local/bin/base", hold);
    e.script("/usr/local/bin/gpu", "mkdir -p etc && touch etc/gpu");
    let tainted = |n: k8s_openapi::api::core::v1::Node| {
        n.spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| {
                t.key == keys::RUNTIME_REQUIRED_TAINT_KEY
                    && t.value.as_deref() == Some(keys::RUNTIME_REQUIRED_TAINT_VALUE)
                    && t.effect == "NoSchedule"
            })
    };
    e.wait("r2 tainted", LIMIT, || async {
        tainted(e.node("r2").await).then_some(())
    })
    .await;
    assert!(!tainted(e.node("r1").await), "a node already set up is not");
    // Held in base's apply: still tainted, gpu waits behind it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(tainted(e.node("r2").await));
    assert_eq!(e.read_host_file("r2", "/etc/gpu"), None);

    release(&e, "r2", "base");
    e.wait_complete("base", LIMIT).await;
    e.wait_complete("gpu", LIMIT).await;
    e.wait("r2's taint lifted", LIMIT, || async {
        (!tainted(e.node("r2").await)).then_some(())
    })
    .await;
    assert!(e.read_host_file("r2", "/etc/gpu").is_some());
}
