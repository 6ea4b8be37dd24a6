//! The operator → agent contract: what a stage Job's container is asked to do.
//!
//! The operator builds an [`AgentCall`] and turns it into the container's arguments with
//! [`AgentCall::to_args`]; the agent parses those arguments back into the same structs (with
//! this crate's `cli` feature they are its clap arguments). Nothing else spells a flag, so
//! the two sides cannot drift apart; a round-trip test holds them together. The stages the
//! agent can run ([`RunStage`]: the node-state stages plus their checks) live here too.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::grants::Capabilities;
use crate::limits::{self, StageLimits};
use crate::node_state::Stage;
use crate::payload::ImagePayload;
use crate::pinned::PinnedRef;
use crate::units;
use crate::v1alpha1::InterruptType;

/// Which plugin export to call. Checks verify a stage, as NodeWright's `<stage>-check` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStage {
    /// Read-only dry run.
    Plan,
    /// Install.
    Apply,
    /// Verify `apply`.
    ApplyCheck,
    /// Configure.
    Config,
    /// Verify `config`.
    ConfigCheck,
    /// Interrupt work (reboot requests are honoured only here).
    Interrupt,
    /// After the interrupt.
    PostInterrupt,
    /// Verify `post-interrupt`.
    PostInterruptCheck,
    /// Version change.
    Upgrade,
    /// Verify `upgrade`.
    UpgradeCheck,
    /// Removal.
    Uninstall,
    /// Verify `uninstall`.
    UninstallCheck,
}

impl RunStage {
    /// Every stage, in lifecycle order.
    pub const ALL: [RunStage; 12] = [
        RunStage::Plan,
        RunStage::Apply,
        RunStage::ApplyCheck,
        RunStage::Config,
        RunStage::ConfigCheck,
        RunStage::Interrupt,
        RunStage::PostInterrupt,
        RunStage::PostInterruptCheck,
        RunStage::Upgrade,
        RunStage::UpgradeCheck,
        RunStage::Uninstall,
        RunStage::UninstallCheck,
    ];

    /// The name used on the command line and in results.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStage::Plan => "plan",
            RunStage::Apply => "apply",
            RunStage::ApplyCheck => "apply-check",
            RunStage::Config => "config",
            RunStage::ConfigCheck => "config-check",
            RunStage::Interrupt => "interrupt",
            RunStage::PostInterrupt => "post-interrupt",
            RunStage::PostInterruptCheck => "post-interrupt-check",
            RunStage::Upgrade => "upgrade",
            RunStage::UpgradeCheck => "upgrade-check",
            RunStage::Uninstall => "uninstall",
            RunStage::UninstallCheck => "uninstall-check",
        }
    }

    /// The node-state stage this one runs or verifies (a check verifies its stage).
    pub fn stage(self) -> Stage {
        match self {
            RunStage::Plan => Stage::Plan,
            RunStage::Apply | RunStage::ApplyCheck => Stage::Apply,
            RunStage::Config | RunStage::ConfigCheck => Stage::Config,
            RunStage::Interrupt => Stage::Interrupt,
            RunStage::PostInterrupt | RunStage::PostInterruptCheck => Stage::PostInterrupt,
            RunStage::Upgrade | RunStage::UpgradeCheck => Stage::Upgrade,
            RunStage::Uninstall | RunStage::UninstallCheck => Stage::Uninstall,
        }
    }

    /// The plugin export a package Job at `stage` runs (`None` for the uninstall
    /// interrupt, which is the node's, not a plugin's).
    pub fn of(stage: Stage) -> Option<RunStage> {
        RunStage::ALL
            .into_iter()
            .find(|r| !r.is_check() && r.stage() == stage)
    }

    /// A check (`apply-check`, ...).
    pub fn is_check(self) -> bool {
        matches!(
            self,
            RunStage::ApplyCheck
                | RunStage::ConfigCheck
                | RunStage::PostInterruptCheck
                | RunStage::UpgradeCheck
                | RunStage::UninstallCheck
        )
    }

    /// Whether the stage may change the host. Plans and checks may not.
    pub fn read_only(self) -> bool {
        self == RunStage::Plan || self.is_check()
    }

    /// The check that verifies this stage (`None` for plans, checks and the interrupt,
    /// whose verifier is `post-interrupt`).
    pub fn check(self) -> Option<RunStage> {
        match self {
            RunStage::Apply => Some(RunStage::ApplyCheck),
            RunStage::Config => Some(RunStage::ConfigCheck),
            RunStage::PostInterrupt => Some(RunStage::PostInterruptCheck),
            RunStage::Upgrade => Some(RunStage::UpgradeCheck),
            RunStage::Uninstall => Some(RunStage::UninstallCheck),
            RunStage::Plan
            | RunStage::ApplyCheck
            | RunStage::ConfigCheck
            | RunStage::Interrupt
            | RunStage::PostInterruptCheck
            | RunStage::UpgradeCheck
            | RunStage::UninstallCheck => None,
        }
    }

    /// Whether a reboot request is honoured.
    pub fn allows_reboot(self) -> bool {
        self == RunStage::Interrupt
    }
}

