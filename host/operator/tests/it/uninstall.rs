//! End to end: uninstalls — on deletion, failed and then fixed through the spec, held by a
//! pause or disable — and the version history a downgrade leaves. Each test names the
//! NodeWright e2e test it mirrors.

use crate::common;
use crate::specs;

use common::E2e;
use nodewright_api::node_state::{Stage, State};
use nodewright_api::v1alpha1::Status;
use serde_json::{Value, json};
use specs::*;

const INSTALL: &str = "/usr/local/bin/drv-install";
const BROKEN: &str = "/usr/local/bin/drv-remove-broken";
const REMOVE: &str = "/usr/local/bin/drv-remove";

/// Scripts for [`driver`]: an install that marks `etc/<package>`, an uninstall that fails
/// (as one missing a lock file would), one that works and counts its runs.
fn driver_scripts(e: &E2e) {
    e.script(INSTALL, "mkdir -p etc && echo \"$1\" > \"etc/$1\"");
    e.script(
        BROKEN,
        "echo \"cannot remove $1: etc/$1.lock is missing\" >&2; exit 3",
    );
    e.script(REMOVE, "rm -f \"etc/$1\" && echo \"$1\" >> etc/removals");
}

/// A package `name` with `uninstall.enabled` whose uninstall runs `uninstall` (a script of
/// [`driver_scripts`]) and whose changes restart `<name>.service`.
fn driver(e: &E2e, name: &str, uninstall: &str) -> Value {
    json!({
        "version": "1.0.0", "plugin": e.plugin("shell"),
        "interrupt": {"type": "service", "services": [format!("{name}.service")]},
        "capabilities": commands(&[INSTALL, BROKEN, REMOVE]),
        "configMap": {
            "apply": format!("{INSTALL} {name}"),
            "uninstall": format!("{uninstall} {name}"),
            "interrupt": format!("services:{name}.service")
        },
        "uninstall": {"enabled": true}
    })
}

