//! End to end, when a rollout may disrupt: a maintenance window that is closed, then moved
//! to now; a real Prometheus whose alerts hold and release the rollout (and whose absence
//! holds it too); a node that stays schedulable while a protected pod runs.

use crate::common;

use std::time::Duration;

use crate::prometheus::Prometheus;
use common::{E2e, held_reboot_package, release};
use nodewright_api::keys;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(240);

fn cr(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": name}, "spec": spec})
}

async fn cordoned(e: &E2e, node: &str) -> bool {
    e.node(node)
        .await
        .spec
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// `HH:MM` in UTC, `minutes` from now.
fn utc_clock(minutes: i64) -> String {
    let t = k8s_openapi::jiff::Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_mins(minutes))
        .unwrap();
    t.strftime("%H:%M").to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn outside_its_window_nothing_disrupts_and_moving_the_window_to_now_completes_it() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("w1", &[]), ("w2", &[])]).await;
    e.workload_pod("w1", "web", json!({"app": "web"})).await;
    e.start_operator(&[]);
    let pkg = held_reboot_package(&e, "1.0.0");
    for n in ["w1", "w2"] {
        release(&e, n, "apply");
        release(&e, n, "post");
    }
    let window = |start: String| json!({"windows": [{"start": start, "duration": "2h"}]});
    e.apply(cr(
        "win",
        json!({"maintenanceWindows": window(utc_clock(120)), "packages": {"driver": pkg}}),
    ))
    .await;

    let (reason, message) = e
        .wait("Ready=False/OutsideMaintenanceWindow", LIMIT, || async {
            let (_, reason, message) = e.condition("win", "Ready").await?;
            (reason == "OutsideMaintenanceWindow").then_some((reason, message))
        })
        .await;
    let next = e
        .nodewright("win")
        .await
        .status
        .unwrap()
        .next_window
        .expect("status.nextWindow while waiting");
    let opens: k8s_openapi::jiff::Timestamp = next
        .parse()
        .unwrap_or_else(|err| panic!("nextWindow {next:?} is RFC 3339: {err}"));
    let ahead = opens
        .duration_since(k8s_openapi::jiff::Timestamp::now())
        .as_secs();
    assert!(
        (60 * 60..=121 * 60).contains(&ahead),
        "opens in about two hours: {next} ({ahead} s); {reason}: {message}"
    );
    assert!(message.contains(&next), "{message}");
    // The plans (which disrupt nothing) may run; then both nodes wait (the status that says
    // so is written by a pass after the one that recorded the plan); no node is cordoned,
    // drained or rebooted.
    e.wait("both nodes planned, then waiting", LIMIT, || async {
        for n in ["w1", "w2"] {
            let st = e.state("win", n).await;
            st.get("driver|1.0.0").filter(|p| {
                p.stage != nodewright_api::node_state::Stage::Plan
                    || p.state == nodewright_api::node_state::State::Complete
            })?;
            (e.node_status("win", n).await == Some(nodewright_api::v1alpha1::Status::Waiting))
                .then_some(())?;
        }
        Some(())
    })
    .await;
    for n in ["w1", "w2"] {
        assert!(!cordoned(&e, n).await, "{n} cordoned outside the window");
        assert_eq!(e.reboots(n), 0);
    }
    assert!(e.pod_exists("web").await, "nothing drained");

    // The admin moves the window to now: the rollout completes by itself.
    e.patch(
        "win",
        json!({"spec": {"maintenanceWindows": window(utc_clock(-1))}}),
    )
    .await;
    e.wait_complete("win", LIMIT).await;
    for n in ["w1", "w2"] {
        assert_eq!(e.reboots(n), 1, "{n}");
    }
    assert!(!e.pod_exists("web").await, "drained inside the window");
    assert_eq!(e.nodewright("win").await.status.unwrap().next_window, None);
}

/// `NodeDown{severity="critical"}` fires while `firing`; a `Noise` alert always fires and must
/// not hold the rollout (the gate selects by name and label).
fn gate_rules(firing: bool) -> String {
    let expr = if firing { "vector(1)" } else { "vector(1) < 0" };
    format!(
        "groups:\n- name: nodewright-localcluster\n  interval: 1s\n  rules:\n  - alert: NodeDown\n    expr: {expr}\n    labels: {{severity: critical}}\n  - alert: Noise\n    expr: vector(1)\n    labels: {{severity: info}}\n"
    )
}

