//! End to end: failures and recovery — drain timeouts, retries and parked stages, a missing
//! grant caught before any node is touched, an operator restarted mid-reboot.

use crate::common;
use crate::specs;

use std::time::Duration;

use common::E2e;
use nodewright_api::keys;
use nodewright_api::node_state::{Stage, State};
use nodewright_api::v1alpha1::Status;
use serde_json::json;
use specs::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_drain_timeout_leaves_the_node_erroring_and_cordoned() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("t1", &[])]).await;
    let package = reboot_package(&e);
    e.workload_pod("t1", "db", json!({"app": "db"})).await;
    e.pdb("db", json!({"app": "db"})).await;
    e.start_operator(&[]);
    e.apply(cr(
        "timeout",
        json!({"drainConfig": {"timeout": "8s"}, "packages": {"driver": package}}),
    ))
    .await;
    e.wait("erroring", LIMIT, || async {
        (e.node_status("timeout", "t1").await == Some(Status::Erroring)).then_some(())
    })
    .await;
    let ready = e.condition("timeout", "Ready").await.unwrap();
    assert!(ready.2.contains("drain timed out"), "{ready:?}");
    assert!(
        e.node("t1")
            .await
            .spec
            .unwrap()
            .unschedulable
            .unwrap_or(false)
    );
    assert!(
        e.events("t1")
            .await
            .iter()
            .any(|(r, _)| r == "DrainTimeout")
    );
    assert_eq!(e.reboots("t1"), 0);
    assert!(e.pod_exists("db").await);
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_are_retried_then_parked_and_denials_name_the_grant() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("f1", &[("pool", "f1")]), ("f2", &[("pool", "f2")])]).await;
    e.script(
        "/usr/local/bin/broken",
        "echo attempt >> etc/attempts; echo 'no driver for this card' >&2; exit 1",
    );
    e.host_file("f2", "/proc/sys/vm/swappiness", "60");
    let metrics = nodewright_testregistry::free_port();
    e.start_operator(&[
        "--job-backoff-limit=1",
        &format!("--metrics-addr=127.0.0.1:{metrics}"),
    ]);
    e.apply(cr("fails", json!({"nodeSelectors": {"matchLabels": {"pool": "f1"}}, "packages": {"broken": {
        "version": "1.0.0", "plugin": e.plugin("shell"), "capabilities": commands(&["/usr/local/bin/broken"]), "configMap": {"apply": "/usr/local/bin/broken"}
    }}})))
    .await;
    e.apply(cr("denied", json!({"nodeSelectors": {"matchLabels": {"pool": "f2"}}, "packages": {"tuning": {
        "version": "1.0.0", "plugin": e.plugin("sysctl"),
        "capabilities": {"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}], "sysctl": ["vm.overcommit_memory"]},
        "configMap": {"vm.swappiness": "10"}
    }}})))
    .await;
    e.wait("fails erroring", LIMIT, || async {
        (e.node_status("fails", "f1").await == Some(Status::Erroring)).then_some(())
    })
    .await;
    let st = e.state("fails", "f1").await;
    assert_eq!(
        (
            st["broken|1.0.0"].stage,
            st["broken|1.0.0"].state,
            st["broken|1.0.0"].attempts
        ),
        (Stage::Apply, State::Erroring, 2)
    );
    assert_eq!(
        e.read_host_file("f1", "/etc/attempts")
            .unwrap()
            .lines()
            .count(),
        2,
        "backoffLimit 1: two attempts, then parked"
    );
    let ready = e.condition("fails", "Ready").await.unwrap();
    assert!(
        ready.2.contains("exited with 1: no driver for this card"),
        "{ready:?}"
    );
    // Events are published from a queue, after the status that says why: wait for it.
    e.wait("a StageFailed event", LIMIT, || async {
        e.events("fails")
            .await
            .iter()
            .any(|(r, _)| r == "StageFailed")
            .then_some(())
    })
    .await;
    // The failed Job is kept, with its pods, for their logs.
    let (jobs, pods) = e.cr_jobs("fails").await;
    assert_eq!(jobs.len(), 1, "the parked stage's Job is kept");
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(e.client.clone(), common::NS);
    let pod = pods
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .next()
        .expect("its pods kept too");
    let log = api.logs(pod, &Default::default()).await.unwrap();
    assert!(log.contains("no driver for this card"), "{log}");

    e.wait("denied erroring", LIMIT, || async {
        (e.node_status("denied", "f2").await == Some(Status::Erroring)).then_some(())
    })
    .await;
    let ready = e.condition("denied", "Ready").await.unwrap();
    assert!(
        ready.2.contains("spec.packages.tuning.capabilities.sysctl")
            && ready.2.contains("vm.swappiness"),
        "{ready:?}"
    );
    assert_eq!(
        e.read_host_file("f2", "/proc/sys/vm/swappiness").as_deref(),
        Some("60"),
        "nothing changed"
    );
    // Each parked stage counted once, by blame.
    let want = [
        "nodewright_stage_failures_total{nodewright=\"fails\",package=\"broken\",stage=\"apply\",blame=\"package\"} 1",
        "nodewright_stage_failures_total{nodewright=\"denied\",package=\"tuning\",stage=\"apply\",blame=\"denied\"} 1",
        "nodewright_status{nodewright=\"fails\",status=\"erroring\"} 1",
    ];
    e.wait(
        "failures in the metrics",
        Duration::from_secs(30),
        || async {
            let text = common::http_get(metrics, "/metrics").await;
            want.iter().all(|w| text.contains(w)).then_some(())
        },
    )
    .await;

    // Granting it (a new generation) re-arms the parked stage.
    e.patch(
        "denied",
        json!({"spec": {"packages": {"tuning": {"capabilities": {"sysctl": ["vm.swappiness"]}}}}}),
    )
    .await;
    e.wait_complete("denied", LIMIT).await;
    assert_eq!(
        e.read_host_file("f2", "/proc/sys/vm/swappiness").as_deref(),
        Some("10")
    );

    // Deleted, a NodeWright leaves no series behind: not its gauges, not its stage-failure
    // counters (NodeWright's `metrics` and `delete-skyhook` tests); the others' stay.
    e.delete("denied").await;
    e.wait("denied gone", LIMIT, || async {
        (!e.exists("denied").await).then_some(())
    })
    .await;
    let text = e
        .wait("no series of denied", Duration::from_secs(30), || async {
            let text = common::http_get(metrics, "/metrics").await;
            (!text.contains("nodewright=\"denied\"")).then_some(text)
        })
        .await;
    assert!(
        text.contains("nodewright_stage_failures_total{nodewright=\"fails\",package=\"broken\",stage=\"apply\",blame=\"package\"} 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_grant_is_a_condition_before_any_node_is_touched() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("g1", &[])]).await;
    let metrics = nodewright_testregistry::free_port();
    e.start_operator(&[
        &format!("--metrics-addr=127.0.0.1:{metrics}"),
        "--sandbox-max-memory=256Mi",
    ]);
    e.apply(cr("nogrant", json!({"packages": {"tuning": {"version": "1.0.0", "plugin": e.plugin("sysctl"), "configMap": {"vm.swappiness": "10"}}}}))).await;
    let c = e
        .wait("PluginsReady=False", LIMIT, || async {
            e.condition("nogrant", "PluginsReady")
                .await
                .filter(|c| c.0 == "False")
        })
        .await;
    assert_eq!(c.1, "GrantMissing");
    assert!(c.2.contains("spec.packages.tuning.capabilities"), "{c:?}");
    assert!(e.jobs().await.is_empty(), "no Job was created");
    assert!(e.state("nogrant", "g1").await.is_empty());
    e.wait(
        "the plugin error in the metrics",
        Duration::from_secs(30),
        || async {
            common::http_get(metrics, "/metrics")
                .await
                .contains(
                    "nodewright_plugin_errors{nodewright=\"nogrant\",reason=\"GrantMissing\"} 1",
                )
                .then_some(())
        },
    )
    .await;
    // A package asking for more sandbox than the operator allows is refused the same way.
    let caps = json!({"sysctl": ["vm.swappiness"], "files": [{"path": "/etc/sysctl.d", "access": "readWrite"}]});
    let greedy = json!({"version": "1.0.0", "plugin": e.plugin("sysctl"), "configMap": {"vm.swappiness": "10"}, "capabilities": caps, "sandbox": {"memory": "512Mi"}});
    e.apply(cr("greedy", json!({"packages": {"tuning": greedy}})))
        .await;
    let c = e
        .wait("PluginsReady=False", LIMIT, || async {
            e.condition("greedy", "PluginsReady")
                .await
                .filter(|c| c.0 == "False")
        })
        .await;
    assert_eq!(c.1, "SandboxAboveCeiling");
    assert!(
        c.2.contains("spec.packages.tuning.sandbox.memory") && c.2.contains("268435456"),
        "{c:?}"
    );
    assert!(e.jobs().await.is_empty(), "no Job was created");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_restart_mid_reboot_finishes_with_one_reboot_and_karpenter_is_told() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("k1", &[])]).await;
    let package = reboot_package(&e);
    e.start_operator(&[]);
    e.apply(cr("restart", json!({"packages": {"driver": package}})))
        .await;
    // Kill the operator as soon as the node is cordoned for the reboot.
    let ann = e
        .wait("k1 cordoned", LIMIT, || async {
            let n = e.node("k1").await;
            n.spec
                .as_ref()?
                .unschedulable?
                .then_some(n.metadata.annotations.clone().unwrap_or_default())
        })
        .await;
    assert_eq!(
        ann.get(keys::KARPENTER_DO_NOT_DISRUPT).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        ann.get(keys::KARPENTER_DO_NOT_REPAIR).map(String::as_str),
        Some("true")
    );
    e.kill_operator();
    tokio::time::sleep(Duration::from_secs(3)).await;
    e.start_operator(&[]);
    e.wait_complete("restart", LIMIT).await;
    assert_eq!(e.reboots("k1"), 1, "no duplicate interrupt");
    let ann = e.node("k1").await.metadata.annotations.unwrap_or_default();
    assert!(
        !ann.contains_key(keys::KARPENTER_DO_NOT_DISRUPT)
            && !ann.contains_key(keys::KARPENTER_DO_NOT_REPAIR),
        "removed afterwards"
    );
}

