//! The cluster verbs: read and steer rollouts through the same objects the operator uses —
//! NodeWright status and annotations, node labels and state annotations, the agent Jobs'
//! results. A node's state is replaced only against the node's `resourceVersion`, so a verb
//! never overwrites what the operator wrote a moment earlier (on a conflict it reads the
//! node again and redoes its edit); flags are single annotation keys merged server-side.
//! Verbs that throw work away refuse while a stage of that work is running; verbs that
//! change a rollout ask for confirmation.

mod args;
pub mod inspect;
mod kube;
mod node;
mod package;
mod preview;
mod select;
mod view;

use std::process::ExitCode;

use ::kube::api::{Api, ListParams, Patch};
use anyhow::{Context, Result};
use nodewright_api::v1alpha1::NodeWright;
use serde_json::{Value, json};

pub use args::{
    ConfirmArg, Flag, NodeCommand, OutputArg, PackageCommand, PolicyCommand, ResetScope,
};
pub use kube::Ctx;
pub use node::node;
pub use package::{package, policy, reset};
pub use preview::{PreviewHow, parse_duration, preview};

use kube::{client, confirm, nodes, nodewright};

/// `status [CR]`.
pub async fn status(cr: Option<String>, output: OutputArg) -> Result<ExitCode> {
    let c = client().await?;
    match cr {
        None => {
            let crs = Api::<NodeWright>::all(c.clone())
                .list(&ListParams::default())
                .await?
                .items;
            let s = view::summaries(&crs);
            output
                .output
                .emit(&s, |wide| view::summaries_table(&s, wide))
        }
        Some(name) => {
            let cr = nodewright(&c, &name).await?;
            let rows = view::node_rows(&cr, &nodes(&c).await?);
            let summary = view::summaries(std::slice::from_ref(&cr));
            output.output.emit(
                &json!({"summary": summary.first(), "nodes": rows}),
                |wide| {
                    format!(
                        "{}\n{}",
                        view::summaries_table(&summary, wide),
                        view::node_rows_table(&cr, &rows, wide)
                    )
                },
            )
        }
    }
}

/// `pause|resume|disable|enable CR`: sets or clears a NodeWright annotation.
pub async fn flag(ctx: &Ctx, cr: &str, flag: Flag, yes: &ConfirmArg) -> Result<ExitCode> {
    let (verb, key, on, state, effect) = flag.meaning();
    let c = client().await?;
    let current = nodewright(&c, cr).await?;
    let is_on = current
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .is_some_and(|v| v == "true");
    if is_on == on {
        println!("{cr}: already {state}");
        return Ok(ExitCode::SUCCESS);
    }
    confirm(ctx, &format!("{verb} {cr} ({effect})"), yes)?;
    // One annotation key, merged server-side: nothing else to lose, so no resourceVersion
    // (the operator's status writes move it several times a second).
    let patch = json!({"metadata": {"annotations": {key: if on { Value::from("true") } else { Value::Null }}}});
    Api::<NodeWright>::all(c)
        .patch(cr, &ctx.params(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("updating {cr}'s annotations"))?;
    ctx.done(&format!("{cr}: {state}: {effect}"));
    Ok(ExitCode::SUCCESS)
}
