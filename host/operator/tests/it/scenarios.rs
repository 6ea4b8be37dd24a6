//! End to end, one behaviour per scenario: ordering, config changes, upgrades, uninstall,
//! drain barriers and PDBs, converged nodes, DeploymentPolicy compartments. Failures and
//! recovery are in `recovery.rs`.

use crate::common;
use crate::specs;

use common::{E2e, release};
use nodewright_api::keys;
use nodewright_api::v1alpha1::Status;
use nodewright_hostops::{HostAction, ServiceVerb};
use serde_json::json;
use specs::*;

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

/// Mirrors NodeWright's `drain-config`: with `drainConfig.disableEviction` a pod whose
/// PodDisruptionBudget allows no disruption is deleted directly, and the rollout completes.
#[tokio::test(flavor = "multi_thread")]
async fn disable_eviction_deletes_a_pod_its_budget_would_keep() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("x1", &[])]).await;
    let package = reboot_package(&e);
    e.workload_pod("x1", "db", json!({"app": "db"})).await;
    e.pdb("db", json!({"app": "db"})).await;
    e.start_operator(&[]);
    e.apply(cr(
        "direct",
        json!({"drainConfig": {"disableEviction": true}, "packages": {"driver": package}}),
    ))
    .await;
    e.wait_complete("direct", LIMIT).await;
    assert!(!e.pod_exists("db").await, "deleted despite its budget");
    assert_eq!(e.reboots("x1"), 1);
    assert_eq!(
        e.condition("direct", "DrainBlocked").await.unwrap().0,
        "False"
    );
}

/// NodeWright's chart ships a LimitRange and its e2e runs under one: agent pods in a
/// namespace with a LimitRange take its defaults where a package names no resources, keep
/// a package's own where it does, and the rollout completes.
#[tokio::test(flavor = "multi_thread")]
async fn agent_pods_take_a_limit_ranges_defaults_unless_the_package_sets_its_own() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("lr1", &[])]).await;
    let limits: k8s_openapi::api::core::v1::LimitRange = serde_json::from_value(json!({
        "metadata": {"name": "agents"},
        "spec": {"limits": [{"type": "Container",
            "default": {"cpu": "500m", "memory": "512Mi"},
            "defaultRequest": {"cpu": "250m", "memory": "256Mi"},
            "max": {"memory": "1Gi"}}]}
    }))
    .unwrap();
    kube::Api::namespaced(e.client.clone(), common::NS)
        .create(&Default::default(), &limits)
        .await
        .unwrap();
    for p in ["a", "b"] {
        e.script(
            &format!("/usr/local/bin/hold-{p}"),
            &format!("while [ ! -f release-{p} ]; do sleep 0.1; done"),
        );
    }
    e.start_operator(&[]);
    let package = |p: &str| {
        let cmd = format!("/usr/local/bin/hold-{p}");
        json!({"version": "1.0.0", "plugin": e.plugin("shell"),
               "capabilities": commands(&[cmd.as_str()]), "configMap": {"apply": cmd}})
    };
    let mut b = package("b");
    b["resources"] = json!({"cpuRequest": "100m", "cpuLimit": "200m", "memoryRequest": "300Mi", "memoryLimit": "600Mi"});
    e.apply(cr(
        "limited",
        json!({"packages": {"a": package("a"), "b": b}}),
    ))
    .await;
    let resources = e
        .wait("both apply pods running", LIMIT, || async {
            let (_, pods) = e.cr_jobs("limited").await;
            let of = |name: &str| {
                pods.iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .find(|p| {
                        let l = p.metadata.labels.clone().unwrap_or_default();
                        l.get(keys::job::PACKAGE).map(String::as_str) == Some(name)
                            && l.get(keys::job::STAGE).map(String::as_str) == Some("apply")
                    })
                    .and_then(|p| p.spec.as_ref()?.containers[0].resources.clone())
            };
            Some((of("a")?, of("b")?))
        })
        .await;
    let quantities = |r: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| {
        r.clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect::<Vec<_>>()
    };
    let (a, b) = resources;
    assert_eq!(
        (quantities(&a.requests), quantities(&a.limits)),
        (
            vec![
                ("cpu".into(), "250m".into()),
                ("memory".into(), "256Mi".into())
            ],
            vec![
                ("cpu".into(), "500m".into()),
                ("memory".into(), "512Mi".into())
            ]
        ),
        "the LimitRange's defaults"
    );
    assert_eq!(
        (quantities(&b.requests), quantities(&b.limits)),
        (
            vec![
                ("cpu".into(), "100m".into()),
                ("memory".into(), "300Mi".into())
            ],
            vec![
                ("cpu".into(), "200m".into()),
                ("memory".into(), "600Mi".into())
            ]
        ),
        "the package's own"
    );
    release(&e, "lr1", "a");
    release(&e, "lr1", "b");
    e.wait_complete("limited", LIMIT).await;
}
