//! While a stage runs and after failures: refusals, logs of a running stage (and following them), policy reset.

use std::process::Command;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use nodewright_api::v1alpha1::{NodeWright, Status};
use serde_json::json;

use super::*;

pub async fn verbs(env: &Env) {
    // Refusals: a running stage is not reset under the agent's feet.
    script(
        env,
        "/usr/local/bin/slow",
        "while [ ! -f etc/go ]; do sleep 0.2; done",
    );
    env.cluster
        .apply(&shell_cr(env, "slow", "/usr/local/bin/slow", json!({})))
        .await
        .unwrap();
    let err = wait("slow's apply running", || async {
        let (_, _, err) = cli(env, &["node", "reset", "n1", "--cr", "slow", "--confirm"]);
        err.contains("is running on n1").then_some(err)
    })
    .await;
    assert!(err.contains("nodewright pause slow"), "{err}");
    // package logs of a running stage: the pod, and its log as far as it got (read through
    // the apiserver from the node).
    let out = ok(
        env,
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
            env,
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
            .is_some_and(|l| l.contains("\"blame\":\"none\"") && l.contains("\"stage\":\"apply\"")),
        "the agent's result came through the follow:\n{out}"
    );
    assert!(
        lines
            .last()
            .is_some_and(|l| l.ends_with("its container ended")),
        "{out}"
    );
    complete(env, "slow").await;

    // policy reset: a compartment stopped on a failure starts again.
    env.cluster
        .apply(&json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": "one-by-one"},
                       "spec": {"default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1, "safetyLimit": 100}}}}}))
        .await
        .unwrap();
    script(env, "/usr/local/bin/flaky", "test -f etc/fixed");
    env.cluster
        .apply(&shell_cr(
            env,
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
        status(env, "flaky").await,
        Some(Status::Complete),
        "still stopped"
    );
    // reset --skip-batch-reset forgets the nodes' state but not the stopped compartment.
    assert!(ok(env, &["reset", "flaky", "--skip-batch-reset", "-y"]).contains("batches kept"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        stopped().await.is_some(),
        "the compartment is still stopped after reset --skip-batch-reset"
    );
    let out = ok(env, &["policy", "reset", "flaky", "--confirm"]);
    assert!(out.contains("batch state cleared"), "{out}");
    complete(env, "flaky").await;
}
