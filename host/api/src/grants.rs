//! Capability grants: what a package may touch on the host.
//!
//! [`Capabilities`] is the shape admins write under `spec.packages.<name>.capabilities`
//! (and what `nodewright plugin run --grant` builds). [`GrantSet::parse`] turns it, once,
//! into typed allowlists; everything not in them is denied. Parsing rejects unknown keys
//! (via serde), bad globs, relative paths and paths that try to escape with `..`, each
//! with the field path at fault.
//!
//! Deny by default:
//! - no `files` entry: no file can be read or written;
//! - no `kernelModules` / `services` / `sysctl` entry: the interface is not linked at all;
//! - no `commands` entry: no host command runs;
//! - `power` (reboot) is only granted when the package's interrupt is `reboot`, and only
//!   honoured in the `interrupt` stage.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use globset::{GlobBuilder, GlobMatcher};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The capabilities granted to one package, as written in the spec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Capabilities {
    /// Host paths the package may read or write. A directory grant covers everything under it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileGrant>,
    /// Kernel module names or globs (`nvidia*`) the package may load, unload and query.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel_modules: Vec<String>,
    /// systemd unit names or globs (`containerd.service`, `nvidia-*.service`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<String>,
    /// sysctl keys or globs in dotted form (`net.ipv4.ip_forward`, `vm.*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sysctl: Vec<String>,
    /// Host commands the package may run, by exact absolute path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<CommandGrant>,
}

/// One granted host path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileGrant {
    /// Absolute host path: a file, or a directory covering everything beneath it.
    pub path: String,
    /// `read` (default) or `readWrite`.
    #[serde(default)]
    pub access: FileAccess,
    /// With `readWrite`: the package may also set the setuid, setgid and sticky bits
    /// (`files.write`/`set-mode` modes above `0o777`). Default `false`: such modes are
    /// denied, and a rewritten file keeps only its permission bits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub special_modes: bool,
}

/// Access granted on a path.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum FileAccess {
    /// Read, stat and list only.
    #[default]
    Read,
    /// Also write, create, remove, chmod and chown.
    ReadWrite,
}

/// One granted host command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandGrant {
    /// Exact absolute path of the binary on the host.
    pub path: String,
    /// Optional argument patterns, one glob per argument. When present, the call must pass
    /// exactly this many arguments and each must match its pattern. When absent, any
    /// arguments are allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// The admin vouches that this command does not change the host, so it may also run in
    /// read-only stages (`plan` and the checks). Default `false`: commands run only in
    /// stages that may change the host.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// The capability interfaces a grant can cover, as named in the WIT world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Capability {
    /// `nodewright:plugin/files`, granted by `capabilities.files`.
    Files,
    /// `nodewright:plugin/kmod`, granted by `capabilities.kernelModules`.
    Kmod,
    /// `nodewright:plugin/services`, granted by `capabilities.services`.
    Services,
    /// `nodewright:plugin/sysctl`, granted by `capabilities.sysctl`.
    Sysctl,
    /// `nodewright:plugin/exec`, granted by `capabilities.commands`.
    Exec,
    /// `nodewright:plugin/power`, granted by `interrupt.type: reboot`.
    Power,
}

impl Capability {
    /// Every grantable capability, in WIT order.
    pub const ALL: [Capability; 6] = [
        Capability::Files,
        Capability::Kmod,
        Capability::Services,
        Capability::Sysctl,
        Capability::Exec,
        Capability::Power,
    ];

    /// The WIT interface name (`files`, `kmod`, ...).
    pub fn interface(self) -> &'static str {
        match self {
            Capability::Files => "files",
            Capability::Kmod => "kmod",
            Capability::Services => "services",
            Capability::Sysctl => "sysctl",
            Capability::Exec => "exec",
            Capability::Power => "power",
        }
    }

    /// Looks a capability up by its WIT interface name.
    pub fn from_interface(name: &str) -> Option<Capability> {
        Capability::ALL.into_iter().find(|c| c.interface() == name)
    }

    /// The spec field that grants it, relative to `capabilities` (power is the exception:
    /// it comes from the package's interrupt).
    pub fn grant_field(self) -> &'static str {
        match self {
            Capability::Files => "files",
            Capability::Kmod => "kernelModules",
            Capability::Services => "services",
            Capability::Sysctl => "sysctl",
            Capability::Exec => "commands",
            Capability::Power => "interrupt.type: reboot",
        }
    }

    /// The `--grant` key used on the command line.
    pub fn flag_key(self) -> &'static str {
        match self {
            Capability::Files => "files",
            Capability::Kmod => "kmod",
            Capability::Services => "service",
            Capability::Sysctl => "sysctl",
            Capability::Exec => "command",
            Capability::Power => "power",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.interface())
    }
}

