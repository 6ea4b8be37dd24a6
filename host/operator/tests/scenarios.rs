//! End to end, one behaviour per scenario: ordering, config changes, upgrades, uninstall,
//! drain barriers and PDBs, drain timeouts, failures and denials, DeploymentPolicy
//! compartments, and an operator restart in the middle of a reboot.

mod common;

use std::time::Duration;

use common::E2e;
use nodewright_api::keys;
use nodewright_api::node_state::{Stage, State};
use nodewright_api::v1alpha1::Status;
use nodewright_hostops::{HostAction, ServiceVerb};
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(240);

fn cr(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": name}, "spec": spec})
}

fn commands(paths: &[&str]) -> Value {
    json!({"commands": paths.iter().map(|p| json!({"path": p})).collect::<Vec<_>>()})
}

/// A shell package that needs a reboot and whose plan says "not yet installed".
fn reboot_package(e: &E2e) -> Value {
    e.script(
        "/usr/local/bin/install-driver",
        "mkdir -p etc && echo installed > etc/driver",
    );
    e.script("/usr/local/bin/driver-ok", "test -f etc/driver");
    json!({
        "version": "1.0.0", "plugin": e.plugin("shell"), "interrupt": {"type": "reboot"},
        "capabilities": {"commands": [{"path": "/usr/local/bin/install-driver"}, {"path": "/usr/local/bin/driver-ok", "readOnly": true}]},
        "configMap": {"apply": "/usr/local/bin/install-driver", "plan": "/usr/local/bin/driver-ok", "interrupt": "reboot"}
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn dependencies_config_changes_upgrade_and_uninstall() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("l1", &[])]).await;
    e.script(
        "/usr/local/bin/base-install",
        "mkdir -p etc && touch etc/base",
    );
    e.script(
        "/usr/local/bin/app-install",
        "test -f etc/base && echo i >> etc/app-installs",
    );
    e.script("/usr/local/bin/app-config", "echo c >> etc/app-configs");
    e.script(
        "/usr/local/bin/app-uninstall",
        "rm -f etc/app-installs && touch etc/app-removed",
    );
    e.start_operator(&[]);
    let app = json!({
        "version": "1.0.0", "plugin": e.plugin("shell"), "dependsOn": {"base": "1.0.0"},
        "capabilities": commands(&["/usr/local/bin/app-install", "/usr/local/bin/app-config", "/usr/local/bin/app-uninstall"]),
        "configMap": {"apply": "/usr/local/bin/app-install", "config": "/usr/local/bin/app-config", "uninstall": "/usr/local/bin/app-uninstall", "motd": "a", "mode": "1"},
        "configInterrupts": {"mode": {"type": "service", "services": ["app.service"]}},
        "uninstall": {"enabled": true}
    });
    let base = json!({"version": "1.0.0", "plugin": e.plugin("shell"), "capabilities": commands(&["/usr/local/bin/base-install"]), "configMap": {"apply": "/usr/local/bin/base-install"}});
    e.apply(cr("life", json!({"packages": {"base": base, "app": app}})))
        .await;
    e.wait_complete("life", LIMIT).await;
    // `app` checks that `base` ran first; it would have failed otherwise.
    assert_eq!(
        e.read_host_file("l1", "/etc/app-installs").as_deref(),
        Some("i\n")
    );
    let configs = |e: &E2e| {
        e.read_host_file("l1", "/etc/app-configs")
            .unwrap_or_default()
            .lines()
            .count()
    };
    let restarts = |e: &E2e| {
        e.journal("l1").iter().filter(|a| matches!(a, HostAction::Service { verb: ServiceVerb::Restart, unit } if unit == "app.service")).count()
    };
    let after_install = configs(&e);

    // A key without a config interrupt: `config` again, nothing restarted, never cordoned.
    e.patch(
        "life",
        json!({"spec": {"packages": {"app": {"configMap": {"motd": "b"}}}}}),
    )
    .await;
    e.wait_complete("life", LIMIT).await;
    assert_eq!(configs(&e), after_install + 1);
    assert_eq!(restarts(&e), 0);
    assert_eq!(
        e.state("life", "l1").await["app|1.0.0"].changed_keys,
        ["motd"]
    );

    // A key with one: `config`, then exactly that service restart.
    e.patch(
        "life",
        json!({"spec": {"packages": {"app": {"configMap": {"mode": "2"}}}}}),
    )
    .await;
    e.wait_complete("life", LIMIT).await;
    assert_eq!(configs(&e), after_install + 2);
    assert_eq!(restarts(&e), 1, "{:?}", e.journal("l1"));
    assert_eq!(e.reboots("l1"), 0);

    // A new version: `upgrade` (the shell plugin's default re-runs apply), old entry dropped.
    e.patch(
        "life",
        json!({"spec": {"packages": {"app": {"version": "1.1.0"}}}}),
    )
    .await;
    e.wait_complete("life", LIMIT).await;
    let st = e.state("life", "l1").await;
    assert_eq!(
        st.keys().cloned().collect::<Vec<_>>(),
        ["app|1.1.0", "base|1.0.0"]
    );
    assert_eq!(st["app|1.1.0"].previous_version.as_deref(), Some("1.0.0"));
    assert_eq!(
        e.read_host_file("l1", "/etc/app-installs").as_deref(),
        Some("i\ni\n")
    );

    // Explicit uninstall: the package's uninstall runs and its entry goes.
    e.patch(
        "life",
        json!({"spec": {"packages": {"app": {"uninstall": {"enabled": true, "apply": true}}}}}),
    )
    .await;
    e.wait_complete("life", LIMIT).await;
    assert!(e.read_host_file("l1", "/etc/app-removed").is_some());
    assert_eq!(
        e.state("life", "l1")
            .await
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        ["base|1.0.0"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn barriers_pdbs_and_external_cordons_hold_the_drain_as_they_should() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("d1", &[]), ("d2", &[]), ("d3", &[])]).await;
    let package = reboot_package(&e);
    e.workload_pod("d1", "training", json!({"workload": "training"}))
        .await;
    e.workload_pod("d2", "db", json!({"app": "db"})).await;
    e.pdb("db", json!({"app": "db"})).await;
    e.workload_pod("d3", "web", json!({"app": "web"})).await;
    e.patch_node("d3", json!({"spec": {"unschedulable": true}}))
        .await;
    e.start_operator(&[]);
    e.apply(cr("drain", json!({"podNonInterruptLabels": {"matchLabels": {"workload": "training"}}, "packages": {"driver": package}}))).await;

    let blocked = e
        .wait("Blocked: NonInterruptPodsRunning", LIMIT, || async {
            e.condition("drain", "Blocked")
                .await
                .filter(|c| c.0 == "True" && c.1 == "NonInterruptPodsRunning")
        })
        .await;
    assert!(blocked.2.contains("default/training"), "{blocked:?}");
    let pdb = e
        .wait(
            "DrainBlocked with the apiserver's message",
            LIMIT,
            || async {
                e.condition("drain", "DrainBlocked")
                    .await
                    .filter(|c| c.0 == "True")
            },
        )
        .await;
    assert!(pdb.2.contains("disruption budget"), "{pdb:?}");
    assert_eq!(pdb.1, "PodDisruptionBudget");
    assert!(
        e.pod_exists("training").await,
        "a protected pod is never evicted"
    );
    assert!(
        e.node("d1")
            .await
            .spec
            .unwrap()
            .unschedulable
            .unwrap_or(false),
        "cordoned while it waits"
    );
    assert_eq!(e.node_status("drain", "d1").await, Some(Status::Blocked));

    e.delete_pod("training").await;
    kube::Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
        e.client.clone(),
        "default",
    )
    .delete("db", &Default::default())
    .await
    .unwrap();
    e.wait_complete("drain", LIMIT).await;
    assert!(
        !e.pod_exists("db").await && !e.pod_exists("web").await,
        "evicted once allowed"
    );
    for n in ["d1", "d2", "d3"] {
        assert_eq!(e.reboots(n), 1, "{n}");
    }
    assert!(
        !e.node("d1")
            .await
            .spec
            .unwrap()
            .unschedulable
            .unwrap_or(false)
    );
    assert!(
        e.node("d3")
            .await
            .spec
            .unwrap()
            .unschedulable
            .unwrap_or(false),
        "an external cordon is kept after completion"
    );
    assert_eq!(
        e.condition("drain", "DrainBlocked").await.unwrap().0,
        "False"
    );
}

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
    assert!(ready.2.contains("exited with 1"), "{ready:?}");
    assert!(
        e.events("fails")
            .await
            .iter()
            .any(|(r, _)| r == "StageFailed")
    );

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
async fn a_converged_node_completes_without_cordon_or_reboot() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("c1", &[])]).await;
    let package = reboot_package(&e);
    e.host_file("c1", "/etc/driver", "installed\n");
    e.start_operator(&[]);
    e.apply(cr("converged", json!({"packages": {"driver": package}})))
        .await;
    e.wait_complete("converged", LIMIT).await;
    assert_eq!(e.reboots("c1"), 0);
    assert!(!e.journal("c1").iter().any(|a| matches!(a, HostAction::Exec { path, .. } if path == "/usr/local/bin/install-driver")), "apply never ran");
    assert!(
        !e.node("c1")
            .await
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(&keys::cordon("converged"))
    );
    assert!(!e.events("c1").await.iter().any(|(r, _)| r == "Interrupt"));
}

