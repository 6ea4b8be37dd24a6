//! The `nodewright` command line: the plugin author loop (`plugin new|build|inspect|run|
//! push|pull`), manifest validation, and the cluster verbs (`preview`, `status`, `node`,
//! `package`, `reset`, `pause`, `resume`, `disable`, `enable`, `policy`, `version`). Two binaries run it:
//! `nodewright`, and `kubectl-nodewright`, which kubectl finds on the PATH as a plugin
//! (`kubectl nodewright status`); they differ only in the name their help shows.

#![deny(missing_docs)]

mod cluster;
mod plugin;
mod printable;
mod validate;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Roll host packages out to Kubernetes nodes, as sandboxed WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "nodewright", version, propagate_version = true)]
struct Cli {
    /// Namespace of the operator's agent Jobs (cluster verbs).
    #[arg(
        long,
        global = true,
        env = "NODEWRIGHT_NAMESPACE",
        default_value = "nodewright"
    )]
    namespace: String,
    /// Send every write as a server-side dry run: validated and admitted (or refused) as
    /// it would be, persisted nowhere; nothing is asked.
    #[arg(long, global = true)]
    dry_run: bool,
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
    /// What applying NodeWrights would do, node by node, before anything is done: the
    /// operator runs each package's read-only plan stage on the nodes (a NodeWrightPreview)
    /// and forecasts the rollout with their answers.
    Preview {
        /// Files of NodeWright manifests (other kinds are skipped).
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<std::path::PathBuf>,
        /// Only these nodes: planned and reported (repeatable).
        #[arg(long = "node")]
        nodes: Vec<String>,
        /// A forecast only, from the operator's caches, as a server-side dry run's answer:
        /// every package assumed to change, no plan stage run (seconds, not minutes).
        #[arg(long)]
        quick: bool,
        /// Keep the NodeWrightPreview (until its TTL) instead of deleting it once read.
        #[arg(long)]
        keep: bool,
        /// Longest wait for the plan stages, e.g. `90s`, `10m`.
        #[arg(long, default_value = "10m", value_parser = cluster::parse_duration)]
        timeout: std::time::Duration,
        #[command(flatten)]
        output: cluster::OutputArg,
    },
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
        scope: cluster::ResetScope,
        #[command(flatten)]
        confirm: cluster::ConfirmArg,
    },
    /// Start no new work for a NodeWright (running stages finish).
    Pause {
        cr: String,
        #[command(flatten)]
        confirm: cluster::ConfirmArg,
    },
    /// Undo `pause`.
    Resume {
        cr: String,
        #[command(flatten)]
        confirm: cluster::ConfirmArg,
    },
    /// Stop a NodeWright and release its cordons.
    Disable {
        cr: String,
        #[command(flatten)]
        confirm: cluster::ConfirmArg,
    },
    /// Undo `disable`.
    Enable {
        cr: String,
        #[command(flatten)]
        confirm: cluster::ConfirmArg,
    },
    /// Versions: this CLI, the cluster, the served API, the operator and its leader.
    Version {
        /// Only this CLI's.
        #[arg(long)]
        client_only: bool,
    },
    /// DeploymentPolicy batch state: reset.
    #[command(subcommand)]
    Policy(cluster::PolicyCommand),
}

/// Turns transparent huge pages off for this process (and what it starts). A CLI process
/// lives milliseconds: huge pages zeroed on first touch cost it more than the TLB misses they
/// save (`nodewright --version` 2.2 ms with them, 1.7 ms without, measured), so `main` calls
/// this before its first allocation touches a page, and the benches that stand for the CLI
/// do too. `plugin build` turns them back on for the toolchains it runs. An error (a kernel
/// that refuses the call) leaves the host's own setting.
pub fn no_huge_pages() -> std::io::Result<()> {
    rustix::thread::disable_transparent_huge_pages(true).map_err(std::io::Error::from)
}

/// Runs the command line as `program` (the name shown in help and usage).
pub fn main(program: &'static str) -> ExitCode {
    let huge_pages = no_huge_pages();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("NODEWRIGHT_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = huge_pages {
        tracing::debug!("transparent huge pages left as the host has them: {e}");
    }
    let matches = Cli::command().name(program).bin_name(program).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // One thread: every command waits on I/O or on one plugin at a time, and worker
    // threads would cost a one-stage `plugin run` more than its stage (the engine's blocking
    // host calls still get tokio's blocking pool).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let ctx = cluster::Ctx {
        namespace: cli.namespace.clone(),
        dry_run: cli.dry_run,
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Plugin(cmd) => plugin::run(cmd).await,
            Command::Validate(args) => validate::run(args),
            Command::Preview {
                files,
                nodes,
                quick,
                keep,
                timeout,
                output,
            } => {
                let how = cluster::PreviewHow {
                    nodes,
                    quick,
                    keep,
                    timeout,
                };
                cluster::preview(&files, &how, output).await
            }
            Command::Status { cr, output } => cluster::status(cr, output).await,
            Command::Node(cmd) => cluster::node(cmd, &ctx).await,
            Command::Package(cmd) => cluster::package(cmd, &ctx).await,
            Command::Reset { cr, scope, confirm } => {
                cluster::reset(&ctx, &cr, &scope, &confirm).await
            }
            Command::Pause { cr, confirm } => {
                cluster::flag(&ctx, &cr, cluster::Flag::Pause, &confirm).await
            }
            Command::Resume { cr, confirm } => {
                cluster::flag(&ctx, &cr, cluster::Flag::Resume, &confirm).await
            }
            Command::Disable { cr, confirm } => {
                cluster::flag(&ctx, &cr, cluster::Flag::Disable, &confirm).await
            }
            Command::Enable { cr, confirm } => {
                cluster::flag(&ctx, &cr, cluster::Flag::Enable, &confirm).await
            }
            Command::Policy(cmd) => cluster::policy(cmd, &ctx).await,
            Command::Version { client_only } => cluster::inspect::version(&ctx, client_only).await,
        }
    });
    // A host call still blocked after a stage's deadline must not hold the process open.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", printable::printable(&format!("{e:#}")));
            ExitCode::from(2)
        }
    }
}
