//! `node ...`: list, reset, update-state, ignore and unignore nodes.

use std::process::ExitCode;

use ::kube::Client;
use ::kube::api::{Api, ListParams, Patch};
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use nodewright_api::keys;
use nodewright_api::node_state::{NodeState, PackageStatus, Stage, State, state_key};
use nodewright_api::v1alpha1::NodeWright;
use serde_json::{Value, json};

use super::args::{NodeCommand, NodeReset, OutputArg, UpdateState};
use super::kube::{Ctx, client, confirm, edit_state, nodes, nodewright, refuse_if_running};
use super::{select, view};

/// `node ...`: one function per verb.
pub async fn node(cmd: NodeCommand, ctx: &Ctx) -> Result<ExitCode> {
    let c = client().await?;
    match cmd {
        NodeCommand::List(output) => {
            let crs = all_nodewrights(&c).await?;
            let rows = view::node_list(&crs, &nodes(&c).await?);
            output
                .output
                .emit(&rows, |wide| view::node_list_table(&rows, wide))
        }
        NodeCommand::Status {
            nodes: patterns,
            output,
        } => status(&c, &patterns, output).await,
        NodeCommand::Ignore { nodes: patterns } => label_ignore(&c, ctx, &patterns, true).await,
        NodeCommand::Unignore { nodes: patterns } => label_ignore(&c, ctx, &patterns, false).await,
        NodeCommand::Reset(args) => reset(&c, ctx, args).await,
        NodeCommand::UpdateState(args) => update_state(&c, ctx, args).await,
    }
}

async fn all_nodewrights(c: &Client) -> Result<Vec<NodeWright>> {
    Ok(Api::<NodeWright>::all(c.clone())
        .list(&ListParams::default())
        .await?
        .items)
}

/// `node status`: every NodeWright's packages on the nodes `patterns` pick.
async fn status(c: &Client, patterns: &[String], output: OutputArg) -> Result<ExitCode> {
    let all = nodes(c).await?;
    let picked: Vec<Node> = select::nodes(&all, patterns)
        .map_err(anyhow::Error::msg)?
        .into_iter()
        .cloned()
        .collect();
    let mut rows: Vec<view::PackageRow> = all_nodewrights(c)
        .await?
        .iter()
        .filter_map(|cr| cr.metadata.name.clone())
        .flat_map(|cr| view::package_rows(&cr, None, &picked))
        .collect();
    rows.sort_by(|a, b| {
        (&a.node, &a.nodewright, &a.package).cmp(&(&b.node, &b.nodewright, &b.package))
    });
    output
        .output
        .emit(&rows, |wide| view::package_table(&rows, wide))
}

