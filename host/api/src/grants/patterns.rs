//! The allowlist entries a grant parses into: name patterns, granted paths, granted
//! commands with their argument patterns, and path normalisation.

use std::path::{Component, Path, PathBuf};

use globset::{GlobBuilder, GlobMatcher};

use super::spec::{FileAccess, GrantError};

/// A name allowlist entry: an exact name or a glob. `*` and `?` never match `/`.
#[derive(Clone, Debug)]
pub struct NamePattern {
    source: String,
    matcher: GlobMatcher,
    literal: bool,
}

impl NamePattern {
    pub(crate) fn parse(
        field: &str,
        index: usize,
        raw: &str,
        allowed: fn(char) -> bool,
    ) -> Result<Self, GrantError> {
        let field = format!("{field}[{index}]");
        if raw.is_empty() {
            return Err(GrantError::new(field, "must not be empty"));
        }
        if let Some(bad) = raw
            .chars()
            .find(|&c| !(allowed(c) || matches!(c, '*' | '?' | '[' | ']' | '!')))
        {
            return Err(GrantError::new(
                field,
                format!("{raw:?} contains {bad:?}, which is not allowed here"),
            ));
        }
        let glob = GlobBuilder::new(raw)
            .literal_separator(true)
            .build()
            .map_err(|e| {
                GrantError::new(field, format!("{raw:?} is not a valid glob: {}", e.kind()))
            })?;
        let literal = !raw.contains(['*', '?', '[']);
        Ok(NamePattern {
            source: raw.to_string(),
            matcher: glob.compile_matcher(),
            literal,
        })
    }

    /// A host-name pattern (module, unit, sysctl key): may not start with `-`.
    pub(crate) fn parse_name(
        field: &str,
        index: usize,
        raw: &str,
        allowed: fn(char) -> bool,
    ) -> Result<Self, GrantError> {
        if raw.starts_with('-') {
            return Err(GrantError::new(
                format!("{field}[{index}]"),
                format!("{raw:?} starts with '-'; a name is never an option"),
            ));
        }
        NamePattern::parse(field, index, raw, allowed)
    }

    /// Whether `name` matches this pattern.
    pub fn matches(&self, name: &str) -> bool {
        self.matcher.is_match(name)
    }

    /// Whether the command argument `arg` is allowed by this pattern, or why not. A
    /// pattern without wildcards must equal the argument. A wildcard pattern cannot be
    /// widened by the argument: it does not match an option (`-x`) unless it starts with
    /// `-` itself, nor an argument with a `..` path component or control characters.
    pub fn check_arg(&self, arg: &str) -> Result<(), String> {
        if self.literal {
            return if self.source == arg {
                Ok(())
            } else {
                Err(format!("{arg:?} is not {:?}", self.source))
            };
        }
        crate::hostargs::wildcard_arg(arg)?;
        if arg.starts_with('-') && !self.source.starts_with('-') {
            return Err(format!(
                "{arg:?} is an option, and the pattern {:?} does not start with '-'",
                self.source
            ));
        }
        if !self.matches(arg) {
            return Err(format!("{arg:?} does not match {:?}", self.source));
        }
        Ok(())
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

/// What a granted path names, decided by how the grant is written.
///
/// A grant ending in `/` names a directory: the plugin may make it (and its missing parents)
/// and everything below it is covered. A grant without the `/` names what the node has
/// there: below it when it is a directory, otherwise exactly one regular file, which the
/// plugin may write, replace or remove but never turn into a directory — so removing a
/// granted file and making a directory in its place, in one stage or across two, never
/// widens a file grant into a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    /// `/etc/app/`: a directory, made when missing.
    Directory,
    /// `/etc/app.conf`: a directory if the node has one there, else one file.
    AsFound,
}

impl PathKind {
    /// The kind a grant's path as written names (`/` itself is a directory).
    pub fn of(raw: &str) -> PathKind {
        if raw.ends_with('/') {
            PathKind::Directory
        } else {
            PathKind::AsFound
        }
    }
}

/// A granted path as the filesystem operations need it: where, and what it names.
#[derive(Clone, Copy, Debug)]
pub struct GrantedPath<'a> {
    /// Normalised absolute path.
    pub path: &'a Path,
    /// What the grant names there.
    pub kind: PathKind,
}

impl<'a> GrantedPath<'a> {
    /// A grant ending in `/`.
    pub fn directory(path: &'a Path) -> Self {
        GrantedPath {
            path,
            kind: PathKind::Directory,
        }
    }

    /// A grant without a trailing `/`.
    pub fn as_found(path: &'a Path) -> Self {
        GrantedPath {
            path,
            kind: PathKind::AsFound,
        }
    }
}

/// A granted path with its access.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathRule {
    /// Normalised absolute path.
    pub path: PathBuf,
    /// What the grant names there (a trailing `/` in the spec makes it a directory).
    pub kind: PathKind,
    /// Granted access.
    pub access: FileAccess,
    /// setuid/setgid/sticky bits may be set (readWrite only).
    pub special_modes: bool,
}

impl PathRule {
    /// The path and kind the filesystem operations resolve against.
    pub fn granted(&self) -> GrantedPath<'_> {
        GrantedPath {
            path: &self.path,
            kind: self.kind,
        }
    }
}

/// A granted command with its optional argument patterns.
#[derive(Clone, Debug)]
pub struct CommandRule {
    /// Exact absolute path.
    pub path: PathBuf,
    /// Per-argument patterns; `None` allows any arguments.
    pub args: Option<Vec<NamePattern>>,
    /// May run in read-only stages.
    pub read_only: bool,
}

impl CommandRule {
    /// Whether `args` fit this rule's patterns, or the first reason they do not.
    pub fn check_args(&self, args: &[String]) -> Result<(), String> {
        let Some(patterns) = &self.args else {
            return Ok(());
        };
        if patterns.len() != args.len() {
            return Err(format!(
                "{} argument(s) given, the grant has {} pattern(s)",
                args.len(),
                patterns.len()
            ));
        }
        for (i, (pattern, arg)) in patterns.iter().zip(args).enumerate() {
            pattern
                .check_arg(arg)
                .map_err(|why| format!("argument {i}: {why}"))?;
        }
        Ok(())
    }
}

/// Normalises an absolute path without touching the filesystem: rejects relative paths,
/// `..` components and NUL bytes; drops `.` and repeated slashes.
pub fn normalize_abs_path(raw: &str) -> Result<PathBuf, String> {
    if raw.contains('\0') {
        return Err(format!("{raw:?} contains a NUL byte"));
    }
    let path = Path::new(raw);
    if !path.is_absolute() {
        return Err(format!("{raw:?} is not an absolute path"));
    }
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                return Err(format!(
                    "{raw:?} contains '..', which could escape the grant"
                ));
            }
            Component::Prefix(_) => return Err(format!("{raw:?} is not a Unix path")),
        }
    }
    Ok(out)
}
