//! The agent as it really runs: in a Job's pod on a (simulated) node of the real control
//! plane, pulling from the real registry, with the host mounted at /host — including a
//! reboot interrupt that restarts the pod and completes on the new boot ID.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, PostParams};
use nodewright_oci::{Registry, RegistryConfig};
use nodewright_testcluster::{ControlPlane, NodeSpec, SimKubelet};
use nodewright_testregistry::TestRegistry;
use serde_json::{Value, json};

fn job(name: &str, node: &str, restart: &str, args: Vec<String>) -> Job {
    // A pod restarted in place (the reboot's) counts against backoffLimit while it runs:
    // with 0, the Job controller fails the Job if it looks between the restart and the
    // pod's success (it did, once, under a loaded suite). The operator's reboot Jobs allow
    // restarts for the same reason.
    let backoff = if restart == "OnFailure" { 6 } else { 0 };
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": backoff,
            "template": {"spec": {
                "nodeName": node,
                "restartPolicy": restart,
                "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
                "containers": [{
                    "name": "agent", "image": "nodewright/agent:dev",
                    "command": [env!("CARGO_BIN_EXE_nodewright-agent")],
                    "args": args,
                    "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                    "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                    "terminationMessagePolicy": "FallbackToLogsOnError"
                }]
            }}
        }
    }))
    .unwrap()
}

async fn wait_complete(jobs: &Api<Job>, name: &str) -> String {
    for _ in 0..300 {
        if let Ok(j) = jobs.get(name).await
            && let Some(c) = j
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        {
            return c.type_;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "job {name} did not finish\n{}",
        ControlPlane::shared().logs()
    );
}

async fn termination(pods: &Api<Pod>, job: &str) -> (Value, i32) {
    let pod = pods
        .list(&ListParams::default().labels(&format!("job-name={job}")))
        .await
        .unwrap()
        .items
        .remove(0);
    let c = pod.status.unwrap().container_statuses.unwrap().remove(0);
    let t = c.state.unwrap().terminated.unwrap();
    (
        serde_json::from_str(t.message.as_deref().unwrap_or("null")).unwrap_or(Value::Null),
        c.restart_count,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_runs_in_a_job_pod_and_reboots_the_node() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let reg = TestRegistry::start();
    let registry = Registry::new(RegistryConfig {
        insecure: vec![reg.host().into()],
        ..Default::default()
    });
    let pinned = registry
        .push(
            &format!("{}/plugins/sysctl:1.0.0", reg.host()),
            &nodewright_artifacts::read(nodewright_artifacts::SYSCTL),
            Default::default(),
            &|_| {},
        )
        .await
        .unwrap()
        .pinned;

    let client = ControlPlane::shared().client().await.unwrap();
    let ns = "agent-e2e";
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            // The agent's pods are privileged: the test apiserver enforces Pod Security
            // `baseline` wherever a namespace says nothing.
            &serde_json::from_value(json!({"metadata": {"name": ns, "labels": {
                nodewright_api::keys::POD_SECURITY_ENFORCE: nodewright_api::keys::POD_SECURITY_PRIVILEGED
            }}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let roots = tempfile::tempdir().unwrap();
    let node = "agent-e2e-n1";
    let sim = SimKubelet::start(client.clone(), vec![NodeSpec::new(node, roots.path())])
        .await
        .unwrap();
    std::fs::create_dir_all(sim.root(node).join("proc/sys/vm")).unwrap();
    std::fs::write(sim.root(node).join("proc/sys/vm/swappiness"), "60").unwrap();
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let common = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        v.extend(
            [
                "--backend=sim",
                "--host-root=/host",
                "--cr-uid=uid-e2e",
                "--generation=1",
                "--termination-log=/dev/termination-log",
            ]
            .map(String::from),
        );
        v
    };

    let apply = common(&[
        "run",
        "--stage=apply",
        "--package=tuning",
        "--version=1.0.0",
        &format!("--plugin={pinned}"),
        r#"--capabilities={"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}], "sysctl": ["vm.swappiness"]}"#,
        r#"--config={"vm.swappiness": "10"}"#,
        &format!("--insecure-registry={}", reg.host()),
    ]);
    jobs.create(
        &PostParams::default(),
        &job("tuning-apply", node, "Never", apply),
    )
    .await
    .unwrap();
    assert_eq!(wait_complete(&jobs, "tuning-apply").await, "Complete");
    let (result, _) = termination(&pods, "tuning-apply").await;
    assert_eq!(result["blame"], "none", "{result}");
    assert_eq!(
        std::fs::read_to_string(sim.root(node).join("proc/sys/vm/swappiness")).unwrap(),
        "10"
    );

    // The merged reboot interrupt: the first attempt requests the reboot, the simulated
    // node reboots (killing the pod), the OnFailure pod restarts and sees the new boot ID.
    let boot_before = sim.boot_id(node);
    jobs.create(
        &PostParams::default(),
        &job(
            "node-reboot",
            node,
            "OnFailure",
            common(&["interrupt", "--type=reboot", "--reboot-wait=20s"]),
        ),
    )
    .await
    .unwrap();
    assert_eq!(wait_complete(&jobs, "node-reboot").await, "Complete");
    let (result, restarts) = termination(&pods, "node-reboot").await;
    assert_ne!(sim.boot_id(node), boot_before);
    assert_eq!(result["blame"], "none", "{result}");
    assert!(
        result["message"]
            .as_str()
            .unwrap()
            .contains(&sim.boot_id(node)),
        "{result}"
    );
    // The reboot kills the first attempt and the restarted one sees the new boot ID — or,
    // on a loaded machine, the first attempt sees the new boot ID itself before the kill
    // reaches it (one run of the full suite did). Never a second reboot-killed attempt.
    assert!(
        restarts <= 1,
        "at most one reboot-killed attempt: {restarts}"
    );
    let reboots = nodewright_hostops::SimHost::journal(&sim.root(node))
        .into_iter()
        .filter(|a| matches!(a, nodewright_hostops::HostAction::Rebooted { .. }))
        .count();
    assert_eq!(reboots, 1, "one reboot, whichever attempt finished");
}
