//! The allowlist entries a grant parses into: name patterns, granted paths, granted
//! commands with their argument patterns, and path normalisation.

use std::path::{Component, Path, PathBuf};

use globset::{GlobBuilder, GlobMatcher};

use super::spec::{FileAccess, GrantError};
use crate::payload::PayloadName;

/// A name allowlist entry: an exact name or a glob. `*` and `?` never match `/`.
///
/// An entry without a wildcard (`*`, `?`, `[`) is an exact name: it matches its own text and
/// nothing else, compared as text — no glob is compiled for it (building each exact name's
/// regex was most of parsing a grant set, which every stage does). In a host name's entry
/// (module, unit, sysctl key) a `\` is always a character of the name — systemd escapes unit
/// names with it (`dev-disk-by\x2duuid.device`) — never a glob escape; in a command
/// argument's glob it escapes the next character, as globs do.
#[derive(Clone, Debug)]
pub struct NamePattern {
    source: String,
    /// The compiled glob of an entry with a wildcard; `None` for an exact name.
    glob: Option<GlobMatcher>,
}

impl NamePattern {
    pub(crate) fn parse(
        field: &str,
        index: usize,
        raw: &str,
        allowed: fn(char) -> bool,
    ) -> Result<Self, GrantError> {
        Self::parse_with(field, index, raw, allowed, true)
    }

    fn parse_with(
        field: &str,
        index: usize,
        raw: &str,
        allowed: fn(char) -> bool,
        escapes: bool,
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
            .backslash_escape(escapes)
            .build()
            .map_err(|e| {
                GrantError::new(field, format!("{raw:?} is not a valid glob: {}", e.kind()))
            })?;
        let wildcard = raw.contains(['*', '?', '[']);
        Ok(NamePattern {
            source: raw.to_string(),
            glob: wildcard.then(|| glob.compile_matcher()),
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
        NamePattern::parse_with(field, index, raw, allowed, false)
    }

    /// Whether `name` matches this pattern.
    pub fn matches(&self, name: &str) -> bool {
        match &self.glob {
            None => self.source == name,
            Some(glob) => glob.is_match(name),
        }
    }

    /// Whether the command argument `arg` is allowed by this pattern, or why not. A
    /// pattern without wildcards must equal the argument. A wildcard pattern cannot be
    /// widened by the argument: it does not match an option (`-x`) unless it starts with
    /// `-` itself, nor an argument with a `..` path component or control characters.
    pub fn check_arg(&self, arg: &str) -> Result<(), String> {
        if self.glob.is_none() {
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

/// What a granted command runs: a binary on the host, or one file of the package's own
/// payloads (`payload:<name>/<path>`), run from its read-only tree — so the grant names
/// exactly the signed bytes that run, not whatever the host holds at a path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CommandTarget {
    /// A binary on the host, by its exact, normalised absolute path.
    Host(PathBuf),
    /// A file of a payload: its name and the file's path below the payload's root.
    Payload {
        /// The payload.
        name: PayloadName,
        /// Below the payload's root: plain names only.
        path: PathBuf,
    },
}

/// How a payload command is written: `payload:<name>/<path>`.
pub const PAYLOAD_COMMAND: &str = "payload:";

impl CommandTarget {
    /// Parses a command as granted or called. Its spelling must be exact: a normalised
    /// absolute path, or `payload:<name>/<path>` with a valid payload name and a path of
    /// plain names (no `.`, `..`, empty or trailing components) — a granted command has one
    /// spelling, so no other spelling of it can match a grant or slip past one.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if let Some(rest) = raw.strip_prefix(PAYLOAD_COMMAND) {
            let usage =
                "write a payload command as payload:<name>/<path to the file in the payload>";
            let Some((name, path)) = rest.split_once('/') else {
                return Err(format!("{raw:?} names no file; {usage}"));
            };
            let name = PayloadName::parse(name).map_err(|e| format!("{raw:?}: {e}"))?;
            let rel = Path::new(path);
            let exact = path
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
            if path.contains('\0') || !exact || !crate::payload::is_below_root(rel) {
                return Err(format!(
                    "{raw:?} must name a file below the payload's root by plain names (no '.', '..' or empty parts); {usage}"
                ));
            }
            return Ok(CommandTarget::Payload {
                name,
                path: rel.to_path_buf(),
            });
        }
        match normalize_abs_path(raw) {
            Ok(p) if p == Path::new("/") => Err("must name a binary, not /".into()),
            Ok(p) if p.as_os_str() == raw => Ok(CommandTarget::Host(p)),
            Ok(p) => Err(format!(
                "command paths must be exact and normalised; call {} as granted",
                p.display()
            )),
            Err(why) => Err(format!("command paths must be exact and normalised: {why}")),
        }
    }
}

impl std::fmt::Display for CommandTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommandTarget::Host(path) => write!(f, "{}", path.display()),
            CommandTarget::Payload { name, path } => {
                write!(f, "{PAYLOAD_COMMAND}{}/{}", name.as_str(), path.display())
            }
        }
    }
}

/// A granted command with its optional argument patterns.
#[derive(Clone, Debug)]
pub struct CommandRule {
    /// What it runs.
    pub target: CommandTarget,
    /// Per-argument patterns; `None` allows any arguments.
    pub args: Option<Vec<NamePattern>>,
    /// May run in read-only stages.
    pub read_only: bool,
}

impl CommandRule {
    /// The arguments that are payload files: for each argument whose pattern starts with
    /// `payload:` (`["--install", "payload:debs/*.deb"]`), its index and the file it names.
    /// A matching argument that is not one exact payload file name is refused, with why.
    /// For arguments [`CommandRule::check_args`] accepted.
    pub fn payload_args(
        &self,
        args: &[String],
    ) -> Result<Vec<(usize, PayloadName, PathBuf)>, String> {
        let Some(patterns) = &self.args else {
            return Ok(Vec::new());
        };
        patterns
            .iter()
            .zip(args)
            .enumerate()
            .filter(|(_, (pattern, _))| pattern.as_str().starts_with(PAYLOAD_COMMAND))
            .map(|(i, (_, arg))| match CommandTarget::parse(arg) {
                Ok(CommandTarget::Payload { name, path }) => Ok((i, name, path)),
                Ok(CommandTarget::Host(_)) => Err(format!("argument {i} must be a payload file")),
                Err(why) => Err(format!("argument {i}: {why}")),
            })
            .collect()
    }

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
