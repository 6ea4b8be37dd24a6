//! The capability interfaces: grant checks, then the host call through [`HostOps`].
//!
//! Each call is checked in the same order: argument shape, grant (a miss is a `denied`
//! error naming the grant to add), stage (writes are refused in plans and checks, reboots
//! outside the interrupt stage), then the host operation runs on a blocking thread.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nodewright_api::grants::{normalize_abs_path, Capability, FileAccess};
use nodewright_hostops::{HostError, HostOps, ServiceVerb};
use wasmtime::component::{HasSelf, Linker};

use crate::bindings::nodewright::plugin::{exec, files, kmod, log, node, power, services, sysctl, types};
use crate::run::{CapState, Denial, HostState, LogLevel, LogSource};
use crate::{Error, Result};

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
            Capability::Services => services::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get),
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

impl CapState {
    fn deny_with(&mut self, cap: Capability, op: &str, target: &str, reason: String) -> CapError {
        let message = format!("{}.{op}({target:?}) denied: {reason}", cap.interface());
        self.log.lock().expect("log lock").push(LogSource::Plugin, LogLevel::Warn, format!("nodewright: {message}"));
        let denial = Denial { capability: cap.interface().into(), operation: op.into(), target: target.into(), message };
        self.denials.push(denial.clone());
        CapError::Denied(types::Denial {
            capability: denial.capability,
            operation: denial.operation,
            target: denial.target,
            message: denial.message,
        })
    }

    fn deny(&mut self, cap: Capability, op: &str, target: &str, write: bool) -> CapError {
        let hint = self.grants.source.hint(cap, target, write);
        self.deny_with(cap, op, target, hint)
    }

    fn refuse_write(&self, cap: Capability, op: &str) -> Option<CapError> {
        self.stage.read_only().then(|| {
            CapError::WrongStage(format!(
                "{}.{op} changes the host and is refused in the read-only {} stage",
                cap.interface(),
                self.stage
            ))
        })
    }

    fn host_error(&mut self, cap: Capability, op: &str, target: &str, e: HostError) -> CapError {
        match e {
            HostError::NotFound(what) => CapError::NotFound(what),
            e @ (HostError::Escape { .. } | HostError::Symlink(_)) => self.deny_with(cap, op, target, e.to_string()),
            e => CapError::Failed(chain(&e)),
        }
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
            Err(join) => Err(CapError::Failed(format!("host operation {}.{op} panicked: {join}", cap.interface()))),
        }
    }

    /// Resolves a guest path to (granted base, normalised path), or a denial.
    fn file_scope(&mut self, op: &str, raw: &str, write: bool) -> Result<(PathBuf, PathBuf), CapError> {
        let path = match normalize_abs_path(raw) {
            Ok(p) => p,
            Err(reason) => return Err(self.deny_with(Capability::Files, op, raw, reason)),
        };
        let need = if write { FileAccess::ReadWrite } else { FileAccess::Read };
        let rule = self.grants.files.iter().rev().find(|r| path.starts_with(&r.path) && r.access >= need);
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
        self.host(Capability::Files, op, &raw, move |h| f(h, &base, &path)).await
    }

    fn check_name(&mut self, cap: Capability, op: &str, name: &str, allowed: bool, write: bool) -> Result<(), CapError> {
        if !allowed {
            return Err(self.deny(cap, op, name, write));
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
        self.log.lock().expect("log lock").push(LogSource::Plugin, level, message);
    }
}

impl node::Host for CapState {
    async fn info(&mut self) -> node::NodeInfo {
        let host = Arc::clone(&self.host);
        let info = tokio::task::spawn_blocking(move || host.node_info()).await.unwrap_or_default();
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
        self.file_op("read", path, false, |h, base, p| h.fs().read(base, p)).await
    }

    async fn write(&mut self, path: String, contents: Vec<u8>, mode: Option<u32>) -> Result<(), CapError> {
        self.file_op("write", path, true, move |h, base, p| h.fs().write(base, p, &contents, mode)).await
    }

    async fn stat(&mut self, path: String) -> Result<Option<files::FileStat>, CapError> {
        let stat = self.file_op("stat", path, false, |h, base, p| h.fs().stat(base, p)).await?;
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
        self.file_op("list-dir", path, false, |h, base, p| h.fs().list_dir(base, p)).await
    }

    async fn create_dir(&mut self, path: String) -> Result<(), CapError> {
        self.file_op("create-dir", path, true, |h, base, p| h.fs().create_dir(base, p)).await
    }

    async fn remove(&mut self, path: String) -> Result<(), CapError> {
        self.file_op("remove", path, true, |h, base, p| h.fs().remove(base, p)).await
    }

    async fn set_owner(&mut self, path: String, uid: u32, gid: u32) -> Result<(), CapError> {
        self.file_op("set-owner", path, true, move |h, base, p| h.fs().set_owner(base, p, uid, gid)).await
    }

    async fn set_mode(&mut self, path: String, mode: u32) -> Result<(), CapError> {
        self.file_op("set-mode", path, true, move |h, base, p| h.fs().set_mode(base, p, mode)).await
    }
}

