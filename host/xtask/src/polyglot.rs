//! The Python and JavaScript plugin build tools, installed once per pinned version into
//! the machine-wide cache (next to the wasm artifacts) and handed to the tests through
//! the variables nodewright-authoring reads.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use nodewright_authoring::tools::{COMPONENTIZE_JS, COMPONENTIZE_PY, ESBUILD};

use crate::run;

/// Where the tools are: (`componentize-py`, a `node_modules` with componentize-js and esbuild).
pub(crate) struct Tools {
    pub componentize_py: PathBuf,
    pub js_tools: PathBuf,
}

impl Tools {
    /// The environment `cargo test` (and clippy, whose build scripts must see the same
    /// values) runs with: the tools, and the rule that a port missing them fails.
    pub(crate) fn env(&self) -> [(&'static str, &Path); 2] {
        [
            ("NODEWRIGHT_COMPONENTIZE_PY", &self.componentize_py),
            ("NODEWRIGHT_JS_TOOLS", &self.js_tools),
        ]
    }
}

pub(crate) fn setup(target: &Path) -> Result<Tools> {
    let base = target.join("authoring-tools");
    let venv = base.join(format!("componentize-py-{COMPONENTIZE_PY}"));
    let componentize_py = venv.join("bin/componentize-py");
    if !componentize_py.is_file() {
        eprintln!(
            "installing componentize-py {COMPONENTIZE_PY} (PyPI) into {}",
            venv.display()
        );
        let _ = std::fs::remove_dir_all(&venv);
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
            .context("python3 with venv is needed for Python plugins")?;
        run(Command::new(venv.join("bin/pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            &format!("componentize-py=={COMPONENTIZE_PY}"),
        ]))?;
    }
    let js = base.join(format!("js-{COMPONENTIZE_JS}-{ESBUILD}"));
    let js_tools = js.join("node_modules");
    if !js_tools.join(".bin/componentize-js").is_file() || !js_tools.join(".bin/esbuild").is_file()
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
    Ok(Tools {
        componentize_py,
        js_tools,
    })
}
