//! When a rollout may disrupt: maintenance windows, health gates, waiting before the
//! cordon, and the status surface that explains each (drain and uninstall conditions).

use crate::world;

use nodewright_api::keys;
use nodewright_api::node_state::{Stage, State};
use nodewright_api::v1alpha1::Status;
use nodewright_planner::{Action, GateFinding, JobPhase, Work};
use serde_json::json;
use world::{World, condition, plain_pkg, reboot_pkg, spec, stages_on};

fn at(s: &str) -> i64 {
    s.parse::<jiff::Timestamp>().unwrap().as_second()
}

fn ever_cordoned(w: &World, node: &str) -> bool {
    w.history.iter().any(|(_, a)| matches!(a, Action::PatchNode(p) if p.node == node && p.unschedulable == Some(true)))
}

/// Passes, every Job succeeding (plans ask for a reboot).
fn passes(w: &mut World, n: usize) {
    for _ in 0..n {
        w.step();
        w.succeed_all(("reboot", 1));
    }
}

/// A ready operator replica, `pod` on `node`.
fn replica(pod: &str, node: &str) -> nodewright_planner::Replica {
    nodewright_planner::Replica {
        pod: pod.into(),
        node: node.into(),
        ready: true,
    }
}

fn nightly() -> serde_json::Value {
    json!({"windows": [{"start": "22:00", "end": "04:00", "timeZone": "Europe/Berlin"}]})
}

#[test]
fn outside_its_window_a_rollout_plans_but_disrupts_nothing_and_says_when_it_starts() {
    let mut w = World::new(3);
    w.now = at("2026-12-01T12:00:00Z"); // 13:00 in Berlin
    w.add_cr("gpu", spec(json!({"maintenanceWindows": nightly(), "interruptionBudget": {"count": 1}, "packages": {"driver": reboot_pkg()}})));
    passes(&mut w, 12);
    for n in ["node-0", "node-1", "node-2"] {
        assert!(!ever_cordoned(&w, n), "{n} cordoned outside the window");
        assert!(
            stages_on(&w, n).iter().all(|s| s == "driver:plan"),
            "{n}: only the plan (it disrupts nothing): {:?}",
            stages_on(&w, n)
        );
    }
    assert_eq!(
        stages_on(&w, "node-0"),
        ["driver:plan"],
        "the batch's node planned"
    );
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Waiting));
    assert_eq!(
        w.cr("gpu").status.next_window.as_deref(),
        Some("2026-12-01T21:00:00Z"),
        "22:00 CET"
    );
    let (ready, reason, msg) = condition(&w, "gpu", "Ready");
    assert_eq!(
        (ready.as_str(), reason.as_str()),
        ("False", "OutsideMaintenanceWindow")
    );
    assert!(
        msg.contains("2026-12-01T21:00:00Z") && msg.contains("1 node(s) wait"),
        "{msg}"
    );
    let batch = w.cr("gpu").status.compartment_statuses["__default__"]
        .batch_state
        .clone();

    // The window opens: the rollout goes on from where it stood, batch by batch.
    w.now = at("2026-12-01T21:00:00Z");
    w.step();
    assert_eq!(
        w.cr("gpu").status.compartment_statuses["__default__"].batch_state,
        batch,
        "batch state kept across the wait"
    );
    assert!(
        w.node("node-0").unschedulable,
        "the waiting node is cordoned first"
    );
    w.run(("reboot", 1), 80);
    assert_eq!(w.cr("gpu").status.status, Some(Status::Complete));
    assert_eq!(w.cr("gpu").status.next_window, None);
    assert_eq!(condition(&w, "gpu", "Ready").1, "NodesConverged");
}

