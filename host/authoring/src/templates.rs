//! The templates `nodewright plugin new` writes: the same package in each language — it
//! writes the config value `message` to `/etc/<name>.conf` — so the three read side by
//! side, and each builds as is.

use std::path::{Path, PathBuf};

use crate::error::BuildError;
use crate::io;
use crate::language::Language;
use crate::tools::{COMPONENTIZE_JS, ESBUILD};

const RUST_LIB: &str = r#"//! __NAME__: a nodewright package plugin.
//!
//! Writes the config value `message` to /etc/__NAME__.conf. Grant it with:
//!
//!     capabilities:
//!       files:
//!         - {path: /etc/__NAME__.conf, access: readWrite}
//!
//! Try it locally:
//!
//!     nodewright plugin build
//!     nodewright plugin run target/wasm32-wasip2/release/__SNAKE__.wasm --stage apply \
//!         --root /tmp/node --grant files=/etc/__NAME__.conf:rw --config message=hello

use nodewright_sdk::{describe_file_change, export_package, log, Change, Context, Interrupt, Outcome, Package, StepError};

const PATH: &str = "/etc/__NAME__.conf";

fn wanted(ctx: &Context) -> String {
    format!("{}\n", ctx.config("message").unwrap_or("managed by nodewright"))
}

struct Plugin;

impl Package for Plugin {
    /// Read-only: what apply would change. Converged nodes are not cordoned or drained.
    fn plan(ctx: &Context) -> Result<Outcome, StepError> {
        let current = ctx.files().read_opt(PATH)?;
        let changes = match describe_file_change(current.as_deref(), wanted(ctx).as_bytes()) {
            Some(detail) => vec![Change::new("file", PATH, detail)],
            None => vec![],
        };
        Ok(Outcome::changed(changes, Interrupt::None))
    }

    fn apply(ctx: &Context) -> Result<Outcome, StepError> {
        let plan = Self::plan(ctx)?;
        if !plan.changes.is_empty() {
            ctx.files().write(PATH, wanted(ctx).as_bytes(), Some(0o644))?;
            log::info(&format!("wrote {PATH}"));
        }
        Ok(plan)
    }

    fn uninstall(ctx: &Context) -> Result<Outcome, StepError> {
        ctx.files().remove(PATH)?;
        Ok(Outcome::changed(vec![Change::new("file", PATH, "removed")], Interrupt::None))
    }
}

export_package!(Plugin);
"#;

const PYTHON_MODULE: &str = r#""""__NAME__: a nodewright package plugin.

Writes the config value `message` to /etc/__NAME__.conf. Grant it with:

    capabilities:
      files:
        - {path: /etc/__NAME__.conf, access: readWrite}

Try it locally:

    nodewright plugin build
    nodewright plugin run build/__NAME__.wasm --stage apply \
        --root /tmp/node --grant files=/etc/__NAME__.conf:rw --config message=hello
