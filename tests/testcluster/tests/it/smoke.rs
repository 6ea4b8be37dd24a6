//! The control plane and simulated nodes behave like Kubernetes: Jobs run real commands
//! and complete, retries follow backoffLimit and podFailurePolicy, PDBs refuse evictions,
//! cordons patch, reboots change the boot ID and restart OnFailure pods, and pod logs are
//! served through the apiserver.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams, PostParams};
use nodewright_testcluster::{ControlPlane, NodeSpec, SimKubelet};
use serde_json::json;

async fn setup(test: &str, nodes: &[&str]) -> (Client, SimKubelet, tempfile::TempDir) {
    let cp = ControlPlane::shared();
    let client = cp.client().await.expect("client");
    let ns: Api<Namespace> = Api::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": test}})).unwrap(),
    )
    .await
    .expect("namespace");
    let roots = tempfile::tempdir().unwrap();
    let specs = nodes
        .iter()
        .map(|n| NodeSpec::new(&format!("{test}-{n}"), roots.path()))
        .collect();
    let sim = SimKubelet::start(client.clone(), specs)
        .await
        .expect("sim kubelet");
    (client, sim, roots)
}

async fn wait_until<T, F: Future<Output = Option<T>>>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> F,
) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if start.elapsed() > timeout {
            panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                ControlPlane::shared().logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn job(name: &str, node: &str, script: &str, extra: serde_json::Value) -> Job {
    let mut spec = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {
                "nodeName": node,
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "nodewright/agent:test", "command": ["/bin/sh", "-c", script]}]
            }}
        }
    });
    if let (Some(s), Some(e)) = (spec["spec"].as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(spec).unwrap()
}

