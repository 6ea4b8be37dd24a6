//! The seam itself: the [`HostOps`] trait and the systemd vocabulary it speaks.

use std::fmt;
use std::path::{Path, PathBuf};

use nodewright_api::hostargs::{self, UnitName, UnitPowerProps};
use serde::{Deserialize, Serialize};

use crate::command::{ExecLimits, ExecOutput};
use crate::error::{HostError, Result};
use crate::node::NodeInfo;
use crate::rootfs::RootFs;

/// A systemd verb.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServiceVerb {
    /// `systemctl start`
    Start,
    /// `systemctl stop`
    Stop,
    /// `systemctl restart`
    Restart,
    /// `systemctl reload`
    Reload,
    /// `systemctl enable`
    Enable,
    /// `systemctl disable`
    Disable,
}

impl ServiceVerb {
    /// The systemctl verb.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceVerb::Start => "start",
            ServiceVerb::Stop => "stop",
            ServiceVerb::Restart => "restart",
            ServiceVerb::Reload => "reload",
            ServiceVerb::Enable => "enable",
            ServiceVerb::Disable => "disable",
        }
    }

    /// Whether the verb changes a unit's state, so that systemd may act on what the unit
    /// pulls in or names for success and failure (start, stop, restart, reload).
    pub fn changes_state(self) -> bool {
        !matches!(self, ServiceVerb::Enable | ServiceVerb::Disable)
    }
}

/// The one power rule for units, shared by every backend: a state change of a unit that
/// is a power unit, can be isolated to, names a `*Action=` or pulls in a power unit is
/// refused, because only a reboot interrupt (the `power` grant) may change the node's power
/// state. `props` reads the unit's properties as the node has them.
pub(crate) fn refuse_power_change(
    verb: ServiceVerb,
    unit: &str,
    props: impl FnOnce() -> Result<UnitPowerProps>,
) -> Result<()> {
    if !verb.changes_state() {
        return Ok(());
    }
    let name = UnitName::parse(unit).map_err(HostError::InvalidName)?;
    match props()?.power_effect(&name) {
        Some(why) => Err(HostError::PowerUnit { verb, why }),
        None => Ok(()),
    }
}

impl fmt::Display for ServiceVerb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// State of a systemd unit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitStatus {
    /// `active`, `inactive`, `failed`, ...
    pub active_state: String,
    /// Whether the unit is enabled.
    pub enabled: bool,
}

/// Performs host effects. Implementations confine files to their host root and never check
/// grants: that is the engine's job, done before any call reaches here.
///
/// Methods are blocking; the engine calls them from a blocking thread.
pub trait HostOps: Send + Sync + fmt::Debug {
    /// The host filesystem, confined to the host root.
    fn fs(&self) -> &RootFs;
    /// Reads a sysctl (dotted key).
    fn sysctl_get(&self, key: &str) -> Result<String>;
    /// Writes a sysctl (dotted key).
    fn sysctl_set(&self, key: &str, value: &str) -> Result<()>;
    /// Loads a kernel module with parameters.
    fn kmod_load(&self, name: &str, params: &[String]) -> Result<()>;
    /// Unloads a kernel module.
    fn kmod_unload(&self, name: &str) -> Result<()>;
    /// Whether the kernel holds loadable module `name`: its `/sys/module/<name>/initstate`
    /// reads `live` or `coming`, the test modprobe itself applies. A built-in module has the
    /// directory but no `initstate`; a kernel without module support has neither (nor a
    /// `/proc/modules`). One rule for every backend: the simulated kernel keeps the same file.
    fn kmod_is_loaded(&self, name: &str) -> Result<bool> {
        hostargs::module_name(name)
            .map_err(|r| HostError::InvalidName(format!("kernel module: {r}")))?;
        let state = format!("/sys/module/{}/initstate", name.replace('-', "_"));
        Ok(self
            .fs()
            .read_host_state(Path::new(&state))?
            .is_some_and(|s| matches!(s.trim(), "live" | "coming")))
    }
    /// Rebuilds the module dependency lists of kernel `release` (`depmod -a`).
    fn depmod(&self, release: &str) -> Result<()>;
    /// Runs a systemctl verb on a unit.
    fn service(&self, verb: ServiceVerb, unit: &str) -> Result<()>;
    /// Reads a unit's state.
    fn service_status(&self, unit: &str) -> Result<UnitStatus>;
    /// `systemctl daemon-reload`.
    fn daemon_reload(&self) -> Result<()>;
    /// Runs a granted command — a binary of the host, or a file of a payload — bounded by
    /// `limits`, with `files` (payload files a grant lets it take) passed in place of their
    /// arguments.
    fn exec(
        &self,
        program: &Runnable<'_>,
        args: &[String],
        files: &[PayloadArg],
        limits: &ExecLimits,
    ) -> Result<ExecOutput>;
    /// Asks the host to reboot. Returns once the request is accepted; the reboot itself
    /// happens asynchronously (the agent's boot-ID protocol observes it).
    fn request_reboot(&self, reason: &str) -> Result<()>;
    /// Facts about the node.
    fn node_info(&self) -> NodeInfo;
}

