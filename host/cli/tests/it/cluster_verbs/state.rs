//! Changing state: reruns, resets, pause/resume/disable/enable, dry runs, confirmation, ignore, node patterns, update-state.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use nodewright_api::keys;
use nodewright_api::node_state::NodeState;
use nodewright_api::v1alpha1::{NodeWright, Status};
use serde_json::{Value, json};

use super::*;

pub async fn verbs(env: &Env) {
    // package rerun: refused without --confirm (no terminal), then reruns only where asked.
    assert!(
        refused(env, &["package", "rerun", "tools", "tool", "--node", "n1"])
            .contains("without --confirm")
    );
    assert_eq!((runs(env, "n1"), runs(env, "n2")), (1, 1));
    ok(
        env,
        &[
            "package",
            "rerun",
            "tools",
            "tool",
            "--node",
            "n1",
            "--confirm",
        ],
    );
    wait("n1 ran again", || async {
        (runs(env, "n1") == 2).then_some(())
    })
    .await;
    complete(env, "tools").await;
    assert_eq!(runs(env, "n2"), 1, "n2 untouched");

    // package rerun --stage: a package without an interrupt has no interrupt stage.
    assert!(
        refused(
            env,
            &[
                "package",
                "rerun",
                "tools",
                "tool",
                "--node",
                "n1",
                "--stage",
                "interrupt",
                "-y"
            ]
        )
        .contains("has no interrupt")
    );

    // node reset (which also restarts a drain clock, e.g. after a drain timeout).
    Api::<Node>::all(env.cluster.client.clone())
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {keys::drain_start("tools"): "1"}}})),
        )
        .await
        .unwrap();
    ok(env, &["node", "reset", "n2", "--cr", "tools", "--confirm"]);
    let n2 = Api::<Node>::all(env.cluster.client.clone())
        .get("n2")
        .await
        .unwrap();
    assert!(
        !n2.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(&keys::drain_start("tools")),
        "the drain clock was reset"
    );
    wait("n2 ran again", || async {
        (runs(env, "n2") == 2).then_some(())
    })
    .await;
    complete(env, "tools").await;

    // reset the whole NodeWright.
    ok(env, &["reset", "tools", "--confirm"]);
    wait("both ran again", || async {
        (runs(env, "n1") == 3 && runs(env, "n2") == 3).then_some(())
    })
    .await;
    complete(env, "tools").await;
    // reset --package: one package's entries only (as NodeWright's).
    assert!(refused(env, &["reset", "tools", "--package", "nope", "-y"]).contains("it has: tool"));
    assert!(
        ok(env, &["reset", "tools", "--package", "tool", "-y"])
            .contains("tools/tool's state removed from 2 node(s), batches kept")
    );
    wait("both ran again", || async {
        (runs(env, "n1") == 4 && runs(env, "n2") == 4).then_some(())
    })
    .await;
    complete(env, "tools").await;

    // pause / resume / disable / enable are the CR's annotations; status shows them.
    let annotations = || async {
        Api::<NodeWright>::all(env.cluster.client.clone())
            .get("tools")
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()
    };
    // --dry-run: every write a server-side dry run — nothing asked, nothing persisted.
    let out = ok(env, &["--dry-run", "pause", "tools"]);
    assert!(out.starts_with("(dry run) tools: paused"), "{out}");
    assert!(
        annotations().await.is_empty(),
        "a dry run persisted nothing"
    );
    let before = (runs(env, "n1"), runs(env, "n2"));
    let out = ok(env, &["--dry-run", "reset", "tools"]);
    assert!(
        out.contains("(dry run) tools's state removed from 2 node(s), batches restarted"),
        "{out}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        (runs(env, "n1"), runs(env, "n2")),
        before,
        "the dry-run reset ran nothing again"
    );

    // Each asks first, as NodeWright's do: refused without --confirm/-y when nobody can answer.
    for verb in ["pause", "disable"] {
        assert!(
            refused(env, &[verb, "tools"]).contains("without --confirm"),
            "{verb}"
        );
    }
    assert!(
        annotations().await.is_empty(),
        "a refused verb wrote nothing"
    );
    assert!(
        ok(env, &["resume", "tools"]).contains("already resumed"),
        "nothing to do, nothing asked"
    );
    ok(env, &["pause", "tools", "--confirm"]);
    assert_eq!(
        annotations().await.get(keys::PAUSE).map(String::as_str),
        Some("true")
    );
    assert!(
        ok(env, &["status"])
            .lines()
            .any(|l| l.starts_with("tools") && l.contains("paused"))
    );
    assert!(refused(env, &["resume", "tools"]).contains("without --confirm"));
    ok(env, &["resume", "tools", "-y"]);
    assert!(!annotations().await.contains_key(keys::PAUSE));
    ok(env, &["disable", "tools", "-y"]);
    assert_eq!(
        annotations().await.get(keys::DISABLE).map(String::as_str),
        Some("true")
    );
    wait("tools disabled", || async {
        (status(env, "tools").await == Some(Status::Disabled)).then_some(())
    })
    .await;
    assert!(refused(env, &["enable", "tools"]).contains("without --confirm"));
    ok(env, &["enable", "tools", "-y"]);
    assert!(!annotations().await.contains_key(keys::DISABLE));
    complete(env, "tools").await;

    // node ignore / unignore.
    ok(env, &["node", "ignore", "n1"]);
    let label = || async {
        Api::<Node>::all(env.cluster.client.clone())
            .get("n1")
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap_or_default()
            .get(keys::IGNORE)
            .cloned()
    };
    assert_eq!(label().await.as_deref(), Some("true"));
    let v: Value = serde_json::from_str(&ok(env, &["node", "list", "-o", "json"])).unwrap();
    assert_eq!(row(&v, "n1")["ignored"], true);
    ok(env, &["node", "unignore", "n1"]);
    assert_eq!(label().await, None);
    // Node arguments are names or regular expressions over whole names.
    assert!(ok(env, &["node", "ignore", "n[0-9]"]).lines().count() == 2);
    let v: Value = serde_json::from_str(&ok(env, &["node", "list", "-o", "json"])).unwrap();
    assert_eq!(
        (
            row(&v, "n1")["ignored"].clone(),
            row(&v, "n2")["ignored"].clone()
        ),
        (json!(true), json!(true))
    );
    ok(env, &["node", "unignore", "n.*"]);
    let v: Value = serde_json::from_str(&ok(env, &["node", "list", "-o", "json"])).unwrap();
    assert_eq!(
        (
            row(&v, "n1")["ignored"].clone(),
            row(&v, "n2")["ignored"].clone()
        ),
        (json!(false), json!(false))
    );
    let v: Value =
        serde_json::from_str(&ok(env, &["node", "status", "n.*", "-o", "json"])).unwrap();
    assert_eq!(
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| r["node"].as_str().unwrap())
            .collect::<std::collections::BTreeSet<_>>(),
        ["n1", "n2"].into()
    );
    assert!(
        refused(env, &["node", "reset", "n9", "--cr", "tools", "-y"])
            .contains("no node matches \"n9\"")
    );

    // node update-state: one entry edited by hand (paused first), honoured by the operator,
    // then put back.
    let entry = || async {
        let n = Api::<Node>::all(env.cluster.client.clone())
            .get("n1")
            .await
            .unwrap();
        let st: NodeState =
            serde_json::from_str(&n.metadata.annotations.unwrap()[&keys::node_state("tools")])
                .unwrap();
        let e = &st["tool|1.0.0"];
        format!("{}/{}", e.stage.as_str(), e.state.as_str())
    };
    assert!(
        refused(env, &update_state("1.0.0", "sideways", "complete", &["-y"]))
            .contains("--stage \"sideways\" is not one of")
    );
    assert!(
        refused(env, &update_state("1.0.0", "apply", "erroring", &[]))
            .contains("without --confirm")
    );
    assert!(
        refused(env, &update_state("2.0.0", "apply", "complete", &["-y"]))
            .contains("--add creates it")
    );
    ok(env, &["pause", "tools", "-y"]);
    let out = ok(
        env,
        &[
            &["--dry-run"][..],
            &update_state("1.0.0", "apply", "erroring", &[]),
        ]
        .concat(),
    );
    assert!(
        out.contains("(dry run) n1: tools's tool 1.0.0 set to apply/erroring"),
        "{out}"
    );
    assert_eq!(
        entry().await,
        "config/complete",
        "the dry run wrote nothing"
    );
    ok(env, &update_state("1.0.0", "apply", "erroring", &["-y"]));
    assert_eq!(entry().await, "apply/erroring");
    ok(env, &["resume", "tools", "-y"]);
    let n1_status = || async {
        Api::<NodeWright>::all(env.cluster.client.clone())
            .get("tools")
            .await
            .ok()?
            .status?
            .node_status
            .get("n1")
            .copied()
    };
    wait("n1 erroring after the edit", || async {
        (n1_status().await == Some(Status::Erroring)).then_some(())
    })
    .await;
    ok(env, &["pause", "tools", "-y"]);
    ok(env, &update_state("1.0.0", "config", "complete", &["-y"]));
    ok(env, &["resume", "tools", "-y"]);
    complete(env, "tools").await;
    assert_eq!(entry().await, "config/complete");

    // package rerun --stage on a reboot package: from config, apply is not run again (the
    // interrupt follows config as always); from the interrupt, only the reboot (with its
    // cordon) and post-interrupt run.
    script(env, "/usr/local/bin/st-apply", "echo a >> etc/st-apply");
    script(env, "/usr/local/bin/st-config", "echo c >> etc/st-config");
    let drv = json!({
        "version": "1.0.0", "plugin": env.cluster.plugin("shell"), "interrupt": {"type": "reboot"},
        "capabilities": {"commands": [{"path": "/usr/local/bin/st-apply"}, {"path": "/usr/local/bin/st-config"}]},
        "configMap": {"apply": "/usr/local/bin/st-apply", "config": "/usr/local/bin/st-config", "interrupt": "reboot"}
    });
    env.cluster.apply(&json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": "staged"}, "spec": {"packages": {"drv": drv}}})).await.unwrap();
    complete(env, "staged").await;
    let counts = |n: &str| {
        (
            lines(env, n, "/etc/st-apply"),
            lines(env, n, "/etc/st-config"),
            reboots(env, n),
        )
    };
    assert_eq!((counts("n1"), counts("n2")), ((1, 1, 1), (1, 1, 1)));
    ok(
        env,
        &[
            "package", "rerun", "staged", "drv", "--node", "n1", "--stage", "config", "-y",
        ],
    );
    wait("n1 configured again", || async {
        (counts("n1") == (1, 2, 2)).then_some(())
    })
    .await;
    complete(env, "staged").await;
    ok(
        env,
        &[
            "package",
            "rerun",
            "staged",
            "drv",
            "--node",
            "n2",
            "--stage",
            "interrupt",
            "-y",
        ],
    );
    wait("n2 rebooted again", || async {
        (reboots(env, "n2") == 2).then_some(())
    })
    .await;
    complete(env, "staged").await;
    assert_eq!(
        (counts("n1"), counts("n2")),
        ((1, 2, 2), (1, 1, 2)),
        "only the asked stages ran"
    );
    let nodes_now = Api::<Node>::all(env.cluster.client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    assert!(
        nodes_now.iter().all(|n| !n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)),
        "uncordoned after the reruns"
    );
}
