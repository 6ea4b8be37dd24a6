//! Typed handles to the host capabilities. Each is a zero-sized token obtained from the
//! [`Context`](crate::Context); the host links an interface only if the component uses
//! it, and checks every call against the package's grant.

use crate::CapError;
use crate::bindings::nodewright::plugin::{exec, files, kmod, power, services, sysctl};

pub use exec::Output as ExecOutput;
pub use files::{FileKind, FileStat};
pub use services::{UnitStatus, Verb as ServiceVerb};

/// Host files under `capabilities.files`. Paths are absolute host paths.
#[derive(Clone, Copy, Debug)]
pub struct Files(pub(crate) ());

impl Files {
    /// Reads a whole file.
    pub fn read(&self, path: &str) -> Result<Vec<u8>, CapError> {
        files::read(path)
    }

    /// Reads a file, `None` when it does not exist.
    pub fn read_opt(&self, path: &str) -> Result<Option<Vec<u8>>, CapError> {
        match files::read(path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(CapError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads a UTF-8 file, `None` when it does not exist.
    pub fn read_string(&self, path: &str) -> Result<Option<String>, CapError> {
        Ok(self
            .read_opt(path)?
            .map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// Writes a whole file atomically, creating parent directories. `mode` defaults to the
    /// existing file's mode, or 0o644.
    pub fn write(&self, path: &str, contents: &[u8], mode: Option<u32>) -> Result<(), CapError> {
        files::write(path, contents, mode)
    }

    /// `lstat`; `None` when missing.
    pub fn stat(&self, path: &str) -> Result<Option<FileStat>, CapError> {
        files::stat(path)
    }

    /// Sorted directory entries.
    pub fn list_dir(&self, path: &str) -> Result<Vec<String>, CapError> {
        files::list_dir(path)
    }

    /// `mkdir -p`.
    pub fn create_dir(&self, path: &str) -> Result<(), CapError> {
        files::create_dir(path)
    }

    /// Removes a file or empty directory; missing is fine.
    pub fn remove(&self, path: &str) -> Result<(), CapError> {
        files::remove(path)
    }

    /// `chown`.
    pub fn set_owner(&self, path: &str, uid: u32, gid: u32) -> Result<(), CapError> {
        files::set_owner(path, uid, gid)
    }

    /// `chmod`.
    pub fn set_mode(&self, path: &str, mode: u32) -> Result<(), CapError> {
        files::set_mode(path, mode)
    }

    /// Installs a payload file — `source` as the plugin reads it, `/payload/NAME/PATH` — at
    /// `path`, as [`Files::write`] writes, without the bytes passing through the plugin.
    /// `mode` defaults to 0o755 for a payload file with an execute bit, else 0o644.
    pub fn install(&self, source: &str, path: &str, mode: Option<u32>) -> Result<(), CapError> {
        files::install(source, path, mode)
    }
}

/// Kernel modules under `capabilities.kernelModules`.
#[derive(Clone, Copy, Debug)]
pub struct Kmod(pub(crate) ());

impl Kmod {
    /// `depmod -a RELEASE`: after installing a module under `/lib/modules/RELEASE`.
    pub fn depmod(&self, release: &str) -> Result<(), CapError> {
        kmod::depmod(release)
    }

    /// `modprobe NAME PARAMS...`
    pub fn load(&self, name: &str, params: &[String]) -> Result<(), CapError> {
        kmod::load(name, params)
    }
    /// `modprobe -r NAME`
    pub fn unload(&self, name: &str) -> Result<(), CapError> {
        kmod::unload(name)
    }
    /// Whether NAME is loaded.
    pub fn is_loaded(&self, name: &str) -> Result<bool, CapError> {
        kmod::is_loaded(name)
    }
}

/// systemd units under `capabilities.services`.
#[derive(Clone, Copy, Debug)]
pub struct Services(pub(crate) ());

impl Services {
    /// `systemctl VERB UNIT`
    pub fn control(&self, verb: ServiceVerb, unit: &str) -> Result<(), CapError> {
        services::control(verb, unit)
    }
    /// Unit state.
    pub fn status(&self, unit: &str) -> Result<UnitStatus, CapError> {
        services::status(unit)
    }
    /// `systemctl daemon-reload`
    pub fn daemon_reload(&self) -> Result<(), CapError> {
        services::daemon_reload()
    }
}

/// Kernel parameters under `capabilities.sysctl`.
#[derive(Clone, Copy, Debug)]
pub struct Sysctl(pub(crate) ());

impl Sysctl {
    /// Current value (trimmed).
    pub fn get(&self, key: &str) -> Result<String, CapError> {
        sysctl::get(key)
    }
    /// Sets a value live.
    pub fn set(&self, key: &str, value: &str) -> Result<(), CapError> {
        sysctl::set(key, value)
    }
}

/// Host commands under `capabilities.commands`.
#[derive(Clone, Copy, Debug)]
pub struct Exec(pub(crate) ());

impl Exec {
    /// Runs a granted command; output is bounded by the host. `path` is a binary of the
    /// host (`/usr/bin/nvidia-smi`) or a file of one of the package's payloads
    /// (`payload:driver/installer.run`, see [`Exec::run_payload`]); an argument whose grant
    /// pattern starts with `payload:` names a payload file the command then reads.
    pub fn run(&self, path: &str, args: &[String]) -> Result<ExecOutput, CapError> {
        exec::run(path, args)
    }

    /// Runs the file `file` of the package's payload `payload`, as granted by
    /// `commands: [{path: "payload:<payload>/<file>"}]`: the host runs it from the payload's
    /// read-only tree, so what runs is exactly the signed file.
    pub fn run_payload(
        &self,
        payload: &str,
        file: &str,
        args: &[String],
    ) -> Result<ExecOutput, CapError> {
        exec::run(&format!("payload:{payload}/{file}"), args)
    }
}

/// Reboot requests (interrupt stage of a `reboot` package only).
#[derive(Clone, Copy, Debug)]
pub struct Power(pub(crate) ());

impl Power {
    /// Asks the host to reboot once the stage returns.
    pub fn request_reboot(&self, reason: &str) -> Result<(), CapError> {
        power::request_reboot(reason)
    }
}