#[test]
fn a_node_past_its_cordon_finishes_its_chain_when_the_window_closes() {
    let mut w = World::new(2);
    w.now = at("2026-12-01T02:50:00Z"); // 03:50 in Berlin: ten minutes left
    w.add_cr("gpu", spec(json!({"maintenanceWindows": nightly(), "interruptionBudget": {"count": 1}, "packages": {"driver": reboot_pkg()}})));
    for _ in 0..20 {
        w.step();
        w.succeed_all(("reboot", 1));
        if w.node("node-0").unschedulable {
            break;
        }
    }
    assert!(
        w.node("node-0").unschedulable,
        "node-0 started inside the window"
    );
    w.now = at("2026-12-01T03:30:00Z"); // closed
    passes(&mut w, 30);
    assert_eq!(
        stages_on(&w, "node-0"),
        [
            "driver:plan",
            "driver:apply",
            "driver:config",
            "interrupt:reboot:driver",
            "driver:post-interrupt"
        ],
        "its chain ran to the end"
    );
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Complete));
    assert!(!w.node("node-0").unschedulable, "released");
    assert!(!ever_cordoned(&w, "node-1"), "no new node starts");
    assert_eq!(w.node_status("gpu", "node-1"), Some(Status::Waiting));
}

#[test]
fn non_disruptive_packages_run_any_time_unless_apply_to_all() {
    let mut w = World::new(2);
    w.now = at("2026-12-01T12:00:00Z");
    w.add_cr(
        "tune",
        spec(json!({"maintenanceWindows": nightly(), "packages": {"tuning": plain_pkg()}})),
    );
    w.run(("none", 0), 20);
    assert_eq!(
        w.cr("tune").status.status,
        Some(Status::Complete),
        "no interrupt: the window does not hold it"
    );

    let mut w = World::new(2);
    w.now = at("2026-12-01T12:00:00Z");
    let mut windows = nightly();
    windows["applyToAll"] = json!(true);
    w.add_cr(
        "tune",
        spec(json!({"maintenanceWindows": windows, "packages": {"tuning": plain_pkg()}})),
    );
    passes(&mut w, 10);
    assert!(
        w.created().is_empty(),
        "applyToAll: nothing starts outside the window"
    );
    assert_eq!(condition(&w, "tune", "Ready").1, "OutsideMaintenanceWindow");
    w.now = at("2026-12-01T21:30:00Z");
    w.run(("none", 0), 20);
    assert_eq!(w.cr("tune").status.status, Some(Status::Complete));
}

#[test]
fn a_policys_window_holds_its_nodewrights_across_a_dst_change() {
    let mut w = World::new(1);
    // 2026-03-29 in Berlin: 02:00 does not exist; a 02:30 window opens at 03:30 CEST = 01:30Z.
    w.snap.policies.insert("night".into(), world::policy(json!({"default": {"budget": {"count": 1}, "strategy": {"fixed": {}}}, "maintenanceWindows": {"windows": [{"start": "02:30", "duration": "1h", "timeZone": "Europe/Berlin"}]}})));
    w.now = at("2026-03-29T01:20:00Z");
    w.add_cr(
        "gpu",
        spec(json!({"deploymentPolicy": "night", "packages": {"driver": reboot_pkg()}})),
    );
    passes(&mut w, 4);
    assert!(!ever_cordoned(&w, "node-0"));
    assert_eq!(
        w.cr("gpu").status.next_window.as_deref(),
        Some("2026-03-29T01:30:00Z")
    );
    w.now = at("2026-03-29T01:30:00Z");
    w.run(("reboot", 1), 40);
    assert_eq!(w.cr("gpu").status.status, Some(Status::Complete));
}

#[test]
fn a_failing_gate_holds_new_disruption_and_names_itself() {
    let mut w = World::new(2);
    w.add_cr("gpu", spec(json!({"interruptionBudget": {"count": 1}, "healthGates": {"prometheus": {"url": "http://prom:9090"}}, "packages": {"driver": reboot_pkg()}})));
    w.cr_mut("gpu").failing_gates = vec![GateFinding {
        gate: "prometheus".into(),
        reason: "AlertsFiring".into(),
        message: "NodeDown{node=\"x\"} firing".into(),
    }];
    passes(&mut w, 8);
    assert!(!ever_cordoned(&w, "node-0") && !ever_cordoned(&w, "node-1"));
    let (on, reason, msg) = condition(&w, "gpu", "HealthGatesPassing");
    assert_eq!((on.as_str(), reason.as_str()), ("False", "AlertsFiring"));
    assert!(msg.contains("prometheus: NodeDown"), "{msg}");
    assert_eq!(condition(&w, "gpu", "Ready").1, "HealthGateFailing");

    w.cr_mut("gpu").failing_gates.clear();
    w.run(("reboot", 1), 80);
    assert_eq!(w.cr("gpu").status.status, Some(Status::Complete));
    assert_eq!(condition(&w, "gpu", "HealthGatesPassing").0, "True");
}

