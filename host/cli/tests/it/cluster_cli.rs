//! Every cluster verb of the `nodewright` binary against the local cluster with the real
//! operator rolling out real plugins.

use std::path::Path;

use nodewright_localcluster::{Binaries, Cluster, Operator};
use serde_json::json;

use crate::cluster_verbs;

use cluster_verbs::*;

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
    // The admission webhook too: `preview` is its answer to a dry run.
    let webhook = cluster
        .admission(nodewright_testregistry::free_port())
        .await
        .unwrap();
    let mut flags = vec![
        "--job-backoff-limit=0",
        "--leader-elect",
        // A Lease name of its own: `version` finds the leader by the Lease's label.
        "--lease-name=nw-cli-test",
    ];
    flags.extend(webhook.iter().map(String::as_str));
    let operator = Operator::start(
        &cluster,
        &bins,
        &work.path().join("cache"),
        &work.path().join("operator.log"),
        "info,kube=warn",
        &flags,
    )
    .unwrap();
    let env = Env {
        cluster,
        _operator: operator,
        work,
    };
    wait("the operator's webhook CA", || env.cluster.webhook_ca()).await;
    script(&env, "/usr/local/bin/count", "echo run >> etc/runs");
    env.cluster
        .apply(&shell_cr(&env, "tools", "/usr/local/bin/count", json!({})))
        .await
        .unwrap();
    complete(&env, "tools").await;
    read::verbs(&env).await;
    preview::verbs(&env).await;
    state::verbs(&env).await;
    running::verbs(&env).await;
}