async fn gate(e: &E2e) -> (String, String, String) {
    e.condition("gated", "HealthGatesPassing")
        .await
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_alerts_hold_and_release_the_rollout_and_an_absent_prometheus_holds_it() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("p1", &[]), ("p2", &[])]).await;
    let work = tempfile::tempdir().unwrap();
    let mut prom = Prometheus::start(&work.path().join("prometheus"), &gate_rules(true), None);
    e.start_operator(&["--health-gate-interval=1"]);
    let pkg = held_reboot_package(&e, "1.0.0");
    for n in ["p1", "p2"] {
        release(&e, n, "post");
    }
    let gates = json!({"prometheus": {"url": prom.url(), "alertNames": "NodeDown|GpuXid", "matchLabels": {"severity": "critical"}, "timeout": "2s"}});
    e.apply(cr("gated", json!({"interruptionBudget": {"count": 1}, "healthGates": gates, "packages": {"driver": pkg}}))).await;

    // Firing from the start: held, the alert named.
    let (_, _, message) = e
        .wait("the gate holds on NodeDown", LIMIT, || async {
            Some(gate(&e).await).filter(|g| g.0 == "False" && g.1 == "AlertsFiring")
        })
        .await;
    assert!(
        message.contains("NodeDown{severity=\"critical\"} firing") && !message.contains("Noise"),
        "{message}"
    );
    assert_eq!(
        e.condition("gated", "Ready").await.unwrap().1,
        "HealthGateFailing"
    );
    assert!(!cordoned(&e, "p1").await && !cordoned(&e, "p2").await);

    // Resolved: the first node starts (its apply waits on us).
    prom.write_rules(&gate_rules(false));
    prom.reload();
    let first = e
        .wait("a node cordoned once the alert resolves", LIMIT, || async {
            for n in ["p1", "p2"] {
                if cordoned(&e, n).await {
                    return Some(n.to_string());
                }
            }
            None
        })
        .await;
    // The cordon may be written before the status that says why it was allowed.
    e.wait("the gate reads passing", LIMIT, || async {
        (gate(&e).await.0 == "True").then_some(())
    })
    .await;
    // Firing again mid-rollout: the node past its cordon finishes, the other does not start.
    prom.write_rules(&gate_rules(true));
    prom.reload();
    e.wait("the gate fails again", LIMIT, || async {
        (gate(&e).await.0 == "False").then_some(())
    })
    .await;
    let other = if first == "p1" { "p2" } else { "p1" };
    release(&e, other, "apply");
    release(&e, &first, "apply");
    e.wait("the started node finishes", LIMIT, || async {
        (e.node_status("gated", &first).await == Some(nodewright_api::v1alpha1::Status::Complete))
            .then_some(())
    })
    .await;
    assert!(
        !cordoned(&e, other).await,
        "{other} started while the alert fired"
    );

    // Prometheus gone: still held, and the condition says why.
    prom.down();
    let (_, reason, message) = e
        .wait("the gate fails closed", LIMIT, || async {
            Some(gate(&e).await).filter(|g| g.1 == "PrometheusUnreachable")
        })
        .await;
    assert!(
        message.contains(&prom.url()) && message.contains("fails closed"),
        "{reason}: {message}"
    );
    assert!(!cordoned(&e, other).await);
    assert_eq!(e.reboots(other), 0);

    // Back, with the alert resolved: the rollout completes.
    prom.write_rules(&gate_rules(false));
    prom.up();
    e.wait_complete("gated", LIMIT).await;
    assert_eq!((e.reboots("p1"), e.reboots("p2")), (1, 1));
}

