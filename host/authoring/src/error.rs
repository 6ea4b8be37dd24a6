//! Why a plugin could not be built: each error says what to install or which manifest field
//! to fix.

use std::path::PathBuf;

use crate::language::Language;

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
