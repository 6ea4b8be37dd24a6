//! `nodewright plugin build`: cargo for wasm32-wasip2, then the world check.

use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context as _, bail};
use clap::Args;
use std::io::BufRead;

/// Arguments of `plugin build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The plugin crate (directory holding Cargo.toml).
    #[arg(long, default_value = ".")]
    path: PathBuf,
    /// Build with the dev profile (faster to build, larger and slower component).
    #[arg(long)]
    debug: bool,
}

pub fn run(args: BuildArgs) -> anyhow::Result<ExitCode> {
    let manifest = args.path.join("Cargo.toml");
    if !manifest.exists() {
        bail!(
            "{} not found: run this in a plugin crate or pass --path",
            manifest.display()
        );
    }
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
    if !args.debug {
        cmd.arg("--release");
    }
    eprintln!(
        "building {} for wasm32-wasip2{}",
        manifest.display(),
        if args.debug { " (debug)" } else { "" }
    );
    let mut child = cmd
        .spawn()
        .context("cannot run cargo (is Rust installed?)")?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut wasm: Vec<PathBuf> = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line?;
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
    let status = child.wait()?;
    if !status.success() {
        let hint = Command::new("rustup")
            .args(["target", "list", "--installed"])
            .output()
            .ok()
            .filter(|o| !String::from_utf8_lossy(&o.stdout).contains("wasm32-wasip2"))
            .map(
                |_| " (the wasm32-wasip2 target is not installed: rustup target add wasm32-wasip2)",
            )
            .unwrap_or("");
        bail!("cargo build failed{hint}");
    }
    let Some(file) = wasm.last() else {
        bail!("cargo produced no .wasm: the crate needs `[lib] crate-type = [\"cdylib\"]`");
    };
    let engine = super::engine()?;
    let (plugin, _) = super::load(&engine, file)?;
    let caps: Vec<&str> = plugin
        .required_capabilities()
        .iter()
        .map(|c| c.interface())
        .collect();
    println!("built    {}", file.display());
    println!(
        "size     {} ({} bytes)",
        super::human_size(plugin.size),
        plugin.size
    );
    println!("digest   {}", plugin.digest);
    println!(
        "needs    {}",
        if caps.is_empty() {
            "no capabilities".to_string()
        } else {
            caps.join(", ")
        }
    );
    Ok(ExitCode::SUCCESS)
}
