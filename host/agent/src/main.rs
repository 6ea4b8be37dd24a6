//! `nodewright-agent`: parses the call the operator wrote into the stage Job's arguments
//! and carries it out (see the library, `nodewright_agent`).

// musl's allocator is slow for allocation-heavy work; see the workspace's `mimalloc`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    match nodewright_agent::Cli::try_parse() {
        Ok(cli) => nodewright_agent::run(&cli.call),
        Err(e) if !e.use_stderr() => {
            // --help, --version.
            let _ = e.print();
            ExitCode::SUCCESS
        }
        Err(e) => {
            let args: Vec<String> = std::env::args().collect();
            nodewright_agent::refuse_arguments(&args, &e.to_string())
        }
    }
}