#[tokio::test(flavor = "multi_thread")]
async fn with_cordon_after_barrier_a_node_stays_schedulable_until_its_protected_pod_ends() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("b1", &[])]).await;
    e.workload_pod("b1", "training", json!({"workload": "training"}))
        .await;
    e.start_operator(&[]);
    let pkg = held_reboot_package(&e, "1.0.0");
    release(&e, "b1", "apply");
    release(&e, "b1", "post");
    e.apply(cr("barrier", json!({"cordonAfterBarrier": true, "podNonInterruptLabels": {"matchLabels": {"workload": "training"}}, "packages": {"driver": pkg}}))).await;
    let (_, _, message) = e
        .wait("Blocked/NonInterruptPodsRunning", LIMIT, || async {
            e.condition("barrier", "Blocked")
                .await
                .filter(|c| c.1 == "NonInterruptPodsRunning")
        })
        .await;
    assert!(message.contains("training"), "{message}");
    assert!(
        !cordoned(&e, "b1").await,
        "schedulable while the protected pod runs"
    );
    assert_eq!(e.reboots("b1"), 0);

    e.delete_pod("training").await;
    e.wait_complete("barrier", LIMIT).await;
    assert_eq!(e.reboots("b1"), 1);
    assert!(!cordoned(&e, "b1").await, "released at the end");
}

/// Sets (or, with `None`, removes) the Pod Security `enforce` label of the Jobs' namespace.
async fn pod_security(e: &E2e, level: Option<&str>) {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, Patch, PatchParams};
    Api::<Namespace>::all(e.client.clone())
        .patch(
            common::NS,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {keys::POD_SECURITY_ENFORCE: level}}})),
        )
        .await
        .unwrap();
}

/// The test apiserver enforces Pod Security `baseline` wherever a namespace says nothing (as
/// a hardened cluster does). With the Jobs' namespace as `helm install --create-namespace`
/// leaves it, the operator finds out before it touches a node (a dry run of the agent's
/// pod): no cordon, no Job, and Ready and Blocked say what refused the pods and which
/// label to set. Once the admin sets it, the rollout completes by itself.
#[tokio::test(flavor = "multi_thread")]
async fn agent_pods_refused_by_pod_security_hold_the_rollout_until_the_namespace_allows_them() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("p1", &[])]).await;
    e.host_file("p1", "/proc/sys/vm/swappiness", "60");
    pod_security(&e, None).await;
    e.start_operator(&[]);
    e.apply(cr(
        "psa",
        json!({"packages": {"tuning": {
            "version": "1.0.0", "plugin": e.plugin("sysctl"),
            "capabilities": {"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}], "sysctl": ["vm.swappiness"]},
            "configMap": {"vm.swappiness": "10"}
        }}}),
    ))
    .await;
    let message = e
        .wait("Ready=False/AgentPodsRefused", LIMIT, || async {
            let (_, reason, message) = e.condition("psa", "Ready").await?;
            (reason == keys::reason::AGENT_PODS_REFUSED).then_some(message)
        })
        .await;
    assert!(
        message.contains("PodSecurity \"baseline:latest\"")
            && message.contains("pod-security.kubernetes.io/enforce=privileged")
            && message.contains(&format!("namespace {}", common::NS)),
        "{message}"
    );
    let (blocked, reason, _) = e.condition("psa", "Blocked").await.unwrap();
    assert_eq!(
        (blocked.as_str(), reason.as_str()),
        ("True", "AgentPodsRefused")
    );
    // A few passes more: still nothing started.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!cordoned(&e, "p1").await, "cordoned with no pod to follow");
    assert!(e.jobs().await.is_empty(), "a Job whose pod is refused");

    pod_security(&e, Some(keys::POD_SECURITY_PRIVILEGED)).await;
    e.wait_complete("psa", LIMIT).await;
    assert_eq!(
        e.read_host_file("p1", "/proc/sys/vm/swappiness").as_deref(),
        Some("10")
    );
    assert_eq!(e.condition("psa", "Blocked").await.unwrap().0, "False");
}

/// Sets the `Ready` condition of pod `name` in the operator's namespace, as its kubelet would.
async fn set_ready(e: &E2e, name: &str, ready: bool) {
    set_ready_with(&e.client, name, ready).await;
}

/// [`set_ready`] with a client (from a task of its own).
async fn set_ready_with(client: &kube::Client, name: &str, ready: bool) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, Patch, PatchParams};
    let status = if ready { "True" } else { "False" };
    Api::<Pod>::namespaced(client.clone(), common::NS)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [
                {"type": "Ready", "status": status},
                {"type": "ContainersReady", "status": status}
            ]}})),
        )
        .await
        .unwrap();
}