#[tokio::test(flavor = "multi_thread")]
async fn seed_002_canary_stops_while_production_and_default_continue() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let tiers = [
        ("w0", "canary"),
        ("w1", "canary"),
        ("w2", "production"),
        ("w3", "production"),
        ("w4", "production"),
        ("w5", ""),
    ];
    let nodes: Vec<(&str, Vec<(&str, &str)>)> = tiers
        .iter()
        .map(|(n, t)| {
            (
                *n,
                if t.is_empty() {
                    vec![]
                } else {
                    vec![("tier", *t)]
                },
            )
        })
        .collect();
    let borrowed: Vec<(&str, &[(&str, &str)])> =
        nodes.iter().map(|(n, l)| (*n, l.as_slice())).collect();
    let mut e = E2e::start(&borrowed).await;
    e.script("/usr/local/bin/roll", "test ! -f etc/fail");
    e.host_file("w0", "/etc/fail", "");
    e.host_file("w1", "/etc/fail", "");
    let policy: nodewright_api::v1alpha1::DeploymentPolicy = serde_json::from_value(json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": "staged"},
        "spec": {
            "default": {"budget": {"count": 2}},
            "compartments": [
                {"name": "canary", "selector": {"matchLabels": {"tier": "canary"}}, "budget": {"count": 1},
                 "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1, "safetyLimit": 100}}},
                {"name": "production", "selector": {"matchLabels": {"tier": "production"}}, "budget": {"percent": 100},
                 "strategy": {"linear": {"initialBatch": 1, "delta": 1, "failureThreshold": 2, "safetyLimit": 100}}}
            ]
        }
    }))
    .unwrap();
    kube::Api::<nodewright_api::v1alpha1::DeploymentPolicy>::all(e.client.clone())
        .create(&Default::default(), &policy)
        .await
        .unwrap();
    e.start_operator(&["--job-backoff-limit=0"]);
    e.apply(cr("rollout", json!({"deploymentPolicy": "staged", "packages": {"roll": {
        "version": "1.0.0", "plugin": e.plugin("shell"), "capabilities": commands(&["/usr/local/bin/roll"]), "configMap": {"apply": "/usr/local/bin/roll"}
    }}})))
    .await;
    e.wait("production and default complete", LIMIT, || async {
        let s = e.nodewright("rollout").await.status?;
        ["w2", "w3", "w4", "w5"]
            .iter()
            .all(|n| s.node_status.get(*n) == Some(&Status::Complete))
            .then_some(())
    })
    .await;
    let status = e
        .wait("canary stopped", LIMIT, || async {
            let s = e.nodewright("rollout").await.status?;
            s.compartment_statuses
                .get("canary")?
                .batch_state
                .as_ref()?
                .should_stop
                .then_some(s)
        })
        .await;
    let erroring: Vec<&str> = ["w0", "w1"]
        .into_iter()
        .filter(|n| status.node_status.get(*n) == Some(&Status::Erroring))
        .collect();
    assert_eq!(erroring.len(), 1, "{:?}", status.node_status);
    let untouched = if erroring[0] == "w0" { "w1" } else { "w0" };
    assert!(
        e.state("rollout", untouched).await.is_empty(),
        "the second canary node never starts"
    );
    assert_eq!(status.compartment_statuses["__default__"].matched, 1);
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