impl fmt::Display for RunStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunStage {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunStage::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown stage {s:?}; expected one of {}",
                    RunStage::ALL.map(RunStage::as_str).join(", ")
                )
            })
    }
}

/// How the agent reaches the host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Backend {
    /// A real node: the host's `/` at `--host-root`, commands in PID 1's namespaces.
    #[default]
    Linux,
    /// A simulated node (tests): `--host-root` is the node's scratch root.
    Sim,
}

impl Backend {
    /// As the flag spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Linux => "linux",
            Backend::Sim => "sim",
        }
    }
}

/// What every agent invocation is told.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct Common {
    /// Where the host's `/` is mounted.
    #[cfg_attr(feature = "cli", arg(long, default_value = "/host"))]
    pub host_root: PathBuf,
    /// Host-ops backend.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value = "linux"))]
    pub backend: Backend,
    /// Node name.
    #[cfg_attr(feature = "cli", arg(long, env = "NODE_NAME"))]
    pub node: String,
    /// NodeWright uid (idempotence markers are keyed by it).
    #[cfg_attr(feature = "cli", arg(long))]
    pub cr_uid: String,
    /// NodeWright generation.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub generation: i64,
    /// The node state entry's run epoch: a re-created entry (node reset, package rerun,
    /// reapply after reboot) has a new one, so its stages run again.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub run: i64,
    /// Where the result goes.
    #[cfg_attr(feature = "cli", arg(long, default_value = "/dev/termination-log"))]
    pub termination_log: PathBuf,
}

impl Common {
    fn to_args(&self) -> Vec<String> {
        vec![
            format!("--host-root={}", self.host_root.display()),
            format!("--backend={}", self.backend.as_str()),
            format!("--node={}", self.node),
            format!("--cr-uid={}", self.cr_uid),
            format!("--generation={}", self.generation),
            format!("--run={}", self.run),
            format!("--termination-log={}", self.termination_log.display()),
        ]
    }
}

