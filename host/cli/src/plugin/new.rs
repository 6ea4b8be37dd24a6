//! `nodewright plugin new NAME [--lang rust|python|js]`: a template that builds as is.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use nodewright_authoring::Language;

/// Arguments of `plugin new`.
#[derive(Debug, Args)]
pub struct NewArgs {
    /// Plugin name: lowercase letters, digits and dashes. Also the directory created.
    name: String,
    /// The language: rust, python or js (JavaScript or TypeScript).
    #[arg(long, default_value = "rust")]
    lang: Language,
    /// Parent directory (default: the current directory).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Rust only: path to the nodewright-sdk crate (default: the SDK this CLI was built
    /// from, if it exists on this machine; otherwise the crates.io release).
    #[arg(long)]
    sdk_path: Option<PathBuf>,
}

pub fn run(args: NewArgs) -> anyhow::Result<ExitCode> {
    let dir = nodewright_authoring::new_project(&args.name, &args.dir, args.lang, args.sdk_path)?;
    println!(
        "created {} ({} plugin {})",
        dir.display(),
        args.lang,
        args.name
    );
    println!("next:   cd {} && nodewright plugin build", dir.display());
    Ok(ExitCode::SUCCESS)
}