/// `node reset`: forget the CR's state on the picked nodes that have one.
async fn reset(c: &Client, ctx: &Ctx, args: NodeReset) -> Result<ExitCode> {
    let NodeReset {
        nodes: patterns,
        cr,
        confirm: yes,
    } = args;
    nodewright(c, &cr).await?;
    let all = nodes(c).await?;
    let picked = select::nodes(&all, &patterns).map_err(anyhow::Error::msg)?;
    let (with, without): (Vec<&Node>, Vec<&Node>) = picked
        .into_iter()
        .partition(|n| view::node_state(n, &cr).is_some());
    let names = |ns: &[&Node]| {
        ns.iter()
            .filter_map(|n| n.metadata.name.clone())
            .collect::<Vec<_>>()
    };
    if with.is_empty() {
        bail!(
            "{cr} has no state on {}: nothing to reset",
            names(&without).join(", ")
        );
    }
    if !without.is_empty() {
        eprintln!(
            "{cr} has no state on {} (skipped)",
            names(&without).join(", ")
        );
    }
    refuse_if_running(c, &ctx.namespace, &cr, &names(&with)).await?;
    confirm(
        ctx,
        &format!(
            "forget {cr}'s state on {} (every package runs there again, interrupts included)",
            names(&with).join(", ")
        ),
        &yes,
    )?;
    for n in with {
        edit_state(c, ctx, n, &cr, |_| None).await?;
        ctx.done(&format!(
            "{}: {cr}'s state removed; its packages run again from the start",
            n.metadata.name.clone().unwrap_or_default()
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// `node update-state`: one package's stage and state set on the picked nodes.
async fn update_state(c: &Client, ctx: &Ctx, args: UpdateState) -> Result<ExitCode> {
    let UpdateState {
        nodes: patterns,
        cr,
        package,
        version,
        stage,
        state,
        add,
        confirm: yes,
    } = args;
    let generation = nodewright(c, &cr)
        .await?
        .metadata
        .generation
        .unwrap_or_default();
    let stage: Stage = api_name(
        "stage",
        &stage,
        "plan, uninstall, upgrade, apply, config, interrupt, post-interrupt, uninstall-interrupt",
    )?;
    let state: State = api_name(
        "state",
        &state,
        "unknown, in_progress, complete, erroring, skipped",
    )?;
    let all = nodes(c).await?;
    let picked = select::nodes(&all, &patterns).map_err(anyhow::Error::msg)?;
    let key = state_key(&package, &version);
    // One edit, checked against what the nodes hold now and applied again to what they
    // hold if the operator writes them meanwhile.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let edit = |mut st: NodeState| {
        match st.get_mut(&key) {
            Some(e) => {
                e.stage = stage;
                e.state = state;
                if state == State::InProgress {
                    // A new attempt: a failed Job the operator kept from the last one (for
                    // its logs) is not this one's answer.
                    e.run = now.max(e.run + 1);
                }
            }
            None => {
                let mut e = PackageStatus::new(&package, &version, stage, generation);
                e.state = state;
                st.insert(key.clone(), e);
            }
        }
        Some(st)
    };
    let mut names = Vec::new();
    for n in &picked {
        let name = n.metadata.name.clone().unwrap_or_default();
        let has = view::node_state(n, &cr).is_some_and(|st| st.contains_key(&key));
        if !has && !add {
            bail!("{cr} has no {package} {version} entry on {name} (--add creates it)")
        }
        names.push(name);
    }
    refuse_if_running(c, &ctx.namespace, &cr, &names).await?;
    confirm(
        ctx,
        &format!(
            "set {cr}'s {package} {version} to {}/{} on {}",
            stage.as_str(),
            state.as_str(),
            names.join(", ")
        ),
        &yes,
    )?;
    for (n, name) in picked.into_iter().zip(names) {
        edit_state(c, ctx, n, &cr, edit).await?;
        ctx.done(&format!(
            "{name}: {cr}'s {package} {version} set to {}/{}",
            stage.as_str(),
            state.as_str()
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// A value as the API spells it (`post-interrupt`, `in_progress`), from flag `--what`.
fn api_name<T: serde::de::DeserializeOwned>(what: &str, raw: &str, valid: &str) -> Result<T> {
    serde_json::from_value(Value::String(raw.into()))
        .map_err(|_| anyhow::anyhow!("--{what} {raw:?} is not one of {valid}"))
}

async fn label_ignore(c: &Client, ctx: &Ctx, patterns: &[String], on: bool) -> Result<ExitCode> {
    let all = nodes(c).await?;
    let picked = select::nodes(&all, patterns).map_err(anyhow::Error::msg)?;
    for n in picked.iter().filter_map(|n| n.metadata.name.as_deref()) {
        let patch = json!({"metadata": {"labels": {keys::IGNORE: if on { Value::from("true") } else { Value::Null }}}});
        Api::<Node>::all(c.clone())
            .patch(n, &ctx.params(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("labelling node {n}"))?;
        ctx.done(&format!(
            "{n}: {}",
            if on {
                "ignored by every NodeWright"
            } else {
                "no longer ignored"
            }
        ));
    }
    Ok(ExitCode::SUCCESS)
}
