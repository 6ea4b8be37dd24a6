//! What a Python or JavaScript plugin's manifest says: its name, its entry module and the
//! capabilities it imports.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::BuildError;
use crate::templates::valid_name;
use crate::world;

/// The fields the build needs, from `pyproject.toml` or `package.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SourceManifest {
    /// The plugin's name (the component is `<name>.wasm`).
    pub name: String,
    /// Python: the module with the exported package; JavaScript: the entry file.
    pub entry: String,
    /// The capabilities the component imports.
    pub capabilities: Vec<String>,
}

#[derive(Deserialize)]
struct PyProject {
    project: Option<PyProjectTable>,
    tool: Option<PyTools>,
}

#[derive(Deserialize)]
struct PyProjectTable {
    name: Option<String>,
}

#[derive(Deserialize)]
struct PyTools {
    nodewright: Option<Declared>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Declared {
    capabilities: Option<Vec<String>>,
    module: Option<String>,
    main: Option<String>,
}

#[derive(Deserialize)]
struct PackageJson {
    name: Option<String>,
    main: Option<String>,
    nodewright: Option<Declared>,
}

fn invalid(file: &Path, message: impl Into<String>) -> BuildError {
    BuildError::Manifest {
        file: file.to_path_buf(),
        message: message.into(),
    }
}

fn finish(
    file: PathBuf,
    name: Option<String>,
    entry: String,
    declared: Option<Declared>,
    section: &str,
) -> Result<SourceManifest, BuildError> {
    let name = name.ok_or_else(|| invalid(&file, "no package name (the `name` field)"))?;
    let name = name.rsplit('/').next().unwrap_or(&name).to_string();
    if !valid_name(&name) {
        return Err(BuildError::InvalidName(name));
    }
    let capabilities = declared
        .and_then(|d| d.capabilities)
        .ok_or_else(|| {
            invalid(
                &file,
                format!(
                    "no `capabilities` in {section}: list the capabilities the plugin uses, e.g. [\"files\"] (or [] for none)"
                ),
            )
        })?;
    world::check_capabilities(&file, &capabilities)?;
    Ok(SourceManifest {
        name,
        entry,
        capabilities,
    })
}

/// Reads `pyproject.toml`: `[project] name`, `[tool.nodewright] capabilities` and
/// `module` (default `plugin`).
pub(crate) fn python(dir: &Path) -> Result<SourceManifest, BuildError> {
    let file = dir.join("pyproject.toml");
    let text = crate::io::read(&file)?;
    let doc: PyProject = toml::from_str(&text).map_err(|e| invalid(&file, e.to_string()))?;
    let declared = doc.tool.and_then(|t| t.nodewright);
    if declared.as_ref().is_some_and(|d| d.main.is_some()) {
        return Err(invalid(
            &file,
            "[tool.nodewright] has `main`; a Python plugin names its module with `module`",
        ));
    }
    let entry = declared
        .as_ref()
        .and_then(|d| d.module.clone())
        .unwrap_or_else(|| "plugin".into());
    if !entry
        .split('.')
        .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    {
        return Err(invalid(
            &file,
            format!("[tool.nodewright] module {entry:?} is not a Python module name"),
        ));
    }
    let name = doc.project.and_then(|p| p.name);
    finish(file, name, entry, declared, "[tool.nodewright]")
}

/// Reads `package.json`: `name`, `main` (default `plugin.js`) and
/// `nodewright.capabilities`.
pub(crate) fn javascript(dir: &Path) -> Result<SourceManifest, BuildError> {
    let file = dir.join("package.json");
    let text = crate::io::read(&file)?;
    let doc: PackageJson =
        serde_json::from_str(&text).map_err(|e| invalid(&file, e.to_string()))?;
    if doc
        .nodewright
        .as_ref()
        .is_some_and(|d| d.module.is_some() || d.main.is_some())
    {
        return Err(invalid(
            &file,
            "\"nodewright\" takes only `capabilities`; the entry file is the package's `main`",
        ));
    }
    let entry = doc.main.unwrap_or_else(|| "plugin.js".into());
    if !dir.join(&entry).is_file() {
        return Err(invalid(
            &file,
            format!("`main` is {entry:?}, which does not exist"),
        ));
    }
    finish(file, doc.name, entry, doc.nodewright, "\"nodewright\"")
}

/// The capabilities a manifest declares, as a progress line shows them.
pub(crate) fn capability_list(caps: &[String]) -> String {
    if caps.is_empty() {
        "none".into()
    } else {
        caps.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project(file: &str, text: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(file), text).unwrap();
        dir
    }

    #[test]
    fn a_python_manifest_names_module_and_capabilities() {
        let dir = project(
            "pyproject.toml",
            "[project]\nname = \"tuning\"\n[tool.nodewright]\ncapabilities = [\"sysctl\", \"files\"]\n",
        );
        assert_eq!(
            python(dir.path()).unwrap(),
            SourceManifest {
                name: "tuning".into(),
                entry: "plugin".into(),
                capabilities: vec!["sysctl".into(), "files".into()]
            }
        );
    }

    #[test]
    fn missing_capabilities_are_refused_naming_the_field() {
        let dir = project("pyproject.toml", "[project]\nname = \"tuning\"\n");
        let err = python(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("no `capabilities` in [tool.nodewright]"),
            "{err}"
        );
        let dir = project(
            "pyproject.toml",
            "[project]\nname = \"tuning\"\n[tool.nodewright]\ncapabilites = []\n",
        );
        let err = python(dir.path()).unwrap_err().to_string();
        assert!(err.contains("capabilites"), "{err}");
    }

    #[test]
    fn a_js_manifest_needs_its_main_file() {
        let dir = project(
            "package.json",
            r#"{"name": "@acme/drop-in", "main": "src/index.ts", "nodewright": {"capabilities": ["files"]}}"#,
        );
        let err = javascript(dir.path()).unwrap_err().to_string();
        assert!(err.contains("src/index.ts"), "{err}");
        std::fs::create_dir(dir.path().join("src")).unwrap();
        std::fs::write(dir.path().join("src/index.ts"), "").unwrap();
        let m = javascript(dir.path()).unwrap();
        assert_eq!(
            (m.name.as_str(), m.entry.as_str()),
            ("drop-in", "src/index.ts")
        );
    }
}
