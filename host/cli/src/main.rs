//! `nodewright`: the plugin author loop (`plugin new|build|inspect|run`) and, as they land,
//! the cluster verbs. Also installed as `kubectl-nodewright`.

mod plugin;
mod units;
mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Roll host packages out to Kubernetes nodes, as sandboxed WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "nodewright", version, propagate_version = true)]
struct Cli {
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
