//! The cluster verbs' arguments: output formats, confirmation, what a reset or rerun
//! covers, and the `node`, `package` and `policy` subcommands.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand, ValueEnum};
use nodewright_api::keys;
use nodewright_api::node_state::Stage;

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
    pub(super) fn emit<T: serde::Serialize>(
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
    pub(super) output: Output,
}

/// `--confirm` / `-y`.
#[derive(Debug, Args)]
pub struct ConfirmArg {
    /// Do it without asking (required when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub(super) confirm: bool,
}

/// What `reset` forgets besides the nodes' state.
#[derive(Debug, Args)]
pub struct ResetScope {
    /// Keep the compartments' batch state (a stopped compartment stays stopped).
    #[arg(long)]
    pub(super) skip_batch_reset: bool,
    /// Forget only this package's entries (batches are kept).
    #[arg(long, conflicts_with = "skip_batch_reset")]
    pub(super) package: Option<String>,
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
    Reset(NodeReset),
    /// Set one package's stage and state on nodes: raw surgery on the node record, as
    /// NodeWright's `update-state` (no stage-graph check; pause the NodeWright first).
    UpdateState(UpdateState),
}

/// `node reset`.
#[derive(Debug, clap::Args)]
pub struct NodeReset {
    /// Node names or regular expressions over whole names.
    #[arg(required = true)]
    pub nodes: Vec<String>,
    /// The NodeWright.
    #[arg(long)]
    pub cr: String,
    #[command(flatten)]
    pub confirm: ConfirmArg,
}

/// `node update-state`.
#[derive(Debug, clap::Args)]
pub struct UpdateState {
    /// Node names or regular expressions over whole names.
    #[arg(required = true)]
    pub nodes: Vec<String>,
    /// The NodeWright.
    #[arg(long)]
    pub cr: String,
    /// The package.
    #[arg(long)]
    pub package: String,
    /// Its version (the entry is `package|version`).
    #[arg(long)]
    pub version: String,
    /// `plan`, `uninstall`, `upgrade`, `apply`, `config`, `interrupt`, `post-interrupt`,
    /// `uninstall-interrupt`.
    #[arg(long)]
    pub stage: String,
    /// `unknown`, `in_progress`, `complete`, `erroring`, `skipped`.
    #[arg(long)]
    pub state: String,
    /// Create the entry on nodes that have none (at the CR's generation).
    #[arg(long)]
    pub add: bool,
    #[command(flatten)]
    pub confirm: ConfirmArg,
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
    Rerun(Rerun),
}

/// `package rerun`.
#[derive(Debug, clap::Args)]
pub struct Rerun {
    /// The NodeWright.
    pub cr: String,
    /// The package.
    pub package: String,
    /// Nodes (repeatable).
    #[arg(long = "node", required_unless_present = "all")]
    pub nodes: Vec<String>,
    /// Every node that has the package.
    #[arg(long, conflicts_with = "nodes")]
    pub all: bool,
    /// Restart at this stage instead (the stages after it follow as usual).
    #[arg(long, value_enum)]
    pub stage: Option<RerunStage>,
    #[command(flatten)]
    pub confirm: ConfirmArg,
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
    pub(super) fn meaning(self) -> (&'static str, &'static str, bool, &'static str, &'static str) {
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