#[test]
fn a_node_unhealthy_after_its_interrupt_stays_cordoned_and_fails_its_batch() {
    let mut w = World::new(2);
    for n in ["node-0", "node-1"] {
        w.node_mut(n).conditions = [
            ("Ready".to_string(), "True".to_string()),
            ("GpuHealthy".to_string(), "True".to_string()),
        ]
        .into();
    }
    w.add_cr("gpu", spec(json!({"interruptionBudget": {"count": 1}, "healthGates": {"nodeHealth": {"conditions": {"Ready": "True", "GpuHealthy": "True"}}}, "packages": {"driver": reboot_pkg()}})));
    // node-0 comes back from its reboot with a bad GPU.
    for _ in 0..40 {
        w.step();
        let rebooting = w
            .snap
            .jobs
            .iter()
            .any(|j| j.node == "node-0" && matches!(j.work, Work::Interrupt { .. }));
        w.succeed_all(("reboot", 1));
        if rebooting {
            w.node_mut("node-0")
                .conditions
                .insert("GpuHealthy".into(), "False".into());
        }
        if w.node_status("gpu", "node-0") == Some(Status::Erroring) {
            break;
        }
    }
    assert!(
        condition(&w, "gpu", "Ready")
            .2
            .contains("GpuHealthy=True (is False)"),
        "{:?}",
        condition(&w, "gpu", "Ready")
    );
    w.step();
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Erroring));
    assert!(w.node("node-0").unschedulable, "kept cordoned");
    let e = &w.state("gpu", "node-0")["driver|1.0.0"];
    assert_eq!(
        (e.stage, e.state),
        (Stage::PostInterrupt, State::Complete),
        "the chain itself finished"
    );
    assert_eq!(
        w.cr("gpu").status.compartment_statuses["__default__"]
            .batch_state
            .as_ref()
            .map(|b| b.failed_nodes),
        Some(1),
        "the batch counts it failed"
    );

    // The condition recovers: the node completes and is released.
    w.node_mut("node-0")
        .conditions
        .insert("GpuHealthy".into(), "True".into());
    w.run(("reboot", 1), 60);
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Complete));
    assert!(!w.node("node-0").unschedulable);
}

#[test]
fn with_cordon_after_barrier_a_node_stays_schedulable_while_protected_pods_run() {
    let mut w = World::new(1);
    w.add_pod("node-0", "training", &[("job", "train")], Some("Job"));
    w.add_pod("node-0", "web", &[], Some("ReplicaSet"));
    w.add_cr("gpu", spec(json!({"cordonAfterBarrier": true, "podNonInterruptLabels": {"matchLabels": {"job": "train"}}, "packages": {"driver": reboot_pkg()}})));
    passes(&mut w, 10);
    assert!(
        !ever_cordoned(&w, "node-0"),
        "schedulable while the protected pod runs"
    );
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Blocked));
    assert_eq!(condition(&w, "gpu", "Blocked").1, "NonInterruptPodsRunning");

    // The pod ends: cordon; a protected pod that lands before the drain keeps the node
    // waiting, cordoned.
    w.snap.pods.retain(|p| p.name != "training");
    w.step();
    assert!(
        w.node("node-0").unschedulable,
        "cordoned once no protected pod runs"
    );
    w.add_pod("node-0", "training-2", &[("job", "train")], Some("Job"));
    passes(&mut w, 5);
    assert!(
        w.node("node-0").unschedulable && w.node_status("gpu", "node-0") == Some(Status::Blocked)
    );
    assert!(
        !w.history
            .iter()
            .any(|(_, a)| matches!(a, Action::Evict { .. })),
        "no drain while it waits"
    );
    w.snap.pods.retain(|p| p.name != "training-2");
    w.run(("reboot", 1), 40);
    assert_eq!(w.node_status("gpu", "node-0"), Some(Status::Complete));
}