/// Where a grant came from, so a denial can say exactly what to add.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrantSource {
    /// `spec.packages.<package>.capabilities` of a NodeWright.
    Spec {
        /// Package name (key under `spec.packages`).
        package: String,
    },
    /// `--grant` flags of `nodewright plugin run`.
    Flags,
}

impl GrantSource {
    /// Where `capability` is granted: the spec field or the CLI flag.
    pub fn field(&self, capability: Capability) -> String {
        match (self, capability) {
            (GrantSource::Spec { package }, Capability::Power) => {
                format!("spec.packages.{package}.interrupt.type: reboot")
            }
            (GrantSource::Spec { package }, c) => {
                format!("spec.packages.{package}.capabilities.{}", c.grant_field())
            }
            (GrantSource::Flags, Capability::Power) => "--grant power".to_string(),
            (GrantSource::Flags, c) => format!("--grant {}=...", c.flag_key()),
        }
    }

    /// A sentence telling the user how to grant `value` for `capability`.
    pub fn hint(&self, capability: Capability, value: &str, write: bool) -> String {
        match (self, capability) {
            (GrantSource::Spec { package }, Capability::Power) => {
                format!("set spec.packages.{package}.interrupt.type to reboot")
            }
            (GrantSource::Spec { package }, Capability::Files) => format!(
                "add {{path: {value:?}, access: {}}} to spec.packages.{package}.capabilities.files",
                if write { "readWrite" } else { "read" }
            ),
            (GrantSource::Spec { package }, c) => {
                format!(
                    "add {value:?} to spec.packages.{package}.capabilities.{}",
                    c.grant_field()
                )
            }
            (GrantSource::Flags, Capability::Power) => "pass --grant power".to_string(),
            (GrantSource::Flags, Capability::Files) => {
                format!(
                    "pass --grant files={value}:{}",
                    if write { "rw" } else { "ro" }
                )
            }
            (GrantSource::Flags, c) => format!("pass --grant {}={value}", c.flag_key()),
        }
    }
}

/// A grant rejected while parsing, with the field path at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct GrantError {
    /// Field path relative to `capabilities`, e.g. `kernelModules[1]`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl GrantError {
    fn new(field: String, message: impl Into<String>) -> Self {
        GrantError {
            field,
            message: message.into(),
        }
    }
}

/// A name allowlist entry: an exact name or a glob. `*` and `?` never match `/`.
#[derive(Clone, Debug)]
pub struct NamePattern {
    source: String,
    matcher: GlobMatcher,
    literal: bool,
}

impl NamePattern {
    fn parse(
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
    fn parse_name(
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

/// A granted path with its access.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathRule {
    /// Normalised absolute path.
    pub path: PathBuf,
    /// Granted access.
    pub access: FileAccess,
    /// setuid/setgid/sticky bits may be set (readWrite only).
    pub special_modes: bool,
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

/// Grants parsed into typed allowlists. Built once per (package, spec generation).
#[derive(Clone, Debug)]
pub struct GrantSet {
    /// Who granted this, for denial hints.
    pub source: GrantSource,
    /// File rules, most specific last.
    pub files: Vec<PathRule>,
    /// Kernel module patterns.
    pub kernel_modules: Vec<NamePattern>,
    /// systemd unit patterns.
    pub services: Vec<NamePattern>,
    /// sysctl key patterns.
    pub sysctl: Vec<NamePattern>,
    /// Command rules.
    pub commands: Vec<CommandRule>,
    /// Reboot requests allowed (in the interrupt stage).
    pub power: bool,
}

fn module_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-')
}

fn unit_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@' | ':' | '\\')
}

fn sysctl_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

fn arg_char(c: char) -> bool {
    !c.is_control()
}

/// Whether package `p` is granted power (may request a reboot): exactly when its interrupt
/// is a reboot. Validation, the operator's checks, the Jobs and the RBAC rules all ask this.
pub fn grants_power(p: &crate::v1alpha1::Package) -> bool {
    p.interrupt
        .as_ref()
        .is_some_and(|i| i.kind == crate::v1alpha1::InterruptType::Reboot)
}

impl GrantSet {
    /// The grants package `name` gets: its `capabilities`, and power per [`grants_power`].
    pub fn of_package(
        name: &str,
        p: &crate::v1alpha1::Package,
    ) -> Result<GrantSet, Vec<GrantError>> {
        GrantSet::parse(
            &p.capabilities,
            grants_power(p),
            GrantSource::Spec {
                package: name.into(),
            },
        )
    }

