//! `nodewright validate FILE...`: the admission rules, offline.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

/// Arguments of `validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// YAML files (multi-document allowed); `-` reads stdin.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

pub fn run(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let mut failed = 0;
    for file in &args.files {
        let text = if file.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin())?
        } else {
            std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))?
        };
        for (i, doc) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
            let value: serde_json::Value = serde::Deserialize::deserialize(doc)
                .with_context(|| format!("{}: document {} is not YAML", file.display(), i + 1))?;
            if value.is_null() {
                continue;
            }
            match nodewright_api::validate::validate_manifest(&value) {
                Ok((kind, name)) => println!("{}: {kind}/{name} is valid", file.display()),
                Err(errors) => {
                    failed += 1;
                    let kind = value["kind"].as_str().unwrap_or("?");
                    let name = value["metadata"]["name"].as_str().unwrap_or("?");
                    println!("{}: {kind}/{name} is invalid:", file.display());
                    for e in errors {
                        println!("  {e}");
                    }
                }
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