#[test]
fn drain_blocked_names_its_cause() {
    let cause = |pods: &[(&str, Option<&str>, bool)], drain: serde_json::Value| {
        let mut w = World::new(1);
        for (name, controller, empty_dir) in pods {
            w.add_pod("node-0", name, &[], *controller);
            w.snap.pods.last_mut().unwrap().empty_dir = *empty_dir;
        }
        w.add_cr(
            "gpu",
            spec(json!({"drainConfig": drain, "packages": {"driver": reboot_pkg()}})),
        );
        passes(&mut w, 6);
        assert!(
            w.node("node-0")
                .annotations
                .contains_key(&keys::drain_blocked("gpu"))
        );
        condition(&w, "gpu", "DrainBlocked")
    };
    assert_eq!(cause(&[("bare", None, false)], json!({})).1, "UnmanagedPod");
    assert_eq!(
        cause(&[("cache", Some("ReplicaSet"), true)], json!({})).1,
        "EmptyDirData"
    );
    let (_, reason, msg) = cause(
        &[("bare", None, false), ("cache", Some("ReplicaSet"), true)],
        json!({}),
    );
    assert_eq!(reason, "MultipleCauses");
    assert!(
        msg.contains("default/bare") && msg.contains("default/cache"),
        "{msg}"
    );
}

#[test]
fn daemonset_pods_stay_unless_ignore_daemon_sets_is_off() {
    let evicted = |drain: serde_json::Value| {
        let mut w = World::new(1);
        w.add_pod("node-0", "agent", &[], Some("DaemonSet"));
        w.add_cr(
            "gpu",
            spec(json!({"drainConfig": drain, "packages": {"driver": reboot_pkg()}})),
        );
        w.run(("reboot", 1), 40);
        w.history
            .iter()
            .any(|(_, a)| matches!(a, Action::Evict { pod, .. } if pod == "agent"))
    };
    assert!(
        !evicted(json!({})),
        "default: DaemonSet pods are left alone"
    );
    assert!(evicted(json!({"ignoreDaemonSets": false})));
}

#[test]
fn uninstall_and_dependency_conditions() {
    let mut w = World::new(1);
    w.add_cr(
        "t",
        spec(json!({"packages": {
            "base": {"version": "1.0.0", "plugin": "r.example/b:1", "uninstall": {"enabled": true}},
        }})),
    );
    w.run(("none", 0), 20);
    w.edit("t", |s| {
        s.packages
            .get_mut("base")
            .unwrap()
            .uninstall
            .as_mut()
            .unwrap()
            .apply = true
    });
    w.step();
    let (on, reason, msg) = condition(&w, "t", "UninstallInProgress");
    assert_eq!(
        (on.as_str(), reason.as_str()),
        ("True", "UninstallInProgress")
    );
    assert!(msg.contains("node-0 (base 1.0.0)"), "{msg}");
    // Paused, the node's pass stops; what its state says is reported all the same.
    w.cr_mut("t").paused = true;
    w.step();
    let (on, _, msg) = condition(&w, "t", "UninstallInProgress");
    assert_eq!(on, "True", "paused mid-uninstall: {msg}");
    assert!(msg.contains("node-0 (base 1.0.0)"), "{msg}");
    w.cr_mut("t").paused = false;
    // The uninstall fails for good.
    w.finish_jobs(|_| {
        Some(JobPhase::Failed {
            genuine: true,
            attempts: 3,
            reason: "BackoffLimitExceeded".into(),
            last: None,
        })
    });
    w.step();
    let (on, reason, _) = condition(&w, "t", "UninstallFailed");
    assert_eq!(
        (on.as_str(), reason.as_str()),
        ("True", "UninstallPodFailing")
    );
    assert_eq!(condition(&w, "t", "UninstallInProgress").0, "False");

    // A package added that depends on the uninstalled one can never install.
    w.edit("t", |s| {
        let mut dep = s.packages["base"].clone();
        dep.uninstall = None;
        dep.plugin = "r.example/d:1".into();
        dep.depends_on = [("base".to_string(), "1.0.0".to_string())].into();
        s.packages.insert("dependent".into(), dep);
    });
    w.step();
    let (on, reason, msg) = condition(&w, "t", "Blocked");
    assert_eq!(
        (on.as_str(), reason.as_str()),
        ("True", "DependencyUninstalled")
    );
    assert!(msg.contains("dependent depends on base"), "{msg}");
}

