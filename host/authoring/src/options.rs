//! How a build runs: the caller's choices, where the tools are, and its progress lines.

use std::path::PathBuf;

use crate::language::Language;

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

/// Where the Python and JavaScript tools are.
#[derive(Clone, Debug)]
pub struct Toolchain {
    /// A `componentize-py` executable to use.
    pub componentize_py: Option<PathBuf>,
    /// A `node_modules` directory holding componentize-js and esbuild.
    pub js_tools: Option<PathBuf>,
    /// Install missing tools into the project (`.venv`, `node_modules`).
    pub install: bool,
}

impl Default for Toolchain {
    fn default() -> Self {
        Toolchain {
            componentize_py: None,
            js_tools: None,
            install: true,
        }
    }
}

impl Toolchain {
    /// `NODEWRIGHT_COMPONENTIZE_PY` and `NODEWRIGHT_JS_TOOLS`, installing what is missing.
    pub fn from_env() -> Self {
        let path = |var: &str| {
            std::env::var_os(var)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Toolchain {
            componentize_py: path("NODEWRIGHT_COMPONENTIZE_PY"),
            js_tools: path("NODEWRIGHT_JS_TOOLS"),
            install: true,
        }
    }
}

/// One progress line on stderr, unless the build is quiet.
pub(crate) fn progress(opts: &BuildOptions, line: &str) {
    if !opts.quiet {
        eprintln!("{line}");
    }
}
