//! The seam itself: the [`HostOps`] trait and the systemd vocabulary it speaks.

use std::fmt;
use std::path::Path;

use nodewright_api::hostargs::{UnitName, UnitPowerProps};
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
    /// Whether a kernel module is loaded.
    fn kmod_is_loaded(&self, name: &str) -> Result<bool>;
    /// Rebuilds the module dependency lists of kernel `release` (`depmod -a`).
    fn depmod(&self, release: &str) -> Result<()>;
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
