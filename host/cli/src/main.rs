//! `nodewright`: the plugin author loop (`plugin new|build|inspect|run|push|pull`), manifest
//! validation, and the cluster verbs (`status`, `node`, `package`, `reset`, `pause`,
//! `resume`, `disable`, `enable`, `policy`). Linked as `kubectl-nodewright` on the PATH, it is
//! also a kubectl plugin (`kubectl nodewright status`).

mod cluster;
mod plugin;
mod units;
mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Roll host packages out to Kubernetes nodes, as sandboxed WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "nodewright", version, propagate_version = true)]
struct Cli {
    /// Namespace of the operator's agent Jobs (cluster verbs).
    #[arg(long, global = true, env = "NODEWRIGHT_NAMESPACE", default_value = "nodewright")]
    namespace: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once per process")]
enum Command {
    /// Write, build, inspect and run plugins locally.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Validate NodeWright and DeploymentPolicy manifests with the admission rules.
    Validate(validate::ValidateArgs),
    /// Rollout status: every NodeWright, or one NodeWright per node and package.
    Status {
        /// A NodeWright.
        cr: Option<String>,
        #[command(flatten)]
        output: cluster::OutputArg,
    },
    /// Nodes: list, status, ignore, unignore, reset.
    #[command(subcommand)]
    Node(cluster::NodeCommand),
    /// Packages: status, logs, rerun.
    #[command(subcommand)]
    Package(cluster::PackageCommand),
    /// Forget a NodeWright's state on every node and restart its rollout.
    Reset {
        cr: String,
        #[command(flatten)]
        confirm: cluster::ConfirmArg,
    },
    /// Start no new work for a NodeWright (running stages finish).
    Pause { cr: String },
    /// Undo `pause`.
    Resume { cr: String },
    /// Stop a NodeWright and release its cordons.
    Disable { cr: String },
    /// Undo `disable`.
    Enable { cr: String },
    /// DeploymentPolicy batch state: reset.
    #[command(subcommand)]
    Policy(cluster::PolicyCommand),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("NODEWRIGHT_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Plugin(cmd) => plugin::run(cmd).await,
            Command::Validate(args) => validate::run(args),
            Command::Status { cr, output } => cluster::status(cr, output).await,
            Command::Node(cmd) => cluster::node(cmd, &cli.namespace).await,
            Command::Package(cmd) => cluster::package(cmd, &cli.namespace).await,
            Command::Reset { cr, confirm } => cluster::reset(&cr, &confirm, &cli.namespace).await,
            Command::Pause { cr } => cluster::flag(&cr, nodewright_api::keys::PAUSE, true).await,
            Command::Resume { cr } => cluster::flag(&cr, nodewright_api::keys::PAUSE, false).await,
            Command::Disable { cr } => cluster::flag(&cr, nodewright_api::keys::DISABLE, true).await,
            Command::Enable { cr } => cluster::flag(&cr, nodewright_api::keys::DISABLE, false).await,
            Command::Policy(cmd) => cluster::policy(cmd).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