/// Agent pods the API server refuses (Pod Security enforcing `baseline` on the Jobs'
/// namespace) would leave every Job podless and every node it started cordoned: nothing
/// new starts, not even a non-disruptive stage, and the status says why and what to change;
/// once admitted, the rollout goes on.
#[test]
fn refused_agent_pods_hold_all_new_work_and_say_why() {
    let refusal = "the API server refuses the agent's pods in namespace nodewright: violates \
                   PodSecurity \"baseline:latest\"; label it pod-security.kubernetes.io/enforce=privileged";
    let mut w = World::new(2);
    w.snap.agent_pods = nodewright_planner::AgentPods::Refused(refusal.into());
    w.add_cr(
        "gpu",
        spec(json!({"packages": {"driver": reboot_pkg(), "tuning": plain_pkg()}})),
    );
    passes(&mut w, 10);
    for n in ["node-0", "node-1"] {
        assert!(!ever_cordoned(&w, n), "{n} cordoned with no pod to follow");
        assert!(stages_on(&w, n).is_empty(), "{n}: {:?}", stages_on(&w, n));
    }
    let (ready, reason, msg) = condition(&w, "gpu", "Ready");
    assert_eq!(
        (ready.as_str(), reason.as_str()),
        ("False", "AgentPodsRefused")
    );
    assert!(
        msg.contains("enforce=privileged") && msg.contains("2 node(s) wait"),
        "{msg}"
    );
    let (blocked, reason, msg) = condition(&w, "gpu", "Blocked");
    assert_eq!(
        (blocked.as_str(), reason.as_str()),
        ("True", "AgentPodsRefused")
    );
    assert!(msg.contains("PodSecurity"), "{msg}");

    w.snap.agent_pods = nodewright_planner::AgentPods::Admitted;
    w.run(("reboot", 1), 80);
    assert_eq!(w.cr("gpu").status.status, Some(Status::Complete));
    assert_eq!(condition(&w, "gpu", "Blocked").0, "False");
    assert_eq!(condition(&w, "gpu", "Ready").1, "NodesConverged");
}

/// The operator's own availability: a node whose reboot would take down the last ready
/// operator replica, while another replica is still starting elsewhere, waits (uncordoned)
/// and the status says for which replica; once it is ready, the rollout goes on. A node that
/// hosts no replica is not held.
#[test]
fn a_reboot_waits_while_its_node_runs_the_last_ready_operator_replica() {
    use nodewright_planner::Replica;
    let replica = |pod: &str, node: &str, ready: bool| Replica {
        pod: pod.into(),
        node: node.into(),
        ready,
    };
    let mut w = World::new(3);
    w.snap.replicas = vec![
        replica("op-0", "node-0", true),
        replica("op-1", "node-1", false),
    ];
    w.add_cr(
        "gpu",
        spec(json!({"interruptionBudget": {"count": 3}, "packages": {"driver": reboot_pkg()}})),
    );
    passes(&mut w, 12);
    assert!(
        !ever_cordoned(&w, "node-0"),
        "the last ready replica's node"
    );
    assert_eq!(stages_on(&w, "node-0"), ["driver:plan"]);
    for n in ["node-1", "node-2"] {
        assert!(ever_cordoned(&w, n), "{n} is not held");
    }
    let (ready, reason, msg) = condition(&w, "gpu", "Ready");
    assert_eq!(
        (ready.as_str(), reason.as_str()),
        ("False", "OperatorReplicaStarting")
    );
    assert!(
        msg.contains("node-0 waits for operator replica op-1"),
        "{msg}"
    );

    w.snap.replicas[1].ready = true;
    w.run(("reboot", 1), 80);
    assert_eq!(w.cr("gpu").status.status, Some(Status::Complete));
    assert!(ever_cordoned(&w, "node-0"));
}

