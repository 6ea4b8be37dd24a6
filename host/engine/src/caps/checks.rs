//! What every capability call goes through: denials that name the grant to add, stage
//! rules, the write budget, path and name checks against the grant.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nodewright_api::grants::{
    Capability, GrantSource, GrantedPath, NameRefusal, PathRefusal, PathRule,
};
use nodewright_hostops::{HostError, HostOps, PERMISSION_BITS};

use crate::bindings::nodewright::plugin::types;
use crate::report::{Denial, LogLevel, LogSource};
use crate::state::CapState;

use types::CapError;

/// Renders an error with its source chain.
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// Cuts a plugin-chosen string to `max` bytes (on a character boundary) for messages.
pub(crate) fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &s[..cut])
}

/// Longest plugin-chosen target kept in a denial.
const MAX_TARGET: usize = 256;

impl CapState {
    pub(super) fn deny_with(
        &mut self,
        cap: Capability,
        op: &str,
        target: &str,
        reason: String,
    ) -> CapError {
        let target = clip(target, MAX_TARGET);
        let message = format!(
            "{}.{op}({target:?}) denied: {}",
            cap.interface(),
            clip(&reason, 1024)
        );
        self.log.lock().expect("log lock").push(
            LogSource::Plugin,
            LogLevel::Warn,
            format!("nodewright: {message}"),
        );
        let denial = Denial {
            capability: cap.interface().into(),
            operation: op.into(),
            target,
            message,
        };
        self.record_denial(denial.clone());
        self.issue(CapError::Denied(types::Denial {
            capability: denial.capability,
            operation: denial.operation,
            target: denial.target,
            message: denial.message,
        }))
    }

    pub(super) fn deny(
        &mut self,
        cap: Capability,
        op: &str,
        target: &str,
        write: bool,
    ) -> CapError {
        let hint = self
            .grants
            .source
            .hint(cap, &clip(target, MAX_TARGET), write);
        self.deny_with(cap, op, target, hint)
    }

    /// A refused name: malformed names say why; well-formed ones name the grant to add.
    pub(super) fn refuse_name(
        &mut self,
        cap: Capability,
        op: &str,
        name: &str,
        refusal: NameRefusal,
        write: bool,
    ) -> CapError {
        match refusal {
            NameRefusal::Invalid(reason) => self.deny_with(cap, op, name, reason),
            NameRefusal::NotGranted => self.deny(cap, op, name, write),
        }
    }

    pub(super) fn refuse_write(&mut self, cap: Capability, op: &str) -> Option<CapError> {
        if !self.stage.read_only() {
            return None;
        }
        let message = format!(
            "{}.{op} changes the host and is refused in the read-only {} stage",
            cap.interface(),
            self.stage
        );
        Some(self.issue(CapError::WrongStage(message)))
    }

    pub(super) fn host_error(
        &mut self,
        cap: Capability,
        op: &str,
        target: &str,
        e: HostError,
    ) -> CapError {
        match e {
            HostError::NotFound(what) => self.issue(CapError::NotFound(clip(&what, 1024))),
            HostError::TooLarge { limit, .. } => {
                let field = self.sandbox_field("memory", "--memory");
                self.deny_with(
                    cap,
                    op,
                    target,
                    format!(
                        "reads are capped at {limit} bytes (half the sandbox memory); raise {field}"
                    ),
                )
            }
            HostError::DirBudget {
                needed,
                allowed,
                depth,
                ..
            } => {
                let field = self.sandbox_field("writeFiles", "--write-files");
                let reason = format!(
                    "this needs {needed} new directories and the stage's budget of {} written files (directories count) has {allowed} left, or it is more than {depth} levels deep; raise {field}",
                    self.budget.files
                );
                self.deny_with(cap, op, target, reason)
            }
            e @ (HostError::Escape { .. }
            | HostError::Symlink(_)
            | HostError::UntrustedSymlink { .. }
            | HostError::Refused { .. }
            | HostError::NotADirectory { .. }
            | HostError::FileGrant { .. }
            | HostError::PowerUnit { .. }
            | HostError::NotRegular { .. }
            | HostError::NotExecutable { .. }
            | HostError::HardLinked { .. }
            | HostError::InvalidName(_)) => self.deny_with(cap, op, target, e.to_string()),
            e => self.issue(CapError::Failed(clip(&chain(&e), 4096))),
        }
    }

