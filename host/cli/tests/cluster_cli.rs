//! Every cluster verb of the `nodewright` binary against the local cluster with the real
//! operator rolling out real plugins.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use nodewright_api::keys;
use nodewright_api::node_state::NodeState;
use nodewright_api::v1alpha1::{NodeWright, Status};
use nodewright_hostops::{HostAction, SimHost};
use nodewright_localcluster::{Binaries, Cluster, Operator};
use serde_json::{Value, json};

struct Env {
    cluster: Cluster,
    _operator: Operator,
    work: tempfile::TempDir,
}

/// Runs `nodewright args…` against the cluster: (success, stdout, stderr).
fn cli(env: &Env, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nodewright"))
        .args(args)
        .env("KUBECONFIG", env.cluster.cp.kubeconfig())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(env: &Env, args: &[&str]) -> String {
    let (success, out, err) = cli(env, args);
    assert!(
        success,
        "nodewright {args:?} failed\n{out}\n{err}\n--- operator log ---\n{}",
        std::fs::read_to_string(env.work.path().join("operator.log")).unwrap_or_default()
    );
    out
}

fn refused(env: &Env, args: &[&str]) -> String {
    let (success, out, err) = cli(env, args);
    assert!(
        !success,
        "nodewright {args:?} should have been refused\n{out}"
    );
    err
}

async fn wait<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    nodewright_localcluster::poll(Duration::from_secs(180), check)
        .await
        .unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// `node update-state n1` on tools' `tool` entry of `version`.
fn update_state<'a>(
    version: &'a str,
    stage: &'a str,
    state: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "node",
        "update-state",
        "n1",
        "--cr",
        "tools",
        "--package",
        "tool",
        "--version",
        version,
        "--stage",
        stage,
        "--state",
        state,
    ];
    args.extend_from_slice(extra);
    args
}

async fn status(env: &Env, cr: &str) -> Option<Status> {
    Api::<NodeWright>::all(env.cluster.client.clone())
        .get(cr)
        .await
        .ok()?
        .status?
        .status
}

async fn complete(env: &Env, cr: &str) {
    wait(&format!("{cr} complete"), || async {
        (status(env, cr).await == Some(Status::Complete)).then_some(())
    })
    .await;
}

fn runs(env: &Env, node: &str) -> usize {
    lines(env, node, "/etc/runs")
}

fn lines(env: &Env, node: &str, path: &str) -> usize {
    std::fs::read_to_string(env.cluster.host_path(node, path))
        .unwrap_or_default()
        .lines()
        .count()
}

fn reboots(env: &Env, node: &str) -> usize {
    SimHost::journal(&env.cluster.sim.root(node))
        .iter()
        .filter(|a| matches!(a, HostAction::RebootRequested { .. }))
        .count()
}

