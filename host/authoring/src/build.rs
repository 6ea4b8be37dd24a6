//! A build: the project's language, then that language's builder.

use std::path::Path;

use crate::error::BuildError;
use crate::language::Language;
use crate::options::{BuildOptions, Built};
use crate::{js, python, rust};

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

impl Language {
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
}