    /// Where the package's sandbox bound `field` is set: the spec field or the CLI flag.
    pub(super) fn sandbox_field(&self, field: &str, flag: &str) -> String {
        match &self.grants.source {
            GrantSource::Spec { package } => format!("spec.packages.{package}.sandbox.{field}"),
            GrantSource::Flags => flag.to_string(),
        }
    }

    /// Takes `bytes` and `files` from the stage's write budget, or refuses.
    pub(super) fn spend(
        &mut self,
        op: &str,
        target: &str,
        bytes: u64,
        files: u32,
    ) -> Result<(), CapError> {
        if bytes > self.budget.bytes_left {
            let field = self.sandbox_field("writeBytes", "--write-bytes");
            let reason = format!(
                "the stage's write budget of {} bytes is used up; raise {field}",
                self.budget.bytes
            );
            return Err(self.deny_with(Capability::Files, op, target, reason));
        }
        if files > self.budget.files_left {
            let field = self.sandbox_field("writeFiles", "--write-files");
            let reason = format!(
                "the stage's budget of {} written files is used up; raise {field}",
                self.budget.files
            );
            return Err(self.deny_with(Capability::Files, op, target, reason));
        }
        self.budget.bytes_left -= bytes;
        self.budget.files_left -= files;
        Ok(())
    }

    /// Refuses setuid/setgid/sticky bits unless a grant covering `path` allows them.
    pub(super) fn check_mode(
        &mut self,
        op: &str,
        path: &Path,
        mode: Option<u32>,
    ) -> Result<bool, CapError> {
        let special = self.grants.allows_special_modes(path);
        if let Some(mode) = mode
            && mode & !PERMISSION_BITS != 0
            && !special
        {
            let hint = match &self.grants.source {
                GrantSource::Spec { package } => {
                    format!(
                        "add {{path: {:?}, access: readWrite, specialModes: true}} to spec.packages.{package}.capabilities.files",
                        path.display()
                    )
                }
                GrantSource::Flags => format!("pass --grant files={}:rw+special", path.display()),
            };
            let reason = format!("mode {mode:#o} sets setuid, setgid or sticky bits; {hint}");
            return Err(self.deny_with(Capability::Files, op, &path.display().to_string(), reason));
        }
        Ok(special)
    }

