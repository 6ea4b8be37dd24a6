//! The verbs that only look: `package logs` (the agent pods' results and logs, followed
//! with `-f`) and `version` (this CLI, the cluster, the served API, the operator).

use std::process::ExitCode;

use anyhow::{Context, Result};
use futures::AsyncBufReadExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ListParams, LogParams};
use nodewright_api::agent::RunStage;
use nodewright_api::keys;

use crate::printable::printable;
use nodewright_api::result::StageResult;

use super::kube::{Ctx, client};
use super::view;

/// Which pods' logs, and how much of them.
pub struct LogsOf<'a> {
    pub stage: Option<&'a str>,
    pub tail: i64,
    pub follow: bool,
}

/// `package logs`: each agent pod of the package on the node (and the node's merged
/// interrupt), oldest first — its result and its log; `-f` streams the newest running one.
pub async fn logs(
    c: &Client,
    namespace: &str,
    cr: &str,
    package: &str,
    node: &str,
    of: LogsOf<'_>,
) -> Result<ExitCode> {
    let LogsOf {
        stage,
        tail,
        follow,
    } = of;
    let api = Api::<Pod>::namespaced(c.clone(), namespace);
    let pods = agent_pods(&api, cr, package, node, stage).await?;
    let mut followed = false;
    for (i, p) in pods.iter().enumerate() {
        let pod = p.metadata.name.clone().unwrap_or_default();
        let (running, result) = print_result(p);
        if follow && running && i + 1 == pods.len() {
            follow_log(&api, &pod, tail).await?;
            followed = true;
            continue;
        }
        // The pod's own log, as `kubectl logs` shows it; if the node cannot serve it, the
        // last lines the agent put in its result.
        let params = LogParams {
            tail_lines: Some(tail),
            ..LogParams::default()
        };
        match api.logs(&pod, &params).await {
            Ok(text) => text.lines().for_each(|l| println!("   | {}", printable(l))),
            Err(e) => {
                println!("   (the pod's log is unavailable: {e})");
                for l in result.iter().flat_map(|r| &r.logs) {
                    println!("   | {}", printable(l));
                }
            }
        }
    }
    if follow && !followed {
        eprintln!("nothing to follow: no pod of these is running");
    }
    if pods.is_empty() {
        print_recorded(c, cr, package, node, stage).await?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The package's agent pods on the node (and the node's merged interrupt's), of `stage`
/// if given, oldest first.
async fn agent_pods(
    api: &Api<Pod>,
    cr: &str,
    package: &str,
    node: &str,
    stage: Option<&str>,
) -> Result<Vec<Pod>> {
    let selector = format!("{}={cr},{}={node}", keys::job::CR, keys::job::NODE);
    let mut pods = api
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    pods.retain(|p| {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        let ours = labels.get(keys::job::PACKAGE).is_some_and(|v| v == package)
            || labels.contains_key(keys::job::INTERRUPT);
        ours && stage.is_none_or(|s| labels.get(keys::job::STAGE).is_some_and(|v| v == s))
    });
    pods.sort_by_key(|p| p.metadata.creation_timestamp.clone());
    Ok(pods)
}

/// Prints the pod's state line (and its changes); returns whether it still runs, and the
/// agent's result when it wrote one.
fn print_result(p: &Pod) -> (bool, Option<StageResult>) {
    let pod = p.metadata.name.clone().unwrap_or_default();
    let terminated = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .and_then(|c| c.state.as_ref()?.terminated.clone());
    let result = terminated
        .as_ref()
        .and_then(|t| serde_json::from_str::<StageResult>(t.message.as_deref()?).ok());
    match (&terminated, &result) {
        (None, _) => println!("== {pod}: running"),
        (Some(t), Some(r)) => {
            println!(
                "== {pod}: {} {} ({}), exit {}: {}",
                r.stage.map_or("(no stage)", RunStage::as_str),
                r.verdict(),
                r.blame.as_str(),
                t.exit_code,
                printable(&r.message)
            );
            for ch in &r.changes {
                println!("   change: {}", printable(ch));
            }
        }
        (Some(t), None) => println!(
            "== {pod}: exit {}, no agent result: {}",
            t.exit_code,
            printable(t.message.as_deref().unwrap_or_default())
        ),
    }
    (terminated.is_none(), result)
}

/// The running pod's log as it grows, until its container ends.
async fn follow_log(api: &Api<Pod>, pod: &str, tail: i64) -> Result<()> {
    let params = LogParams {
        tail_lines: Some(tail),
        follow: true,
        ..LogParams::default()
    };
    let mut lines = api
        .log_stream(pod, &params)
        .await
        .with_context(|| format!("following {pod}'s log"))?
        .lines();
    while let Some(line) = futures::TryStreamExt::try_next(&mut lines).await? {
        println!("   | {}", printable(&line));
    }
    println!("== {pod}: its container ended");
    Ok(())
}

/// No pods left (finished Jobs are deleted once recorded): what the node state keeps.
async fn print_recorded(
    c: &Client,
    cr: &str,
    package: &str,
    node: &str,
    stage: Option<&str>,
) -> Result<()> {
    let n = Api::<Node>::all(c.clone())
        .get_opt(node)
        .await?
        .with_context(|| format!("node {node:?} not found"))?;
    let st = view::node_state(&n, cr).unwrap_or_default();
    let entry = st
        .values()
        .find(|p| p.name == package)
        .with_context(|| format!("{cr}/{package} has no Job pods and no state on {node}"))?;
    let which = stage.map_or_else(String::new, |s| format!(" of the {s} stage"));
    println!(
        "no agent pods{which} for {cr}/{package} on {node} (a Job is deleted once recorded); its state: {}",
        view::stage_state(entry)
    );
    if !entry.message.is_empty() {
        println!("last message: {}", printable(&entry.message));
    }
    Ok(())
}

/// `version`: this CLI's, the cluster's, the served API's and the operator's.
pub async fn version(ctx: &Ctx, client_only: bool) -> Result<ExitCode> {
    println!("client:   nodewright {}", env!("CARGO_PKG_VERSION"));
    if client_only {
        return Ok(ExitCode::SUCCESS);
    }
    let c = client().await?;
    let server = c
        .apiserver_version()
        .await
        .context("reading the apiserver's version")?;
    println!("server:   Kubernetes {}", server.git_version);
    let crds = Api::<CustomResourceDefinition>::all(c.clone());
    for name in nodewright_api::crdgen::CRD_NAMES {
        match crds.get_opt(name).await? {
            Some(crd) => {
                let versions: Vec<String> = crd
                    .spec
                    .versions
                    .iter()
                    .map(|v| format!("{}{}", v.name, if v.storage { " (storage)" } else { "" }))
                    .collect();
                println!("api:      {name} {}", versions.join(", "));
            }
            None => println!(
                "api:      {name} not installed (install the chart, or `kubectl apply -f deploy/crds`)"
            ),
        }
    }
    let deployments = Api::<Deployment>::namespaced(c.clone(), &ctx.namespace)
        .list(&ListParams::default().labels("app.kubernetes.io/name=nodewright"))
        .await?
        .items;
    if deployments.is_empty() {
        println!(
            "operator: no Deployment labelled app.kubernetes.io/name=nodewright in namespace {}",
            ctx.namespace
        );
    }
    for d in &deployments {
        let image = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.clone())
            .unwrap_or_default();
        let ready = d
            .status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0);
        let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        println!(
            "operator: {} {image} ({ready}/{wanted} ready)",
            d.metadata.name.clone().unwrap_or_default()
        );
    }
    // The operator labels its Lease, whatever `--lease-name` calls it.
    let leases = Api::<Lease>::namespaced(c, &ctx.namespace)
        .list(&ListParams::default().labels(&format!("{}=true", keys::OPERATOR_LEASE)))
        .await?
        .items;
    if leases.is_empty() {
        println!(
            "leader:   no Lease labelled {}=true in namespace {} (leader election off, or no operator has run)",
            keys::OPERATOR_LEASE,
            ctx.namespace
        );
    }
    for l in leases {
        let spec = l.spec.unwrap_or_default();
        let renewed = spec
            .renew_time
            .map(|t| t.0.to_string())
            .unwrap_or_else(|| "never".into());
        println!(
            "leader:   {} (Lease {}, renewed {renewed})",
            spec.holder_identity.unwrap_or_else(|| "none".into()),
            l.metadata.name.unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}
