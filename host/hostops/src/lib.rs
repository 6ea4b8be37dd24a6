//! The one seam between nodewright's capabilities and the host.
//!
//! Every host effect a plugin can cause — a file write, a module load, a unit restart, a
//! sysctl write, a command, a reboot request — goes through [`HostOps`]. The engine checks
//! grants *before* calling it; this crate only performs the effect, confined to the host
//! root. Two backends:
//!
//! - [`LinuxHost`]: a real node. Files live under the host root (the host's `/` mounted into
//!   the agent's pod, or `/` itself); `modprobe`, `systemctl` and granted commands run in the
//!   host's namespaces (joined with `setns(2)` — no `nsenter` binary — when the agent runs in
//!   a pod with `hostPID`).
//! - [`SimHost`] (feature `sim`): a simulated node for tests and `nodewright plugin run`. Files
//!   are real files under a scratch root; kernel modules, units, sysctls and reboots are
//!   recorded in a journal and kept as state under the root (`/proc/modules`, `/proc/sys`,
//!   `/run/nodewright-sim`) so a later `plan` sees what an earlier `apply` did. This is the
//!   only test double nodewright allows, because rebooting a machine cannot run here.
//!
//! File access is confined twice: [`RootFs`] opens the granted directory itself with cap-std,
//! so neither `..` nor a symlink can leave it, and the host root bounds everything.

#![deny(missing_docs)]

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub mod argv;
mod command;
mod linux;
mod namespaces;
mod rootfs;
#[cfg(feature = "sim")]
mod sim;

pub use command::{ExecLimits, ExecOutput, run_bounded, run_bounded_in};
pub use linux::{HostNamespaces, LinuxHost};
pub use namespaces::Namespaces;
pub use rootfs::{FileKind, FileStat, PERMISSION_BITS, RootFs, WriteOptions};
#[cfg(feature = "sim")]
pub use sim::{HostAction, SimHost};

/// A failed host operation.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The path, unit, module or key does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// A file operation failed.
    #[error("{op} {path}")]
    Io {
        /// The operation (`read`, `write`, ...).
        op: &'static str,
        /// The host path.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A path resolved outside the directory it was confined to (symlink or `..`).
    #[error("{path} resolves outside the granted directory {base}")]
    Escape {
        /// The requested path.
        path: String,
        /// The granted directory.
        base: String,
    },
    /// A write would replace or follow a symlink.
    #[error("{0} is a symlink; nodewright does not write through or over symlinks")]
    Symlink(String),
    /// A host command exited unsuccessfully.
    #[error("`{command}` exited with {status}: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Exit status, as text.
        status: String,
        /// Last part of its stderr.
        stderr: String,
    },
    /// A host command could not be started.
    #[error("cannot run `{command}`")]
    Spawn {
        /// The command line.
        command: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The operation is not supported by this backend.
    #[error("{0}")]
    Unsupported(String),
    /// A module, unit or key that is not well-formed for its kind never reaches a command.
    #[error("invalid {0}")]
    InvalidName(String),
    /// A path below a granted *file* (`/etc/x/y` under the grant `/etc/x`).
    #[error("{path} is below {base}, which is a file, not a directory")]
    NotADirectory {
        /// The requested path.
        path: String,
        /// The granted file.
        base: String,
    },
    /// A read larger than the bound.
    #[error("{path} is larger than the {limit}-byte read limit")]
    TooLarge {
        /// The host path.
        path: String,
        /// The bound in bytes.
        limit: u64,
    },
    /// A device, socket or FIFO where a regular file or directory is needed.
    #[error("{path} is {kind}; only regular files and directories can be used")]
    NotRegular {
        /// The host path.
        path: String,
        /// What it is.
        kind: String,
    },
    /// A write would leave the filesystem with less free space than the floor.
    #[error(
        "writing {needed} bytes to {path} would leave less than the {floor}-byte free-space floor ({available} bytes free)"
    )]
    DiskFloor {
        /// The host path.
        path: String,
        /// Free bytes before the write.
        available: u64,
        /// Bytes the write needs.
        needed: u64,
        /// The floor.
        floor: u64,
    },
}

impl HostError {
    pub(crate) fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            HostError::NotFound(path.display().to_string())
        } else {
            HostError::Io {
                op,
                path: path.display().to_string(),
                source,
            }
        }
    }
}

