//! `nodewright plugin build`: the language's build (cargo, componentize-py, or esbuild +
//! componentize-js; see nodewright-authoring), then the world check.

use nodewright_api::units::format_bytes;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use nodewright_authoring::{BuildOptions, Language, Toolchain};

/// Arguments of `plugin build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The plugin project (directory holding Cargo.toml, pyproject.toml or package.json).
    #[arg(long, default_value = ".")]
    path: PathBuf,
    /// The language, when the directory has manifests of more than one.
    #[arg(long)]
    lang: Option<Language>,
    /// Rust: build with the dev profile (faster to build, larger and slower component).
    #[arg(long)]
    debug: bool,
    /// Python and JavaScript: never install the build tools into the project (.venv,
    /// node_modules); fail naming them instead.
    #[arg(long)]
    no_install: bool,
}

pub fn run(args: BuildArgs) -> anyhow::Result<ExitCode> {
    // The toolchains (cargo, rustc, pip, npm) run as the host has them, transparent huge
    // pages included: the CLI's start turned them off (`crate::no_huge_pages`), and children
    // inherit that.
    let _ = rustix::thread::disable_transparent_huge_pages(false);
    let mut tools = Toolchain::from_env();
    tools.install = !args.no_install;
    let built = nodewright_authoring::build(
        &args.path,
        &BuildOptions {
            language: args.lang,
            debug: args.debug,
            out_dir: None,
            tools,
            quiet: false,
        },
    )?;
    let engine = super::engine()?;
    let (plugin, _) = super::load(&engine, &built.wasm)?;
    let caps: Vec<&str> = plugin
        .required_capabilities()
        .iter()
        .map(|c| c.interface())
        .collect();
    println!("built    {}", built.wasm.display());
    println!("language {}", built.language);
    println!(
        "size     {} ({} bytes)",
        format_bytes(plugin.size as u64),
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
