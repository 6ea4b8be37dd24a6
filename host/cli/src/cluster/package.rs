//! `package ...`, `reset CR` and `policy reset CR`.

use std::process::ExitCode;

use ::kube::Client;
use ::kube::api::{Api, Patch};
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use nodewright_api::node_state::{NodeState, Stage};
use nodewright_api::v1alpha1::NodeWright;
use serde_json::json;

use super::args::{ConfirmArg, PackageCommand, PolicyCommand, Rerun, RerunStage, ResetScope};
use super::kube::{Ctx, client, confirm, edit_state, nodes, nodewright, refuse_if_running};
use super::{inspect, view};

/// `package ...`.
pub async fn package(cmd: PackageCommand, ctx: &Ctx) -> Result<ExitCode> {
    let c = client().await?;
    match cmd {
        PackageCommand::Status {
            cr,
            package,
            output,
        } => {
            let spec = nodewright(&c, &cr).await?.spec;
            if let Some(p) = &package
                && !spec.packages.contains_key(p)
            {
                bail!(
                    "{cr} has no package {p:?} (it has: {})",
                    spec.packages.keys().cloned().collect::<Vec<_>>().join(", ")
                );
            }
            let rows = view::package_rows(&cr, package.as_deref(), &nodes(&c).await?);
            output
                .output
                .emit(&rows, |wide| view::package_table(&rows, wide))
        }
        PackageCommand::Logs {
            cr,
            package,
            node,
            stage,
            tail,
            follow,
        } => {
            inspect::logs(
                &c,
                &ctx.namespace,
                &cr,
                &package,
                &node,
                inspect::LogsOf {
                    stage: stage.as_deref(),
                    tail,
                    follow,
                },
            )
            .await
        }
        PackageCommand::Rerun(args) => rerun(&c, ctx, args).await,
    }
}

/// `package rerun`: the package's state on the chosen nodes rewound to its first stage, or
/// to `--stage`.
async fn rerun(c: &Client, ctx: &Ctx, args: Rerun) -> Result<ExitCode> {
    let Rerun {
        cr,
        package,
        nodes: wanted,
        all,
        stage,
        confirm: yes,
    } = args;
    let spec = nodewright(c, &cr).await?.spec;
    let Some(p) = spec.packages.get(&package) else {
        bail!("{cr} has no package {package:?}")
    };
    if matches!(
        stage,
        Some(RerunStage::Interrupt | RerunStage::PostInterrupt)
    ) && p.interrupt.is_none()
        && p.config_interrupts.is_empty()
    {
        bail!(
            "{cr}/{package} has no interrupt (spec.packages.{package}.interrupt is unset): there is no interrupt stage to rerun"
        );
    }
    let with: Vec<Node> = nodes(c)
        .await?
        .into_iter()
        .filter(|n| view::node_state(n, &cr).is_some_and(|s| s.values().any(|p| p.name == package)))
        .filter(|n| all || wanted.contains(n.metadata.name.as_ref().unwrap_or(&String::new())))
        .collect();
    let names: Vec<String> = with
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    if let Some(missing) = wanted.iter().find(|w| !names.contains(w)) {
        bail!("{missing} has no state for {cr}/{package}: nothing to rerun there");
    }
    if names.is_empty() {
        bail!("no node has state for {cr}/{package}");
    }
    refuse_if_running(c, &ctx.namespace, &cr, &names).await?;
    let from = stage.map_or_else(
        || "its first stage".to_string(),
        |s| format!("its {} stage", Stage::from(s).as_str()),
    );
    confirm(
        ctx,
        &format!(
            "run {package} of {cr} again from {from} on {}",
            names.join(", ")
        ),
        &yes,
    )?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let edit = |mut st: NodeState| {
        match stage {
            // Without an entry the operator starts the package afresh.
            None => st.retain(|_, p| p.name != package),
            Some(s) => st
                .values_mut()
                .filter(|p| p.name == package)
                .for_each(|p| p.restart_at(s.into(), now)),
        }
        Some(st)
    };
    for n in &with {
        edit_state(c, ctx, n, &cr, edit).await?;
        ctx.done(&format!(
            "{}: {package} will run again from {from}",
            n.metadata.name.clone().unwrap_or_default()
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// `reset CR`: forget the NodeWright's state on every node and its batch state.
pub async fn reset(ctx: &Ctx, cr: &str, scope: &ResetScope, yes: &ConfirmArg) -> Result<ExitCode> {
    let c = client().await?;
    let spec = nodewright(&c, cr).await?.spec;
    if let Some(p) = &scope.package
        && !spec.packages.contains_key(p)
    {
        bail!(
            "{cr} has no package {p:?} (it has: {})",
            spec.packages.keys().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    let has = |n: &Node| {
        view::node_state(n, cr).is_some_and(|st| {
            scope
                .package
                .as_ref()
                .is_none_or(|p| st.values().any(|e| &e.name == p))
        })
    };
    let with: Vec<Node> = nodes(&c).await?.into_iter().filter(has).collect();
    refuse_if_running(&c, &ctx.namespace, cr, &[]).await?;
    // One package: only its entries, and the batches go on (as NodeWright's `--package`).
    let batches = scope.package.is_none() && !scope.skip_batch_reset;
    let what = scope
        .package
        .as_ref()
        .map_or_else(|| format!("{cr}'s state"), |p| format!("{cr}/{p}'s state"));
    confirm(
        ctx,
        &format!(
            "forget {what} on {} node(s){}",
            with.len(),
            if batches {
                " and restart its batches"
            } else {
                ""
            }
        ),
        yes,
    )?;
    for n in &with {
        edit_state(&c, ctx, n, cr, |mut st| {
            st.retain(|_, e| scope.package.as_ref().is_some_and(|p| &e.name != p));
            Some(st)
        })
        .await?;
    }
    if batches {
        clear_batches(&c, ctx, cr).await?;
    }
    ctx.done(&format!(
        "{what} removed from {} node(s){}",
        with.len(),
        if batches {
            ", batches restarted"
        } else {
            ", batches kept"
        }
    ));
    Ok(ExitCode::SUCCESS)
}

async fn clear_batches(c: &Client, ctx: &Ctx, cr: &str) -> Result<()> {
    let patch = json!({"status": {"compartmentStatuses": null}});
    Api::<NodeWright>::all(c.clone())
        .patch_status(cr, &ctx.params(), &Patch::Merge(&patch))
        .await
        .context("clearing status.compartmentStatuses")?;
    Ok(())
}

/// `policy reset CR`.
pub async fn policy(cmd: PolicyCommand, ctx: &Ctx) -> Result<ExitCode> {
    let PolicyCommand::Reset { cr, confirm: yes } = cmd;
    let c = client().await?;
    let current = nodewright(&c, &cr).await?;
    let stopped: Vec<String> = current
        .status
        .map(|s| s.compartment_statuses)
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, s)| s.batch_state.as_ref().is_some_and(|b| b.should_stop))
        .map(|(n, _)| n)
        .collect();
    confirm(
        ctx,
        &format!(
            "restart {cr}'s batches from a first batch{}",
            if stopped.is_empty() {
                String::new()
            } else {
                format!(" (stopped: {})", stopped.join(", "))
            }
        ),
        &yes,
    )?;
    clear_batches(&c, ctx, &cr).await?;
    ctx.done(&format!(
        "{cr}: batch state cleared; compartments start again from a first batch"
    ));
    Ok(ExitCode::SUCCESS)
}
