//! The capability interfaces: grant checks, then the host call through [`HostOps`].
//!
//! Each call is checked in the same order: argument shape, grant (a miss is a `denied`
//! error naming the grant to add), stage (writes are refused in plans and checks, reboots
//! outside the interrupt stage), then the host operation runs on a blocking thread.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nodewright_api::grants::{
    Capability, FileAccess, GrantSource, NameRefusal, normalize_abs_path,
};
use nodewright_api::hostargs;
use nodewright_hostops::{HostError, HostOps, PERMISSION_BITS, ServiceVerb, WriteOptions};
use wasmtime::component::{HasSelf, Linker};

use crate::bindings::nodewright::plugin::{
    exec, files, kmod, log, node, power, services, sysctl, types,
};
use crate::error::{Error, Result};
use crate::report::{Denial, LogLevel, LogSource};
use crate::state::{CapState, HostState};

use types::CapError;

/// Builds a linker with WASI (nothing granted behind it), the always-linked interfaces and
/// exactly the capabilities in `caps`.
pub(crate) fn linker(engine: &wasmtime::Engine, caps: &[Capability]) -> Result<Linker<HostState>> {
    let mut linker = Linker::<HostState>::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(Error::link)?;
    fn get(s: &mut HostState) -> &mut CapState {
        &mut s.caps
    }
    types::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get).map_err(Error::link)?;
    log::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get).map_err(Error::link)?;
    node::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get).map_err(Error::link)?;
    for cap in caps {
        match cap {
            Capability::Files => files::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get),
            Capability::Kmod => kmod::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get),
            Capability::Services => {
                services::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get)
            }
            Capability::Sysctl => sysctl::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get),
            Capability::Exec => exec::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get),
            Capability::Power => power::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get),
        }
        .map_err(Error::link)?;
    }
    Ok(linker)
}