/// The packages `node` has removed, in order.
fn removals(e: &E2e, node: &str) -> Vec<String> {
    e.read_host_file(node, "/etc/removals")
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

async fn wait_condition(e: &E2e, cr: &str, kind: &str, on: &str) -> (String, String, String) {
    e.wait(&format!("{cr} {kind}={on}"), LIMIT, || async {
        e.condition(cr, kind).await.filter(|c| c.0 == on)
    })
    .await
}

async fn wait_gone(e: &E2e, cr: &str) {
    e.wait(&format!("{cr} deleted"), LIMIT, || async {
        (!e.exists(cr).await).then_some(())
    })
    .await
}

/// Mirrors NodeWright's `uninstall-on-delete`, `uninstall-fix-config` and
/// `uninstall-finalizer-fix`: a failing uninstall sets `UninstallFailed` naming node and
/// package; a fixed `configMap` re-runs it and clears the condition — on a live NodeWright
/// (an explicit uninstall) and on one being deleted, whose finalizer waits for every node's
/// uninstall and its interrupt, and whose nodes end released.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_uninstall_is_fixed_through_the_spec_and_deletion_uninstalls_every_node() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let nodes = ["u1", "u2"];
    let mut e = E2e::start(&[("u1", &[]), ("u2", &[])]).await;
    driver_scripts(&e);
    e.start_operator(&["--job-backoff-limit=0"]);
    let spec = json!({"interruptionBudget": {"count": 2}, "packages": {
        "early": driver(&e, "early", BROKEN),
        "late": driver(&e, "late", BROKEN)
    }});
    e.apply(cr("drv", spec)).await;
    e.wait_complete("drv", LIMIT).await;
    for n in nodes {
        assert_eq!(e.read_host_file(n, "/etc/late").as_deref(), Some("late\n"));
        assert_eq!(restarts(&e, n, "late.service"), 1, "{:?}", e.journal(n));
    }

    // An explicit uninstall that fails, then is fixed.
    e.patch(
        "drv",
        json!({"spec": {"packages": {"early": {"uninstall": {"enabled": true, "apply": true}}}}}),
    )
    .await;
    let (_, reason, message) = wait_condition(&e, "drv", "UninstallFailed", "True").await;
    assert_eq!(reason, "UninstallPodFailing");
    assert!(
        message.contains("early") && nodes.iter().any(|n| message.contains(n)),
        "names the node and the package: {message}"
    );
    assert!(
        message.contains(
            "uninstall command exited with 3: cannot remove early: etc/early.lock is missing"
        ),
        "quotes the command's last error line: {message}"
    );
    e.patch(
        "drv",
        json!({"spec": {"packages": {"early": {"configMap": {"uninstall": format!("{REMOVE} early")}}}}}),
    )
    .await;
    e.wait_complete("drv", LIMIT).await;
    wait_condition(&e, "drv", "UninstallFailed", "False").await;
    for n in nodes {
        assert_eq!(removals(&e, n), ["early"]);
        assert!(
            !e.state("drv", n)
                .await
                .keys()
                .any(|k| k.starts_with("early|")),
            "the uninstalled package's entry goes"
        );
    }

    // Deleting: `late`'s uninstall fails, the finalizer holds, the fix lets it go.
    e.delete("drv").await;
    let (_, _, message) = wait_condition(&e, "drv", "UninstallFailed", "True").await;
    assert!(message.contains("late"), "{message}");
    assert!(
        e.exists("drv").await,
        "the finalizer waits for the uninstalls"
    );
    e.patch(
        "drv",
        json!({"spec": {"packages": {"late": {"configMap": {"uninstall": format!("{REMOVE} late")}}}}}),
    )
    .await;
    wait_gone(&e, "drv").await;
    for n in nodes {
        assert_eq!(removals(&e, n), ["early", "late"], "{n}");
        assert_eq!(e.read_host_file(n, "/etc/late"), None);
        assert_eq!(
            restarts(&e, n, "late.service"),
            2,
            "{n}: the install's interrupt and the uninstall's: {:?}",
            e.journal(n)
        );
        let node = e.node(n).await;
        assert!(
            !node.spec.and_then(|s| s.unschedulable).unwrap_or(false),
            "{n} ends uncordoned"
        );
        let left: Vec<String> = node
            .metadata
            .annotations
            .unwrap_or_default()
            .into_keys()
            .filter(|k| k.ends_with(".drv"))
            .collect();
        assert!(left.is_empty(), "{n} keeps {left:?}");
    }
}

/// Mirrors NodeWright's `delete-blocked-when-paused` and `delete-blocked-when-disabled`: a
/// pause or disable keeps a deletion's uninstalls from running, so the NodeWright stays,
/// with `DeletionBlocked` and a warning event naming the way on; lifting it lets the
/// uninstalls run and the object go.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_or_disabled_deletion_waits_for_its_uninstalls_until_lifted() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("h1", &[])]).await;
    driver_scripts(&e);
    e.start_operator(&[]);
    let cases = [
        (
            "held-p",
            "nodewright.io/pause",
            "PausedWithPendingUninstall",
        ),
        (
            "held-d",
            "nodewright.io/disable",
            "DisabledWithPendingUninstall",
        ),
    ];
    for (name, _, _) in cases {
        e.apply(cr(
            name,
            json!({"packages": {name: driver(&e, name, REMOVE)}}),
        ))
        .await;
    }
    for (name, annotation, _) in cases {
        e.wait_complete(name, LIMIT).await;
        e.patch(
            name,
            json!({"metadata": {"annotations": {annotation: "true"}}}),
        )
        .await;
        e.delete(name).await;
    }
    for (name, _, reason) in cases {
        let (_, why, message) = wait_condition(&e, name, "DeletionBlocked", "True").await;
        assert_eq!(why, reason);
        assert!(message.contains(&format!("h1: {name}")), "{message}");
        let events = e.events(name).await;
        assert!(
            events
                .iter()
                .any(|(r, note)| r == "DeletionBlocked" && note == &message),
            "{events:?}"
        );
    }
    // Held: a few passes later nothing was uninstalled and both objects are still there.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(removals(&e, "h1").is_empty());
    assert!(e.exists("held-p").await && e.exists("held-d").await);
    assert_eq!(e.node_status("held-p", "h1").await, Some(Status::Paused));
    assert_eq!(e.node_status("held-d", "h1").await, Some(Status::Disabled));

    for (name, annotation, _) in cases {
        e.patch(
            name,
            json!({"metadata": {"annotations": {annotation: null}}}),
        )
        .await;
        wait_gone(&e, name).await;
    }
    assert_eq!(removals(&e, "h1"), ["held-p", "held-d"]);
}

