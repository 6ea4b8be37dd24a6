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

pub mod argv;
mod command;
mod error;
mod linux;
mod namespaces;
mod node;
mod ops;
mod procsys;
mod rootfs;
#[cfg(feature = "sim")]
mod sim;

pub use command::{
    ExecLimits, ExecOutput, HELPER_TIMEOUT, ProcessTree, Program, fd_path, run_bounded,
    run_bounded_in, run_program_bounded,
};
pub use error::{HostError, Result};
pub use linux::{HostNamespaces, LinuxHost};
pub use namespaces::Namespaces;
pub use node::{NodeIdentity, NodeInfo, parse_os_release};
pub use ops::{HostOps, PayloadArg, Runnable, ServiceVerb, UnitStatus};
pub use rootfs::{FileKind, FileStat, PERMISSION_BITS, RootFs, WriteOptions};
#[cfg(feature = "sim")]
pub use sim::{HostAction, SimHost};
