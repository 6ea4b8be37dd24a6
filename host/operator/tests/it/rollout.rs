//! End to end: the operator binary rolls packages out across simulated nodes of a real
//! control plane, with real agents pulling real plugins from a real registry.

use crate::common;

use std::time::Duration;

use common::E2e;
use nodewright_api::keys;
use nodewright_api::node_state::{Stage, State};
use nodewright_api::v1alpha1::Status;
use nodewright_hostops::HostAction;
use serde_json::json;

const MINUTES: Duration = Duration::from_secs(180);

fn tuning(e: &E2e, name: &str, value: &str) -> serde_json::Value {
    json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright",
        "metadata": {"name": name},
        "spec": {"packages": {"tuning": {
            "version": "1.0.0", "plugin": e.plugin("sysctl"),
            "capabilities": {"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}], "sysctl": ["vm.swappiness"]},
            "configMap": {"vm.swappiness": value}
        }}}
    })
}

/// The Python port of `sysctl` rolls out through the same operator, agent and sandbox
/// defaults as the Rust plugin, and leaves the same host behind.
#[tokio::test(flavor = "multi_thread")]
async fn a_python_plugin_rolls_out_like_the_rust_one() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    if nodewright_artifacts::port(nodewright_artifacts::SYSCTL_PY, "SYSCTL_PY").is_none() {
        return;
    }
    let mut e = E2e::start(&[("n1", &[]), ("n2", &[])]).await;
    for n in ["n1", "n2"] {
        e.host_file(n, "/proc/sys/vm/swappiness", "60");
    }
    e.start_operator(&[]);
    let mut spec = tuning(&e, "tuning-py", "10");
    spec["spec"]["packages"]["tuning"]["plugin"] = json!(e.plugin("sysctl-py"));
    e.apply(spec).await;
    // Each node's agent compiles the interpreter component cold; on a loaded 2-core machine
    // a compile can pass the agent's 120 s bound and be retried, so the wait is longer.
    e.wait_complete("tuning-py", 2 * MINUTES).await;
    for n in ["n1", "n2"] {
        assert_eq!(
            e.read_host_file(n, "/proc/sys/vm/swappiness").as_deref(),
            Some("10"),
            "{n}"
        );
        assert_eq!(
            e.read_host_file(n, "/etc/sysctl.d/60-nodewright-tuning.conf")
                .as_deref(),
            Some("# Managed by nodewright. Local edits are overwritten.\nvm.swappiness = 10\n"),
            "{n}"
        );
        let st = e.state("tuning-py", n).await;
        let entry = &st["tuning|1.0.0"];
        assert_eq!((entry.stage, entry.state), (Stage::Config, State::Complete));
        assert!(
            entry
                .digest
                .as_ref()
                .is_some_and(|d| d.repository().ends_with("/plugins/sysctl-py")),
            "{entry:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_simple_apply_reaches_every_node_without_disruption() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("n1", &[]), ("n2", &[]), ("n3", &[])]).await;
    for n in ["n1", "n2", "n3"] {
        e.host_file(n, "/proc/sys/vm/swappiness", "60");
    }
    let metrics = nodewright_testregistry::free_port();
    e.start_operator(&[&format!("--metrics-addr=127.0.0.1:{metrics}")]);
    e.apply(tuning(&e, "tuning", "10")).await;
    e.wait_complete("tuning", MINUTES).await;
    let cr = e.nodewright("tuning").await;
    let status = cr.status.unwrap();
    for n in ["n1", "n2", "n3"] {
        assert_eq!(
            e.read_host_file(n, "/proc/sys/vm/swappiness").as_deref(),
            Some("10"),
            "{n}"
        );
        assert!(
            e.read_host_file(n, "/etc/sysctl.d/60-nodewright-tuning.conf")
                .unwrap()
                .contains("vm.swappiness = 10")
        );
        let st = e.state("tuning", n).await;
        let entry = &st["tuning|1.0.0"];
        assert_eq!((entry.stage, entry.state), (Stage::Config, State::Complete));
        assert_eq!(
            entry.digest.as_ref().map(|d| d.as_str()),
            Some(status.resolved_plugins["tuning"].as_str()),
            "the node ran the pinned digest: {entry:?}"
        );
        let node = e.node(n).await;
        assert!(
            !node.spec.unwrap().unschedulable.unwrap_or(false),
            "never cordoned"
        );
        assert_eq!(
            node.metadata
                .annotations
                .unwrap()
                .get(&keys::node_status("tuning"))
                .map(String::as_str),
            Some("complete")
        );
    }
    assert_eq!(status.complete_nodes.as_deref(), Some("3/3"));
    assert!(
        status.resolved_plugins["tuning"].contains("@sha256:"),
        "tag resolved and recorded: {:?}",
        status.resolved_plugins
    );
    assert!(
        cr.metadata
            .finalizers
            .unwrap()
            .contains(&keys::FINALIZER.to_string())
    );
    let ready = e.condition("tuning", "Ready").await.unwrap();
    assert_eq!(ready.0, "True", "{ready:?}");
    let events = e.events("tuning").await;
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "State" && m.contains("-> [complete]")),
        "{events:?}\n{}",
        e.operator_log()
    );
    assert!(e.events("n1").await.iter().any(|(r, _)| r == "Apply"));

    // The rollout as metrics (gauges refresh every 2 s), and every documented name exported.
    let want = [
        "nodewright_status{nodewright=\"tuning\",status=\"complete\"} 1",
        "nodewright_nodes{nodewright=\"tuning\",status=\"complete\"} 3",
        "nodewright_packages{nodewright=\"tuning\",package=\"tuning\",version=\"1.0.0\",stage=\"config\",state=\"complete\"} 3",
        "nodewright_node_status{nodewright=\"tuning\",node=\"n2\",status=\"complete\"} 1",
        "nodewright_condition{nodewright=\"tuning\",condition=\"Ready\",status=\"True\"} 1",
        "nodewright_compartment_nodes_completed{nodewright=\"tuning\",compartment=\"__default__\"} 3",
        "nodewright_actions_total{action=\"create_job\"}",
        "nodewright_jobs{nodewright=\"tuning\",phase=\"active\"} 0",
        "nodewright_events_total{reason=\"Apply\"}",
    ];
    let text = e
        .wait(
            "the metrics show the finished rollout",
            Duration::from_secs(30),
            || async {
                let text = common::http_get(metrics, "/metrics").await;
                want.iter().all(|w| text.contains(w)).then_some(text)
            },
        )
        .await;
    let documented = common::documented_metrics();
    assert!(
        documented.len() >= 20,
        "the docs table was read: {documented:?}"
    );
    // Counters are declared without their `_total` suffix.
    let declared: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .collect();
    for name in &declared {
        assert!(
            documented
                .iter()
                .any(|d| d.trim_end_matches("_total") == *name),
            "exported metric {name} is not documented in docs/operator.md"
        );
    }
    // A family shows up once it has a series; these need a webhook, a broken plugin or a
    // failing stage, which this rollout does not have.
    let not_here = [
        "nodewright_admission_reviews_total",
        "nodewright_plugin_errors",
        "nodewright_stage_failures_total",
    ];
    for name in documented
        .iter()
        .filter(|d| !not_here.contains(&d.as_str()))
    {
        assert!(
            declared.contains(&name.trim_end_matches("_total")),
            "documented metric {name} is not exported\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_packages_coalesce_into_one_reboot_then_post_interrupt_runs() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("r1", &[])]).await;
    // `driver` needs a reboot, `tools` a service restart: one reboot covers both.
    e.script(
        "/usr/local/bin/install-driver",
        "mkdir -p etc && echo installed > etc/driver",
    );
    e.script("/usr/local/bin/driver-ok", "test -f etc/driver");
    e.script(
        "/usr/local/bin/install-tools",
        "mkdir -p etc && echo installed > etc/tools",
    );
    e.script(
        "/usr/local/bin/after-reboot",
        "echo seen > etc/post-interrupt",
    );
    e.workload_pod("r1", "web", json!({"app": "web"})).await;
    e.start_operator(&[]);
    let shell = e.plugin("shell");
    e.apply(json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright",
        "metadata": {"name": "gpu"},
        "spec": {"packages": {
            "driver": {
                "version": "1.0.0", "plugin": shell, "interrupt": {"type": "reboot"},
                "capabilities": {"commands": [
                    {"path": "/usr/local/bin/install-driver"}, {"path": "/usr/local/bin/after-reboot"},
                    {"path": "/usr/local/bin/driver-ok", "readOnly": true}
                ]},
                "configMap": {"apply": "/usr/local/bin/install-driver", "plan": "/usr/local/bin/driver-ok", "check": "/usr/local/bin/driver-ok",
                              "post-interrupt": "/usr/local/bin/after-reboot", "interrupt": "reboot"}
            },
            "tools": {
                "version": "1.0.0", "plugin": shell, "interrupt": {"type": "service", "services": ["containerd.service"]},
                "capabilities": {"commands": [{"path": "/usr/local/bin/install-tools"}]},
                "configMap": {"apply": "/usr/local/bin/install-tools", "interrupt": "services:containerd.service"}
            }
        }}}
    ))
    .await;
    let boot_before = e.sim.boot_id("r1");
    // Cordoned and drained while the packages install.
    e.wait("r1 cordoned", MINUTES, || async {
        e.node("r1").await.spec?.unschedulable?.then_some(())
    })
    .await;
    e.wait("web evicted", MINUTES, || async {
        (!e.pod_exists("web").await).then_some(())
    })
    .await;
    e.wait("tools skipped under the merged reboot", MINUTES, || async {
        let st = e.state("gpu", "r1").await;
        st.get("tools|1.0.0")
            .is_some_and(|t| {
                t.stage == Stage::Interrupt && matches!(t.state, State::Skipped | State::Complete)
            })
            .then_some(())
    })
    .await;
    e.wait_complete("gpu", Duration::from_secs(300)).await;
    assert_ne!(e.sim.boot_id("r1"), boot_before, "rebooted");
    let reboots = e
        .journal("r1")
        .iter()
        .filter(|a| matches!(a, HostAction::RebootRequested { .. }))
        .count();
    assert_eq!(reboots, 1, "exactly one reboot for both packages");
    assert_eq!(
        e.read_host_file("r1", "/etc/post-interrupt").as_deref(),
        Some("seen\n"),
        "post-interrupt ran after the reboot"
    );
    let st = e.state("gpu", "r1").await;
    for key in ["driver|1.0.0", "tools|1.0.0"] {
        assert_eq!(
            (st[key].stage, st[key].state),
            (Stage::PostInterrupt, State::Complete),
            "{key}"
        );
    }
    let node = e.node("r1").await;
    assert!(
        !node.spec.unwrap().unschedulable.unwrap_or(false),
        "uncordoned after completion"
    );
    let ann = node.metadata.annotations.unwrap_or_default();
    assert!(
        !ann.contains_key(&keys::cordon("gpu"))
            && !ann.contains_key(keys::KARPENTER_DO_NOT_DISRUPT)
    );
    assert!(
        e.events("r1")
            .await
            .iter()
            .any(|(r, m)| r == "Interrupt" && m.contains("reboot"))
    );
    assert_eq!(e.node_status("gpu", "r1").await, Some(Status::Complete));
}