    /// Parses `caps` into allowlists. `power` says whether the package may request a reboot.
    /// Returns every problem found, each with its field path.
    pub fn parse(
        caps: &Capabilities,
        power: bool,
        source: GrantSource,
    ) -> Result<GrantSet, Vec<GrantError>> {
        let mut errors = Vec::new();
        let mut files = Vec::new();
        for (i, grant) in caps.files.iter().enumerate() {
            if grant.special_modes && grant.access != FileAccess::ReadWrite {
                errors.push(GrantError::new(
                    format!("files[{i}].specialModes"),
                    "needs access: readWrite",
                ));
            }
            match normalize_abs_path(&grant.path) {
                Ok(path) => files.push(PathRule {
                    path,
                    access: grant.access,
                    special_modes: grant.special_modes,
                }),
                Err(msg) => errors.push(GrantError::new(format!("files[{i}].path"), msg)),
            }
        }
        files.sort_by_key(|r| r.path.components().count());
        let mut names =
            |field: &str, raw: &[String], allowed: fn(char) -> bool| -> Vec<NamePattern> {
                raw.iter()
                    .enumerate()
                    .filter_map(|(i, s)| {
                        NamePattern::parse_name(field, i, s, allowed)
                            .map_err(|e| errors.push(e))
                            .ok()
                    })
                    .collect()
            };
        let kernel_modules = names("kernelModules", &caps.kernel_modules, module_char);
        let services = names("services", &caps.services, unit_char);
        let sysctl = names("sysctl", &caps.sysctl, sysctl_char);
        let mut commands = Vec::new();
        for (i, grant) in caps.commands.iter().enumerate() {
            let path = match normalize_abs_path(&grant.path) {
                Ok(p) if p == Path::new("/") => {
                    errors.push(GrantError::new(
                        format!("commands[{i}].path"),
                        "must name a binary, not /",
                    ));
                    continue;
                }
                Ok(p) => p,
                Err(msg) => {
                    errors.push(GrantError::new(format!("commands[{i}].path"), msg));
                    continue;
                }
            };
            let args = grant.args.as_ref().map(|patterns| {
                patterns
                    .iter()
                    .enumerate()
                    .filter_map(|(j, s)| {
                        NamePattern::parse(&format!("commands[{i}].args"), j, s, arg_char)
                            .map_err(|e| errors.push(e))
                            .ok()
                    })
                    .collect()
            });
            commands.push(CommandRule {
                path,
                args,
                read_only: grant.read_only,
            });
        }
        if errors.is_empty() {
            Ok(GrantSet {
                source,
                files,
                kernel_modules,
                services,
                sysctl,
                commands,
                power,
            })
        } else {
            Err(errors)
        }
    }

    /// A grant set that allows nothing.
    pub fn deny_all(source: GrantSource) -> GrantSet {
        GrantSet {
            source,
            files: Vec::new(),
            kernel_modules: Vec::new(),
            services: Vec::new(),
            sysctl: Vec::new(),
            commands: Vec::new(),
            power: false,
        }
    }

    /// Whether the grant covers the interface at all (decides linking).
    pub fn grants(&self, capability: Capability) -> bool {
        match capability {
            Capability::Files => !self.files.is_empty(),
            Capability::Kmod => !self.kernel_modules.is_empty(),
            Capability::Services => !self.services.is_empty(),
            Capability::Sysctl => !self.sysctl.is_empty(),
            Capability::Exec => !self.commands.is_empty(),
            Capability::Power => self.power,
        }
    }

    /// The strongest access granted on a normalised absolute `path`, if any.
    pub fn file_access(&self, path: &Path) -> Option<FileAccess> {
        self.files
            .iter()
            .filter(|r| path.starts_with(&r.path))
            .map(|r| r.access)
            .max()
    }

