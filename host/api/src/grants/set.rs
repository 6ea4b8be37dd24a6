//! [`GrantSet`]: a package's grants parsed once into typed allowlists, and the questions
//! the sandbox asks of them on every call.

use std::path::{Path, PathBuf};

use super::patterns::{
    CommandRule, CommandTarget, NamePattern, PAYLOAD_COMMAND, PathKind, PathRule,
    normalize_abs_path,
};
use super::spec::{Capabilities, Capability, FileAccess, GrantError, GrantSource};
use crate::payload::PayloadName;

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

/// An argument pattern naming payload files (`payload:NAME/GLOB`) names one payload, by a
/// valid name without wildcards, and a path pattern below it.
fn payload_arg_pattern(field: &str, index: usize, raw: &str) -> Result<(), GrantError> {
    let Some(rest) = raw.strip_prefix(PAYLOAD_COMMAND) else {
        return Ok(());
    };
    let refuse = |why: String| Err(GrantError::new(format!("{field}[{index}]"), why));
    let Some((name, path)) = rest.split_once('/') else {
        return refuse(format!(
            "{raw:?} names no file; write payload:<name>/<file or glob>"
        ));
    };
    if let Err(e) = PayloadName::parse(name) {
        return refuse(format!(
            "{raw:?}: {e} (a payload pattern names one payload, without wildcards)"
        ));
    }
    if path.is_empty()
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return refuse(format!(
            "{raw:?} must name files below the payload's root by plain names or globs"
        ));
    }
    Ok(())
}

impl GrantSet {
    /// Parses `caps` into allowlists. `power` says whether the package may request a reboot.
    /// Returns every problem found, each with its field path.
    // Long on purpose: one block per grant kind, each collecting its errors with its field
    // path.
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
                    kind: PathKind::of(&grant.path),
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
            let target = match CommandTarget::parse(&grant.path) {
                Ok(t) => t,
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
                        let field = format!("commands[{i}].args");
                        payload_arg_pattern(&field, j, s)
                            .and_then(|()| NamePattern::parse(&field, j, s, arg_char))
                            .map_err(|e| errors.push(e))
                            .ok()
                    })
                    .collect()
            });
            commands.push(CommandRule {
                target,
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

    /// The rule granting `target` with `args`, if any (a read-only rule is preferred).
    pub fn command_rule(&self, target: &CommandTarget, args: &[String]) -> Option<&CommandRule> {
        let mut matching = self
            .commands
            .iter()
            .filter(|rule| rule.target == *target && rule.check_args(args).is_ok());
        let first = matching.next()?;
        Some(if first.read_only {
            first
        } else {
            matching.find(|r| r.read_only).unwrap_or(first)
        })
    }

    /// Whether running `raw` (as a plugin calls it) with `args` is granted.
    pub fn allows_command(&self, raw: &str, args: &[String]) -> bool {
        self.check_command(raw, args).is_ok()
    }

    /// Checks a file path a plugin passed: absolute and normalisable, then covered by a
    /// rule granting at least read (or, with `write`, readWrite) — the most specific such
    /// rule. Returns the rule and the normalised path.
    pub fn check_file(&self, raw: &str, write: bool) -> Result<(&PathRule, PathBuf), PathRefusal> {
        let path = normalize_abs_path(raw).map_err(PathRefusal::Invalid)?;
        let need = if write {
            FileAccess::ReadWrite
        } else {
            FileAccess::Read
        };
        match self
            .files
            .iter()
            .rev()
            .find(|r| path.starts_with(&r.path) && r.access >= need)
        {
            Some(rule) => Ok((rule, path)),
            None => Err(PathRefusal::NotGranted(path)),
        }
    }

    /// Checks a command a plugin asked to run: its spelling exact ([`CommandTarget::parse`]:
    /// a granted command has one), each argument well-formed, then a rule for that command
    /// whose argument patterns match (a read-only one preferred), then the payload files
    /// its `payload:` arguments name. Returns all three.
    pub fn check_command(
        &self,
        raw: &str,
        args: &[String],
    ) -> Result<CheckedCommand<'_>, CommandRefusal> {
        let target = CommandTarget::parse(raw).map_err(CommandRefusal::Invalid)?;
        if let Some(why) = args.iter().enumerate().find_map(|(i, a)| {
            crate::hostargs::command_arg(a)
                .err()
                .map(|why| format!("argument {i} {why}"))
        }) {
            return Err(CommandRefusal::Invalid(why));
        }
        if let Some(rule) = self.command_rule(&target, args) {
            let payload_args = rule.payload_args(args).map_err(CommandRefusal::Invalid)?;
            return Ok(CheckedCommand {
                rule,
                target,
                payload_args,
            });
        }
        match self
            .commands
            .iter()
            .filter(|c| c.target == target)
            .find_map(|c| c.check_args(args).err())
        {
            Some(why) => Err(CommandRefusal::Arguments(why)),
            None => Err(CommandRefusal::NotGranted),
        }
    }
}

/// A command [`GrantSet::check_command`] allowed.
#[derive(Clone, Debug)]
pub struct CheckedCommand<'a> {
    /// The rule granting it.
    pub rule: &'a CommandRule,
    /// What it runs.
    pub target: CommandTarget,
    /// Its arguments that name payload files: index, payload, file below the payload's root.
    pub payload_args: Vec<(usize, PayloadName, PathBuf)>,
}

/// Why a file path was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathRefusal {
    /// Not an absolute path that normalises (the reason says why). No grant can allow it.
    Invalid(String),
    /// No rule grants the (normalised) path with the access asked.
    NotGranted(PathBuf),
}

/// Why a command was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandRefusal {
    /// The path is not exact and normalised, or an argument is malformed (the reason says
    /// which). No grant can allow it.
    Invalid(String),
    /// The path is granted, but no rule's argument patterns match (the reason says how the
    /// nearest differs).
    Arguments(String),
    /// No rule grants the path.
    NotGranted,
}

/// Why a host name was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameRefusal {
    /// The name is not well-formed for its kind; the reason says why. No grant can allow it.
    Invalid(String),
    /// Well-formed, but no grant pattern matches it.
    NotGranted,
}