/// A reboot of a node running a ready operator replica while another is ready elsewhere:
/// once the node is drained, the replicas there are fenced (the node's mark names them, an
/// event says so) and the reboot waits until they are out of the Service; one node fences
/// at a time, so the replicas of two nodes rebooting in one batch never leave together; the
/// mark stays through the reboot and goes after it.
#[test]
fn a_reboot_waits_for_the_operator_replicas_on_its_node_to_leave_the_service() {
    use nodewright_api::keys::CrMark;
    use nodewright_planner::Work;
    let mut w = World::new(3);
    w.replicas_fence_themselves = false;
    w.snap.replicas = vec![replica("op-0", "node-0"), replica("op-1", "node-1")];
    w.add_cr(
        "gpu",
        spec(json!({"interruptionBudget": {"count": 3}, "packages": {"driver": reboot_pkg()}})),
    );
    passes(&mut w, 16);
    let fence = CrMark::FenceOperator.key("gpu");
    let marks: Vec<Option<&String>> = ["node-0", "node-1", "node-2"]
        .iter()
        .map(|n| w.node(n).annotations.get(&fence))
        .collect();
    assert_eq!(
        marks,
        [Some(&"op-0".to_string()), None, None],
        "node-0 fences its replica first; node-1 waits its turn; node-2 runs none"
    );
    let rebooting = |w: &World, node: &str| {
        w.snap
            .jobs
            .iter()
            .any(|j| j.node == node && matches!(j.work, Work::Interrupt { .. }))
            || w.created()
                .iter()
                .any(|(_, work, n)| *n == node && matches!(work, Work::Interrupt { .. }))
    };
    assert!(!rebooting(&w, "node-0") && !rebooting(&w, "node-1"));
    assert!(
        rebooting(&w, "node-2"),
        "a node with no replica is not held"
    );
    assert_eq!(
        w.events("OperatorHandover").len(),
        1,
        "{:?}",
        w.events("OperatorHandover")
    );

    // The operator's replicas do their part: the rollout finishes, each replica fenced in
    // turn and back once its node is through.
    w.replicas_fence_themselves = true;
    w.run(("reboot", 1), 120);
    assert_eq!(w.cr("gpu").status.status, Some(Status::Complete));
    for n in ["node-0", "node-1", "node-2"] {
        assert!(rebooting(&w, n), "{n} rebooted");
        assert_eq!(
            w.node(n).annotations.get(&fence),
            None,
            "{n}'s mark is gone"
        );
    }
    assert!(w.snap.replicas.iter().all(|r| r.ready), "both back");
    // Replayed from every node write: never two nodes fenced at once, and each of the two
    // replica nodes fenced once.
    let mut marked = std::collections::BTreeSet::new();
    let mut fenced = Vec::new();
    for (pass, a) in &w.history {
        if let Action::PatchNode(p) = a
            && let Some(v) = p.annotations.get(&fence)
        {
            if v.is_some() && marked.insert(p.node.clone()) {
                fenced.push(p.node.clone());
            } else if v.is_none() {
                marked.remove(&p.node);
            }
            assert!(marked.len() <= 1, "pass {pass}: {marked:?} fenced together");
        }
    }
    assert_eq!(fenced, ["node-0", "node-1"]);
}