    /// Whether a rule covering `path` lets the package set setuid/setgid/sticky bits.
    pub fn allows_special_modes(&self, path: &Path) -> bool {
        self.files.iter().any(|r| {
            r.special_modes && r.access == FileAccess::ReadWrite && path.starts_with(&r.path)
        })
    }

    /// Checks a kernel module name: its grammar, then the grant.
    pub fn check_module(&self, name: &str) -> Result<(), NameRefusal> {
        crate::hostargs::module_name(name).map_err(NameRefusal::Invalid)?;
        self.kernel_modules
            .iter()
            .any(|p| p.matches(name))
            .then_some(())
            .ok_or(NameRefusal::NotGranted)
    }

    /// Checks a systemd unit name: its grammar, then the grant.
    pub fn check_service(&self, unit: &str) -> Result<(), NameRefusal> {
        crate::hostargs::unit_name(unit).map_err(NameRefusal::Invalid)?;
        self.services
            .iter()
            .any(|p| p.matches(unit))
            .then_some(())
            .ok_or(NameRefusal::NotGranted)
    }

    /// Checks a dotted sysctl key: its grammar, then the grant.
    pub fn check_sysctl(&self, key: &str) -> Result<(), NameRefusal> {
        crate::hostargs::sysctl_key(key).map_err(NameRefusal::Invalid)?;
        self.sysctl
            .iter()
            .any(|p| p.matches(key))
            .then_some(())
            .ok_or(NameRefusal::NotGranted)
    }

    /// Whether the kernel module `name` is well-formed and granted.
    pub fn allows_module(&self, name: &str) -> bool {
        self.check_module(name).is_ok()
    }

    /// Whether the systemd unit `unit` is well-formed and granted.
    pub fn allows_service(&self, unit: &str) -> bool {
        self.check_service(unit).is_ok()
    }

    /// Whether the sysctl key `key` (dotted) is well-formed and granted.
    pub fn allows_sysctl(&self, key: &str) -> bool {
        self.check_sysctl(key).is_ok()
    }

    /// The rule granting `path` with `args`, if any (a read-only rule is preferred).
    pub fn command_rule(&self, path: &Path, args: &[String]) -> Option<&CommandRule> {
        let mut matching = self
            .commands
            .iter()
            .filter(|rule| rule.path == path && rule.check_args(args).is_ok());
        let first = matching.next()?;
        Some(if first.read_only {
            first
        } else {
            matching.find(|r| r.read_only).unwrap_or(first)
        })
    }