fn script(env: &Env, path: &str, body: &str) {
    for n in &env.cluster.nodes {
        let local = env.cluster.host_path(n, path);
        std::fs::create_dir_all(local.parent().unwrap()).unwrap();
        std::fs::write(&local, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&local, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
}

fn shell_cr(env: &Env, name: &str, command: &str, extra: Value) -> Value {
    let mut spec = json!({"packages": {"tool": {
        "version": "1.0.0", "plugin": env.cluster.plugin("shell"),
        "capabilities": {"commands": [{"path": command}]},
        "configMap": {"apply": command}
    }}});
    if let (Some(s), Value::Object(extra)) = (spec.as_object_mut(), extra) {
        s.extend(extra);
    }
    json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": name}, "spec": spec})
}

#[tokio::test(flavor = "multi_thread")]
async fn every_cluster_verb_works_against_a_live_rollout() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let work = tempfile::tempdir().unwrap();
    let nodes: Vec<(String, Vec<(String, String)>)> = ["n1", "n2"]
        .iter()
        .map(|n| (n.to_string(), vec![]))
        .collect();
    let cluster = Cluster::start(work.path(), &nodes).await.unwrap();
    let bins = Binaries::in_dir(
        Path::new(env!("CARGO_BIN_EXE_nodewright"))
            .parent()
            .unwrap(),
    )
    .unwrap();
    let operator = Operator::start(
        &cluster,
        &bins,
        &work.path().join("cache"),
        &work.path().join("operator.log"),
        "info,kube=warn",
        &["--job-backoff-limit=0", "--leader-elect"],
    )
    .unwrap();
    let env = Env {
        cluster,
        _operator: operator,
        work,
    };
    script(&env, "/usr/local/bin/count", "echo run >> etc/runs");
    env.cluster
        .apply(&shell_cr(&env, "tools", "/usr/local/bin/count", json!({})))
        .await
        .unwrap();
    complete(&env, "tools").await;

    // status: the overview, one NodeWright per node, JSON.
    let out = ok(&env, &["status"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("tools") && l.contains("complete") && l.contains("2/2")),
        "{out}"
    );
    let out = ok(&env, &["status", "tools"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("n1") && l.contains("config/complete")),
        "{out}"
    );
    let v: Value = serde_json::from_str(&ok(&env, &["status", "tools", "-o", "json"])).unwrap();
    assert_eq!(v["summary"]["status"], "complete");
    assert_eq!(v["nodes"].as_array().unwrap().len(), 2);
    assert!(refused(&env, &["status", "nope"]).contains("NodeWright \"nope\" not found"));

    // The other output forms: YAML for scripts, wide with generations and packages.
    let y = ok(&env, &["status", "tools", "-o", "yaml"]);
    assert!(
        y.contains("status: complete") && y.contains("node: n1"),
        "{y}"
    );
    let w = ok(&env, &["status", "-o", "wide"]);
    assert!(
        w.lines().next().unwrap().contains("OBSERVED/GEN")
            && w.lines()
                .any(|l| l.starts_with("tools") && l.contains("1/1") && l.contains("tool:1.0.0")),
        "{w}"
    );

    // The same binary as a kubectl plugin, found by kubectl on the PATH.
    let kubectl = nodewright_testcluster::ktest_binary().unwrap();
    let plugin_dir = Path::new(env!("CARGO_BIN_EXE_kubectl-nodewright"))
        .parent()
        .unwrap();
    let out = Command::new(&kubectl)
        .args(["kubectl", "nodewright", "status", "tools"])
        .env("KUBECONFIG", env.cluster.cp.kubeconfig())
        .env(
            "PATH",
            format!(
                "{}:{}",
                plugin_dir.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && stdout
                .lines()
                .any(|l| l.starts_with("n1") && l.contains("config/complete")),
        "kubectl nodewright status tools:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let help = Command::new(env!("CARGO_BIN_EXE_kubectl-nodewright"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("Usage: kubectl nodewright"),
        "help names the kubectl form"
    );

    // version: the CLI, the cluster, the served API, the operator's Deployment (a
    // zero-replica stand-in here: the operator runs as a local process) and its leader.
    assert_eq!(
        ok(&env, &["version", "--client-only"]).trim(),
        format!("client:   nodewright {}", env!("CARGO_PKG_VERSION"))
    );
    env.cluster
        .apply(&json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "nodewright-operator", "namespace": "nodewright", "labels": {"app.kubernetes.io/name": "nodewright"}},
                       "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "op"}},
                                "template": {"metadata": {"labels": {"app": "op"}}, "spec": {"containers": [{"name": "operator", "image": "registry.example/nodewright-operator:0.1.0"}]}}}}))
        .await
        .unwrap();
    let out = ok(&env, &["version"]);
    for want in [
        "server:   Kubernetes v1.36.3",
        "api:      nodewrights.nodewright.io v1alpha1 (storage)",
        "api:      deploymentpolicies.nodewright.io v1alpha1 (storage)",
        "operator: nodewright-operator registry.example/nodewright-operator:0.1.0 (0/0 ready)",
    ] {
        assert!(out.lines().any(|l| l == want), "{want:?} in\n{out}");
    }
    assert!(
        out.lines()
            .any(|l| l.starts_with("leader:   ") && !l.contains("no Lease")),
        "the operator's Lease holder:\n{out}"
    );

    // node list / status.
    let v: Value = serde_json::from_str(&ok(&env, &["node", "list", "-o", "json"])).unwrap();
    let row = |v: &Value, n: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|r| r["node"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(row(&v, "n1")["nodewrights"]["tools"], "complete");
    assert_eq!(row(&v, "n1")["ignored"], false);
    let w = ok(&env, &["node", "list", "-o", "wide"]);
    let boot = Api::<Node>::all(env.cluster.client.clone())
        .get("n1")
        .await
        .unwrap()
        .status
        .unwrap()
        .node_info
        .unwrap()
        .boot_id;
    assert!(
        w.lines().any(|l| l.starts_with("n1")
            && l.contains("True")
            && l.contains(&boot)
            && l.contains("complete")),
        "{w}"
    );
    let out = ok(&env, &["node", "status", "n2"]);
    assert!(
        out.lines().any(|l| l.starts_with("tools")
            && l.contains("n2")
            && l.contains("tool")
            && l.contains("complete")),
        "{out}"
    );

    // package status / logs.
    let v: Value = serde_json::from_str(&ok(
        &env,
        &["package", "status", "tools", "tool", "-o", "json"],
    ))
    .unwrap();
    assert_eq!(
        v.as_array()
            .unwrap()
            .iter()
            .filter(|r| r["state"] == "complete")
            .count(),
        2,
        "{v}"
    );
    assert!(refused(&env, &["package", "status", "tools", "nope"]).contains("it has: tool"));
    let out = ok(&env, &["package", "logs", "tools", "tool", "--node", "n1"]);
    assert!(out.contains("config/complete"), "{out}");

    // package rerun: refused without --confirm (no terminal), then reruns only where asked.
    assert!(
        refused(&env, &["package", "rerun", "tools", "tool", "--node", "n1"])
            .contains("without --confirm")
    );
    assert_eq!((runs(&env, "n1"), runs(&env, "n2")), (1, 1));
    ok(
        &env,
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
        (runs(&env, "n1") == 2).then_some(())
    })
    .await;
    complete(&env, "tools").await;
    assert_eq!(runs(&env, "n2"), 1, "n2 untouched");

    // package rerun --stage: a package without an interrupt has no interrupt stage.
    assert!(
        refused(
            &env,
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
    ok(&env, &["node", "reset", "n2", "--cr", "tools", "--confirm"]);
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
        (runs(&env, "n2") == 2).then_some(())
    })
    .await;
    complete(&env, "tools").await;

    // reset the whole NodeWright.
    ok(&env, &["reset", "tools", "--confirm"]);
    wait("both ran again", || async {
        (runs(&env, "n1") == 3 && runs(&env, "n2") == 3).then_some(())
    })
    .await;
    complete(&env, "tools").await;
    // reset --package: one package's entries only (as NodeWright's).
    assert!(refused(&env, &["reset", "tools", "--package", "nope", "-y"]).contains("it has: tool"));
    assert!(
        ok(&env, &["reset", "tools", "--package", "tool", "-y"])
            .contains("tools/tool's state removed from 2 node(s), batches kept")
    );
    wait("both ran again", || async {
        (runs(&env, "n1") == 4 && runs(&env, "n2") == 4).then_some(())
    })
    .await;
    complete(&env, "tools").await;

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
    let out = ok(&env, &["--dry-run", "pause", "tools"]);
    assert!(out.starts_with("(dry run) tools: paused"), "{out}");
    assert!(
        annotations().await.is_empty(),
        "a dry run persisted nothing"
    );
    let before = (runs(&env, "n1"), runs(&env, "n2"));
    let out = ok(&env, &["--dry-run", "reset", "tools"]);
    assert!(
        out.contains("(dry run) tools's state removed from 2 node(s), batches restarted"),
        "{out}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        (runs(&env, "n1"), runs(&env, "n2")),
        before,
        "the dry-run reset ran nothing again"
    );

    // Each asks first, as NodeWright's do: refused without --confirm/-y when nobody can answer.
    for verb in ["pause", "disable"] {
        assert!(
            refused(&env, &[verb, "tools"]).contains("without --confirm"),
            "{verb}"
        );
    }
    assert!(
        annotations().await.is_empty(),
        "a refused verb wrote nothing"
    );
    assert!(
        ok(&env, &["resume", "tools"]).contains("already resumed"),
        "nothing to do, nothing asked"
    );
    ok(&env, &["pause", "tools", "--confirm"]);
    assert_eq!(
        annotations().await.get(keys::PAUSE).map(String::as_str),
        Some("true")
    );
    assert!(
        ok(&env, &["status"])
            .lines()
            .any(|l| l.starts_with("tools") && l.contains("paused"))
    );
    assert!(refused(&env, &["resume", "tools"]).contains("without --confirm"));
    ok(&env, &["resume", "tools", "-y"]);
    assert!(!annotations().await.contains_key(keys::PAUSE));
    ok(&env, &["disable", "tools", "-y"]);
    assert_eq!(
        annotations().await.get(keys::DISABLE).map(String::as_str),
        Some("true")
    );
    wait("tools disabled", || async {
        (status(&env, "tools").await == Some(Status::Disabled)).then_some(())
    })
    .await;
    assert!(refused(&env, &["enable", "tools"]).contains("without --confirm"));
    ok(&env, &["enable", "tools", "-y"]);
    assert!(!annotations().await.contains_key(keys::DISABLE));
    complete(&env, "tools").await;

    // node ignore / unignore.
    ok(&env, &["node", "ignore", "n1"]);
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
    let v: Value = serde_json::from_str(&ok(&env, &["node", "list", "-o", "json"])).unwrap();
    assert_eq!(row(&v, "n1")["ignored"], true);
    ok(&env, &["node", "unignore", "n1"]);
    assert_eq!(label().await, None);
    // Node arguments are names or regular expressions over whole names.
    assert!(ok(&env, &["node", "ignore", "n[0-9]"]).lines().count() == 2);
    let v: Value = serde_json::from_str(&ok(&env, &["node", "list", "-o", "json"])).unwrap();
    assert_eq!(
        (
            row(&v, "n1")["ignored"].clone(),
            row(&v, "n2")["ignored"].clone()
        ),
        (json!(true), json!(true))
    );
    ok(&env, &["node", "unignore", "n.*"]);
    let v: Value = serde_json::from_str(&ok(&env, &["node", "list", "-o", "json"])).unwrap();
    assert_eq!(
        (
            row(&v, "n1")["ignored"].clone(),
            row(&v, "n2")["ignored"].clone()
        ),
        (json!(false), json!(false))
    );
    let v: Value =
        serde_json::from_str(&ok(&env, &["node", "status", "n.*", "-o", "json"])).unwrap();
    assert_eq!(
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| r["node"].as_str().unwrap())
            .collect::<std::collections::BTreeSet<_>>(),
        ["n1", "n2"].into()
    );
    assert!(
        refused(&env, &["node", "reset", "n9", "--cr", "tools", "-y"])
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
        refused(
            &env,
            &update_state("1.0.0", "sideways", "complete", &["-y"])
        )
        .contains("--stage \"sideways\" is not one of")
    );
    assert!(
        refused(&env, &update_state("1.0.0", "apply", "erroring", &[]))
            .contains("without --confirm")
    );
    assert!(
        refused(&env, &update_state("2.0.0", "apply", "complete", &["-y"]))
            .contains("--add creates it")
    );
    ok(&env, &["pause", "tools", "-y"]);
    let out = ok(
        &env,
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
    ok(&env, &update_state("1.0.0", "apply", "erroring", &["-y"]));
    assert_eq!(entry().await, "apply/erroring");
    ok(&env, &["resume", "tools", "-y"]);
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
    ok(&env, &["pause", "tools", "-y"]);
    ok(&env, &update_state("1.0.0", "config", "complete", &["-y"]));
    ok(&env, &["resume", "tools", "-y"]);
    complete(&env, "tools").await;
    assert_eq!(entry().await, "config/complete");

    // package rerun --stage on a reboot package: from config, apply is not run again (the
    // interrupt follows config as always); from the interrupt, only the reboot (with its
    // cordon) and post-interrupt run.
    script(&env, "/usr/local/bin/st-apply", "echo a >> etc/st-apply");
    script(&env, "/usr/local/bin/st-config", "echo c >> etc/st-config");
    let drv = json!({
        "version": "1.0.0", "plugin": env.cluster.plugin("shell"), "interrupt": {"type": "reboot"},
        "capabilities": {"commands": [{"path": "/usr/local/bin/st-apply"}, {"path": "/usr/local/bin/st-config"}]},
        "configMap": {"apply": "/usr/local/bin/st-apply", "config": "/usr/local/bin/st-config", "interrupt": "reboot"}
    });
    env.cluster.apply(&json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": "staged"}, "spec": {"packages": {"drv": drv}}})).await.unwrap();
    complete(&env, "staged").await;
    let counts = |n: &str| {
        (
            lines(&env, n, "/etc/st-apply"),
            lines(&env, n, "/etc/st-config"),
            reboots(&env, n),
        )
    };
    assert_eq!((counts("n1"), counts("n2")), ((1, 1, 1), (1, 1, 1)));
    ok(
        &env,
        &[
            "package", "rerun", "staged", "drv", "--node", "n1", "--stage", "config", "-y",
        ],
    );
    wait("n1 configured again", || async {
        (counts("n1") == (1, 2, 2)).then_some(())
    })
    .await;
    complete(&env, "staged").await;
    ok(
        &env,
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
        (reboots(&env, "n2") == 2).then_some(())
    })
    .await;
    complete(&env, "staged").await;
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

    // Refusals: a running stage is not reset under the agent's feet.
    script(
        &env,
        "/usr/local/bin/slow",
        "while [ ! -f etc/go ]; do sleep 0.2; done",
    );
    env.cluster
        .apply(&shell_cr(&env, "slow", "/usr/local/bin/slow", json!({})))
        .await
        .unwrap();
    let err = wait("slow's apply running", || async {
        let (_, _, err) = cli(&env, &["node", "reset", "n1", "--cr", "slow", "--confirm"]);
        err.contains("is running on n1").then_some(err)
    })
    .await;
    assert!(err.contains("nodewright pause slow"), "{err}");
    // package logs of a running stage: the pod, and its log as far as it got (read through
    // the apiserver from the node).
    let out = ok(
        &env,
        &[
            "package", "logs", "slow", "tool", "--node", "n1", "--stage", "apply",
        ],
    );
    assert!(
        out.contains(": running")
            && out.contains("   | nodewright-agent: apply of tool 1.0.0 on n1"),
        "{out}"
    );
    assert!(
        !ok(
            &env,
            &[
                "package", "logs", "slow", "tool", "--node", "n1", "--stage", "config"
            ]
        )
        .contains("=="),
        "no config pod yet"
    );
    // -f follows the running pod until its container ends: released, the agent finishes
    // and its result is the log's last line.
    let mut follower = Command::new(env!("CARGO_BIN_EXE_nodewright"))
        .args([
            "package", "logs", "slow", "tool", "--node", "n1", "--stage", "apply", "-f",
        ])
        .env("KUBECONFIG", env.cluster.cp.kubeconfig())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Released only once the follower is on the running pod (its header printed).
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let stdout = follower.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines: Vec<String> = Vec::new();
    let header = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(l) = rx.recv().await {
            lines.push(l);
            if lines.last().is_some_and(|l| l.ends_with(": running")) {
                return true;
            }
        }
        false
    });
    assert!(
        header.await.unwrap_or(false),
        "the follower found the running pod: {lines:?}"
    );
    for n in ["n1", "n2"] {
        std::fs::write(env.cluster.host_path(n, "/etc/go"), "").unwrap();
    }
    tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(l) = rx.recv().await {
            lines.push(l);
        }
    })
    .await
    .expect("the follow ends with the pod");
    let exit = follower.wait().unwrap();
    let out = lines.join("\n");
    assert!(exit.success(), "{out}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("nodewright-agent: apply of tool")),
        "{out}"
    );
    assert!(
        lines
            .iter()
            .rev()
            .nth(1)
            .is_some_and(|l| l.contains("\"outcome\":\"ok\"") && l.contains("\"stage\":\"apply\"")),
        "the agent's result came through the follow:\n{out}"
    );
    assert!(
        lines
            .last()
            .is_some_and(|l| l.ends_with("its container ended")),
        "{out}"
    );
    complete(&env, "slow").await;

    // policy reset: a compartment stopped on a failure starts again.
    env.cluster
        .apply(&json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": "one-by-one"},
                       "spec": {"default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1, "safetyLimit": 100}}}}}))
        .await
        .unwrap();
    script(&env, "/usr/local/bin/flaky", "test -f etc/fixed");
    env.cluster
        .apply(&shell_cr(
            &env,
            "flaky",
            "/usr/local/bin/flaky",
            json!({"deploymentPolicy": "one-by-one"}),
        ))
        .await
        .unwrap();
    let stopped = || async {
        let st = Api::<NodeWright>::all(env.cluster.client.clone())
            .get("flaky")
            .await
            .ok()?
            .status?;
        st.compartment_statuses
            .values()
            .any(|c| c.batch_state.as_ref().is_some_and(|b| b.should_stop))
            .then_some(())
    };
    wait("the compartment stops on the failure", stopped).await;
    for n in ["n1", "n2"] {
        std::fs::write(env.cluster.host_path(n, "/etc/fixed"), "").unwrap();
    }
    // A new generation re-arms the failed node, but the stopped compartment holds the rest.
    Api::<NodeWright>::all(env.cluster.client.clone())
        .patch(
            "flaky",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"priority": 150}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_ne!(
        status(&env, "flaky").await,
        Some(Status::Complete),
        "still stopped"
    );
    // reset --skip-batch-reset forgets the nodes' state but not the stopped compartment.
    assert!(ok(&env, &["reset", "flaky", "--skip-batch-reset", "-y"]).contains("batches kept"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        stopped().await.is_some(),
        "the compartment is still stopped after reset --skip-batch-reset"
    );
    let out = ok(&env, &["policy", "reset", "flaky", "--confirm"]);
    assert!(out.contains("batch state cleared"), "{out}");
    complete(&env, "flaky").await;
}
