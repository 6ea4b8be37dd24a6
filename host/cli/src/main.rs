//! `nodewright`: see the library for the commands.

fn main() -> std::process::ExitCode {
    nodewright_cli::main("nodewright")
}