"""

import nodewright
from nodewright import Change, Context, Outcome, describe_file_change

PATH = "/etc/__NAME__.conf"


def wanted(ctx: Context) -> str:
    return (ctx.value("message") or "managed by nodewright") + "\n"


@nodewright.export
class Plugin(nodewright.Package):
    def plan(self, ctx: Context) -> Outcome:
        """Read-only: what apply would change. Converged nodes are not cordoned or drained."""
        detail = describe_file_change(ctx.files.read_opt(PATH), wanted(ctx).encode())
        return Outcome.changed([Change("file", PATH, detail)] if detail else [])

    def apply(self, ctx: Context) -> Outcome:
        plan = self.plan(ctx)
        if plan.changes:
            ctx.files.write(PATH, wanted(ctx), 0o644)
            nodewright.info(f"wrote {PATH}")
        return plan

    def uninstall(self, ctx: Context) -> Outcome:
        ctx.files.remove(PATH)
        return Outcome.changed([Change("file", PATH, "removed")])
"#;

const PYPROJECT: &str = r#"[project]
name = "__NAME__"
version = "0.1.0"
requires-python = ">=3.10"
# The nodewright SDK is bundled by `nodewright plugin build`; for editor completion,
# `pip install <nodewright checkout>/sdk/python`.

[tool.nodewright]
# The capabilities the component imports (its request); the admin grants each.
capabilities = ["files"]
# The module holding the @nodewright.export class.
module = "plugin"
"#;

const JS_MODULE: &str = r#"// @ts-check
// __NAME__: a nodewright package plugin.
//
// Writes the config value `message` to /etc/__NAME__.conf. Grant it with:
//
//     capabilities:
//       files:
//         - {path: /etc/__NAME__.conf, access: readWrite}
//
// Try it locally:
//
//     nodewright plugin build
//     nodewright plugin run build/__NAME__.wasm --stage apply \
//         --root /tmp/node --grant files=/etc/__NAME__.conf:rw --config message=hello

import { Change, Outcome, Package, describeFileChange, exportPackage, log } from '@nodewright/sdk';

const PATH = '/etc/__NAME__.conf';

/** @param {import('@nodewright/sdk').Context} ctx */
const wanted = (ctx) => `${ctx.value('message') ?? 'managed by nodewright'}\n`;

class Plugin extends Package {
  /** Read-only: what apply would change. Converged nodes are not cordoned or drained. */
  plan(ctx) {
    const detail = describeFileChange(ctx.files.readOpt(PATH), wanted(ctx));
    return Outcome.changed(detail ? [new Change('file', PATH, detail)] : []);
  }

  apply(ctx) {
    const plan = this.plan(ctx);
    if (plan.changes.length > 0) {
      ctx.files.write(PATH, wanted(ctx), 0o644);
      log.info(`wrote ${PATH}`);
    }
    return plan;
  }

  uninstall(ctx) {
    ctx.files.remove(PATH);
    return Outcome.changed([new Change('file', PATH, 'removed')]);
  }
}

exportPackage(Plugin);
"#;

const JSCONFIG: &str = r#"{
  "compilerOptions": {
    "checkJs": true,
    "module": "es2022",
    "moduleResolution": "bundler",
    "target": "es2022",
    "paths": { "@nodewright/sdk": ["./build/sdk/js/index.d.ts"] }
  }
}
"#;

/// Whether `name` is usable as a plugin name: lowercase letters, digits and dashes,
/// starting with a letter, at most 63 characters.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-')
}

/// The Rust SDK this build comes from, when it is on this machine.
fn default_rust_sdk() -> Option<PathBuf> {
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk");
    built_from
        .join("Cargo.toml")
        .exists()
        .then(|| built_from.canonicalize().ok())
        .flatten()
}

fn rust_manifest(name: &str, rust_sdk: Option<PathBuf>) -> Result<String, BuildError> {
    let sdk = match rust_sdk.or_else(default_rust_sdk) {
        Some(p) => {
            let p = p
                .canonicalize()
                .map_err(|source| BuildError::Io { path: p, source })?;
            format!(
                "nodewright-sdk = {{ path = {:?} }}",
                p.display().to_string()
            )
        }
        None => format!("nodewright-sdk = \"{}\"", env!("CARGO_PKG_VERSION")),
    };
    Ok(format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
rust-version = "1.95"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
{sdk}

# Small, abort-on-panic components.
[profile.release]
opt-level = "s"
lto = true
codegen-units = 1
panic = "abort"
strip = true

# A standalone crate, even inside another workspace.
[workspace]
"#
    ))
}

fn package_json(name: &str) -> String {
    format!(
        r#"{{
  "name": "{name}",
  "version": "0.1.0",
  "private": true,
  "type": "module",
  "main": "plugin.js",
  "nodewright": {{
    "capabilities": ["files"]
  }},
  "devDependencies": {{
    "@bytecodealliance/componentize-js": "{COMPONENTIZE_JS}",
    "esbuild": "{ESBUILD}"
  }}
}}
"#
    )
}

/// Where a template keeps the files its package ships beside the component: one directory
/// per payload, this README first.
pub const PAYLOADS_README: &str = "payloads/README.md";

const PAYLOADS_TEXT: &str = r#"# Payloads

Files this package ships beside its component — a kernel module, firmware, a `.deb`, a
vendor installer. Each directory here is one payload, named after it: `payloads/driver/`
is read by the plugin at `/payload/driver/`, read-only, with ordinary file I/O.

- Try the plugin with them on a scratch root:
  `nodewright plugin run <component.wasm> --stage plan --payload payloads/driver`
- Ship them in the plugin's own artifact (its digest and signatures cover every byte):
  `nodewright plugin push <component.wasm> <registry>/<repo>:<tag> --payload payloads/driver`

Nodes stage payloads before they are cordoned. What a plugin may do with them (install a
file, load a module, run an installer, pass a `.deb` to dpkg) is granted by the admin:
see docs/writing-a-plugin.md, "Shipping files".
"#;

/// Writes a template plugin named `name` in `parent/name` and returns that directory.
/// `rust_sdk` points a Rust template at an SDK checkout (default: the one this build
/// comes from when present, else the crates.io release).
pub fn new_project(
    name: &str,
    parent: &Path,
    language: Language,
    rust_sdk: Option<PathBuf>,
) -> Result<PathBuf, BuildError> {
    if !valid_name(name) {
        return Err(BuildError::InvalidName(name.to_string()));
    }
    let dir = parent.join(name);
    if dir.exists() {
        return Err(BuildError::Io {
            path: dir,
            source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        });
    }
    let fill = |t: &str| {
        t.replace("__NAME__", name)
            .replace("__SNAKE__", &name.replace('-', "_"))
    };
    let files: Vec<(&str, String)> = match language {
        Language::Rust => vec![
            ("Cargo.toml", rust_manifest(name, rust_sdk)?),
            ("src/lib.rs", fill(RUST_LIB)),
            (".gitignore", "/target\n".into()),
        ],
        Language::Python => vec![
            ("pyproject.toml", fill(PYPROJECT)),
            ("plugin.py", fill(PYTHON_MODULE)),
            (".gitignore", "/build\n/.venv\n__pycache__/\n".into()),
        ],
        Language::JavaScript => vec![
            ("package.json", package_json(name)),
            ("plugin.js", fill(JS_MODULE)),
            ("jsconfig.json", JSCONFIG.into()),
            (".gitignore", "/build\n/node_modules\n".into()),
        ],
    };
    for (file, text) in files
        .into_iter()
        .chain([(PAYLOADS_README, PAYLOADS_TEXT.to_string())])
    {
        io::write(&dir.join(file), &text)?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("gpu-mode"));
        assert!(!valid_name("Gpu"));
        assert!(!valid_name("9lives"));
        assert!(!valid_name("a_b"));
        assert!(!valid_name("a-"));
    }

    #[test]
    fn each_template_declares_what_it_uses() {
        let dir = tempfile::tempdir().unwrap();
        let py = new_project("motd", dir.path(), Language::Python, None).unwrap();
        let m = crate::manifest::python(&py).unwrap();
        assert_eq!(m.capabilities, ["files"]);
        let js = new_project("motd-js", dir.path(), Language::JavaScript, None).unwrap();
        let m = crate::manifest::javascript(&js).unwrap();
        assert_eq!(
            (m.name.as_str(), m.capabilities.as_slice()),
            ("motd-js", &["files".to_string()][..])
        );
        assert!(matches!(
            new_project("motd", dir.path(), Language::Rust, None),
            Err(BuildError::Io { .. })
        ));
    }

    #[test]
    fn every_template_has_a_place_for_payloads() {
        let dir = tempfile::tempdir().unwrap();
        for (name, lang) in [
            ("a", Language::Rust),
            ("b", Language::Python),
            ("c", Language::JavaScript),
        ] {
            let project = new_project(name, dir.path(), lang, None).unwrap();
            let readme = std::fs::read_to_string(project.join(PAYLOADS_README)).unwrap();
            assert!(
                readme.contains("--payload payloads/driver") && readme.contains("/payload/driver/"),
                "{lang}: {readme}"
            );
        }
    }
}
