//! `kubectl-nodewright`: the same command line, found by kubectl on the PATH as the
//! `kubectl nodewright` plugin.

// musl's allocator is slow for allocation-heavy work; see the workspace's `mimalloc`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    nodewright_cli::main("kubectl nodewright")
}
