//! `kubectl-nodewright`: the same command line, found by kubectl on the PATH as the
//! `kubectl nodewright` plugin.

fn main() -> std::process::ExitCode {
    nodewright_cli::main("kubectl nodewright")
}
