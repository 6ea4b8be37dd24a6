//! What every cluster verb shares: the client, reading nodes and NodeWrights, asking for
//! confirmation, refusing while a stage runs, and rewriting a node's state without losing
//! a write of the operator's.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, Resource};
use nodewright_api::keys;
use nodewright_api::node_state::{self, NodeState};
use nodewright_api::v1alpha1::NodeWright;
use serde_json::json;

use super::args::ConfirmArg;

/// What every cluster verb shares: where the operator's Jobs are, and whether writes are
/// only tried (`--dry-run`: sent as server-side dry runs — validated by the apiserver and
/// the admission webhook, refused as they would be, persisted nowhere — with no question
/// asked).
#[derive(Debug, Clone)]
pub struct Ctx {
    pub namespace: String,
    pub dry_run: bool,
}

impl Ctx {
    pub(super) fn params(&self) -> PatchParams {
        PatchParams {
            dry_run: self.dry_run,
            ..PatchParams::default()
        }
    }

    /// Prints what a write did (or, in a dry run, would do).
    pub(super) fn done(&self, what: &str) {
        println!("{}{what}", if self.dry_run { "(dry run) " } else { "" });
    }
}

pub(super) async fn client() -> Result<Client> {
    Client::try_default()
        .await
        .context("connecting to the cluster (KUBECONFIG or in-cluster config)")
}

pub(super) async fn nodes(c: &Client) -> Result<Vec<Node>> {
    Ok(Api::<Node>::all(c.clone())
        .list(&ListParams::default())
        .await
        .context("listing nodes")?
        .items)
}

pub(super) async fn nodewright(c: &Client, name: &str) -> Result<NodeWright> {
    Api::<NodeWright>::all(c.clone())
        .get_opt(name)
        .await?
        .with_context(|| format!("NodeWright {name:?} not found"))
}

/// Asks unless `--confirm` was given (or nothing will be written); refuses when nobody can
/// answer.
pub(super) fn confirm(ctx: &Ctx, what: &str, arg: &ConfirmArg) -> Result<()> {
    if arg.confirm || ctx.dry_run {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        bail!("refusing to {what} without --confirm (stdin is not a terminal to ask on)");
    }
    eprint!("{what}? [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        bail!("not confirmed")
    }
}

/// Refuses when an agent Job of `cr` is still running on one of `on` (all nodes if empty).
pub(super) async fn refuse_if_running(
    c: &Client,
    namespace: &str,
    cr: &str,
    on: &[String],
) -> Result<()> {
    let jobs = Api::<Job>::namespaced(c.clone(), namespace)
        .list(&ListParams::default().labels(&format!("{}={cr}", keys::job::CR)))
        .await?;
    for j in jobs.items {
        let labels = j.metadata.labels.clone().unwrap_or_default();
        let node = labels.get(keys::job::NODE).cloned().unwrap_or_default();
        let active = j.status.as_ref().and_then(|s| s.active).unwrap_or(0) > 0;
        if active && (on.is_empty() || on.contains(&node)) {
            let stage = labels.get(keys::job::STAGE).cloned().unwrap_or_default();
            bail!(
                "refusing: {cr}'s {stage} stage is running on {node} (Job {}); wait for it to finish, or pause the NodeWright (`nodewright pause {cr}`) and wait",
                j.metadata.name.unwrap_or_default()
            );
        }
    }
    Ok(())
}

/// Conflicts a state edit rides out before giving up: the operator writes a busy node
/// several times a second.
const EDIT_ATTEMPTS: usize = 5;

/// Rewrites `cr`'s state on `node` with `edit` (which returns the new state, or `None` to
/// start over: state, status and drain marks cleared), against the node's
/// `resourceVersion`. On a conflict (the operator wrote the node meanwhile) it reads the
/// node again and applies `edit` to what is there now, so nothing the operator wrote is
/// lost and the edit is not lost either.
pub(super) async fn edit_state(
    c: &Client,
    ctx: &Ctx,
    node: &Node,
    cr: &str,
    edit: impl Fn(NodeState) -> Option<NodeState>,
) -> Result<()> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let api = Api::<Node>::all(c.clone());
    let mut current = node.clone();
    let mut attempt = 1;
    loop {
        let annotations = current.metadata.annotations.clone().unwrap_or_default();
        let state = NodeState::read(&name, &annotations, cr).unwrap_or_default();
        let ann = match edit(state) {
            Some(s) if !s.is_empty() => {
                let mut ann = std::collections::BTreeMap::new();
                s.write(cr, &mut ann);
                ann
            }
            // Starting over also restarts a drain that timed out.
            _ => node_state::reset(cr),
        };
        let patch = json!({"metadata": {
            "resourceVersion": current.meta().resource_version,
            "annotations": ann,
        }});
        match api.patch(&name, &ctx.params(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < EDIT_ATTEMPTS => {
                attempt += 1;
                current = api
                    .get(&name)
                    .await
                    .with_context(|| format!("reading node {name} again after a conflict"))?;
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("updating node {name} ({attempt} attempt(s); it kept changing)")
                });
            }
        }
    }
}