/// Result alias for host operations.
pub type Result<T, E = HostError> = std::result::Result<T, E>;

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

/// Facts about the node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Kubernetes node name.
    pub name: String,
    /// Node labels.
    pub labels: Vec<(String, String)>,
    /// Running kernel release.
    pub kernel_release: String,
    /// `/etc/os-release` pairs.
    pub os_release: Vec<(String, String)>,
    /// Current boot ID.
    pub boot_id: String,
    /// CPU architecture.
    pub architecture: String,
}

/// Who the node is, as the agent learnt it from the Node object (or the CLI's flags).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeIdentity {
    /// Kubernetes node name.
    pub name: String,
    /// Node labels.
    pub labels: Vec<(String, String)>,
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
    /// Whether a kernel module is loaded.
    fn kmod_is_loaded(&self, name: &str) -> Result<bool>;
    /// Runs a systemctl verb on a unit.
    fn service(&self, verb: ServiceVerb, unit: &str) -> Result<()>;
    /// Reads a unit's state.
    fn service_status(&self, unit: &str) -> Result<UnitStatus>;
    /// `systemctl daemon-reload`.
    fn daemon_reload(&self) -> Result<()>;
    /// Runs a host command, bounded by `limits`.
    fn exec(&self, path: &Path, args: &[String], limits: &ExecLimits) -> Result<ExecOutput>;
    /// Asks the host to reboot. Returns once the request is accepted; the reboot itself
    /// happens asynchronously (the agent's boot-ID protocol observes it).
    fn request_reboot(&self, reason: &str) -> Result<()>;
    /// Facts about the node.
    fn node_info(&self) -> NodeInfo;
}

/// sysctl access through a `proc/sys` directory: the host's `/proc/sys` on a real node, a
/// plain directory under the scratch root on a simulated one.
#[derive(Clone, Debug)]
pub(crate) struct ProcSys {
    base: PathBuf,
}

impl ProcSys {
    pub(crate) fn new(proc_root: &Path) -> Self {
        ProcSys {
            base: proc_root.join("sys"),
        }
    }

    /// `net.ipv4.ip_forward` → `<proc>/sys/net/ipv4/ip_forward`. The engine checks keys
    /// before they reach here; checked again because this is a raw path join.
    pub(crate) fn path(&self, key: &str) -> Result<PathBuf> {
        nodewright_api::hostargs::sysctl_key(key)
            .map_err(|r| HostError::InvalidName(format!("sysctl key: {r}")))?;
        Ok(self.base.join(key.replace('.', "/")))
    }

    pub(crate) fn get(&self, key: &str) -> Result<String> {
        let path = self.path(key)?;
        let raw = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => HostError::NotFound(format!("sysctl {key}")),
            _ => HostError::io("read", &path, e),
        })?;
        Ok(raw.trim_end().to_string())
    }

    pub(crate) fn read_opt(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.base.join(rel))
            .ok()
            .map(|s| s.trim().to_string())
    }
}

/// Parses `/etc/os-release` content into pairs, unquoting values.
pub fn parse_os_release(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.starts_with('#') {
                return None;
            }
            let (k, v) = line.split_once('=')?;
            let v = v.trim().trim_matches('"').trim_matches('\'');
            Some((k.trim().to_string(), v.to_string()))
        })
        .collect()
}

/// How long host helper commands (`modprobe`, `systemctl`) may take.
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(120);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_is_unquoted() {
        let pairs =
            parse_os_release("# c\nID=debian\nPRETTY_NAME=\"Debian GNU/Linux 12\"\n\nbad\n");
        assert_eq!(
            pairs,
            vec![
                ("ID".into(), "debian".into()),
                ("PRETTY_NAME".into(), "Debian GNU/Linux 12".into())
            ]
        );
    }

    #[test]
    fn sysctl_keys_cannot_escape() {
        let p = ProcSys::new(Path::new("/proc"));
        assert_eq!(
            p.path("net.ipv4.ip_forward").unwrap(),
            Path::new("/proc/sys/net/ipv4/ip_forward")
        );
        assert!(p.path("net/../../etc").is_err());
        assert!(p.path("a..b").is_err());
        assert!(p.path("").is_err());
    }
}