/// What the planner asks of one package stage on one node: the part of a [`StageCall`]
/// that comes from the NodeWright and the node's state. The operator adds the
/// deployment's part ([`StageCall::new`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct StageAsk {
    /// Stage (plan, apply, apply-check, config, ...).
    #[cfg_attr(feature = "cli", arg(long))]
    pub stage: RunStage,
    /// Package name.
    #[cfg_attr(feature = "cli", arg(long))]
    pub package: String,
    /// Package version.
    #[cfg_attr(feature = "cli", arg(long))]
    pub version: String,
    /// Previous version (upgrade).
    #[cfg_attr(feature = "cli", arg(long))]
    pub previous_version: Option<String>,
    /// The node's place in the rollout order; the plugin sees it as `NODEWRIGHT_NODE_ORDER`.
    #[cfg_attr(feature = "cli", arg(long))]
    pub node_order: Option<u32>,
    /// The plugin, pinned by digest.
    #[cfg_attr(feature = "cli", arg(long))]
    pub plugin: PinnedRef,
    /// Payloads from container images (`NAME=IMAGE@DIGEST[#/PATH]`), beside the plugin's.
    #[cfg_attr(feature = "cli", arg(long = "payload-image"))]
    pub payload_images: Vec<ImagePayload>,
    /// The package's `capabilities`, as JSON.
    #[cfg_attr(feature = "cli", arg(long, default_value = "{}", value_parser = json::<Capabilities>))]
    pub capabilities: Capabilities,
    /// The package is granted power (see [`crate::v1alpha1::Package::grants_power`]).
    #[cfg_attr(feature = "cli", arg(long))]
    pub reboot_allowed: bool,
    /// Configuration, as a JSON object of strings.
    #[cfg_attr(feature = "cli", arg(long, default_value = "{}", value_parser = json::<BTreeMap<String, String>>))]
    pub config: BTreeMap<String, String>,
    /// Config keys changed since the last successful config.
    #[cfg_attr(feature = "cli", arg(long = "changed-key"))]
    pub changed_keys: Vec<String>,
    /// Stage wall-clock limit (a duration: `90s`, `1h`).
    #[cfg_attr(feature = "cli", arg(long, default_value = "1h", value_parser = units::duration))]
    pub timeout: Duration,
    /// The sandbox's bounds.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub limits: StageLimits,
    /// How long to let a running stage finish after SIGTERM.
    #[cfg_attr(feature = "cli", arg(long, default_value = "30s", value_parser = units::duration))]
    pub graceful_shutdown: Duration,
}

impl StageAsk {
    /// `stage` of `package` `version` with `plugin`, every other field at its default.
    pub fn new(stage: RunStage, package: &str, version: &str, plugin: PinnedRef) -> Self {
        StageAsk {
            stage,
            package: package.into(),
            version: version.into(),
            previous_version: None,
            node_order: None,
            plugin,
            payload_images: Vec::new(),
            capabilities: Capabilities::default(),
            reboot_allowed: false,
            config: BTreeMap::new(),
            changed_keys: Vec::new(),
            timeout: Duration::from_secs(3600),
            limits: StageLimits::default(),
            graceful_shutdown: Duration::from_secs(30),
        }
    }

    fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--stage={}", self.stage),
            format!("--package={}", self.package),
            format!("--version={}", self.version),
            format!("--plugin={}", self.plugin),
            format!("--capabilities={}", to_json(&self.capabilities)),
            format!("--config={}", to_json(&self.config)),
        ];
        args.extend(
            self.payload_images
                .iter()
                .map(|p| format!("--payload-image={p}")),
        );
        args.extend(
            self.changed_keys
                .iter()
                .map(|k| format!("--changed-key={k}")),
        );
        if let Some(prev) = &self.previous_version {
            args.push(format!("--previous-version={prev}"));
        }
        if let Some(order) = self.node_order {
            args.push(format!("--node-order={order}"));
        }
        if self.reboot_allowed {
            args.push("--reboot-allowed".into());
        }
        args.extend([
            format!("--timeout={}", units::format_duration(self.timeout)),
            format!("--memory={}", self.limits.memory),
            format!("--write-bytes={}", self.limits.write_bytes),
            format!("--write-files={}", self.limits.write_files),
            format!(
                "--graceful-shutdown={}",
                units::format_duration(self.graceful_shutdown)
            ),
        ]);
        args
    }
}

/// One stage of one package (then its check, unless `no_check`): the planner's
/// [`StageAsk`] with the deployment's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct StageCall {
    /// What every invocation is told.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: Common,
    /// What the stage is.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub ask: StageAsk,
    /// Free space every write must leave on its filesystem.
    #[cfg_attr(feature = "cli", arg(long, default_value = "256Mi", value_parser = units::bytes))]
    pub min_free_bytes: u64,
    /// How it reaches registries and where it caches what it pulls.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub pulling: Pulling,
    /// Run only the stage, not its check afterwards.
    #[cfg_attr(feature = "cli", arg(long))]
    pub no_check: bool,
}

impl StageCall {
    /// `ask` with the deployment defaults; the caller sets what its deployment differs in.
    pub fn new(common: Common, ask: StageAsk) -> Self {
        StageCall {
            common,
            ask,
            min_free_bytes: limits::DEFAULT_MIN_FREE_BYTES,
            pulling: Pulling::default(),
            no_check: false,
        }
    }

