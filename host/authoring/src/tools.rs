//! Finding, or installing into the project, the tools a Python or JavaScript build runs.
//!
//! Order: the path the caller configured (`NODEWRIGHT_COMPONENTIZE_PY`,
//! `NODEWRIGHT_JS_TOOLS`), then the project's own environment (`.venv`, `node_modules`),
//! then `PATH` (Python only); when none has them and installing is allowed, the pinned
//! versions are installed into the project, as `npm install` would, with a line saying so.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::BuildError;
use crate::language::Language;
use crate::options::{BuildOptions, progress};

pub use crate::versions::{COMPONENTIZE_JS, COMPONENTIZE_PY, ESBUILD};

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn configured(path: &Path, var: &str, language: Language) -> Result<PathBuf, BuildError> {
    if path.exists() {
        Ok(path.to_path_buf())
    } else {
        Err(BuildError::ToolMissing {
            tool: if language == Language::Python {
                "componentize-py"
            } else {
                "componentize-js"
            },
            language,
            install: format!("{var} names {}, which does not exist", path.display()),
        })
    }
}

fn run(cmd: &mut Command, tool: &str, hint: &str) -> Result<(), BuildError> {
    let status = cmd.status().map_err(|_| BuildError::ToolFailed {
        tool: tool.to_string(),
        status: None,
        hint: format!("cannot start {tool}"),
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(BuildError::ToolFailed {
            tool: tool.to_string(),
            status: status.code(),
            hint: hint.to_string(),
        })
    }
}

/// The `componentize-py` to build with.
pub(crate) fn componentize_py(dir: &Path, opts: &BuildOptions) -> Result<PathBuf, BuildError> {
    if let Some(p) = &opts.tools.componentize_py {
        return configured(p, "NODEWRIGHT_COMPONENTIZE_PY", Language::Python);
    }
    let venv = dir.join(".venv");
    let local = venv.join("bin/componentize-py");
    if local.is_file() {
        return Ok(local);
    }
    if let Some(p) = on_path("componentize-py") {
        return Ok(p);
    }
    let install = format!(
        "run `pip install componentize-py=={COMPONENTIZE_PY}` (or let `nodewright plugin build` install it into the project's .venv)"
    );
    if !opts.tools.install {
        return Err(BuildError::ToolMissing {
            tool: "componentize-py",
            language: Language::Python,
            install,
        });
    }
    let Some(python) = on_path("python3") else {
        return Err(BuildError::ToolMissing {
            tool: "python3",
            language: Language::Python,
            install: "install Python 3.10 or later with venv (Debian: apt-get install python3 python3-venv)".into(),
        });
    };
    progress(
        opts,
        &format!(
            "installing componentize-py {COMPONENTIZE_PY} into {} (first build only)",
            venv.display()
        ),
    );
    run(
        Command::new(python).args(["-m", "venv"]).arg(&venv),
        "python3 -m venv",
        "could not create the project's .venv (Debian: apt-get install python3-venv)",
    )?;
    run(
        Command::new(venv.join("bin/pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            &format!("componentize-py=={COMPONENTIZE_PY}"),
        ]),
        "pip",
        &format!("could not install componentize-py=={COMPONENTIZE_PY} (is PyPI reachable?)"),
    )?;
    Ok(local)
}

/// `(componentize-js, esbuild)` to build with.
pub(crate) fn javascript(
    dir: &Path,
    opts: &BuildOptions,
) -> Result<(PathBuf, PathBuf), BuildError> {
    let pair = |modules: &Path| {
        (
            modules.join(".bin/componentize-js"),
            modules.join(".bin/esbuild"),
        )
    };
    if let Some(modules) = &opts.tools.js_tools {
        let (c, e) = pair(modules);
        configured(&c, "NODEWRIGHT_JS_TOOLS", Language::JavaScript)?;
        configured(&e, "NODEWRIGHT_JS_TOOLS", Language::JavaScript)?;
        return Ok((c, e));
    }
    let modules = dir.join("node_modules");
    let (c, e) = pair(&modules);
    if c.is_file() && e.is_file() {
        return Ok((c, e));
    }
    let packages = format!("@bytecodealliance/componentize-js@{COMPONENTIZE_JS} esbuild@{ESBUILD}");
    if !opts.tools.install {
        return Err(BuildError::ToolMissing {
            tool: "componentize-js",
            language: Language::JavaScript,
            install: format!("run `npm install --save-dev {packages}` in the plugin directory"),
        });
    }
    let Some(npm) = on_path("npm") else {
        return Err(BuildError::ToolMissing {
            tool: "npm",
            language: Language::JavaScript,
            install: "install Node.js 20 or later with npm".into(),
        });
    };
    progress(
        opts,
        &format!(
            "installing {packages} into {} (first build only)",
            modules.display()
        ),
    );
    run(
        Command::new(npm)
            .current_dir(dir)
            .args([
                "install",
                "--save-dev",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
            ])
            .args(packages.split(' ')),
        "npm install",
        "could not install the JavaScript build tools (is the npm registry reachable?)",
    )?;
    if !(c.is_file() && e.is_file()) {
        return Err(BuildError::ToolMissing {
            tool: "componentize-js",
            language: Language::JavaScript,
            install: format!("npm install left no {} or {}", c.display(), e.display()),
        });
    }
    Ok((c, e))
}
