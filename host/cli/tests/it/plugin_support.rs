//! Running the `nodewright` binary for the author-loop tests.

use std::path::Path;
use std::process::{Command, Output};

pub fn nodewright(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodewright"))
        .args(args)
        .env("NODEWRIGHT_CACHE_DIR", cache)
        .output()
        .expect("run nodewright")
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
