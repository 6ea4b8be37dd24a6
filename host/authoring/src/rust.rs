//! A Rust plugin: cargo for `wasm32-wasip2`, against the Rust SDK.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::BuildError;
use crate::language::Language;
use crate::options::{BuildOptions, progress};

pub(crate) fn build(dir: &Path, opts: &BuildOptions) -> Result<PathBuf, BuildError> {
    let manifest = dir.join("Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--target",
        "wasm32-wasip2",
        "--message-format",
        "json-render-diagnostics",
        "--manifest-path",
    ])
    .arg(&manifest)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    if !opts.debug {
        cmd.arg("--release");
    }
    progress(
        opts,
        &format!(
            "building {} for wasm32-wasip2{}",
            manifest.display(),
            if opts.debug { " (debug)" } else { "" }
        ),
    );
    let mut child = cmd.spawn().map_err(|_| BuildError::ToolMissing {
        tool: "cargo",
        language: Language::Rust,
        install: "install Rust with rustup (https://rustup.rs)".into(),
    })?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut wasm: Vec<PathBuf> = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact"
            && msg["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "cdylib"))
            && let Some(files) = msg["filenames"].as_array()
        {
            wasm.extend(
                files
                    .iter()
                    .filter_map(|f| f.as_str())
                    .filter(|f| f.ends_with(".wasm"))
                    .map(PathBuf::from),
            );
        }
    }
    let status = child.wait().map_err(|source| BuildError::Io {
        path: manifest.clone(),
        source,
    })?;
    if !status.success() {
        let missing_target = Command::new("rustup")
            .args(["target", "list", "--installed"])
            .output()
            .ok()
            .is_some_and(|o| !String::from_utf8_lossy(&o.stdout).contains("wasm32-wasip2"));
        return Err(BuildError::ToolFailed {
            tool: "cargo build".into(),
            status: status.code(),
            hint: if missing_target {
                "the wasm32-wasip2 target is not installed: rustup target add wasm32-wasip2".into()
            } else {
                "the compiler's errors are above".into()
            },
        });
    }
    wasm.pop().ok_or_else(|| BuildError::Manifest {
        file: manifest,
        message: "cargo produced no .wasm: the crate needs `[lib] crate-type = [\"cdylib\"]`"
            .into(),
    })
}
