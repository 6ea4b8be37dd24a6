//! The Python and JavaScript plugin build tools, installed once per pinned version into
//! the machine-wide cache (next to the wasm artifacts) and handed to the tests through
//! the variables nodewright-authoring reads.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::run;

// The pinned versions, shared with nodewright-authoring without building it.
#[path = "../../authoring/src/versions.rs"]
mod versions;
use versions::{COMPONENTIZE_JS, COMPONENTIZE_PY, ESBUILD};

/// Where the tools are: (`componentize-py`, a `node_modules` with componentize-js and esbuild).
pub(crate) struct Tools {
    pub componentize_py: PathBuf,
    pub js_tools: PathBuf,
}

impl Tools {
    /// The environment every cargo build runs with once the tools are installed (the
    /// artifacts' build script builds the ports with them and reruns when it changes).
    pub(crate) fn env(&self) -> [(&'static str, &Path); 2] {
        [
            ("NODEWRIGHT_COMPONENTIZE_PY", &self.componentize_py),
            ("NODEWRIGHT_JS_TOOLS", &self.js_tools),
        ]
    }
}

impl Tools {
    /// Where the tools go under `target` (installed or not).
    pub(crate) fn at(target: &Path) -> Tools {
        let base = target.join("authoring-tools");
        Tools {
            componentize_py: base
                .join(format!("componentize-py-{COMPONENTIZE_PY}"))
                .join("bin/componentize-py"),
            js_tools: base
                .join(format!("js-{COMPONENTIZE_JS}-{ESBUILD}"))
                .join("node_modules"),
        }
    }

    /// Both are installed.
    pub(crate) fn installed(&self) -> bool {
        self.componentize_py.is_file()
            && self.js_tools.join(".bin/componentize-js").is_file()
            && self.js_tools.join(".bin/esbuild").is_file()
    }
}

/// Installs what is missing; returns where the tools are.
pub(crate) fn setup(target: &Path) -> Result<Tools> {
    let tools = Tools::at(target);
    let venv = tools
        .componentize_py
        .ancestors()
        .nth(2)
        .expect("<venv>/bin/componentize-py")
        .to_path_buf();
    if !tools.componentize_py.is_file() {
        crate::setup::pip_venv(
            &venv,
            &[format!("componentize-py=={COMPONENTIZE_PY}")],
            "Python plugins",
        )?;
    }
    let js = tools
        .js_tools
        .parent()
        .expect("<dir>/node_modules")
        .to_path_buf();
    if !tools.js_tools.join(".bin/componentize-js").is_file()
        || !tools.js_tools.join(".bin/esbuild").is_file()
    {
        eprintln!(
            "installing componentize-js {COMPONENTIZE_JS} and esbuild {ESBUILD} (npm) into {}",
            js.display()
        );
        std::fs::create_dir_all(&js)?;
        std::fs::write(
            js.join("package.json"),
            format!(
                r#"{{"name": "nodewright-js-tools", "private": true, "devDependencies": {{"@bytecodealliance/componentize-js": "{COMPONENTIZE_JS}", "esbuild": "{ESBUILD}"}}}}"#
            ),
        )?;
        run(Command::new("npm").current_dir(&js).args([
            "install",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
        ]))
        .context("Node.js 20+ with npm is needed for JavaScript plugins")?;
    }
    Ok(tools)
}