    /// Whether running `path` with `args` is granted.
    pub fn allows_command(&self, path: &Path, args: &[String]) -> bool {
        self.command_rule(path, args).is_some()
    }
}

/// Why a host name was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameRefusal {
    /// The name is not well-formed for its kind; the reason says why. No grant can allow it.
    Invalid(String),
    /// Well-formed, but no grant pattern matches it.
    NotGranted,
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

impl Capabilities {
    /// Builds capabilities from `nodewright plugin run --grant` values. Returns the
    /// capabilities and whether `power` was granted.
    ///
    /// Syntax, one grant per flag:
    /// - `files=/etc/sysctl.d` (read) or `files=/etc/sysctl.d:rw` (`:rw+special` also
    ///   allows setuid/setgid/sticky modes)
    /// - `kmod=br_netfilter`, `service=containerd.service`, `sysctl=net.ipv4.*`
    /// - `command=/usr/bin/nvidia-smi` or `command=/usr/bin/nvidia-smi:-pm,1`
    /// - `probe=/usr/bin/nvidia-smi[:args]`: a command vouched read-only (`readOnly: true`)
    /// - `power`
    pub fn from_flags<S: AsRef<str>>(flags: &[S]) -> Result<(Capabilities, bool), GrantError> {
        let mut caps = Capabilities::default();
        let mut power = false;
        for (i, flag) in flags.iter().enumerate() {
            let flag = flag.as_ref();
            let field = format!("--grant[{i}]");
            if flag == "power" {
                power = true;
                continue;
            }
            let Some((key, value)) = flag.split_once('=') else {
                return Err(GrantError::new(
                    field,
                    format!("{flag:?} is not KEY=VALUE (or `power`)"),
                ));
            };
            if value.is_empty() {
                return Err(GrantError::new(
                    field,
                    format!("{flag:?} has an empty value"),
                ));
            }
            match key {
                "files" | "file" => {
                    let (path, access, special_modes) = match value.rsplit_once(':') {
                        Some((p, "rw")) => (p, FileAccess::ReadWrite, false),
                        Some((p, "rw+special")) => (p, FileAccess::ReadWrite, true),
                        Some((p, "ro")) => (p, FileAccess::Read, false),
                        Some((_, other)) => {
                            return Err(GrantError::new(
                                field,
                                format!("access {other:?} must be `ro`, `rw` or `rw+special`"),
                            ));
                        }
                        None => (value, FileAccess::Read, false),
                    };
                    caps.files.push(FileGrant {
                        path: path.to_string(),
                        access,
                        special_modes,
                    });
                }
                "kmod" | "kernelModule" => caps.kernel_modules.push(value.to_string()),
                "service" | "services" => caps.services.push(value.to_string()),
                "sysctl" => caps.sysctl.push(value.to_string()),
                "command" | "exec" | "probe" => {
                    let (path, args) = match value.split_once(':') {
                        Some((p, a)) => (p, Some(a.split(',').map(str::to_string).collect())),
                        None => (value, None),
                    };
                    caps.commands.push(CommandGrant {
                        path: path.to_string(),
                        args,
                        read_only: key == "probe",
                    });
                }
                other => {
                    return Err(GrantError::new(
                        field,
                        format!(
                            "unknown grant {other:?}; expected files, kmod, service, sysctl, command, probe or power"
                        ),
                    ));
                }
            }
        }
        Ok((caps, power))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(caps: &Capabilities) -> Result<GrantSet, Vec<GrantError>> {
        GrantSet::parse(
            caps,
            false,
            GrantSource::Spec {
                package: "drv".into(),
            },
        )
    }

    #[test]
    fn deny_by_default() {
        let set = parse(&Capabilities::default()).unwrap();
        for c in Capability::ALL {
            assert!(!set.grants(c), "{c} granted by an empty spec");
        }
        assert_eq!(set.file_access(Path::new("/etc/passwd")), None);
        assert!(!set.allows_module("nvidia"));
        assert!(!set.allows_command(Path::new("/bin/sh"), &[]));
    }

    #[test]
    fn file_grants_cover_subtrees_and_take_the_strongest_access() {
        let caps = Capabilities {
            files: vec![
                FileGrant {
                    path: "/etc".into(),
                    access: FileAccess::Read,
                    special_modes: false,
                },
                FileGrant {
                    path: "/etc/sysctl.d/".into(),
                    access: FileAccess::ReadWrite,
                    special_modes: false,
                },
            ],
            ..Default::default()
        };
        let set = parse(&caps).unwrap();
        assert_eq!(
            set.file_access(Path::new("/etc/hosts")),
            Some(FileAccess::Read)
        );
        assert_eq!(
            set.file_access(Path::new("/etc/sysctl.d/99-x.conf")),
            Some(FileAccess::ReadWrite)
        );
        assert_eq!(
            set.file_access(Path::new("/etcetera")),
            None,
            "prefix match must be by component"
        );
        assert_eq!(set.file_access(Path::new("/var/lib")), None);
    }

    #[test]
    fn bad_paths_are_rejected_with_field_paths() {
        let caps = Capabilities {
            files: vec![
                FileGrant {
                    path: "etc/x".into(),
                    access: FileAccess::Read,
                    special_modes: false,
                },
                FileGrant {
                    path: "/etc/../root".into(),
                    access: FileAccess::Read,
                    special_modes: false,
                },
            ],
            commands: vec![CommandGrant {
                path: "bin/sh".into(),
                args: None,
                read_only: false,
            }],
            ..Default::default()
        };
        let errs = parse(&caps).unwrap_err();
        let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            ["files[0].path", "files[1].path", "commands[0].path"]
        );
        assert!(errs[1].message.contains(".."), "{}", errs[1]);
    }

