//! The cluster verbs: read and steer rollouts through the same objects the operator uses —
//! NodeWright status and annotations, node labels and state annotations, the agent Jobs'
//! results. A node's state is replaced only against the node's `resourceVersion`, so a verb
//! never overwrites what the operator wrote a moment earlier; flags are single annotation
//! keys merged server-side. Verbs that throw work away refuse while a stage of that work is
//! running; verbs that change a rollout ask for confirmation.

pub mod inspect;
mod select;
mod view;

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, Resource};
use nodewright_api::keys;
use nodewright_api::node_state::{self, NodeState, PackageStatus, Stage, State, state_key};
use nodewright_api::v1alpha1::NodeWright;
use serde_json::{Value, json};

/// Output format.
#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum Output {
    /// A table.
    #[default]
    Table,
    /// A table with more columns (messages whole, generations, boot IDs, plugin refs).
    Wide,
    /// JSON, for scripts.
    Json,
    /// YAML, for scripts and people.
    Yaml,
}

impl Output {
    /// Prints `data` as asked; `table(wide)` renders the two table forms.
    fn emit<T: serde::Serialize>(
        self,
        data: &T,
        table: impl FnOnce(bool) -> String,
    ) -> Result<ExitCode> {
        match self {
            Output::Table => print!("{}", table(false)),
            Output::Wide => print!("{}", table(true)),
            Output::Json => println!("{}", serde_json::to_string_pretty(data)?),
            Output::Yaml => print!("{}", serde_yaml_ng::to_string(data)?),
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// `-o`.
#[derive(Debug, Args)]
pub struct OutputArg {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    output: Output,
}

/// `--confirm` / `-y`.
#[derive(Debug, Args)]
pub struct ConfirmArg {
    /// Do it without asking (required when stdin is not a terminal).
    #[arg(long, short = 'y')]
    confirm: bool,
}

/// What `reset` forgets besides the nodes' state.
#[derive(Debug, Args)]
pub struct ResetScope {
    /// Keep the compartments' batch state (a stopped compartment stays stopped).
    #[arg(long)]
    skip_batch_reset: bool,
    /// Forget only this package's entries (batches are kept).
    #[arg(long, conflicts_with = "skip_batch_reset")]
    package: Option<String>,
}

/// The stages `package rerun --stage` can restart at.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum RerunStage {
    Apply,
    Config,
    Interrupt,
    PostInterrupt,
}

impl From<RerunStage> for Stage {
    fn from(s: RerunStage) -> Stage {
        match s {
            RerunStage::Apply => Stage::Apply,
            RerunStage::Config => Stage::Config,
            RerunStage::Interrupt => Stage::Interrupt,
            RerunStage::PostInterrupt => Stage::PostInterrupt,
        }
    }
}

/// Verbs on nodes.
#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Nodes and their status under each NodeWright.
    List(OutputArg),
    /// Every NodeWright's packages on some nodes (all without NODE).
    Status {
        /// Node names or regular expressions over whole names.
        nodes: Vec<String>,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Keep nodes out of every NodeWright (label `nodewright.io/ignore=true`).
    Ignore {
        /// Node names or regular expressions over whole names.
        #[arg(required = true)]
        nodes: Vec<String>,
    },
    /// Let ignored nodes take part again.
    Unignore {
        /// Node names or regular expressions over whole names.
        #[arg(required = true)]
        nodes: Vec<String>,
    },
    /// Forget a NodeWright's state on nodes: every package runs there again from the start.
    Reset {
        /// Node names or regular expressions over whole names.
        #[arg(required = true)]
        nodes: Vec<String>,
        /// The NodeWright.
        #[arg(long)]
        cr: String,
        #[command(flatten)]
        confirm: ConfirmArg,
    },
    /// Set one package's stage and state on nodes: raw surgery on the node record, as
    /// NodeWright's `update-state` (no stage-graph check; pause the NodeWright first).
    UpdateState {
        /// Node names or regular expressions over whole names.
        #[arg(required = true)]
        nodes: Vec<String>,
        /// The NodeWright.
        #[arg(long)]
        cr: String,
        /// The package.
        #[arg(long)]
        package: String,
        /// Its version (the entry is `package|version`).
        #[arg(long)]
        version: String,
        /// `plan`, `uninstall`, `upgrade`, `apply`, `config`, `interrupt`, `post-interrupt`,
        /// `uninstall-interrupt`.
        #[arg(long)]
        stage: String,
        /// `unknown`, `in_progress`, `complete`, `erroring`, `skipped`.
        #[arg(long)]
        state: String,
        /// Create the entry on nodes that have none (at the CR's generation).
        #[arg(long)]
        add: bool,
        #[command(flatten)]
        confirm: ConfirmArg,
    },
}

/// Verbs on packages.
#[derive(Debug, Subcommand)]
pub enum PackageCommand {
    /// Each node's stage and state of a NodeWright's packages.
    Status {
        cr: String,
        package: Option<String>,
        #[command(flatten)]
        output: OutputArg,
    },
    /// The agent pods of a package on a node: each one's result (outcome, blame, changes)
    /// and its log.
    Logs {
        cr: String,
        package: String,
        #[arg(long)]
        node: String,
        /// Only this stage's pods (`interrupt` for the node's merged interrupt).
        #[arg(long)]
        stage: Option<String>,
        /// Lines of each pod's log to show.
        #[arg(long, default_value_t = 50)]
        tail: i64,
        /// Keep printing the running pod's log until its container ends.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Run a package again on some nodes: from its first stage, or from `--stage`.
    Rerun {
        cr: String,
        package: String,
        /// Nodes (repeatable).
        #[arg(long = "node", required_unless_present = "all")]
        nodes: Vec<String>,
        /// Every node that has the package.
        #[arg(long, conflicts_with = "nodes")]
        all: bool,
        /// Restart at this stage instead (the stages after it follow as usual).
        #[arg(long, value_enum)]
        stage: Option<RerunStage>,
        #[command(flatten)]
        confirm: ConfirmArg,
    },
}

/// Verbs on DeploymentPolicy state.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Restart a NodeWright's batches from a first batch (clears its compartment state,
    /// including a compartment stopped on failures).
    Reset {
        cr: String,
        #[command(flatten)]
        confirm: ConfirmArg,
    },
}

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
    fn params(&self) -> PatchParams {
        PatchParams {
            dry_run: self.dry_run,
            ..PatchParams::default()
        }
    }

    /// Prints what a write did (or, in a dry run, would do).
    fn done(&self, what: &str) {
        println!("{}{what}", if self.dry_run { "(dry run) " } else { "" });
    }
}

async fn client() -> Result<Client> {
    Client::try_default()
        .await
        .context("connecting to the cluster (KUBECONFIG or in-cluster config)")
}

async fn nodes(c: &Client) -> Result<Vec<Node>> {
    Ok(Api::<Node>::all(c.clone())
        .list(&ListParams::default())
        .await
        .context("listing nodes")?
        .items)
}

async fn nodewright(c: &Client, name: &str) -> Result<NodeWright> {
    Api::<NodeWright>::all(c.clone())
        .get_opt(name)
        .await?
        .with_context(|| format!("NodeWright {name:?} not found"))
}

/// Asks unless `--confirm` was given (or nothing will be written); refuses when nobody can
/// answer.
fn confirm(ctx: &Ctx, what: &str, arg: &ConfirmArg) -> Result<()> {
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
async fn refuse_if_running(c: &Client, namespace: &str, cr: &str, on: &[String]) -> Result<()> {
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

/// Replaces (or removes, with `None`) a NodeWright's state on a node, against the node's
/// resourceVersion.
async fn write_state(
    c: &Client,
    ctx: &Ctx,
    node: &Node,
    cr: &str,
    state: Option<&NodeState>,
) -> Result<()> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut ann = BTreeMap::new();
    match state {
        Some(s) if !s.is_empty() => s.write(cr, &mut ann),
        // Starting over also restarts a drain that timed out.
        _ => ann = node_state::reset(cr),
    }
    let patch =
        json!({"metadata": {"resourceVersion": node.meta().resource_version, "annotations": ann}});
    Api::<Node>::all(c.clone())
        .patch(&name, &ctx.params(), &Patch::Merge(&patch))
        .await
        .with_context(|| {
            format!("updating node {name} (if it changed meanwhile, run the verb again)")
        })?;
    Ok(())
}

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

/// The NodeWright annotations `pause|resume|disable|enable` steer.
#[derive(Clone, Copy, Debug)]
pub enum Flag {
    Pause,
    Resume,
    Disable,
    Enable,
}

impl Flag {
    /// (verb, annotation, set or cleared, the state it leads to, what that means).
    fn meaning(self) -> (&'static str, &'static str, bool, &'static str, &'static str) {
        match self {
            Flag::Pause => (
                "pause",
                keys::PAUSE,
                true,
                "paused",
                "no new stage starts (running ones finish)",
            ),
            Flag::Resume => (
                "resume",
                keys::PAUSE,
                false,
                "resumed",
                "its rollout goes on",
            ),
            Flag::Disable => (
                "disable",
                keys::DISABLE,
                true,
                "disabled",
                "nothing runs for it and its cordons are released",
            ),
            Flag::Enable => (
                "enable",
                keys::DISABLE,
                false,
                "enabled",
                "its rollout goes on",
            ),
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

/// `node ...`.
pub async fn node(cmd: NodeCommand, ctx: &Ctx) -> Result<ExitCode> {
    let c = client().await?;
    match cmd {
        NodeCommand::List(output) => {
            let crs = Api::<NodeWright>::all(c.clone())
                .list(&ListParams::default())
                .await?
                .items;
            let rows = view::node_list(&crs, &nodes(&c).await?);
            output
                .output
                .emit(&rows, |wide| view::node_list_table(&rows, wide))
        }
        NodeCommand::Status {
            nodes: patterns,
            output,
        } => {
            let all = nodes(&c).await?;
            let picked: Vec<Node> = select::nodes(&all, &patterns)
                .map_err(anyhow::Error::msg)?
                .into_iter()
                .cloned()
                .collect();
            let crs = Api::<NodeWright>::all(c.clone())
                .list(&ListParams::default())
                .await?
                .items;
            let mut rows: Vec<view::PackageRow> = crs
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
        NodeCommand::Ignore { nodes: patterns } => label_ignore(&c, ctx, &patterns, true).await,
        NodeCommand::Unignore { nodes: patterns } => label_ignore(&c, ctx, &patterns, false).await,
        NodeCommand::Reset {
            nodes: patterns,
            cr,
            confirm: yes,
        } => {
            nodewright(&c, &cr).await?;
            let all = nodes(&c).await?;
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
            refuse_if_running(&c, &ctx.namespace, &cr, &names(&with)).await?;
            confirm(
                ctx,
                &format!(
                    "forget {cr}'s state on {} (every package runs there again, interrupts included)",
                    names(&with).join(", ")
                ),
                &yes,
            )?;
            for n in with {
                write_state(&c, ctx, n, &cr, None).await?;
                ctx.done(&format!(
                    "{}: {cr}'s state removed; its packages run again from the start",
                    n.metadata.name.clone().unwrap_or_default()
                ));
            }
            Ok(ExitCode::SUCCESS)
        }
        NodeCommand::UpdateState {
            nodes: patterns,
            cr,
            package,
            version,
            stage,
            state,
            add,
            confirm: yes,
        } => {
            let generation = nodewright(&c, &cr)
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
            let all = nodes(&c).await?;
            let picked = select::nodes(&all, &patterns).map_err(anyhow::Error::msg)?;
            let key = state_key(&package, &version);
            let mut edits = Vec::new();
            for n in picked {
                let name = n.metadata.name.clone().unwrap_or_default();
                let mut st = view::node_state(n, &cr).unwrap_or_default();
                match st.get_mut(&key) {
                    Some(e) => {
                        e.stage = stage;
                        e.state = state;
                    }
                    None if add => {
                        let mut e = PackageStatus::new(&package, &version, stage, generation);
                        e.state = state;
                        st.insert(key.clone(), e);
                    }
                    None => {
                        bail!("{cr} has no {package} {version} entry on {name} (--add creates it)")
                    }
                }
                edits.push((n, name, st));
            }
            let names: Vec<String> = edits.iter().map(|(_, name, _)| name.clone()).collect();
            refuse_if_running(&c, &ctx.namespace, &cr, &names).await?;
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
            for (n, name, st) in edits {
                write_state(&c, ctx, n, &cr, Some(&st)).await?;
                ctx.done(&format!(
                    "{name}: {cr}'s {package} {version} set to {}/{}",
                    stage.as_str(),
                    state.as_str()
                ));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
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
        PackageCommand::Rerun {
            cr,
            package,
            nodes: wanted,
            all,
            stage,
            confirm: yes,
        } => {
            let spec = nodewright(&c, &cr).await?.spec;
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
            let with: Vec<Node> = nodes(&c)
                .await?
                .into_iter()
                .filter(|n| {
                    view::node_state(n, &cr).is_some_and(|s| s.values().any(|p| p.name == package))
                })
                .filter(|n| {
                    all || wanted.contains(n.metadata.name.as_ref().unwrap_or(&String::new()))
                })
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
            refuse_if_running(&c, &ctx.namespace, &cr, &names).await?;
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
            for n in &with {
                let mut st = view::node_state(n, &cr).unwrap_or_default();
                match stage {
                    // Without an entry the operator starts the package afresh.
                    None => st.retain(|_, p| p.name != package),
                    Some(s) => st
                        .values_mut()
                        .filter(|p| p.name == package)
                        .for_each(|p| p.restart_at(s.into(), now)),
                }
                write_state(&c, ctx, n, &cr, Some(&st)).await?;
                ctx.done(&format!(
                    "{}: {package} will run again from {from}",
                    n.metadata.name.clone().unwrap_or_default()
                ));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
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
        let mut st = view::node_state(n, cr).unwrap_or_default();
        st.retain(|_, e| scope.package.as_ref().is_some_and(|p| &e.name != p));
        write_state(&c, ctx, n, cr, Some(&st)).await?;
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