/// Renders an error with its source chain.
fn chain(e: &dyn std::error::Error) -> String {
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
    fn deny_with(&mut self, cap: Capability, op: &str, target: &str, reason: String) -> CapError {
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

    fn deny(&mut self, cap: Capability, op: &str, target: &str, write: bool) -> CapError {
        let hint = self
            .grants
            .source
            .hint(cap, &clip(target, MAX_TARGET), write);
        self.deny_with(cap, op, target, hint)
    }

    /// A refused name: malformed names say why; well-formed ones name the grant to add.
    fn refuse_name(
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

    fn refuse_write(&mut self, cap: Capability, op: &str) -> Option<CapError> {
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

    fn host_error(&mut self, cap: Capability, op: &str, target: &str, e: HostError) -> CapError {
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
            e @ (HostError::Escape { .. }
            | HostError::Symlink(_)
            | HostError::NotADirectory { .. }
            | HostError::NotRegular { .. }
            | HostError::InvalidName(_)) => self.deny_with(cap, op, target, e.to_string()),
            e => self.issue(CapError::Failed(clip(&chain(&e), 4096))),
        }
    }

    /// Where the package's sandbox bound `field` is set: the spec field or the CLI flag.
    fn sandbox_field(&self, field: &str, flag: &str) -> String {
        match &self.grants.source {
            GrantSource::Spec { package } => format!("spec.packages.{package}.sandbox.{field}"),
            GrantSource::Flags => flag.to_string(),
        }
    }

    /// Takes `bytes` and `files` from the stage's write budget, or refuses.
    fn spend(&mut self, op: &str, target: &str, bytes: u64, files: u32) -> Result<(), CapError> {
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
    fn check_mode(&mut self, op: &str, path: &Path, mode: Option<u32>) -> Result<bool, CapError> {
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

    /// Runs a blocking host operation off the async executor.
    async fn host<T: Send + 'static>(
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

    /// Resolves a guest path to (granted base, normalised path), or a denial.
    fn file_scope(
        &mut self,
        op: &str,
        raw: &str,
        write: bool,
    ) -> Result<(PathBuf, PathBuf), CapError> {
        let path = match normalize_abs_path(raw) {
            Ok(p) => p,
            Err(reason) => return Err(self.deny_with(Capability::Files, op, raw, reason)),
        };
        let need = if write {
            FileAccess::ReadWrite
        } else {
            FileAccess::Read
        };
        let rule = self
            .grants
            .files
            .iter()
            .rev()
            .find(|r| path.starts_with(&r.path) && r.access >= need);
        match rule {
            Some(rule) => {
                let base = rule.path.clone();
                if write && let Some(e) = self.refuse_write(Capability::Files, op) {
                    return Err(e);
                }
                Ok((base, path))
            }
            None => Err(self.deny(Capability::Files, op, &path.display().to_string(), write)),
        }
    }

    async fn file_op<T: Send + 'static>(
        &mut self,
        op: &'static str,
        raw: String,
        write: bool,
        f: impl FnOnce(&dyn HostOps, &Path, &Path) -> nodewright_hostops::Result<T> + Send + 'static,
    ) -> Result<T, CapError> {
        let (base, path) = self.file_scope(op, &raw, write)?;
        self.host(Capability::Files, op, &raw, move |h| f(h, &base, &path))
            .await
    }

    fn check_name(
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

impl types::Host for CapState {}

impl log::Host for CapState {
    async fn log(&mut self, level: log::Level, message: String) {
        let level = match level {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        self.log
            .lock()
            .expect("log lock")
            .push(LogSource::Plugin, level, message);
    }
}

impl node::Host for CapState {
    async fn info(&mut self) -> node::NodeInfo {
        let host = Arc::clone(&self.host);
        let info = tokio::task::spawn_blocking(move || host.node_info())
            .await
            .unwrap_or_default();
        node::NodeInfo {
            name: info.name,
            labels: info.labels,
            kernel_release: info.kernel_release,
            os_release: info.os_release,
            boot_id: info.boot_id,
            architecture: info.architecture,
        }
    }
}

impl files::Host for CapState {
    async fn read(&mut self, path: String) -> Result<Vec<u8>, CapError> {
        let max = self.budget.max_read;
        self.file_op("read", path, false, move |h, base, p| {
            h.fs().read(base, p, max)
        })
        .await
    }

    async fn write(
        &mut self,
        path: String,
        contents: Vec<u8>,
        mode: Option<u32>,
    ) -> Result<(), CapError> {
        let (base, normalized) = self.file_scope("write", &path, true)?;
        let special_modes = self.check_mode("write", &normalized, mode)?;
        self.spend("write", &path, contents.len() as u64, 1)?;
        let options = WriteOptions {
            mode,
            special_modes,
            min_free_bytes: self.budget.min_free,
        };
        self.host(Capability::Files, "write", &path, move |h| {
            h.fs().write(&base, &normalized, &contents, &options)
        })
        .await
    }

    async fn stat(&mut self, path: String) -> Result<Option<files::FileStat>, CapError> {
        let stat = self
            .file_op("stat", path, false, |h, base, p| h.fs().stat(base, p))
            .await?;
        Ok(stat.map(|s| files::FileStat {
            kind: match s.kind {
                nodewright_hostops::FileKind::File => files::FileKind::File,
                nodewright_hostops::FileKind::Directory => files::FileKind::Directory,
                nodewright_hostops::FileKind::Symlink => files::FileKind::Symlink,
                nodewright_hostops::FileKind::Other => files::FileKind::Other,
            },
            size: s.size,
            mode: s.mode,
            uid: s.uid,
            gid: s.gid,
        }))
    }

    async fn list_dir(&mut self, path: String) -> Result<Vec<String>, CapError> {
        self.file_op("list-dir", path, false, |h, base, p| {
            h.fs().list_dir(base, p)
        })
        .await
    }

    async fn create_dir(&mut self, path: String) -> Result<(), CapError> {
        let (base, normalized) = self.file_scope("create-dir", &path, true)?;
        self.spend("create-dir", &path, 0, 1)?;
        self.host(Capability::Files, "create-dir", &path, move |h| {
            h.fs().create_dir(&base, &normalized)
        })
        .await
    }

    async fn remove(&mut self, path: String) -> Result<(), CapError> {
        self.file_op("remove", path, true, |h, base, p| h.fs().remove(base, p))
            .await
    }

    async fn set_owner(&mut self, path: String, uid: u32, gid: u32) -> Result<(), CapError> {
        self.file_op("set-owner", path, true, move |h, base, p| {
            h.fs().set_owner(base, p, uid, gid)
        })
        .await
    }

    async fn set_mode(&mut self, path: String, mode: u32) -> Result<(), CapError> {
        let (base, normalized) = self.file_scope("set-mode", &path, true)?;
        self.check_mode("set-mode", &normalized, Some(mode))?;
        self.host(Capability::Files, "set-mode", &path, move |h| {
            h.fs().set_mode(&base, &normalized, mode)
        })
        .await
    }
}

impl kmod::Host for CapState {
    async fn load(&mut self, name: String, params: Vec<String>) -> Result<(), CapError> {
        let checked = self.grants.check_module(&name);
        self.check_name(Capability::Kmod, "load", &name, checked, true)?;
        if let Some(reason) = params.iter().find_map(|p| hostargs::module_param(p).err()) {
            return Err(self.deny_with(Capability::Kmod, "load", &name, reason));
        }
        let n = name.clone();
        self.host(Capability::Kmod, "load", &name, move |h| {
            h.kmod_load(&n, &params)
        })
        .await
    }

    async fn unload(&mut self, name: String) -> Result<(), CapError> {
        let checked = self.grants.check_module(&name);
        self.check_name(Capability::Kmod, "unload", &name, checked, true)?;
        let n = name.clone();
        self.host(Capability::Kmod, "unload", &name, move |h| {
            h.kmod_unload(&n)
        })
        .await
    }

    async fn is_loaded(&mut self, name: String) -> Result<bool, CapError> {
        let checked = self.grants.check_module(&name);
        self.check_name(Capability::Kmod, "is-loaded", &name, checked, false)?;
        let n = name.clone();
        self.host(Capability::Kmod, "is-loaded", &name, move |h| {
            h.kmod_is_loaded(&n)
        })
        .await
    }
}

impl services::Host for CapState {
    async fn control(&mut self, verb: services::Verb, unit: String) -> Result<(), CapError> {
        let verb = match verb {
            services::Verb::Start => ServiceVerb::Start,
            services::Verb::Stop => ServiceVerb::Stop,
            services::Verb::Restart => ServiceVerb::Restart,
            services::Verb::Reload => ServiceVerb::Reload,
            services::Verb::Enable => ServiceVerb::Enable,
            services::Verb::Disable => ServiceVerb::Disable,
        };
        let checked = self.grants.check_service(&unit);
        self.check_name(Capability::Services, verb.as_str(), &unit, checked, true)?;
        let u = unit.clone();
        self.host(Capability::Services, verb.as_str(), &unit, move |h| {
            h.service(verb, &u)
        })
        .await
    }

    async fn status(&mut self, unit: String) -> Result<services::UnitStatus, CapError> {
        let checked = self.grants.check_service(&unit);
        self.check_name(Capability::Services, "status", &unit, checked, false)?;
        let u = unit.clone();
        let s = self
            .host(Capability::Services, "status", &unit, move |h| {
                h.service_status(&u)
            })
            .await?;
        Ok(services::UnitStatus {
            active_state: s.active_state,
            enabled: s.enabled,
        })
    }

    async fn daemon_reload(&mut self) -> Result<(), CapError> {
        // Linked only when some unit is granted, so the grant check is the link itself.
        if let Some(e) = self.refuse_write(Capability::Services, "daemon-reload") {
            return Err(e);
        }
        self.host(Capability::Services, "daemon-reload", "", |h| {
            h.daemon_reload()
        })
        .await
    }
}

impl sysctl::Host for CapState {
    async fn get(&mut self, key: String) -> Result<String, CapError> {
        let checked = self.grants.check_sysctl(&key);
        self.check_name(Capability::Sysctl, "get", &key, checked, false)?;
        let k = key.clone();
        self.host(Capability::Sysctl, "get", &key, move |h| h.sysctl_get(&k))
            .await
    }

    async fn set(&mut self, key: String, value: String) -> Result<(), CapError> {
        let checked = self.grants.check_sysctl(&key);
        self.check_name(Capability::Sysctl, "set", &key, checked, true)?;
        let k = key.clone();
        self.host(Capability::Sysctl, "set", &key, move |h| {
            h.sysctl_set(&k, &value)
        })
        .await
    }
}

impl exec::Host for CapState {
    async fn run(&mut self, path: String, args: Vec<String>) -> Result<exec::Output, CapError> {
        let target = std::iter::once(path.as_str())
            .chain(args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        // Commands are granted by exact path: a different spelling of a granted path is
        // refused for what it is, not as a missing grant.
        let normalized = match normalize_abs_path(&path) {
            Ok(p) if p.as_os_str() == path.as_str() => p,
            Ok(p) => {
                let reason = format!(
                    "command paths must be exact and normalised; call {} as granted",
                    p.display()
                );
                return Err(self.deny_with(Capability::Exec, "run", &target, reason));
            }
            Err(why) => {
                let reason = format!("command paths must be exact and normalised: {why}");
                return Err(self.deny_with(Capability::Exec, "run", &target, reason));
            }
        };
        let Some(read_only) = self
            .grants
            .command_rule(&normalized, &args)
            .map(|r| r.read_only)
        else {
            let mismatch = self
                .grants
                .commands
                .iter()
                .filter(|c| c.path == normalized)
                .find_map(|c| c.check_args(&args).err());
            let reason = match mismatch {
                Some(why) => {
                    format!("arguments do not match the granted patterns for {path}: {why}")
                }
                None => self.grants.source.hint(Capability::Exec, &path, false),
            };
            return Err(self.deny_with(Capability::Exec, "run", &target, reason));
        };
        // A granted command may do anything: in a read-only stage only commands the admin
        // vouched for (`readOnly: true`) run.
        if !read_only && self.stage.read_only() {
            let message = format!(
                "exec.run changes the host and is refused in the read-only {} stage; grant {path} with readOnly: true if it only inspects the host",
                self.stage
            );
            return Err(self.issue(CapError::WrongStage(message)));
        }
        let limits = self.exec_limits.clone();
        let out = self
            .host(Capability::Exec, "run", &target, move |h| {
                h.exec(&normalized, &args, &limits)
            })
            .await?;
        Ok(exec::Output {
            status: out.status,
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }
}

impl power::Host for CapState {
    async fn request_reboot(&mut self, reason: String) -> Result<(), CapError> {
        if !self.grants.power {
            return Err(self.deny(Capability::Power, "request-reboot", &reason, false));
        }
        if !self.stage.allows_reboot() {
            let message = format!(
                "power.request-reboot is only honoured in the interrupt stage, not in {}",
                self.stage
            );
            return Err(self.issue(CapError::WrongStage(message)));
        }
        // One reboot per stage however often it is asked for.
        if self.reboot_requested {
            return Ok(());
        }
        let r = clip(&reason, 256);
        self.host(Capability::Power, "request-reboot", &reason, move |h| {
            h.request_reboot(&r)
        })
        .await?;
        self.reboot_requested = true;
        Ok(())
    }
}