    #[test]
    fn name_globs() {
        let caps = Capabilities {
            kernel_modules: vec!["nvidia*".into(), "br_netfilter".into()],
            services: vec!["containerd.service".into()],
            sysctl: vec!["net.ipv4.*".into()],
            ..Default::default()
        };
        let set = parse(&caps).unwrap();
        assert!(set.allows_module("nvidia_uvm"));
        assert!(set.allows_module("br_netfilter"));
        assert!(!set.allows_module("br_netfilter2"));
        assert!(set.allows_service("containerd.service"));
        assert!(!set.allows_service("kubelet.service"));
        assert!(set.allows_sysctl("net.ipv4.ip_forward"));
        assert!(!set.allows_sysctl("net.ipv6.conf.all.forwarding"));
    }

    #[test]
    fn bad_globs_and_characters_name_the_entry() {
        let caps = Capabilities {
            kernel_modules: vec!["ok".into(), "nv[idia".into()],
            services: vec!["a b".into()],
            sysctl: vec![String::new()],
            ..Default::default()
        };
        let errs = parse(&caps).unwrap_err();
        let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["kernelModules[1]", "services[0]", "sysctl[0]"]);
    }

    #[test]
    fn command_argument_patterns() {
        let caps = Capabilities {
            commands: vec![
                CommandGrant {
                    path: "/usr/bin/nvidia-smi".into(),
                    args: Some(vec!["-pm".into(), "[01]".into()]),
                    read_only: false,
                },
                CommandGrant {
                    path: "/usr/bin/true".into(),
                    args: None,
                    read_only: true,
                },
            ],
            ..Default::default()
        };
        let set = parse(&caps).unwrap();
        let smi = Path::new("/usr/bin/nvidia-smi");
        assert!(set.allows_command(smi, &["-pm".into(), "1".into()]));
        assert!(!set.allows_command(smi, &["-pm".into(), "2".into()]));
        assert!(
            !set.allows_command(smi, &["-pm".into()]),
            "argument count must match"
        );
        assert!(set.allows_command(Path::new("/usr/bin/true"), &["anything".into()]));
        assert!(
            !set.allows_command(Path::new("/usr/bin/../bin/true"), &[]),
            "paths are exact"
        );
        assert!(
            set.command_rule(Path::new("/usr/bin/true"), &[])
                .unwrap()
                .read_only
        );
        assert!(
            !set.command_rule(smi, &["-pm".into(), "1".into()])
                .unwrap()
                .read_only
        );
    }

