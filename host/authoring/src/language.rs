//! The languages a plugin can be written in, as `--lang` spells them.

use std::fmt;

/// The languages a plugin can be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    /// cargo + the Rust SDK (`Cargo.toml`).
    Rust,
    /// componentize-py + the Python SDK (`pyproject.toml`).
    Python,
    /// esbuild + componentize-js + the JavaScript SDK (`package.json`).
    JavaScript,
}

impl Language {
    /// Every language, in the order `--lang` lists them.
    pub const ALL: [Language; 3] = [Language::Rust, Language::Python, Language::JavaScript];

    /// The `--lang` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::Python => "python",
            Language::JavaScript => "js",
        }
    }

    /// The manifest that marks a project of this language.
    pub fn manifest(self) -> &'static str {
        match self {
            Language::Rust => "Cargo.toml",
            Language::Python => "pyproject.toml",
            Language::JavaScript => "package.json",
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Language {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "rust" | "rs" => Ok(Language::Rust),
            "python" | "py" => Ok(Language::Python),
            "js" | "javascript" | "ts" | "typescript" => Ok(Language::JavaScript),
            other => Err(format!(
                "unknown language {other:?}: one of rust, python, js"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_parse_and_print() {
        for l in Language::ALL {
            assert_eq!(l.as_str().parse::<Language>().unwrap(), l);
        }
        assert!(
            "go".parse::<Language>()
                .unwrap_err()
                .contains("rust, python, js")
        );
    }
}
