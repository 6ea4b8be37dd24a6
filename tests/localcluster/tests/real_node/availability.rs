//! Phase 4 of the real-node test: the operator stays available across its own nodes'
//! reboots. Two real nodes each run one of the chart's two operator replicas (its soft
//! anti-affinity, as kube-scheduler places them); a package reboots both, one node at a time.
//! Before each reboot the replica there is fenced — out of the webhook Service, its Lease let
//! go if it led — so leadership moves to the other node and the fail-closed webhook answers
//! every request throughout: a prober asks it four times a second, from before the rollout is
//! applied until it is complete, and reads the Lease's holder each time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use nodewright_api::pinned::PinnedRef;
use nodewright_api::v1alpha1::NodeWright;
use nodewright_localcluster::real::RealCluster;
use serde_json::json;

use crate::{apply, operator_pods, over_budget, wait_complete};

/// The chart's Lease (release `nodewright`); its holder is a replica's pod name (the chart
/// passes it), or the pod name and the process id where no identity is given.
const LEASE: &str = "nodewright-operator";
/// How often the prober asks.
const EVERY: Duration = Duration::from_millis(250);

/// What the prober saw.
#[derive(Debug, Default)]
struct Seen {
    /// Webhook answers: the dry-run of an invalid NodeWright refused for its budget.
    answered: usize,
    /// Anything else (`failed calling webhook`, a timeout), with when it came.
    failures: Vec<String>,
    /// The Lease's holders in the order they held it (an empty holder skipped).
    holders: Vec<String>,
}

/// Asks the webhook and reads the Lease every [`EVERY`] until stopped.
struct Prober {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Seen>,
}

impl Prober {
    fn start(client: Client) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut seen = Seen::default();
            let crs: Api<NodeWright> = Api::all(client.clone());
            let leases: Api<Lease> = Api::namespaced(client, "nodewright");
            let (bad, names) = over_budget("probe");
            let bad: NodeWright = serde_json::from_value(bad).unwrap();
            while !stopped.load(Ordering::Relaxed) {
                let at = started.elapsed().as_secs_f64();
                let asked = crs
                    .patch(
                        "probe",
                        &PatchParams::apply("e2e-probe").force().dry_run(),
                        &Patch::Apply(&bad),
                    )
                    .await;
                match asked {
                    Err(e) if e.to_string().contains(names) => {
                        seen.answered += 1;
                    }
                    Err(e) => seen.failures.push(format!("{at:.1}s: {e}")),
                    Ok(_) => seen
                        .failures
                        .push(format!("{at:.1}s: admitted a budget of 250%")),
                }
                let holder = leases
                    .get_opt(LEASE)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|l| l.spec?.holder_identity)
                    .filter(|h| !h.is_empty());
                if let Some(h) = holder
                    && seen.holders.last() != Some(&h)
                {
                    seen.holders.push(h);
                }
                tokio::time::sleep(EVERY).await;
            }
            seen
        });
        Prober { stop, task }
    }

    async fn stop(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// The operator's pods and their nodes.
async fn replicas(c: &RealCluster) -> BTreeMap<String, String> {
    operator_pods(c)
        .await
        .into_iter()
        .filter_map(|p| Some((p.metadata.name?, p.spec?.node_name?)))
        .collect()
}

/// Phase 4: a reboot of every real node by one NodeWright, the operator handing over.
pub async fn reboots_hand_over(c: &RealCluster, shell: &PinnedRef) {
    let names: BTreeSet<String> = c.nodes.iter().map(|n| n.name().to_string()).collect();
    let placed = replicas(c).await;
    assert_eq!(
        placed.values().cloned().collect::<BTreeSet<_>>(),
        names,
        "one operator replica on each real node (the chart's anti-affinity): {placed:?}"
    );
    for node in &c.nodes {
        let held = node.host_path("/etc/nodewright-localcluster");
        std::fs::create_dir_all(&held).unwrap();
        for (file, body) in [
            (
                "install.sh",
                "#!/bin/sh\necho installed > /etc/nodewright-localcluster/driver\n",
            ),
            (
                "verify.sh",
                "#!/bin/sh\ntest -f /etc/nodewright-localcluster/driver\n",
            ),
        ] {
            std::fs::write(held.join(file), body).unwrap();
            std::fs::set_permissions(
                held.join(file),
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )
            .unwrap();
        }
    }
    let boots: Vec<u32> = c.nodes.iter().map(|n| n.boots()).collect();
    let prober = Prober::start(c.client.clone());
    let driver = json!({
        "version": "1.0.0", "plugin": shell, "interrupt": {"type": "reboot"},
        "capabilities": {"commands": [{"path": "/etc/nodewright-localcluster/install.sh"}, {"path": "/etc/nodewright-localcluster/verify.sh"}]},
        "configMap": {"apply": "/etc/nodewright-localcluster/install.sh", "post-interrupt": "/etc/nodewright-localcluster/verify.sh", "interrupt": "reboot"}
    });
    let nw = json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": "driver"},
        "spec": {
            "nodeSelectors": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": names}]},
            "interruptionBudget": {"count": 1},
            "packages": {"driver": driver}
        }
    });
    apply(c, nw).await.unwrap();
    wait_complete(c, "driver").await;
    let seen = prober.stop().await;

    for (node, before) in c.nodes.iter().zip(boots) {
        assert_eq!(
            node.boots(),
            before + 1,
            "{}: exactly one reboot",
            node.name()
        );
        assert!(
            node.systemctl_calls()
                .iter()
                .any(|l| l.starts_with("reboot")),
            "{}: {:?}",
            node.name(),
            node.systemctl_calls()
        );
        let n = Api::<Node>::all(c.client.clone())
            .get(node.name())
            .await
            .unwrap();
        assert!(
            !n.spec.and_then(|s| s.unschedulable).unwrap_or(false),
            "{} uncordoned after post-interrupt",
            node.name()
        );
    }
    // The webhook answered throughout: every probe, through both reboots.
    assert!(
        seen.failures.is_empty(),
        "the webhook failed {} of {} probes during the reboots:\n{}",
        seen.failures.len(),
        seen.failures.len() + seen.answered,
        seen.failures.join("\n")
    );
    assert!(seen.answered >= 20, "{seen:?}");
    // Leadership moved: whichever node led first, its reboot handed the Lease to the other
    // node's replica, so both nodes led at some point.
    let placed = replicas(c).await;
    let node_of = |holder: &String| {
        placed
            .iter()
            .find(|(pod, _)| *holder == **pod || holder.starts_with(&format!("{pod}-")))
            .map(|(_, node)| node.clone())
    };
    let led: BTreeSet<String> = seen.holders.iter().filter_map(node_of).collect();
    assert_eq!(
        led, names,
        "the Lease's holders {:?} over the replicas {placed:?}",
        seen.holders
    );
    // Each node's replica was fenced before its reboot, and said so.
    let events = Api::<k8s_openapi::api::events::v1::Event>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let fenced: BTreeSet<String> = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("OperatorHandover"))
        .filter_map(|e| e.regarding.as_ref()?.name.clone())
        .collect();
    assert_eq!(fenced, names, "OperatorHandover events");
    let line = format!(
        "the webhook answered {} probes; the Lease went {:?}\n",
        seen.answered, seen.holders
    );
    std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes()).unwrap();
}