    /// Runs a host operation that only asks the kernel — a file read, stat, listing,
    /// directory, mode or owner under a grant, a sysctl, `/proc/modules` — in place, on the
    /// thread running the plugin: it cannot wait on another process (FIFOs and devices are
    /// refused before they are opened; reads are bounded), and a hand-off to the blocking
    /// pool and back cost more than the operation (about 15 µs of the 60 a `plan` with three
    /// calls spent). A panic in it is the host's failure, as on the pool.
    pub(super) fn host_in_place<T>(
        &mut self,
        cap: Capability,
        op: &str,
        target: &str,
        f: impl FnOnce(&dyn HostOps) -> nodewright_hostops::Result<T>,
    ) -> Result<T, CapError> {
        let host = Arc::clone(&self.host);
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&*host))) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.host_error(cap, op, target, e)),
            Err(_) => Err(self.issue(CapError::Failed(format!(
                "host operation {}.{op} panicked",
                cap.interface()
            )))),
        }
    }

    /// Runs a host operation that runs a helper or a granted command (`systemctl`,
    /// `modprobe`, exec, the reboot request), or a file write with its fsync, on the
    /// blocking pool, so the stage's deadline ends the stage even while it runs.
    pub(super) async fn host<T: Send + 'static>(
        &mut self,
        cap: Capability,
        op: &str,
        target: &str,
        f: impl FnOnce(&dyn HostOps) -> nodewright_hostops::Result<T> + Send + 'static,
    ) -> Result<T, CapError> {
        let host = Arc::clone(&self.host);
        match tokio::task::spawn_blocking(move || f(&*host)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.host_error(cap, op, target, e)),
            Err(join) => Err(self.issue(CapError::Failed(format!(
                "host operation {}.{op} panicked: {join}",
                cap.interface()
            )))),
        }
    }

    /// Resolves a payload path as the plugin reads it (`/payload/<name>/<path>`) to (the
    /// payload's tree, the path inside it), or a denial naming what a source must be: one
    /// of this package's payloads, a relative path below it without `..`.
    pub(super) fn payload_file(
        &mut self,
        op: &str,
        raw: &str,
    ) -> Result<(PathBuf, PathBuf), CapError> {
        let refuse =
            |this: &mut Self, why: String| Err(this.deny_with(Capability::Files, op, raw, why));
        let Some(rest) = raw
            .strip_prefix(nodewright_api::payload::GUEST_ROOT)
            .and_then(|r| r.strip_prefix('/'))
        else {
            return refuse(
                self,
                format!(
                    "the source must be a file of one of the package's payloads, {}/<name>/<path>",
                    nodewright_api::payload::GUEST_ROOT
                ),
            );
        };
        let (name, inner) = rest.split_once('/').unwrap_or((rest, ""));
        let Some(tree) = nodewright_api::payload::PayloadName::parse(name)
            .ok()
            .and_then(|n| self.payloads.get(&n).cloned())
        else {
            let has = self.payload_names();
            return refuse(
                self,
                format!(
                    "the package has no payload named {name:?} (it has: {has}); payloads are pushed with the plugin (`plugin push --payload`)"
                ),
            );
        };
        let rel = Path::new(inner);
        if inner.contains('\0') || !nodewright_api::payload::is_below_root(rel) {
            return refuse(
                self,
                format!(
                    "the source must name a file below {}/{name}/, without `..`",
                    nodewright_api::payload::GUEST_ROOT
                ),
            );
        }
        Ok((tree, rel.to_path_buf()))
    }

    /// The package's payloads by name, `a, b` (`none` when it has none), for denials.
    pub(super) fn payload_names(&self) -> String {
        if self.payloads.is_empty() {
            return "none".into();
        }
        let names: Vec<&str> = self.payloads.keys().map(|n| n.as_str()).collect();
        names.join(", ")
    }

    /// Resolves a guest path to (the rule granting it, normalised path), or a denial: the
    /// shape and the grant ([`nodewright_api::grants::GrantSet::check_file`]), then the
    /// stage.
    pub(super) fn file_scope(
        &mut self,
        op: &str,
        raw: &str,
        write: bool,
    ) -> Result<(PathRule, PathBuf), CapError> {
        let (rule, path) = match self.grants.check_file(raw, write) {
            Ok((rule, path)) => (rule.clone(), path),
            Err(PathRefusal::Invalid(reason)) => {
                return Err(self.deny_with(Capability::Files, op, raw, reason));
            }
            Err(PathRefusal::NotGranted(path)) => {
                let target = path.display().to_string();
                return Err(self.deny(Capability::Files, op, &target, write));
            }
        };
        if write && let Some(e) = self.refuse_write(Capability::Files, op) {
            return Err(e);
        }
        Ok((rule, path))
    }

    pub(super) fn file_op<T>(
        &mut self,
        op: &'static str,
        raw: String,
        write: bool,
        f: impl FnOnce(&dyn HostOps, GrantedPath<'_>, &Path) -> nodewright_hostops::Result<T>,
    ) -> Result<T, CapError> {
        let (rule, path) = self.file_scope(op, &raw, write)?;
        self.host_in_place(Capability::Files, op, &raw, |h| f(h, rule.granted(), &path))
    }

    pub(super) fn check_name(
        &mut self,
        cap: Capability,
        op: &str,
        name: &str,
        checked: Result<(), NameRefusal>,
        write: bool,
    ) -> Result<(), CapError> {
        if let Err(refusal) = checked {
            return Err(self.refuse_name(cap, op, name, refusal, write));
        }
        if write && let Some(e) = self.refuse_write(cap, op) {
            return Err(e);
        }
        Ok(())
    }
}
