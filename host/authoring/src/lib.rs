//! Builds nodewright plugins from source and writes the templates authors start from.
//!
//! One contract (`wit/plugin.wit`), three languages: Rust builds with cargo for
//! `wasm32-wasip2` against the Rust SDK; Python with `componentize-py` and JavaScript (or
//! TypeScript) with esbuild and `componentize-js`, each against the world narrowed to the
//! capabilities its manifest declares ([`world`]) and with the copy of the SDK embedded
//! here, so a build always pairs the contract with the SDK written for it. [`build`] finds
//! or installs the language's tools ([`tools`]) and returns the component; checking that
//! the component really is a plugin is the engine's job, done by the caller.
//! [`new_project`] writes a template that builds as is. Every failure is a [`BuildError`]
//! that says what to install or which manifest field to fix.

mod io;
mod js;
mod manifest;
mod python;
mod rust;
mod templates;
pub mod tools;
pub mod world;

use std::fmt;
use std::path::{Path, PathBuf};

pub use templates::{new_project, valid_name};
pub use tools::Toolchain;

/// The languages a plugin can be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    /// cargo + the Rust SDK (`Cargo.toml`).
    Rust,
    /// componentize-py + the Python SDK (`pyproject.toml`).
    Python,
    /// esbuild + componentize-js + the JavaScript SDK (`package.json`).
    JavaScript,
}

impl Language {
    /// Every language, in the order `--lang` lists them.
    pub const ALL: [Language; 3] = [Language::Rust, Language::Python, Language::JavaScript];

    /// The `--lang` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::Python => "python",
            Language::JavaScript => "js",
        }
    }

    /// The manifest that marks a project of this language.
    pub fn manifest(self) -> &'static str {
        match self {
            Language::Rust => "Cargo.toml",
            Language::Python => "pyproject.toml",
            Language::JavaScript => "package.json",
        }
    }

    /// The language of the project in `dir`, from its manifest.
    pub fn detect(dir: &Path) -> Result<Language, BuildError> {
        let found: Vec<Language> = Language::ALL
            .into_iter()
            .filter(|l| dir.join(l.manifest()).is_file())
            .collect();
        match found[..] {
            [one] => Ok(one),
            [] => Err(BuildError::NoProject {
                dir: dir.to_path_buf(),
            }),
            _ => Err(BuildError::Ambiguous {
                dir: dir.to_path_buf(),
                found: found.iter().map(|l| l.manifest()).collect(),
            }),
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Language {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "rust" | "rs" => Ok(Language::Rust),
            "python" | "py" => Ok(Language::Python),
            "js" | "javascript" | "ts" | "typescript" => Ok(Language::JavaScript),
            other => Err(format!(
                "unknown language {other:?}: one of rust, python, js"
            )),
        }
    }
}

/// How to build.
#[derive(Clone, Debug, Default)]
pub struct BuildOptions {
    /// Force the language instead of detecting it from the manifest.
    pub language: Option<Language>,
    /// Rust: the dev profile (faster to build, larger and slower component).
    pub debug: bool,
    /// Where generated files and the component go (default `<project>/build`; Rust
    /// always uses cargo's target directory).
    pub out_dir: Option<PathBuf>,
    /// Where the Python and JavaScript tools are.
    pub tools: Toolchain,
    /// No progress lines on stderr.
    pub quiet: bool,
}

/// A component built from source.
#[derive(Clone, Debug)]
pub struct Built {
    /// The component file.
    pub wasm: PathBuf,
    /// The language it was written in.
    pub language: Language,
}

/// Builds the plugin project in `dir`.
pub fn build(dir: &Path, opts: &BuildOptions) -> Result<Built, BuildError> {
    // Absolute from here on: the tools run in directories of their own.
    let dir = &dir.canonicalize().map_err(|source| BuildError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let language = match opts.language {
        Some(l) => {
            if !dir.join(l.manifest()).is_file() {
                return Err(BuildError::Manifest {
                    file: dir.join(l.manifest()),
                    message: format!("a {l} plugin needs this file"),
                });
            }
            l
        }
        None => Language::detect(dir)?,
    };
    let out = || opts.out_dir.clone().unwrap_or_else(|| dir.join("build"));
    let wasm = match language {
        Language::Rust => rust::build(dir, opts)?,
        Language::Python => python::build(dir, &out(), opts)?,
        Language::JavaScript => js::build(dir, &out(), opts)?,
    };
    Ok(Built { wasm, language })
}

fn capability_list(caps: &[String]) -> String {
    if caps.is_empty() {
        "none".into()
    } else {
        caps.join(", ")
    }
}

fn progress(opts: &BuildOptions, line: &str) {
    if !opts.quiet {
        eprintln!("{line}");
    }
}

/// Why a plugin could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// No manifest of any language.
    #[error(
        "no plugin project in {dir}: expected Cargo.toml (Rust), pyproject.toml (Python) or package.json (JavaScript); create one with `nodewright plugin new NAME --lang rust|python|js`"
    )]
    NoProject {
        /// The directory searched.
        dir: PathBuf,
    },
    /// Manifests of more than one language.
    #[error("{dir} has {}: pass --lang to say which to build", found.join(" and "))]
    Ambiguous {
        /// The directory searched.
        dir: PathBuf,
        /// The manifests found.
        found: Vec<&'static str>,
    },
    /// A manifest is missing or lacks a field.
    #[error("{}: {message}", file.display())]
    Manifest {
        /// The manifest.
        file: PathBuf,
        /// What is wrong, naming the field.
        message: String,
    },
    /// A declared capability the contract does not have.
    #[error("{}: unknown capability {name:?} (the contract's capabilities: {known})", file.display())]
    UnknownCapability {
        /// The manifest.
        file: PathBuf,
        /// The name declared.
        name: String,
        /// The names the contract has.
        known: String,
    },
    /// A tool the language needs is not installed and could not be installed.
    #[error("{tool} is needed to build a {language} plugin: {install}")]
    ToolMissing {
        /// The tool.
        tool: &'static str,
        /// The language.
        language: Language,
        /// How to install it.
        install: String,
    },
    /// A tool ran and failed (its own output was shown above).
    #[error("{tool} failed{}: {hint}", status.map(|s| format!(" (exit {s})")).unwrap_or_default())]
    ToolFailed {
        /// The tool.
        tool: String,
        /// Its exit code, if it exited.
        status: Option<i32>,
        /// What usually causes it.
        hint: String,
    },
    /// The project's name is unusable as a plugin or file name.
    #[error(
        "plugin name {0:?} must be lowercase letters, digits and dashes, starting with a letter"
    )]
    InvalidName(String),
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_says_the_language() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            Language::detect(dir.path()),
            Err(BuildError::NoProject { .. })
        ));
        std::fs::write(dir.path().join("pyproject.toml"), "").unwrap();
        assert_eq!(Language::detect(dir.path()).unwrap(), Language::Python);
        std::fs::write(dir.path().join("package.json"), "{}").unwrap();
        let err = Language::detect(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("pyproject.toml and package.json") && err.contains("--lang"),
            "{err}"
        );
    }

    #[test]
    fn languages_parse_and_print() {
        for l in Language::ALL {
            assert_eq!(l.as_str().parse::<Language>().unwrap(), l);
        }
        assert!(
            "go".parse::<Language>()
                .unwrap_err()
                .contains("rust, python, js")
        );
    }
}
