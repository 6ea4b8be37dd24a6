//! One package of a NodeWright: its plugin, grants, interrupt, sandbox and uninstall.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::grants::{Capabilities, GrantError, GrantSet, GrantSource};

/// One package.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Package {
    /// Strict semver; the upgrade/downgrade ordering key.
    pub version: String,
    /// OCI reference of the plugin: `registry/repo:tag` or `registry/repo@sha256:…`.
    /// A tag is resolved to a digest once and recorded in status.
    pub plugin: String,
    /// Payloads taken from existing container images, beside those the plugin's artifact
    /// carries: each image (or index) resolved and pinned like the plugin, judged by the
    /// same trust policies, and its layers applied in order into a read-only tree the
    /// plugin reads at `/payload/<name>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub payloads: Vec<PayloadSource>,
    /// What the plugin may touch on the host. Everything else is denied.
    #[serde(default)]
    pub capabilities: Capabilities,
    /// The interrupt the package's changes need (the ceiling; plugins may report less).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupt: Option<Interrupt>,
    /// Packages (name → exact version) that must be complete first.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub depends_on: BTreeMap<String, String>,
    /// Plugin configuration. Plugins see no environment; this is their only input.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config_map: BTreeMap<String, String>,
    /// Interrupt to run when a config key (or `*` glob) changes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config_interrupts: BTreeMap<String, Interrupt>,
    /// Agent container resources. `memoryLimit` must leave room for the agent beside the
    /// sandbox (see `sandbox.memory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// Bounds for this package's stages in the sandbox, each within the operator's ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxSpec>,
    /// Grace period when an agent pod is stopped, e.g. `30s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_shutdown: Option<String>,
    /// Per-attempt deadline for package stages (whole stage for interrupts), e.g. `1h`;
    /// `0s` means no bound. Unset: the operator default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_timeout: Option<String>,
    /// Uninstall support.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uninstall: Option<Uninstall>,
}

/// A payload taken from a container image.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PayloadSource {
    /// The payload's name: letters, digits, `.`, `_`, `-`; unique among the package's
    /// payloads (the artifact's too).
    pub name: String,
    /// OCI reference of the image or image index (`registry/repo:tag` or `…@sha256:…`);
    /// a tag is resolved once, like the plugin's, and recorded in status.
    pub image: String,
    /// Where in the image the payload's root is (absolute, e.g. `/opt/nvidia`): only what
    /// lies under it is kept. Unset: the whole image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// An interrupt.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Interrupt {
    /// The kind of interrupt.
    #[serde(rename = "type")]
    pub kind: InterruptType,
    /// Units to restart, for `service`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<String>,
}

/// Interrupt kinds, weakest first.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum InterruptType {
    /// Nothing.
    #[default]
    Noop,
    /// Restart `services`.
    Service,
    /// Restart every configured service.
    RestartAllServices,
    /// Reboot the node.
    Reboot,
}

/// Agent container resources: all four or none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// e.g. `100m`.
    pub cpu_request: String,
    /// e.g. `500m`.
    pub cpu_limit: String,
    /// e.g. `64Mi`.
    pub memory_request: String,
    /// e.g. `256Mi`; at least the sandbox's memory plus the agent's headroom.
    pub memory_limit: String,
}

/// Per-package sandbox bounds. Unset fields take the defaults in
/// [`crate::limits`]; the operator refuses values above its ceilings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxSpec {
    /// Cap on the plugin's linear memory (all its memories together), e.g. `256Mi`.
    /// Default `128Mi`. Reads through `files` are capped at half of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// Bytes one stage may write through `files`, e.g. `1Gi`. Default `256Mi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bytes: Option<String>,
    /// Files and directories one stage may write or create. Default `4096`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_files: Option<u32>,
}

/// Uninstall support.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Uninstall {
    /// The plugin implements `uninstall`.
    #[serde(default)]
    pub enabled: bool,
    /// Uninstall from every node now (requires `enabled`).
    #[serde(default)]
    pub apply: bool,
}

impl InterruptType {
    /// As the spec spells it (`restartAllServices`, ...): Job labels, agent flags.
    pub fn as_str(self) -> &'static str {
        match self {
            InterruptType::Noop => "noop",
            InterruptType::Service => "service",
            InterruptType::RestartAllServices => "restartAllServices",
            InterruptType::Reboot => "reboot",
        }
    }

    /// Every interrupt type, weakest first.
    pub const ALL: [InterruptType; 4] = [
        InterruptType::Noop,
        InterruptType::Service,
        InterruptType::RestartAllServices,
        InterruptType::Reboot,
    ];
}

impl std::fmt::Display for Interrupt {
    /// For people: `reboot`, `restart a.service, b.service`, `restartAllServices`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            InterruptType::Service => write!(f, "restart {}", self.services.join(", ")),
            kind => f.write_str(kind.as_str()),
        }
    }
}

impl std::fmt::Display for InterruptType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for InterruptType {
    type Err = String;

    /// Parses [`InterruptType::as_str`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        InterruptType::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown interrupt type {s:?}"))
    }
}

impl Package {
    /// Whether the package is granted power (may request a reboot): exactly when its
    /// interrupt is a reboot. Validation, the operator's checks, the Jobs and the RBAC
    /// rules all ask this.
    pub fn grants_power(&self) -> bool {
        self.interrupt
            .as_ref()
            .is_some_and(|i| i.kind == InterruptType::Reboot)
    }

    /// The grants package `name` gets: its `capabilities`, and power per
    /// [`Package::grants_power`].
    pub fn grant_set(&self, name: &str) -> Result<GrantSet, Vec<GrantError>> {
        GrantSet::parse(
            &self.capabilities,
            self.grants_power(),
            GrantSource::Spec {
                package: name.into(),
            },
        )
    }
}