/// Mirrors NodeWright's `downgrade-enabled-false-preserves-state` and the sequence that once
/// read complete with nothing run: 1.1.0, down to 1.0.0, back up to 1.1.0 — each version
/// runs on the host. Then a package removed from the spec while its apply runs is stopped,
/// and its entry stays as a record that no longer reads as running.
#[tokio::test(flavor = "multi_thread")]
async fn a_downgrade_and_back_up_runs_each_version_on_the_host() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("v1", &[])]).await;
    const INSTALL: &str = "/usr/local/bin/ver-install";
    const HOLD: &str = "/usr/local/bin/ver-hold";
    e.script(
        INSTALL,
        "mkdir -p etc && echo \"$1\" > etc/version && echo \"$1\" >> etc/installs",
    );
    e.script(
        HOLD,
        "while [ ! -f release-hold ]; do sleep 0.1; done; touch etc/held",
    );
    e.start_operator(&[]);
    let version = |v: &str| {
        json!({
            "version": v, "plugin": e.plugin("shell"),
            "capabilities": commands(&[INSTALL]),
            "configMap": {"apply": format!("{INSTALL} {v}")}
        })
    };
    e.apply(cr("ver", json!({"packages": {"tool": version("1.1.0")}})))
        .await;
    e.wait_complete("ver", LIMIT).await;
    for v in ["1.0.0", "1.1.0"] {
        e.patch("ver", json!({"spec": {"packages": {"tool": version(v)}}}))
            .await;
        e.wait_complete("ver", LIMIT).await;
        assert_eq!(
            e.read_host_file("v1", "/etc/version").as_deref(),
            Some(format!("{v}\n").as_str()),
            "the host runs {v}"
        );
    }
    assert_eq!(
        e.read_host_file("v1", "/etc/installs").as_deref(),
        Some("1.1.0\n1.0.0\n1.1.0\n")
    );

    // Added, then removed while its apply waits.
    e.patch(
        "ver",
        json!({"spec": {"packages": {"held": {
            "version": "1.0.0", "plugin": e.plugin("shell"),
            "capabilities": commands(&[HOLD]), "configMap": {"apply": HOLD},
            "gracefulShutdown": "2s"
        }}}}),
    )
    .await;
    let held_job = |j: &k8s_openapi::api::batch::v1::Job, stage: &str| {
        let labels = j.metadata.labels.clone().unwrap_or_default();
        labels.get("nodewright.io/package").map(String::as_str) == Some("held")
            && labels.get("nodewright.io/stage").map(String::as_str) == Some(stage)
    };
    e.wait("held's apply Job", LIMIT, || async {
        let (jobs, pods) = e.cr_jobs("ver").await;
        let running = pods.iter().any(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("nodewright.io/package"))
                .map(String::as_str)
                == Some("held")
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        });
        (running && jobs.iter().any(|j| held_job(j, "apply"))).then_some(())
    })
    .await;
    e.patch("ver", json!({"spec": {"packages": {"held": null}}}))
        .await;
    e.wait_complete("ver", LIMIT).await;
    let held = e
        .wait("held's entry settled", LIMIT, || async {
            e.state("ver", "v1")
                .await
                .get("held|1.0.0")
                .filter(|h| h.state != State::InProgress)
                .cloned()
        })
        .await;
    assert_eq!((held.stage, held.state), (Stage::Apply, State::Unknown));
    assert!(
        held.message.contains("left the spec during apply"),
        "{held:?}"
    );
    e.wait("held's Job stopped and gone", LIMIT, || async {
        let (jobs, _) = e.cr_jobs("ver").await;
        (!jobs.iter().any(|j| held_job(j, "apply"))).then_some(())
    })
    .await;
    assert_eq!(e.read_host_file("v1", "/etc/held"), None);
}
