//! `nodewright-demo`: the main job. Brings up a local control plane with simulated nodes and
//! a registry, pushes the first-party plugins, runs the operator, applies the shipped
//! examples (`examples/manifests`: a kernel module that needs a reboot, rolled out through the
//! staged DeploymentPolicy, and a sysctl tuning package), and shows the rollout node by node
//! until it completes. Then it keeps the cluster up for `kubectl` until Ctrl-C, or exits with
//! `--teardown`.

// musl's allocator is slow for allocation-heavy work; see the workspace's `mimalloc`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod view;

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use nodewright_api::keys;
use nodewright_api::node_state::NodeState;
use nodewright_api::v1alpha1::{NodeWright, Status};
use nodewright_hostops::{HostAction, SimHost};
use nodewright_localcluster::{Binaries, Cluster, Operator};
use serde_json::Value;

use crate::view::{Frame, NodeLine};

#[derive(Debug, Parser)]
#[command(
    name = "nodewright-demo",
    about = "A live nodewright rollout on a local cluster of simulated nodes"
)]
struct Args {
    /// Tear the cluster down once the rollout completes (default: keep it up until Ctrl-C).
    #[arg(long)]
    teardown: bool,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Where `nodewright-operator` and `nodewright-agent` are (default: beside this binary;
    /// built with cargo when missing).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

/// The shipped examples the demo applies, in order.
const MANIFESTS: &[&str] = &[
    include_str!("../../../examples/manifests/staged-rollout-policy.yaml"),
    include_str!("../../../examples/manifests/kernel-module-reboot.yaml"),
    include_str!("../../../examples/manifests/tuning-sysctl.yaml"),
];

/// (name, tier): one canary, three production, two in the policy's default compartment.
const NODES: &[(&str, &str)] = &[
    ("gpu-0", "canary"),
    ("gpu-1", "production"),
    ("gpu-2", "production"),
    ("gpu-3", "production"),
    ("gpu-4", ""),
    ("gpu-5", ""),
];

fn step(what: &str) -> Instant {
    eprint!("• {what} … ");
    let _ = std::io::stderr().flush();
    Instant::now()
}

fn done(t: Instant) {
    eprintln!("done ({:.1} s)", t.elapsed().as_secs_f64());
}

/// Points every `plugin:` at the local registry's copy of the same first-party plugin.
fn localize(doc: &mut Value, cluster: &Cluster) {
    if let Some(packages) = doc
        .pointer_mut("/spec/packages")
        .and_then(Value::as_object_mut)
    {
        for p in packages.values_mut() {
            let Some(r) = p["plugin"].as_str() else {
                continue;
            };
            let repo = r.split('@').next().unwrap_or(r);
            let last = repo.rsplit('/').next().unwrap_or(repo);
            let name = last.split(':').next().unwrap_or(last);
            p["plugin"] = Value::from(cluster.plugin(name));
        }
    }
}

/// Tries two invalid NodeWrights; both must be refused at admission, naming the field.
/// Retries while the webhook is not serving yet (admission fails closed meanwhile).
async fn admission_check(cluster: &Cluster) -> Result<Vec<(&'static str, String)>> {
    let bad = [
        (
            "an interruptionBudget of 250%",
            serde_json::json!({"interruptionBudget": {"percent": 250}, "packages": {}}),
            "spec.interruptionBudget.percent",
        ),
        (
            "a grant path with '..'",
            serde_json::json!({"packages": {"escape": {"version": "1.0.0", "plugin": cluster.plugin("files"), "capabilities": {"files": [{"path": "/etc/../root", "access": "readWrite"}]}}}}),
            "capabilities.files[0].path",
        ),
    ];
    let mut out = Vec::new();
    for (what, spec, field) in bad {
        let doc = serde_json::json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": "refused-example"}, "spec": spec});
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match cluster.apply(&doc).await {
                Ok(()) => bail!(
                    "{what} was admitted: the cluster does not validate like the chart's webhook"
                ),
                Err(e) if format!("{e:#}").contains(field) => {
                    out.push((what, field.to_string()));
                    break;
                }
                Err(e) if Instant::now() > deadline => {
                    bail!("{what}: no refusal from the webhook after 60 s: {e:#}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }
    Ok(out)
}

async fn frame(
    cluster: &Cluster,
    crs: &[(String, Vec<String>)],
    started: Instant,
) -> Result<Frame> {
    let nws: Api<NodeWright> = Api::all(cluster.client.clone());
    let mut out = Frame {
        elapsed: started.elapsed().as_secs_f64(),
        ..Frame::default()
    };
    for (name, packages) in crs {
        out.crs.push((
            name.clone(),
            packages.clone(),
            nws.get_opt(name).await?.and_then(|n| n.status),
        ));
    }
    let nodes = Api::<Node>::all(cluster.client.clone())
        .list(&ListParams::default())
        .await?;
    for n in nodes.items {
        let name = n.metadata.name.clone().unwrap_or_default();
        let labels = n.metadata.labels.unwrap_or_default();
        let annotations = n.metadata.annotations.unwrap_or_default();
        let states = crs
            .iter()
            .filter_map(|(cr, _)| {
                annotations
                    .contains_key(&keys::node_state(cr))
                    .then_some(())?;
                Some((cr.clone(), NodeState::read(&name, &annotations, cr).ok()?))
            })
            .collect();
        out.nodes.push(NodeLine {
            tier: labels
                .get("nodewright.io/tier")
                .cloned()
                .unwrap_or_else(|| "-".into()),
            cordoned: n.spec.and_then(|s| s.unschedulable).unwrap_or(false),
            reboots: SimHost::journal(&cluster.sim.root(&name))
                .iter()
                .filter(|a| matches!(a, HostAction::RebootRequested { .. }))
                .count(),
            states,
            name,
        });
    }
    out.nodes.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn complete(f: &Frame) -> bool {
    f.crs.iter().all(|(_, _, s)| {
        s.as_ref()
            .is_some_and(|s| s.status == Some(Status::Complete))
    })
}

#[tokio::main]
// Long on purpose: the demo is a script read top to bottom (cluster, registry, operator,
// rollouts, teardown), each step printing what it does.
async fn main() -> Result<()> {
    let args = Args::parse();
    let dir = match args.bin_dir {
        Some(d) => d,
        None => std::env::current_exe()?
            .parent()
            .context("the demo binary's directory")?
            .to_path_buf(),
    };
    let bins = Binaries::in_dir(&dir)?;
    let work = tempfile::Builder::new()
        .prefix("nodewright-demo-")
        .tempdir()?;

    let t = step(&format!(
        "starting a control plane, {} simulated nodes and a registry with the plugins",
        NODES.len()
    ));
    let defs: Vec<(String, Vec<(String, String)>)> = NODES
        .iter()
        .map(|(n, tier)| {
            let mut labels = vec![
                ("nvidia.com/gpu.present".to_string(), "true".to_string()),
                ("nodewright.io/pool".into(), "workers".into()),
            ];
            if !tier.is_empty() {
                labels.push(("nodewright.io/tier".into(), tier.to_string()));
            }
            (n.to_string(), labels)
        })
        .collect();
    let cluster = Cluster::start(work.path(), &defs).await?;
    for (n, _) in NODES {
        // The driver module is loaded with no options yet: new options need a reboot.
        cluster.host_file(n, "/proc/modules", "nvidia 0 0 - Live 0x0\n")?;
        cluster.host_file(n, "/sys/module/nvidia/initstate", "live\n")?;
        // The kernel's defaults for the two keys the tuning example sets.
        cluster.host_file(n, "/proc/sys/net/core/somaxconn", "4096\n")?;
        cluster.host_file(n, "/proc/sys/net/ipv4/tcp_max_syn_backlog", "1024\n")?;
        cluster
            .workload_pod(n, &format!("web-{n}"), serde_json::json!({"app": "web"}))
            .await?;
    }
    done(t);

    let t = step("starting the operator with its admission webhook, as the chart installs it");
    let log = work.path().join("operator.log");
    let flags = cluster
        .admission(nodewright_testregistry::free_port())
        .await?;
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let op = Operator::start(
        &cluster,
        &bins,
        &work.path().join("operator-cache"),
        &log,
        "info,kube=warn",
        &flags,
    )?;
    done(t);

    let t = step("checking admission: what validation refuses, the cluster refuses");
    for (what, refusal) in admission_check(&cluster).await? {
        eprint!("\n    {what}: refused ({refusal})");
    }
    eprintln!();
    done(t);

    let t = step(
        "applying examples/manifests (DeploymentPolicy staged-rollout, NodeWrights gpu-modules and tuning)",
    );
    let mut crs = Vec::new();
    for text in MANIFESTS {
        let mut doc: Value = serde_yaml_ng::from_str(text)?;
        localize(&mut doc, &cluster);
        if doc["kind"] == "NodeWright" {
            let packages = doc["spec"]["packages"]
                .as_object()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            crs.push((
                doc["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                packages,
            ));
        }
        cluster.apply(&doc).await.context("applying an example")?;
    }
    done(t);
    eprintln!();

    let started = Instant::now();
    let tty = std::io::stdout().is_terminal();
    let mut last = Frame::default();
    let outcome = loop {
        let f = frame(&cluster, &crs, started).await?;
        if tty {
            print!("\x1b[H\x1b[2J{}", view::render(&f));
            let _ = std::io::stdout().flush();
        } else {
            for line in view::changes(&last, &f) {
                println!("{line}");
            }
        }
        let finished = complete(&f);
        let erroring = f.crs.iter().any(|(_, _, s)| {
            s.as_ref()
                .is_some_and(|s| s.status == Some(Status::Erroring))
        });
        last = f;
        if finished {
            break Ok(());
        }
        if erroring || started.elapsed() > Duration::from_secs(args.timeout) {
            break Err(if erroring {
                "a NodeWright is erroring"
            } else {
                "timed out"
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    if !tty {
        print!("\n{}", view::render(&last));
    }
    let reboots: usize = last.nodes.iter().map(|n| n.reboots).sum();
    match outcome {
        Ok(()) => println!(
            "\nRollout complete in {:.0} s: {} nodes, {reboots} reboots.",
            last.elapsed,
            last.nodes.len()
        ),
        Err(why) => {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            eprintln!("\n{why}. Operator log (tail):");
            for l in tail.into_iter().rev() {
                eprintln!("  {l}");
            }
            bail!("the demo rollout did not complete ({why})");
        }
    }

    if args.teardown {
        drop(op);
        return Ok(());
    }
    let ktest = nodewright_testcluster::ktest_binary()?;
    let per_node: BTreeMap<&str, usize> = last
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.reboots))
        .collect();
    println!("Reboots per node: {per_node:?}\n");
    println!("The cluster stays up. In another shell:\n");
    println!("  export KUBECONFIG={}", cluster.cp.kubeconfig().display());
    println!("  alias kubectl='{} kubectl'", ktest.display());
    println!("  kubectl get nodewrights,deploymentpolicies");
    println!(
        "  kubectl get nodewright gpu-modules -o yaml          # status, conditions, compartments"
    );
    println!("  kubectl get events -A --field-selector reason=Interrupt");
    println!("  kubectl get node gpu-0 -o jsonpath='{{.metadata.annotations}}'");
    if dir.join("kubectl-nodewright").exists() {
        // The CLI's kubectl plugin, found on the PATH.
        println!("  export PATH={}:$PATH", dir.display());
        println!("  kubectl nodewright status gpu-modules -o wide      # per node and package");
        println!("  kubectl nodewright package rerun tuning sysctl --node gpu-0   # asks first");
    }
    println!("\nOperator log: {}", log.display());
    println!("Ctrl-C tears everything down.");
    tokio::signal::ctrl_c().await?;
    drop(op);
    Ok(())
}