async fn job_condition(jobs: &Api<Job>, name: &str) -> Option<(String, String)> {
    let j = jobs.get(name).await.ok()?;
    j.status?
        .conditions?
        .into_iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .map(|c| (c.type_, c.reason.unwrap_or_default()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_runs_its_command_on_the_simulated_node_and_completes() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let (client, sim, _roots) = setup("smoke-complete", &["n1"]).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "smoke-complete");
    let node = "smoke-complete-n1";
    jobs.create(
        &PostParams::default(),
        &job(
            "hello",
            node,
            "echo hi > \"$NODEWRIGHT_SIM_ROOT/hello\"; printf done > /dev/termination-log",
            json!({}),
        ),
    )
    .await
    .unwrap();
    let (cond, _) = wait_until("job completion", Duration::from_secs(60), || {
        job_condition(&jobs, "hello")
    })
    .await;
    assert_eq!(cond, "Complete");
    assert_eq!(
        std::fs::read_to_string(sim.root(node).join("hello")).unwrap(),
        "hi\n"
    );
    let pods: Api<Pod> = Api::namespaced(client, "smoke-complete");
    let pod = pods
        .list(&ListParams::default().labels("job-name=hello"))
        .await
        .unwrap()
        .items
        .remove(0);
    let status = pod.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Succeeded"));
    let term = status.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!((term.exit_code, term.message.as_deref()), (0, Some("done")));
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_logs_come_through_the_apiserver() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let (client, _sim, _roots) = setup("smoke-logs", &["n1"]).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "smoke-logs");
    jobs.create(
        &PostParams::default(),
        &job(
            "talk",
            "smoke-logs-n1",
            "echo one; echo two >&2; echo three",
            json!({}),
        ),
    )
    .await
    .unwrap();
    wait_until("job completion", Duration::from_secs(60), || {
        job_condition(&jobs, "talk")
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client, "smoke-logs");
    let pod = pods
        .list(&ListParams::default().labels("job-name=talk"))
        .await
        .unwrap()
        .items
        .remove(0);
    let name = pod.metadata.name.unwrap();
    // kubectl logs' path: apiserver → the node's kubelet endpoint → the container's output.
    assert_eq!(
        pods.logs(&name, &Default::default()).await.unwrap(),
        "one\ntwo\nthree\n"
    );
    let tail = kube::api::LogParams {
        tail_lines: Some(2),
        ..Default::default()
    };
    assert_eq!(pods.logs(&name, &tail).await.unwrap(), "two\nthree\n");
    let missing = kube::api::LogParams {
        container: Some("nope".into()),
        ..Default::default()
    };
    assert!(
        pods.logs(&name, &missing).await.is_err(),
        "an unknown container is an error"
    );

    // Following a running container: its output as it comes, ending when it does.
    let jobs: Api<Job> = Api::namespaced(pods.clone().into_client(), "smoke-logs");
    jobs.create(
        &PostParams::default(),
        &job(
            "slow-talk",
            "smoke-logs-n1",
            "echo early; sleep 2; echo late",
            json!({}),
        ),
    )
    .await
    .unwrap();
    let running = wait_until("the talker running", Duration::from_secs(60), || async {
        let p = pods
            .list(&ListParams::default().labels("job-name=slow-talk"))
            .await
            .ok()?
            .items
            .pop()?;
        (p.status.as_ref()?.phase.as_deref() == Some("Running")).then(|| p.metadata.name.unwrap())
    })
    .await;
    let follow = kube::api::LogParams {
        follow: true,
        ..Default::default()
    };
    let mut stream = pods.log_stream(&running, &follow).await.unwrap();
    let mut text = String::new();
    tokio::time::timeout(
        Duration::from_secs(30),
        futures::AsyncReadExt::read_to_string(&mut stream, &mut text),
    )
    .await
    .expect("the follow ends with the container")
    .unwrap();
    assert_eq!(text, "early\nlate\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_are_retried_per_backoff_limit_and_pod_failure_policy() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let (client, _sim, _roots) = setup("smoke-retry", &["n1"]).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "smoke-retry");
    let pods: Api<Pod> = Api::namespaced(client, "smoke-retry");
    let node = "smoke-retry-n1";
    jobs.create(
        &PostParams::default(),
        &job("flaky", node, "exit 3", json!({"backoffLimit": 2})),
    )
    .await
    .unwrap();
    let (cond, reason) = wait_until("backoff limit", Duration::from_secs(120), || {
        job_condition(&jobs, "flaky")
    })
    .await;
    assert_eq!(
        (cond.as_str(), reason.as_str()),
        ("Failed", "BackoffLimitExceeded")
    );
    let attempts = pods
        .list(&ListParams::default().labels("job-name=flaky"))
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(attempts, 3, "backoffLimit 2 means 3 attempts");

    let policy = json!({"backoffLimit": 5, "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}});
    jobs.create(
        &PostParams::default(),
        &job("fatal", node, "exit 42", policy),
    )
    .await
    .unwrap();
    let (cond, reason) = wait_until("pod failure policy", Duration::from_secs(60), || {
        job_condition(&jobs, "fatal")
    })
    .await;
    assert_eq!(
        (cond.as_str(), reason.as_str()),
        ("Failed", "PodFailurePolicy")
    );
    assert_eq!(
        pods.list(&ListParams::default().labels("job-name=fatal"))
            .await
            .unwrap()
            .items
            .len(),
        1,
        "FailJob stops at the first matching exit"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn eviction_under_a_pdb_is_refused_with_the_apiservers_message() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let (client, _sim, _roots) = setup("smoke-pdb", &["n1"]).await;
    let ns = "smoke-pdb";
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"nodeName": "smoke-pdb-n1", "containers": [{"name": "web", "image": "nginx"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "web"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    wait_until(
        "PDB to count the pod healthy",
        Duration::from_secs(60),
        || async {
            let s = pdbs.get("web").await.ok()?.status?;
            (s.current_healthy == Some(1) && s.disruptions_allowed == Some(0)).then_some(())
        },
    )
    .await;
    let err = pods
        .evict("web", &EvictParams::default())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{text}"
    );

    pdbs.delete("web", &Default::default()).await.unwrap();
    pods.evict("web", &EvictParams::default())
        .await
        .expect("eviction allowed once the PDB is gone");
    wait_until(
        "evicted pod to be gone",
        Duration::from_secs(60),
        || async { pods.get_opt("web").await.ok()?.is_none().then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cordon_is_a_patch() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let (client, _sim, _roots) = setup("smoke-cordon", &["n1"]).await;
    let nodes: Api<Node> = Api::all(client);
    let name = "smoke-cordon-n1";
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    assert_eq!(
        nodes.get(name).await.unwrap().spec.unwrap().unschedulable,
        Some(true)
    );
    let ready = nodes
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True");
}

/// The kubelet side lifts the not-ready taint of a node it registers; a taint added by
/// another writer after the node was read (the operator tainting a joining node) survives.
#[tokio::test(flavor = "multi_thread")]
async fn lifting_not_ready_keeps_a_taint_added_after_the_node_was_read() {
    nodewright_testregistry::require!(ControlPlane);
    let client = ControlPlane::shared().client().await.expect("client");
    let nodes: Api<Node> = Api::all(client);
    let name = "smoke-lift-not-ready";
    let taint = |key: &str| json!({"key": key, "effect": "NoSchedule"});
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"taints": [taint("node.kubernetes.io/not-ready")]},
            }))
            .unwrap(),
        )
        .await
        .expect("create node");
    let read = nodes.get(name).await.unwrap();
    let mut both = read.spec.clone().unwrap().taints.unwrap();
    both.push(serde_json::from_value(taint("nodewright.io")).unwrap());
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": both}})),
        )
        .await
        .unwrap();

    nodewright_testcluster::simnode::lift_not_ready(&nodes, read)
        .await
        .expect("lift not-ready");
    let keys: Vec<String> = nodes
        .get(name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .taints
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert_eq!(keys, ["nodewright.io"], "only not-ready is lifted");
    nodes.delete(name, &Default::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reboot_changes_the_boot_id_and_restarts_on_failure_pods() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let (client, sim, _roots) = setup("smoke-reboot", &["n1"]).await;
    let node = "smoke-reboot-n1";
    let pods: Api<Pod> = Api::namespaced(client.clone(), "smoke-reboot");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {"nodeName": node, "restartPolicy": "OnFailure",
                 "containers": [{"name": "a", "image": "x", "command": ["/bin/sh", "-c", "cat /proc/sys/kernel/random/boot_id >/dev/null; sleep 300"]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let running = |want_restarts: i32| {
        let pods = pods.clone();
        async move {
            let s = pods.get("agent").await.ok()?.status?;
            let c = s.container_statuses?.into_iter().next()?;
            (c.restart_count == want_restarts && c.state?.running.is_some()).then_some(())
        }
    };
    wait_until("pod running", Duration::from_secs(60), || running(0)).await;
    let nodes: Api<Node> = Api::all(client);
    let boot_before = nodes
        .get(node)
        .await
        .unwrap()
        .status
        .unwrap()
        .node_info
        .unwrap()
        .boot_id;
    assert_eq!(boot_before, sim.boot_id(node));

    // The host asks for a reboot the way the agent's host-ops seam does.
    std::fs::write(
        sim.root(node).join("run/nodewright-sim/reboot-requested"),
        "test",
    )
    .unwrap();
    let boot_after = wait_until("new boot id", Duration::from_secs(30), || async {
        let b = nodes.get(node).await.ok()?.status?.node_info?.boot_id;
        (b != boot_before).then_some(b)
    })
    .await;
    assert_eq!(
        boot_after,
        std::fs::read_to_string(sim.root(node).join("proc/sys/kernel/random/boot_id")).unwrap()
    );
    wait_until(
        "pod restarted after the reboot",
        Duration::from_secs(30),
        || running(1),
    )
    .await;
    let last = pods
        .get("agent")
        .await
        .unwrap()
        .status
        .unwrap()
        .container_statuses
        .unwrap()[0]
        .last_state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(last.exit_code, 137);
    assert_eq!(last.message.as_deref(), Some("killed by a node reboot"));
}