impl kmod::Host for CapState {
    async fn load(&mut self, name: String, params: Vec<String>) -> Result<(), CapError> {
        let allowed = self.grants.allows_module(&name);
        self.check_name(Capability::Kmod, "load", &name, allowed, true)?;
        let n = name.clone();
        self.host(Capability::Kmod, "load", &name, move |h| h.kmod_load(&n, &params)).await
    }

    async fn unload(&mut self, name: String) -> Result<(), CapError> {
        let allowed = self.grants.allows_module(&name);
        self.check_name(Capability::Kmod, "unload", &name, allowed, true)?;
        let n = name.clone();
        self.host(Capability::Kmod, "unload", &name, move |h| h.kmod_unload(&n)).await
    }

    async fn is_loaded(&mut self, name: String) -> Result<bool, CapError> {
        let allowed = self.grants.allows_module(&name);
        self.check_name(Capability::Kmod, "is-loaded", &name, allowed, false)?;
        let n = name.clone();
        self.host(Capability::Kmod, "is-loaded", &name, move |h| h.kmod_is_loaded(&n)).await
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
        let allowed = self.grants.allows_service(&unit);
        self.check_name(Capability::Services, verb.as_str(), &unit, allowed, true)?;
        let u = unit.clone();
        self.host(Capability::Services, verb.as_str(), &unit, move |h| h.service(verb, &u)).await
    }

    async fn status(&mut self, unit: String) -> Result<services::UnitStatus, CapError> {
        let allowed = self.grants.allows_service(&unit);
        self.check_name(Capability::Services, "status", &unit, allowed, false)?;
        let u = unit.clone();
        let s = self.host(Capability::Services, "status", &unit, move |h| h.service_status(&u)).await?;
        Ok(services::UnitStatus { active_state: s.active_state, enabled: s.enabled })
    }

    async fn daemon_reload(&mut self) -> Result<(), CapError> {
        // Linked only when some unit is granted, so the grant check is the link itself.
        if let Some(e) = self.refuse_write(Capability::Services, "daemon-reload") {
            return Err(e);
        }
        self.host(Capability::Services, "daemon-reload", "", |h| h.daemon_reload()).await
    }
}

impl sysctl::Host for CapState {
    async fn get(&mut self, key: String) -> Result<String, CapError> {
        let allowed = self.grants.allows_sysctl(&key);
        self.check_name(Capability::Sysctl, "get", &key, allowed, false)?;
        let k = key.clone();
        self.host(Capability::Sysctl, "get", &key, move |h| h.sysctl_get(&k)).await
    }

    async fn set(&mut self, key: String, value: String) -> Result<(), CapError> {
        let allowed = self.grants.allows_sysctl(&key);
        self.check_name(Capability::Sysctl, "set", &key, allowed, true)?;
        let k = key.clone();
        self.host(Capability::Sysctl, "set", &key, move |h| h.sysctl_set(&k, &value)).await
    }
}

impl exec::Host for CapState {
    async fn run(&mut self, path: String, args: Vec<String>) -> Result<exec::Output, CapError> {
        let target = std::iter::once(path.clone()).chain(args.iter().cloned()).collect::<Vec<_>>().join(" ");
        let normalized = match normalize_abs_path(&path) {
            Ok(p) => p,
            Err(reason) => return Err(self.deny_with(Capability::Exec, "run", &target, reason)),
        };
        let Some(read_only) = self.grants.command_rule(&normalized, &args).map(|r| r.read_only) else {
            let hint = self.grants.source.hint(Capability::Exec, &path, false);
            let reason = if self.grants.commands.iter().any(|c| c.path == normalized) {
                format!("arguments do not match the granted patterns for {path}")
            } else {
                hint
            };
            return Err(self.deny_with(Capability::Exec, "run", &target, reason));
        };
        // A granted command may do anything: in a read-only stage only commands the admin
        // vouched for (`readOnly: true`) run.
        if !read_only && let Some(CapError::WrongStage(msg)) = self.refuse_write(Capability::Exec, "run") {
            return Err(CapError::WrongStage(format!("{msg}; grant {path} with readOnly: true if it only inspects the host")));
        }
        let limits = self.exec_limits.clone();
        let out = self.host(Capability::Exec, "run", &target, move |h| h.exec(&normalized, &args, &limits)).await?;
        Ok(exec::Output { status: out.status, stdout: out.stdout, stderr: out.stderr })
    }
}

impl power::Host for CapState {
    async fn request_reboot(&mut self, reason: String) -> Result<(), CapError> {
        if !self.grants.power {
            return Err(self.deny(Capability::Power, "request-reboot", &reason, false));
        }
        if !self.stage.allows_reboot() {
            return Err(CapError::WrongStage(format!(
                "power.request-reboot is only honoured in the interrupt stage, not in {}",
                self.stage
            )));
        }
        let r = reason.clone();
        self.host(Capability::Power, "request-reboot", &reason, move |h| h.request_reboot(&r)).await
    }
}