/// The running apply pod of `cr`'s `package`, once it runs.
async fn running_apply_pod(e: &E2e, cr: &str) -> String {
    e.wait("the apply pod running", LIMIT, || async {
        let (_, pods) = e.cr_jobs(cr).await;
        pods.into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(keys::job::STAGE))
                    .map(String::as_str)
                    == Some("apply")
            })
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .and_then(|p| p.metadata.name)
    })
    .await
}

/// Mirrors NodeWright's `operator-agent/sigterm_grace`: an agent pod deleted mid-stage lets
/// the running stage finish within `gracefulShutdown` and its result counts (applied once);
/// a stage that outlives the grace is stopped with everything it started, and the retry
/// applies once — the stopped attempt never finishes behind its pod's back.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_agent_pod_finishes_within_its_grace_or_stops_and_applies_once() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("g1", &[("pool", "g1")]), ("g2", &[("pool", "g2")])]).await;
    // `<seconds>`: marks its start; two seconds later starts a command in a process group
    // of its own that sleeps, then marks the end — so a pod deleted in those two seconds
    // stops while a command it had not started yet when the stop began is still to come.
    e.script(
        "/usr/local/bin/slow-apply",
        "mkdir -p etc && echo start >> etc/starts && sleep 2 && \
         perl -e 'setpgrp(0, 0); sleep $ARGV[0]; open(my $f, \">>\", \"etc/applies\") or die; print $f \"done\\n\"' \"$1\"",
    );
    e.start_operator(&[]);
    let package = |seconds: &str, grace: &str| {
        json!({"version": "1.0.0", "plugin": e.plugin("shell"), "gracefulShutdown": grace,
               "capabilities": commands(&["/usr/local/bin/slow-apply"]),
               "configMap": {"apply": format!("/usr/local/bin/slow-apply {seconds}")}})
    };
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(e.client.clone(), common::NS);
    let lines = |e: &E2e, node: &str, file: &str| {
        e.read_host_file(node, file)
            .unwrap_or_default()
            .lines()
            .count()
    };

    // Within the grace: the stage finishes and counts.
    e.apply(cr(
        "within",
        json!({"nodeSelectors": {"matchLabels": {"pool": "g1"}}, "packages": {"slow": package("3", "20s")}}),
    ))
    .await;
    let pod = running_apply_pod(&e, "within").await;
    pods.delete(&pod, &Default::default()).await.unwrap();
    e.wait_complete("within", LIMIT).await;
    assert_eq!(
        (
            lines(&e, "g1", "/etc/starts"),
            lines(&e, "g1", "/etc/applies")
        ),
        (1, 1),
        "finished in its grace, not run again"
    );

    // Past the grace: stopped, the retry applies once.
    e.apply(cr(
        "past",
        json!({"nodeSelectors": {"matchLabels": {"pool": "g2"}}, "packages": {"slow": package("6", "4s")}}),
    ))
    .await;
    let first = running_apply_pod(&e, "past").await;
    e.wait("the first attempt started", LIMIT, || async {
        (lines(&e, "g2", "/etc/starts") == 1).then_some(())
    })
    .await;
    pods.delete(&first, &Default::default()).await.unwrap();
    e.wait_complete("past", LIMIT).await;
    // Deleted within its first two seconds, the first attempt started its late command
    // during the 4 s grace; had that command outlived the pod, it would have marked its end
    // 8 s after the attempt began — before the retry (a new pod, the same 8 s) completed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        (
            lines(&e, "g2", "/etc/starts"),
            lines(&e, "g2", "/etc/applies")
        ),
        (2, 1),
        "stopped once, applied once"
    );
    let st = e.state("past", "g2").await;
    assert_eq!(st["slow|1.0.0"].state, State::Complete);
}