/// What a granted command runs, as [`HostOps::exec`] takes it.
#[derive(Clone, Copy, Debug)]
pub enum Runnable<'a> {
    /// A binary of the host, by path.
    Host(&'a Path),
    /// The file `rel` of a payload's read-only `tree` (`shown`: how the grant names it,
    /// `payload:<name>/<path>`). It is opened below the tree without following a link,
    /// must be a regular executable file, and what runs is that open file
    /// ([`crate::Program::File`]) — never a path looked up again.
    Payload {
        /// The payload's tree.
        tree: &'a Path,
        /// The file, below it.
        rel: &'a Path,
        /// How the grant names it.
        shown: &'a str,
    },
}

impl Runnable<'_> {
    /// How the host's record and errors name it.
    pub fn shown(&self) -> String {
        match self {
            Runnable::Host(path) => path.display().to_string(),
            Runnable::Payload { shown, .. } => shown.to_string(),
        }
    }
}

/// A payload file a granted command takes as its argument `index` (the grant's pattern
/// there starts with `payload:`): opened below `tree` as a payload program is (a regular
/// file, no link followed; it need not be executable) and passed as `/proc/self/fd/N`.
#[derive(Clone, Debug)]
pub struct PayloadArg {
    /// Which argument it replaces.
    pub index: usize,
    /// The payload's tree.
    pub tree: PathBuf,
    /// The file, below it.
    pub rel: PathBuf,
}

/// Opens each payload argument: the open files, and `args` with each payload argument
/// replaced by the path the command reads it at.
pub(crate) fn open_payload_args(
    args: &[String],
    files: &[PayloadArg],
) -> Result<(Vec<std::fs::File>, Vec<String>)> {
    let mut passed = args.to_vec();
    let mut open = Vec::with_capacity(files.len());
    for f in files {
        let (file, _) = crate::rootfs::open_payload_file("exec", &f.tree, &f.rel)?;
        let Some(slot) = passed.get_mut(f.index) else {
            return Err(HostError::InvalidName(format!(
                "payload argument {} of a command with {} arguments",
                f.index,
                args.len()
            )));
        };
        *slot = crate::command::fd_path(&file);
        open.push(file);
    }
    Ok((open, passed))
}

/// Opens a payload file for [`Runnable::Payload`]: below the tree, a regular file with
/// an exec bit, and an ELF binary or a `#!` script — nothing a C library would hand to a
/// shell as a guess (glibc's `execvp` does that with a file the kernel cannot run; musl's
/// does not), so the same file runs, or is refused, on every build.
pub(crate) fn open_payload_executable(tree: &Path, rel: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::{FileExt, PermissionsExt};
    let (file, meta) = crate::rootfs::open_payload_file("exec", tree, rel)?;
    let refuse = |why: String| HostError::NotExecutable {
        path: rel.display().to_string(),
        why,
    };
    let mode = meta.permissions().mode();
    if mode & 0o111 == 0 {
        return Err(refuse(format!(
            "no exec bit (mode {:04o}); give it one where the payload is packed",
            mode & 0o7777
        )));
    }
    let mut magic = [0u8; 4];
    let n = file
        .read_at(&mut magic, 0)
        .map_err(|e| HostError::io("exec", rel, e))?;
    if !(magic[..n].starts_with(b"\x7fELF") || magic[..n].starts_with(b"#!")) {
        return Err(refuse(
            "it is neither an ELF binary nor a script starting with #!".into(),
        ));
    }
    Ok(file)
}
