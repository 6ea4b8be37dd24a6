//! `nodewright plugin new NAME`: a template crate that builds as is.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Args;

/// Arguments of `plugin new`.
#[derive(Debug, Args)]
pub struct NewArgs {
    /// Plugin name: lowercase letters, digits and dashes. Also the directory created.
    name: String,
    /// Parent directory (default: the current directory).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Path to the nodewright-sdk crate (default: the SDK this CLI was built from, if it
    /// exists on this machine; otherwise the crates.io release).
    #[arg(long)]
    sdk_path: Option<PathBuf>,
}

const TEMPLATE_LIB: &str = r#"//! __NAME__: a nodewright package plugin.
//!
//! Writes the config value `message` to /etc/__NAME__.conf. Grant it with:
//!
//!     capabilities:
//!       files:
//!         - {path: /etc/__NAME__.conf, access: readWrite}
//!
//! Try it locally:
//!
//!     nodewright plugin build
//!     nodewright plugin run target/wasm32-wasip2/release/__SNAKE__.wasm --stage apply \
//!         --root /tmp/node --grant files=/etc/__NAME__.conf:rw --config message=hello

use nodewright_sdk::{describe_file_change, export_package, log, Change, Context, Interrupt, Outcome, Package, StepError};

const PATH: &str = "/etc/__NAME__.conf";

fn wanted(ctx: &Context) -> String {
    format!("{}\n", ctx.config("message").unwrap_or("managed by nodewright"))
}

struct Plugin;

impl Package for Plugin {
    /// Read-only: what apply would change. Converged nodes are not cordoned or drained.
    fn plan(ctx: &Context) -> Result<Outcome, StepError> {
        let current = ctx.files().read_opt(PATH)?;
        let changes = match describe_file_change(current.as_deref(), wanted(ctx).as_bytes()) {
            Some(detail) => vec![Change::new("file", PATH, detail)],
            None => vec![],
        };
        Ok(Outcome::changed(changes, Interrupt::None))
    }

    fn apply(ctx: &Context) -> Result<Outcome, StepError> {
        let plan = Self::plan(ctx)?;
        if !plan.changes.is_empty() {
            ctx.files().write(PATH, wanted(ctx).as_bytes(), Some(0o644))?;
            log::info(&format!("wrote {PATH}"));
        }
        Ok(plan)
    }

    fn uninstall(ctx: &Context) -> Result<Outcome, StepError> {
        ctx.files().remove(PATH)?;
        Ok(Outcome::changed(vec![Change::new("file", PATH, "removed")], Interrupt::None))
    }
}

export_package!(Plugin);
"#;

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-')
}

fn default_sdk() -> Option<PathBuf> {
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk");
    built_from
        .join("Cargo.toml")
        .exists()
        .then(|| built_from.canonicalize().ok())
        .flatten()
}

pub fn run(args: NewArgs) -> anyhow::Result<ExitCode> {
    if !valid_name(&args.name) {
        bail!(
            "plugin name {:?} must be lowercase letters, digits and dashes, starting with a letter",
            args.name
        );
    }
    let dir = args.dir.join(&args.name);
    if dir.exists() {
        bail!("{} already exists", dir.display());
    }
    let sdk = match args.sdk_path.or_else(default_sdk) {
        Some(p) => {
            let p = p
                .canonicalize()
                .with_context(|| format!("SDK path {}", p.display()))?;
            format!(
                "nodewright-sdk = {{ path = {:?} }}",
                p.display().to_string()
            )
        }
        None => format!("nodewright-sdk = \"{}\"", env!("CARGO_PKG_VERSION")),
    };
    let snake = args.name.replace('-', "_");
    let manifest = format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
rust-version = "1.95"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
{sdk}

# Small, abort-on-panic components.
[profile.release]
opt-level = "s"
lto = true
codegen-units = 1
panic = "abort"
strip = true

# A standalone crate, even inside another workspace.
[workspace]
"#,
        name = args.name
    );
    std::fs::create_dir_all(dir.join("src"))
        .with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(dir.join("Cargo.toml"), manifest)?;
    std::fs::write(
        dir.join("src/lib.rs"),
        TEMPLATE_LIB
            .replace("__NAME__", &args.name)
            .replace("__SNAKE__", &snake),
    )?;
    std::fs::write(dir.join(".gitignore"), "/target\n")?;
    println!("created {} (plugin {})", dir.display(), args.name);
    println!("next:   cd {} && nodewright plugin build", dir.display());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("gpu-mode"));
        assert!(!valid_name("Gpu"));
        assert!(!valid_name("9lives"));
        assert!(!valid_name("a_b"));
        assert!(!valid_name("a-"));
    }
}