    #[test]
    fn names_are_checked_against_their_grammar_before_the_glob() {
        let caps = Capabilities {
            kernel_modules: vec!["nvidia*".into()],
            services: vec!["*.service".into()],
            sysctl: vec!["net.*".into()],
            ..Default::default()
        };
        let set = parse(&caps).unwrap();
        assert!(matches!(
            set.check_module("nvidia/../../evil"),
            Err(NameRefusal::Invalid(_))
        ));
        assert!(matches!(
            set.check_module("nvidia -C"),
            Err(NameRefusal::Invalid(_))
        ));
        assert_eq!(set.check_module("nvidia_uvm"), Ok(()));
        assert_eq!(set.check_module("evil"), Err(NameRefusal::NotGranted));
        assert!(matches!(
            set.check_service("/tmp/evil.service"),
            Err(NameRefusal::Invalid(_))
        ));
        assert!(matches!(
            set.check_service("--root=/tmp.service"),
            Err(NameRefusal::Invalid(_))
        ));
        assert_eq!(set.check_service("app.service"), Ok(()));
        assert!(matches!(
            set.check_sysctl("net/../kernel/panic"),
            Err(NameRefusal::Invalid(_))
        ));
        assert_eq!(set.check_sysctl("net.core.somaxconn"), Ok(()));
        let errs = parse(&Capabilities {
            kernel_modules: vec!["-C".into()],
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(errs[0].field, "kernelModules[0]");
    }

    #[test]
    fn wildcard_argument_patterns_cannot_be_widened() {
        let caps = Capabilities {
            commands: vec![CommandGrant {
                path: "/usr/bin/tool".into(),
                args: Some(vec!["--level=*".into(), "/var/lib/app/*".into()]),
                read_only: false,
            }],
            ..Default::default()
        };
        let set = parse(&caps).unwrap();
        let tool = Path::new("/usr/bin/tool");
        let args = |a: &str, b: &str| vec![a.to_string(), b.to_string()];
        assert!(set.allows_command(tool, &args("--level=3", "/var/lib/app/x.conf")));
        assert!(
            !set.allows_command(tool, &args("--level=3", "/var/lib/app/../../etc/shadow")),
            "'..' widens the pattern"
        );
        assert!(
            !set.allows_command(tool, &args("--level=3", "/var/lib/app/a/b")),
            "'*' does not cross '/'"
        );
        assert!(!set.allows_command(tool, &args("--level=3", "-/var/lib/app/x")));
        let rule = &set.commands[0];
        assert!(
            rule.check_args(&args("--level=3", "--config=/var/lib/app/x"))
                .unwrap_err()
                .contains("argument 1")
        );
        let any = Capabilities {
            commands: vec![CommandGrant {
                path: "/usr/bin/tool".into(),
                args: Some(vec!["*".into()]),
                read_only: false,
            }],
            ..Default::default()
        };
        let set = parse(&any).unwrap();
        assert!(set.allows_command(tool, &["file".to_string()]));
        assert!(
            !set.allows_command(tool, &["--exec=/bin/sh".to_string()]),
            "a leading wildcard does not match an option"
        );
    }

    #[test]
    fn special_modes_need_an_explicit_readwrite_grant() {
        let caps = Capabilities {
            files: vec![
                FileGrant {
                    path: "/usr/local/bin".into(),
                    access: FileAccess::ReadWrite,
                    special_modes: true,
                },
                FileGrant {
                    path: "/etc/app".into(),
                    access: FileAccess::ReadWrite,
                    special_modes: false,
                },
            ],
            ..Default::default()
        };
        let set = parse(&caps).unwrap();
        assert!(set.allows_special_modes(Path::new("/usr/local/bin/tool")));
        assert!(!set.allows_special_modes(Path::new("/etc/app/x")));
        let bad = Capabilities {
            files: vec![FileGrant {
                path: "/x".into(),
                access: FileAccess::Read,
                special_modes: true,
            }],
            ..Default::default()
        };
        assert_eq!(parse(&bad).unwrap_err()[0].field, "files[0].specialModes");
        let (caps, _) = Capabilities::from_flags(&["files=/opt/bin:rw+special"]).unwrap();
        assert!(caps.files[0].special_modes);
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = serde_json::from_str::<Capabilities>(r#"{"kernelModule": ["x"]}"#).unwrap_err();
        assert!(
            err.to_string().contains("unknown field `kernelModule`"),
            "{err}"
        );
    }

    #[test]
    fn flags() {
        let (caps, power) = Capabilities::from_flags(&[
            "files=/etc/sysctl.d:rw",
            "files=/etc/os-release",
            "kmod=br_netfilter",
            "sysctl=net.*",
            "service=containerd.service",
            "command=/usr/bin/nvidia-smi:-pm,1",
            "power",
        ])
        .unwrap();
        assert!(power);
        assert_eq!(
            caps.files[0],
            FileGrant {
                path: "/etc/sysctl.d".into(),
                access: FileAccess::ReadWrite,
                special_modes: false
            }
        );
        assert_eq!(caps.files[1].access, FileAccess::Read);
        assert_eq!(
            caps.commands[0].args.as_deref(),
            Some(&["-pm".to_string(), "1".to_string()][..])
        );
        let err = Capabilities::from_flags(&["kmods=x"]).unwrap_err();
        assert_eq!(err.field, "--grant[0]");
        assert!(Capabilities::from_flags(&["files=/x:rx"]).is_err());
        assert!(Capabilities::from_flags(&["kmod"]).is_err());
    }

    #[test]
    fn hints_name_the_grant_to_add() {
        let spec = GrantSource::Spec {
            package: "driver".into(),
        };
        assert_eq!(
            spec.hint(Capability::Kmod, "nvidia", false),
            r#"add "nvidia" to spec.packages.driver.capabilities.kernelModules"#
        );
        assert_eq!(
            spec.hint(Capability::Files, "/etc/x", true),
            r#"add {path: "/etc/x", access: readWrite} to spec.packages.driver.capabilities.files"#
        );
        assert_eq!(
            GrantSource::Flags.hint(Capability::Services, "a.service", false),
            "pass --grant service=a.service"
        );
        assert_eq!(
            GrantSource::Flags.hint(Capability::Power, "", false),
            "pass --grant power"
        );
        assert_eq!(
            spec.field(Capability::Sysctl),
            "spec.packages.driver.capabilities.sysctl"
        );
        assert_eq!(
            GrantSource::Flags.field(Capability::Exec),
            "--grant command=..."
        );
    }
}