    fn to_args(&self) -> Vec<String> {
        let mut args = vec!["run".to_string()];
        args.extend(self.ask.to_args());
        args.push(format!("--min-free-bytes={}", self.min_free_bytes));
        args.extend(self.pulling.to_args());
        if self.no_check {
            args.push("--no-check".into());
        }
        args.extend(self.common.to_args());
        args
    }
}

/// How an invocation that pulls reaches registries (the deployment's settings and the
/// pod's mounted logins), and the node cache it pulls into.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct Pulling {
    /// Registries reachable over plain HTTP.
    #[cfg_attr(feature = "cli", arg(long = "insecure-registry"))]
    pub insecure_registries: Vec<String>,
    /// Registry credentials: docker config files (mounted `kubernetes.io/dockerconfigjson`
    /// Secrets), asked in order; the first with an entry for a registry gives its login.
    #[cfg_attr(feature = "cli", arg(long = "registry-config"))]
    pub registry_configs: Vec<PathBuf>,
    /// CA bundles trusted for one registry each (`HOST=PEM-FILE`).
    #[cfg_attr(feature = "cli", arg(long = "registry-ca"))]
    pub registry_cas: Vec<RegistryCa>,
    /// Plugin cache (default: `<host-root>/var/lib/nodewright/plugins`).
    #[cfg_attr(feature = "cli", arg(long))]
    pub cache_dir: Option<PathBuf>,
    /// Most the node cache may hold (none: no quota): staging a payload that would take it
    /// past this is refused, naming the payload, its size and what the cache holds.
    #[cfg_attr(feature = "cli", arg(long, value_parser = units::bytes))]
    pub cache_quota: Option<u64>,
}

impl Pulling {
    fn to_args(&self) -> Vec<String> {
        let mut args: Vec<String> = self
            .insecure_registries
            .iter()
            .map(|r| format!("--insecure-registry={r}"))
            .collect();
        args.extend(
            self.registry_configs
                .iter()
                .map(|p| format!("--registry-config={}", p.display())),
        );
        args.extend(
            self.registry_cas
                .iter()
                .map(|c| format!("--registry-ca={c}")),
        );
        if let Some(dir) = &self.cache_dir {
            args.push(format!("--cache-dir={}", dir.display()));
        }
        if let Some(quota) = self.cache_quota {
            args.push(format!("--cache-quota={quota}"));
        }
        args
    }
}

/// What the planner asks of a node before its cordon: stage the payloads of these
/// plugins into the node cache, so that no download happens while the node is out of
/// service.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct PrestageAsk {
    /// The plugins, pinned by digest, whose payloads to stage.
    #[cfg_attr(feature = "cli", arg(long = "plugin"))]
    pub plugins: Vec<PinnedRef>,
    /// Payloads from container images to stage (`NAME=IMAGE@DIGEST[#/PATH]`).
    #[cfg_attr(feature = "cli", arg(long = "payload-image"))]
    pub images: Vec<ImagePayload>,
    /// Other plugins packages on the node refer to, pinned: what the node cache keeps
    /// beside what this call stages when it collects garbage first.
    #[cfg_attr(feature = "cli", arg(long = "keep"))]
    pub keep: Vec<PinnedRef>,
    /// Other image payloads packages on the node refer to (`NAME=IMAGE@DIGEST[#/PATH]`).
    #[cfg_attr(feature = "cli", arg(long = "keep-image"))]
    pub keep_images: Vec<ImagePayload>,
}

/// Staging a node's payloads ahead of its cordon: the planner's [`PrestageAsk`] with the
/// deployment's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct PrestageCall {
    /// What every invocation is told.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: Common,
    /// What to stage.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub ask: PrestageAsk,
    /// How it reaches registries and where it caches what it pulls.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub pulling: Pulling,
}

impl PrestageCall {
    fn to_args(&self) -> Vec<String> {
        let mut args = vec!["prestage".to_string()];
        args.extend(self.ask.plugins.iter().map(|p| format!("--plugin={p}")));
        args.extend(
            self.ask
                .images
                .iter()
                .map(|p| format!("--payload-image={p}")),
        );
        args.extend(self.ask.keep.iter().map(|p| format!("--keep={p}")));
        args.extend(
            self.ask
                .keep_images
                .iter()
                .map(|p| format!("--keep-image={p}")),
        );
        args.extend(self.pulling.to_args());
        args.extend(self.common.to_args());
        args
    }
}

