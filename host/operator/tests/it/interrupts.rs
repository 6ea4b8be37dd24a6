//! End to end: interrupts — a service restart that fails, config interrupts chosen by key
//! pattern and coalesced across packages. Each test names the NodeWright e2e test it mirrors.

use std::time::Duration;

use crate::common;
use crate::specs;

use common::E2e;
use nodewright_api::v1alpha1::Status;
use nodewright_hostops::SimHost;
use serde_json::json;
use specs::*;

/// Mirrors NodeWright's `failing_service_interrupt`: the restart of a unit systemd refuses
/// (here masked, as a removed unit is) fails on every attempt; the node ends `erroring`
/// naming the unit and never reads complete.
#[tokio::test(flavor = "multi_thread")]
async fn a_service_interrupt_that_fails_leaves_the_node_erroring_naming_the_unit() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("s1", &[])]).await;
    e.script(
        "/usr/local/bin/svc-install",
        "mkdir -p etc && touch etc/svc",
    );
    let unit_dir = e.host_path("s1", "/etc/systemd/system");
    std::fs::create_dir_all(&unit_dir).unwrap();
    std::os::unix::fs::symlink("/dev/null", unit_dir.join("gone.service")).unwrap();
    e.start_operator(&["--job-backoff-limit=1"]);
    e.apply(cr(
        "svc",
        json!({"packages": {"svc": {
            "version": "1.0.0", "plugin": e.plugin("shell"),
            "interrupt": {"type": "service", "services": ["gone.service"]},
            "capabilities": commands(&["/usr/local/bin/svc-install"]),
            "configMap": {"apply": "/usr/local/bin/svc-install", "interrupt": "services:gone.service"}
        }}}),
    ))
    .await;
    e.wait("s1 erroring", LIMIT, || async {
        (e.node_status("svc", "s1").await == Some(Status::Erroring)).then_some(())
    })
    .await;
    assert!(e.read_host_file("s1", "/etc/svc").is_some(), "apply ran");
    let (_, _, message) = e.condition("svc", "Ready").await.unwrap();
    assert!(
        message.contains("gone.service") && message.contains("masked"),
        "{message}"
    );
    let attempts = || {
        SimHost::argv_log(&e.sim.root("s1"))
            .iter()
            .filter(|a| a.iter().any(|x| x == "restart") && a.iter().any(|x| x == "gone.service"))
            .count()
    };
    // backoffLimit 1: two attempts that count against it. The Job's podFailurePolicy
    // ignores a pod failure that is not the package's (a DisruptionTarget condition, or an
    // exit code of the host's or a disruption's blame), and such an attempt is retried
    // without counting: once, in a loaded suite, this test saw three attempts. Never fewer
    // than two, and none once the node is parked.
    let parked_after = attempts();
    assert!(
        parked_after >= 2,
        "backoffLimit 1: retried once ({parked_after} attempts)"
    );
    assert_eq!(restarts(&e, "s1", "gone.service"), 0);
    // Parked: later passes neither retry it nor call the node complete.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(attempts(), parked_after, "no attempt once parked");
    assert_eq!(e.node_status("svc", "s1").await, Some(Status::Erroring));
    assert_ne!(
        e.nodewright("svc").await.status.unwrap().status,
        Some(Status::Complete)
    );
}

/// Mirrors NodeWright's `config-skyhook`: a changed key runs the config interrupt whose
/// `*` pattern matches it (and none for a key no pattern matches); two packages whose config
/// interrupts restart the same unit, changed in one edit, restart it once.
#[tokio::test(flavor = "multi_thread")]
async fn config_interrupts_match_by_pattern_and_coalesce_across_packages() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("c1", &[])]).await;
    e.script(
        "/usr/local/bin/cfg-install",
        "mkdir -p etc && touch etc/cfg",
    );
    e.script("/usr/local/bin/cfg-config", "echo \"$1\" >> etc/configs");
    e.start_operator(&[]);
    let package = |name: &str, key: &str| {
        json!({
            "version": "1.0.0", "plugin": e.plugin("shell"),
            "capabilities": commands(&["/usr/local/bin/cfg-install", "/usr/local/bin/cfg-config"]),
            "configMap": {
                "apply": "/usr/local/bin/cfg-install",
                "config": format!("/usr/local/bin/cfg-config {name}"),
                key: "1", "motd": "hello"
            },
            "configInterrupts": {"mode-*": {"type": "service", "services": ["shared.service"]}}
        })
    };
    e.apply(cr(
        "cfg",
        json!({"packages": {"a": package("a", "mode-x"), "b": package("b", "mode-y")}}),
    ))
    .await;
    e.wait_complete("cfg", LIMIT).await;
    let configs = |e: &E2e| {
        e.read_host_file("c1", "/etc/configs")
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let installed = configs(&e).len();
    assert_eq!(restarts(&e, "c1", "shared.service"), 0);

    // A key no pattern matches: config runs, nothing restarts.
    e.patch(
        "cfg",
        json!({"spec": {"packages": {"a": {"configMap": {"motd": "bye"}}}}}),
    )
    .await;
    e.wait_complete("cfg", LIMIT).await;
    assert_eq!(configs(&e)[installed..], ["a"]);
    assert_eq!(restarts(&e, "c1", "shared.service"), 0);

    // Both packages' matching keys in one edit: each config runs, the unit restarts once.
    e.patch(
        "cfg",
        json!({"spec": {"packages": {"a": {"configMap": {"mode-x": "2"}}, "b": {"configMap": {"mode-y": "2"}}}}}),
    )
    .await;
    e.wait_complete("cfg", LIMIT).await;
    let mut ran = configs(&e)[installed + 1..].to_vec();
    ran.sort();
    assert_eq!(ran, ["a", "b"]);
    assert_eq!(
        restarts(&e, "c1", "shared.service"),
        1,
        "{:?}",
        e.journal("c1")
    );
    let st = e.state("cfg", "c1").await;
    assert_eq!(st["a|1.0.0"].changed_keys, ["mode-x"]);
    assert_eq!(st["b|1.0.0"].changed_keys, ["mode-y"]);
}