/// A node that was fencing when the pass began (its mark in the snapshot, here another CR's
/// that nothing in this pass writes) holds every other node's reboot: the fencing nodes are
/// found from the nodes' marks, not only from what the pass itself fences. Once the mark is
/// gone, the waiting node fences its own replica.
#[test]
fn a_node_fencing_when_the_pass_begins_holds_another_nodes_reboot() {
    use nodewright_api::keys::CrMark;
    use nodewright_planner::Work;
    let mut w = World::new(0);
    w.add_node("node-0", &[("pool", "gpu")]);
    w.add_node("node-1", &[]);
    w.replicas_fence_themselves = false;
    w.snap.replicas = vec![replica("op-0", "node-0"), replica("op-1", "node-1")];
    w.add_cr(
        "gpu",
        spec(json!({"nodeSelectors": {"matchLabels": {"pool": "gpu"}}, "packages": {"driver": reboot_pkg()}})),
    );
    let theirs = CrMark::FenceOperator.key("other");
    let ours = CrMark::FenceOperator.key("gpu");
    let rebooting = |w: &World| {
        w.created()
            .iter()
            .any(|(_, work, n)| *n == "node-0" && matches!(work, Work::Interrupt { .. }))
    };
    for pass in 0..16 {
        // node-1 fences its replica for a reboot of its own, in every snapshot.
        w.node_mut("node-1")
            .annotations
            .insert(theirs.clone(), "op-1".into());
        w.step();
        w.succeed_all(("reboot", 1));
        assert_eq!(
            w.node("node-0").annotations.get(&ours),
            None,
            "pass {pass}: node-0 fenced while node-1 was fencing"
        );
        assert!(!rebooting(&w), "pass {pass}: node-0 rebooted");
    }
    assert_eq!(
        stages_on(&w, "node-0").last().map(String::as_str),
        Some("driver:config"),
        "node-0 is through its steps and waits for its reboot"
    );

    w.node_mut("node-1").annotations.remove(&theirs);
    passes(&mut w, 2);
    assert_eq!(
        w.node("node-0").annotations.get(&ours).map(String::as_str),
        Some("op-0"),
        "with node-1 through, node-0 fences its replica"
    );
}

/// A Job whose pod cannot start (the kubelet cannot pull the agent image): the node reads
/// erroring with the kubelet's reason and the image, nothing more starts there, and the Job
/// is left to the kubelet's retries; once the pod starts, the rollout goes on by itself.
#[test]
fn a_job_whose_pod_cannot_start_leaves_its_node_erroring_until_it_starts() {
    let mut w = World::new(1);
    w.add_cr("tune", spec(json!({"packages": {"tuning": plain_pkg()}})));
    w.step();
    let stuck = "the agent pod p cannot start: ImagePullBackOff: 401 Unauthorized (image r.example/agent@sha256:0)";
    let job = w.snap.jobs.first_mut().expect("the first stage's Job");
    job.stuck = Some(stuck.into());
    let name = job.name.clone();
    for _ in 0..5 {
        w.step();
    }
    assert_eq!(w.node_status("tune", "node-0"), Some(Status::Erroring));
    let (_, _, msg) = condition(&w, "tune", "Ready");
    assert!(
        msg.contains("ImagePullBackOff") && msg.contains("r.example/agent"),
        "{msg}"
    );
    assert_eq!(w.snap.jobs.len(), 1, "nothing else started; the Job stays");
    let entry = |w: &World| {
        w.state("tune", "node-0")
            .values()
            .next()
            .map(|e| (e.attempts, e.message.clone()))
            .expect("the stage's entry")
    };
    assert_eq!(
        entry(&w),
        (1, stuck.to_string()),
        "the pod that cannot start counts as a failed attempt of the stage, and says why"
    );
    assert!(
        !w.history
            .iter()
            .any(|(_, a)| matches!(a, Action::DeleteJob { name: n, .. } if *n == name)),
        "the kubelet keeps trying: the Job is not deleted"
    );

    w.snap.jobs[0].stuck = None;
    w.step();
    assert_eq!(
        entry(&w).0,
        0,
        "started: the kubelet's try that ran is the attempt now"
    );
    w.run(("reboot", 1), 40);
    assert_eq!(w.cr("tune").status.status, Some(Status::Complete));
}
