//! File helpers whose errors name the path.

use std::path::Path;

use crate::error::BuildError;

fn err(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn create_dir(path: &Path) -> Result<(), BuildError> {
    std::fs::create_dir_all(path).map_err(err(path))
}

pub(crate) fn write(path: &Path, contents: &str) -> Result<(), BuildError> {
    if let Some(parent) = path.parent() {
        create_dir(parent)?;
    }
    std::fs::write(path, contents).map_err(err(path))
}

pub(crate) fn read(path: &Path) -> Result<String, BuildError> {
    std::fs::read_to_string(path).map_err(err(path))
}

/// Copies the files under `from` to `to`, skipping hidden entries and the named directories.
pub(crate) fn copy_tree(from: &Path, to: &Path, skip: &[&str]) -> Result<(), BuildError> {
    create_dir(to)?;
    for entry in std::fs::read_dir(from).map_err(err(from))? {
        let entry = entry.map_err(err(from))?;
        let name = entry.file_name();
        let name_str = name.to_string_lossy();
        if name_str.starts_with('.') || skip.contains(&name_str.as_ref()) {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type().map_err(err(&path))?;
        if kind.is_dir() {
            copy_tree(&path, &to.join(&name), skip)?;
        } else if kind.is_file() {
            std::fs::copy(&path, to.join(&name)).map_err(err(&path))?;
        }
    }
    Ok(())
}
