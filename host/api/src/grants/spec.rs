//! The grants as admins write them (`spec.packages.<name>.capabilities`), the capability
//! interfaces they cover, where a grant came from and why one was rejected.

use std::fmt;

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
    /// Exact absolute path of the binary on the host, or `payload:<name>/<path>`: a file of
    /// one of the package's payloads, run from its read-only, digest-verified tree (the
    /// grant then names exactly the signed bytes that run).
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
    pub(crate) fn new(field: String, message: impl Into<String>) -> Self {
        GrantError {
            field,
            message: message.into(),
        }
    }
}
