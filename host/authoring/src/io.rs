//! File helpers whose errors name the path.

use std::path::Path;

use crate::BuildError;

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