/// The operator's availability across its own rollouts: two replicas (pods the operator
/// finds by `--replica-selector`, as the chart passes it), one on each node; the one on r1 is
/// still starting. A reboot of r0 would leave no ready replica, so r0 waits, uncordoned,
/// and Ready says for which replica, while r1 (whose reboot leaves r0's replica serving)
/// goes ahead; once the replica is ready, r0 reboots too. Each reboot, with a replica ready
/// elsewhere, first takes its node's replica out of the Service (fenced).
#[tokio::test(flavor = "multi_thread")]
async fn a_reboot_waits_while_its_node_runs_the_last_ready_operator_replica() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("r0", &[]), ("r1", &[])]).await;
    let pods = Api::<Pod>::namespaced(e.client.clone(), common::NS);
    for (name, node) in [("op-0", "r0"), ("op-1", "r1")] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": "nw-replica-test"}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "operator", "image": "sleeper"}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    e.wait("both replicas running", LIMIT, || async {
        let all = pods.list(&Default::default()).await.ok()?;
        let ready = all
            .items
            .iter()
            .filter_map(nodewright_operator_replica_ready)
            .filter(|r| *r)
            .count();
        (ready == 2).then_some(())
    })
    .await;
    set_ready(&e, "op-1", false).await;
    e.start_operator(&["--replica-selector=app=nw-replica-test"]);
    e.apply(cr(
        "drivers",
        json!({"interruptionBudget": {"count": 2}, "packages": {"driver": crate::specs::reboot_package(&e)}}),
    ))
    .await;
    let message = e
        .wait("Ready=False/OperatorReplicaStarting", LIMIT, || async {
            let (_, reason, message) = e.condition("drivers", "Ready").await?;
            (reason == keys::reason::OPERATOR_REPLICA_STARTING).then_some(message)
        })
        .await;
    assert!(
        message.contains("r0 waits for operator replica op-1"),
        "{message}"
    );
    assert!(!cordoned(&e, "r0").await, "the last ready replica's node");
    assert_eq!(e.reboots("r0"), 0);

    // The replica pods here are sleepers: the test does what a replica does when its node
    // is fenced for a reboot (reports not ready until the mark goes), and records which
    // nodes were fenced.
    set_ready(&e, "op-1", true).await;
    let fenced = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mirror = {
        let (client, fenced) = (e.client.clone(), fenced.clone());
        tokio::spawn(async move {
            use k8s_openapi::api::core::v1::Node;
            let nodes = Api::<Node>::all(client.clone());
            let mut out = std::collections::BTreeSet::new();
            loop {
                for (pod, node) in [("op-0", "r0"), ("op-1", "r1")] {
                    let Ok(n) = nodes.get(node).await else {
                        continue;
                    };
                    let marked = n
                        .metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| keys::fences_operator(a.keys()));
                    if marked && out.insert(pod) {
                        fenced.lock().unwrap().push(node.to_string());
                        set_ready_with(&client, pod, false).await;
                    } else if !marked && out.remove(pod) {
                        set_ready_with(&client, pod, true).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    e.wait_complete("drivers", LIMIT).await;
    mirror.abort();
    assert_eq!((e.reboots("r0"), e.reboots("r1")), (1, 1));
    let mut fenced = fenced.lock().unwrap().clone();
    fenced.sort();
    assert_eq!(
        fenced,
        ["r0", "r1"],
        "each node's replica was taken out before its reboot"
    );
}

/// A pod's `Ready` condition, if it reports one.
fn nodewright_operator_replica_ready(p: &k8s_openapi::api::core::v1::Pod) -> Option<bool> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status == "True")
}

/// A replica's own node fenced for a reboot (`nodewright.io/fence-operator.<cr>`, as the
/// planner writes it before rebooting a node that runs a ready replica while another is
/// ready elsewhere): the replica reports not ready, naming why, and — leading — lets go of
/// the Lease at once, so a standby leads before the node goes down, and ends once the
/// webhook Service no longer routes to it (ending while it still did is what the real-node
/// e2e caught: the API server dialled its closed port, and the fail-closed webhook refused).
#[tokio::test(flavor = "multi_thread")]
async fn a_fenced_replica_reports_not_ready_and_hands_over_the_lease() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, ListParams, Patch, PatchParams};
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("r0", &[])]).await;
    let metrics = nodewright_testregistry::free_port();
    let webhook = nodewright_testregistry::free_port();
    e.start_operator(&[
        "--leader-elect",
        "--identity=op-0",
        "--pod-name=op-0",
        "--node-name=r0",
        &format!("--metrics-addr=127.0.0.1:{metrics}"),
        &format!("--webhook-addr=127.0.0.1:{webhook}"),
        "--webhook-host=127.0.0.1",
    ]);
    // The webhook Service routes to op-0, as the EndpointSlice controller lists a ready pod.
    let slices = Api::<EndpointSlice>::namespaced(e.client.clone(), common::NS);
    let slice = |ready: bool| -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "nodewright-webhook-x1", "labels": {"kubernetes.io/service-name": "nodewright-webhook"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.0.9"], "conditions": {"ready": ready},
                           "targetRef": {"kind": "Pod", "namespace": common::NS, "name": "op-0"}}],
            "ports": [{"name": "webhook", "port": 9443, "protocol": "TCP"}]
        }))
        .unwrap()
    };
    slices
        .create(&Default::default(), &slice(true))
        .await
        .unwrap();
    let leases = Api::<Lease>::namespaced(e.client.clone(), common::NS);
    let holder = || async {
        let list = leases
            .list(&ListParams::default().labels(&format!("{}=true", keys::OPERATOR_LEASE)))
            .await
            .ok()?;
        let lease = list.items.into_iter().next()?;
        Some(lease.spec?.holder_identity.unwrap_or_default())
    };
    e.wait("op-0 leading and ready", LIMIT, || async {
        let (status, _) = nodewright_localcluster::http_get(metrics, "/readyz")
            .await
            .ok()?;
        (status == 200 && holder().await.as_deref() == Some("op-0")).then_some(())
    })
    .await;

    Api::<Node>::all(e.client.clone())
        .patch(
            "r0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                keys::CrMark::FenceOperator.key("drivers"): "op-0"
            }}})),
        )
        .await
        .unwrap();
    e.wait("the Lease let go of", LIMIT, || async {
        (holder().await.as_deref() == Some("")).then_some(())
    })
    .await;
    assert!(
        e.operator_log().contains("handing over the lease"),
        "{}",
        e.operator_log()
    );
    // It lets go of the Lease at once, but ends only once the webhook Service no longer
    // routes to it: until then it keeps answering (its readiness says fenced).
    e.wait("the leader waiting to leave the Service", LIMIT, || async {
        e.operator_log()
            .contains("waiting for the webhook Service to stop routing")
            .then_some(())
    })
    .await;
    let (status, body) = nodewright_localcluster::http_get(metrics, "/readyz")
        .await
        .expect("a fenced leader the Service still routes to is still up");
    assert_eq!(status, 503, "{body}");
    slices
        .replace("nodewright-webhook-x1", &Default::default(), &{
            let mut s = slice(false);
            s.metadata.resource_version = slices
                .get("nodewright-webhook-x1")
                .await
                .unwrap()
                .metadata
                .resource_version;
            s
        })
        .await
        .unwrap();
    // Then the process ends (its restart would wait as a standby): nothing answers its
    // probes any more.
    e.wait("the leader gone", LIMIT, || async {
        nodewright_localcluster::http_get(metrics, "/readyz")
            .await
            .is_err()
            .then_some(())
    })
    .await;

    // A standby started on the fenced node stays out of the Service and does not lead.
    let standby = nodewright_testregistry::free_port();
    e.start_operator(&[
        "--leader-elect",
        "--identity=op-0b",
        "--node-name=r0",
        &format!("--metrics-addr=127.0.0.1:{standby}"),
    ]);
    let (status, body) = e
        .wait("the standby answering its probe", LIMIT, || async {
            let (status, body) = nodewright_localcluster::http_get(standby, "/readyz")
                .await
                .ok()?;
            body.contains("fenced").then_some((status, body))
        })
        .await;
    assert_eq!(status, 503, "{body}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        holder().await.as_deref(),
        Some(""),
        "a fenced replica never leads"
    );
}