/// A CA bundle trusted for one registry: `HOST[:PORT]=PEM-FILE` on a command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryCa {
    /// The registry (`host[:port]`), as it appears in plugin references.
    pub registry: String,
    /// The PEM file.
    pub pem: PathBuf,
}

impl FromStr for RegistryCa {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('=') {
            Some((registry, pem)) if !registry.is_empty() && !pem.is_empty() => Ok(RegistryCa {
                registry: registry.into(),
                pem: pem.into(),
            }),
            _ => Err(format!("{s:?} is not HOST=PEM-FILE")),
        }
    }
}

impl fmt::Display for RegistryCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.registry, self.pem.display())
    }
}

/// What the planner asks of a node's merged interrupt (or a package's uninstall
/// interrupt): the part of an [`InterruptCall`] that comes from the NodeWright.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct InterruptAsk {
    /// `reboot`, `service` or `restartAllServices`.
    #[cfg_attr(feature = "cli", arg(long = "type"))]
    pub kind: InterruptType,
    /// The package that owns the merged interrupt (part of its idempotence key).
    #[cfg_attr(feature = "cli", arg(long, default_value = "node"))]
    pub package: String,
    /// Units to restart (for `service`; for `restartAllServices`, the operator's list).
    #[cfg_attr(feature = "cli", arg(long = "service"))]
    pub services: Vec<String>,
}

impl InterruptAsk {
    fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--type={}", self.kind),
            format!("--package={}", self.package),
        ];
        args.extend(self.services.iter().map(|s| format!("--service={s}")));
        args
    }
}

/// The node's merged interrupt (or a package's uninstall interrupt): the planner's
/// [`InterruptAsk`] with the deployment's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct InterruptCall {
    /// What every invocation is told.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: Common,
    /// What the interrupt is.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub ask: InterruptAsk,
    /// How long to wait for the node to go down after requesting a reboot.
    #[cfg_attr(feature = "cli", arg(long, default_value = "10s", value_parser = units::duration))]
    pub reboot_wait: Duration,
}

impl InterruptCall {
    /// `ask` with the default reboot wait.
    pub fn new(common: Common, ask: InterruptAsk) -> Self {
        InterruptCall {
            common,
            ask,
            reboot_wait: Duration::from_secs(10),
        }
    }

    fn to_args(&self) -> Vec<String> {
        let mut args = vec!["interrupt".to_string()];
        args.extend(self.ask.to_args());
        args.push(format!(
            "--reboot-wait={}",
            units::format_duration(self.reboot_wait)
        ));
        args.extend(self.common.to_args());
        args
    }
}

/// What one agent invocation does.
#[allow(
    clippy::large_enum_variant,
    reason = "one value lives per agent process and per Job built; a box buys nothing and clap's derive reads the plain struct"
)]
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Subcommand))]
pub enum AgentCall {
    /// Run one stage of one package.
    Run(StageCall),
    /// Perform the node's merged interrupt (reboot protocol or service restarts).
    Interrupt(InterruptCall),
    /// Stage plugins' payloads into the node cache (before the node's cordon).
    Prestage(PrestageCall),
}

impl AgentCall {
    /// The container arguments that ask for this call (the agent parses them back).
    pub fn to_args(&self) -> Vec<String> {
        match self {
            AgentCall::Run(c) => c.to_args(),
            AgentCall::Interrupt(c) => c.to_args(),
            AgentCall::Prestage(c) => c.to_args(),
        }
    }

    /// What every invocation is told.
    pub fn common(&self) -> &Common {
        match self {
            AgentCall::Run(c) => &c.common,
            AgentCall::Interrupt(c) => &c.common,
            AgentCall::Prestage(c) => &c.common,
        }
    }
}

fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("capabilities and config serialize")
}

#[cfg(feature = "cli")]
fn json<T: serde::de::DeserializeOwned>(s: &str) -> Result<T, String> {
    serde_json::from_str(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
