//! Running one stage in a fresh store, and the types a run reports.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nodewright_hostops::{ExecLimits, HostOps};
use serde::{Deserialize, Serialize};
use wasmtime::Store;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::bindings::types as wit;
use crate::sandbox::{CapturedStream, Limiter, LogBuffer, MemoryLimitExceeded, SandboxLimits};
use crate::{EPOCH_TICK, GrantSet, PreparedPlugin, RunError};

/// Which export to call. Checks verify a stage, as NodeWright's `<stage>-check` does.
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

    /// The stage the plugin sees in `context.stage` (for a check, the stage verified).
    fn wit_stage(self) -> wit::Stage {
        match self {
            RunStage::Plan => wit::Stage::Plan,
            RunStage::Apply | RunStage::ApplyCheck => wit::Stage::Apply,
            RunStage::Config | RunStage::ConfigCheck => wit::Stage::Config,
            RunStage::Interrupt => wit::Stage::Interrupt,
            RunStage::PostInterrupt | RunStage::PostInterruptCheck => wit::Stage::PostInterrupt,
            RunStage::Upgrade | RunStage::UpgradeCheck => wit::Stage::Upgrade,
            RunStage::Uninstall | RunStage::UninstallCheck => wit::Stage::Uninstall,
        }
    }

    /// Whether the stage may change the host. Plans and checks may not.
    pub fn read_only(self) -> bool {
        match self {
            RunStage::Plan
            | RunStage::ApplyCheck
            | RunStage::ConfigCheck
            | RunStage::PostInterruptCheck
            | RunStage::UpgradeCheck
            | RunStage::UninstallCheck => true,
            RunStage::Apply
            | RunStage::Config
            | RunStage::Interrupt
            | RunStage::PostInterrupt
            | RunStage::Upgrade
            | RunStage::Uninstall => false,
        }
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

/// The environment variable that carries [`StageContext::node_order`].
pub const NODE_ORDER_ENV: &str = "NODEWRIGHT_NODE_ORDER";

/// Why a stage is running (the WIT `context` minus the stage, which comes from [`RunStage`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageContext {
    /// Node name.
    pub node: String,
    /// Package name.
    pub package: String,
    /// Version.
    pub version: String,
    /// Previous version (upgrade).
    pub previous_version: Option<String>,
    /// Configuration.
    pub config: BTreeMap<String, String>,
    /// Keys changed since the last successful config.
    pub changed_keys: Vec<String>,
    /// The node's place in its NodeWright's rollout order, if it is in a batch. The plugin
    /// sees it as the environment variable `NODEWRIGHT_NODE_ORDER` (the only variable it
    /// sees), as NodeWright packages see theirs.
    pub node_order: Option<u32>,
}

impl StageContext {
    /// A context for `package` `version` on `node`.
    pub fn new(node: &str, package: &str, version: &str) -> Self {
        StageContext {
            node: node.into(),
            package: package.into(),
            version: version.into(),
            ..Default::default()
        }
    }

    /// Adds a config entry.
    pub fn with_config(mut self, key: &str, value: &str) -> Self {
        self.config.insert(key.into(), value.into());
        self
    }

    fn to_wit(&self, stage: RunStage) -> wit::Context {
        wit::Context {
            node: self.node.clone(),
            package: self.package.clone(),
            version: self.version.clone(),
            previous_version: self.previous_version.clone(),
            stage: stage.wit_stage(),
            config: self
                .config
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            changed_keys: self.changed_keys.clone(),
        }
    }
}

/// A host change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// `file`, `sysctl`, `kernel-module`, ...
    pub kind: String,
    /// Path, key, module, unit.
    pub target: String,
    /// Human detail.
    pub detail: String,
}

/// The interrupt a change needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "services", rename_all = "camelCase")]
pub enum Interrupt {
    /// Nothing.
    None,
    /// Restart these units.
    Service(Vec<String>),
    /// Restart all configured services.
    RestartAllServices,
    /// Reboot.
    Reboot,
}

/// A successful stage's report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// Changes made or planned.
    pub changes: Vec<Change>,
    /// Interrupt needed.
    pub interrupt: Interrupt,
    /// Summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Outcome {
    /// No change, no interrupt.
    pub fn is_converged(&self) -> bool {
        self.changes.is_empty() && self.interrupt == Interrupt::None
    }
}

/// A capability call refused by the grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denial {
    /// Capability interface.
    pub capability: String,
    /// Operation.
    pub operation: String,
    /// Refused argument.
    pub target: String,
    /// Actionable message naming the grant to add.
    pub message: String,
}

/// Why the plugin reported failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", content = "message", rename_all = "kebab-case")]
pub enum StepFailure {
    /// A capability call was denied (blame: the grant).
    #[error("{}", .0.message)]
    Denied(Denial),
    /// A call not allowed in this stage.
    #[error("{0}")]
    WrongStage(String),
    /// Something the plugin needed does not exist on the host.
    #[error("not found: {0}")]
    NotFound(String),
    /// The host failed to perform an allowed call (blame: the host).
    #[error("host operation failed: {0}")]
    HostFailed(String),
    /// The package configuration is unusable (blame: the spec).
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    /// The package failed (blame: the package).
    #[error("{0}")]
    Failed(String),
}

/// Where a log line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogSource {
    /// The `log` interface.
    Plugin,
    /// Guest stdout.
    Stdout,
    /// Guest stderr.
    Stderr,
}

/// Log level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogLevel {
    /// Trace.
    Trace,
    /// Debug.
    Debug,
    /// Info.
    Info,
    /// Warn.
    Warn,
    /// Error.
    Error,
}

/// One captured log line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLine {
    /// Source.
    pub source: LogSource,
    /// Level.
    pub level: LogLevel,
    /// Text.
    pub message: String,
}

/// What one stage run produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// The stage run.
    pub stage: RunStage,
    /// The plugin's answer.
    pub result: Result<Outcome, StepFailure>,
    /// Captured log lines (most recent, bounded).
    pub logs: Vec<LogLine>,
    /// Older lines dropped to stay within the bound.
    pub logs_dropped: u64,
    /// Denied calls, even those the plugin recovered from: the first
    /// [`MAX_DENIALS_KEPT`] of them.
    pub denials: Vec<Denial>,
    /// How many calls were denied in all (a plugin looping on a denial is counted, not
    /// stored).
    #[serde(default)]
    pub denials_total: u64,
    /// Wall time of instantiate + call.
    pub duration: Duration,
    /// Linear memory the stage's instances held at its end, in bytes: also its peak, since
    /// a wasm memory never shrinks. What counts against `sandbox.memory`.
    #[serde(default)]
    pub memory_peak: u64,
}

/// Store data for one run.
pub(crate) struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
    pub(crate) caps: CapState,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Denials kept in a [`RunReport`]; the rest are only counted.
pub const MAX_DENIALS_KEPT: usize = 32;

/// Errors the host remembers having raised in one run, to tell them from forgeries.
const MAX_ISSUED: usize = 4096;

/// What one stage may still read and write.
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    pub(crate) max_read: u64,
    pub(crate) bytes: u64,
    pub(crate) bytes_left: u64,
    pub(crate) files: u32,
    pub(crate) files_left: u32,
    pub(crate) min_free: u64,
}

impl Budget {
    fn new(limits: &SandboxLimits) -> Self {
        Budget {
            max_read: limits.max_read_bytes(),
            bytes: limits.write_bytes,
            bytes_left: limits.write_bytes,
            files: limits.write_files,
            files_left: limits.write_files,
            min_free: limits.min_free_bytes,
        }
    }
}

/// What capability implementations see.
pub(crate) struct CapState {
    pub(crate) grants: Arc<GrantSet>,
    pub(crate) host: Arc<dyn HostOps>,
    pub(crate) stage: RunStage,
    pub(crate) log: Arc<Mutex<LogBuffer>>,
    pub(crate) denials: Vec<Denial>,
    pub(crate) denials_total: u64,
    /// Fingerprints of the capability errors this run raised: a plugin may pass one on,
    /// but not invent one (which would shift the blame to the grant or the host).
    pub(crate) issued: HashSet<u64>,
    pub(crate) exec_limits: ExecLimits,
    pub(crate) budget: Budget,
    pub(crate) reboot_requested: bool,
    /// Set when the run's store is dropped: a granted command still running then (the
    /// stage's deadline passed while it ran) is killed.
    #[expect(dead_code, reason = "held for its Drop")]
    pub(crate) ended: EndOfRun,
}

/// Raises its flag when dropped.
pub(crate) struct EndOfRun(pub(crate) Arc<std::sync::atomic::AtomicBool>);

impl Drop for EndOfRun {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl CapState {
    /// Remembers `e` as raised by the host and returns it.
    pub(crate) fn issue(&mut self, e: wit::CapError) -> wit::CapError {
        if self.issued.len() < MAX_ISSUED {
            self.issued.insert(fingerprint(&e));
        }
        e
    }

    pub(crate) fn record_denial(&mut self, denial: Denial) {
        self.denials_total += 1;
        if self.denials.len() < MAX_DENIALS_KEPT {
            self.denials.push(denial);
        }
    }
}

fn fingerprint(e: &wit::CapError) -> u64 {
    let mut h = DefaultHasher::new();
    match e {
        wit::CapError::Denied(d) => {
            ("denied", &d.capability, &d.operation, &d.target, &d.message).hash(&mut h)
        }
        wit::CapError::WrongStage(m) => ("wrong-stage", m).hash(&mut h),
        wit::CapError::NotFound(m) => ("not-found", m).hash(&mut h),
        wit::CapError::Failed(m) => ("failed", m).hash(&mut h),
    }
    h.finish()
}

impl From<wit::Change> for Change {
    fn from(c: wit::Change) -> Self {
        Change {
            kind: c.kind,
            target: c.target,
            detail: c.detail,
        }
    }
}

impl From<wit::Interrupt> for Interrupt {
    fn from(i: wit::Interrupt) -> Self {
        match i {
            wit::Interrupt::None => Interrupt::None,
            wit::Interrupt::Services(s) => Interrupt::Service(s),
            wit::Interrupt::RestartAllServices => Interrupt::RestartAllServices,
            wit::Interrupt::Reboot => Interrupt::Reboot,
        }
    }
}

impl From<wit::Denial> for Denial {
    fn from(d: wit::Denial) -> Self {
        Denial {
            capability: d.capability,
            operation: d.operation,
            target: d.target,
            message: d.message,
        }
    }
}

/// The plugin's error as the host will judge it. A capability error counts as the
/// grant's (`denied`) or the host's (`failed`) only if the host raised exactly that error
/// in this run; an invented one is the package's failure.
fn step_failure(e: wit::StepError, issued: &HashSet<u64>) -> StepFailure {
    let cap = match e {
        wit::StepError::InvalidConfig(m) => return StepFailure::InvalidConfig(m),
        wit::StepError::Failed(m) => return StepFailure::Failed(m),
        wit::StepError::Capability(cap) => cap,
    };
    if !issued.contains(&fingerprint(&cap)) {
        let (kind, text) = match &cap {
            wit::CapError::Denied(d) => ("denied", d.message.as_str()),
            wit::CapError::WrongStage(m) => ("wrong-stage", m.as_str()),
            wit::CapError::NotFound(m) => ("not-found", m.as_str()),
            wit::CapError::Failed(m) => ("failed", m.as_str()),
        };
        return StepFailure::Failed(format!(
            "the plugin reported a {kind} capability error the host never raised: {}",
            crate::caps::clip(text, 512)
        ));
    }
    match cap {
        wit::CapError::Denied(d) => StepFailure::Denied(d.into()),
        wit::CapError::WrongStage(m) => StepFailure::WrongStage(m),
        wit::CapError::NotFound(m) => StepFailure::NotFound(m),
        wit::CapError::Failed(m) => StepFailure::HostFailed(m),
    }
}

/// Most units one service interrupt may name.
const MAX_INTERRUPT_UNITS: usize = 64;

/// Checks what the plugin reports before anything acts on it: the units of a service
/// interrupt are passed to `systemctl restart` by the agent.
fn check_outcome(o: wit::Outcome) -> Result<Outcome, StepFailure> {
    let interrupt = match o.interrupt {
        wit::Interrupt::Services(units) => {
            let mut seen = Vec::new();
            for unit in units {
                if let Err(why) = nodewright_api::hostargs::unit_name(&unit) {
                    return Err(StepFailure::Failed(format!(
                        "the outcome's service interrupt names an invalid unit: {why}"
                    )));
                }
                if !seen.contains(&unit) {
                    seen.push(unit);
                }
            }
            if seen.len() > MAX_INTERRUPT_UNITS {
                return Err(StepFailure::Failed(format!(
                    "the outcome's service interrupt names {} units; at most {MAX_INTERRUPT_UNITS}",
                    seen.len()
                )));
            }
            Interrupt::Service(seen)
        }
        other => other.into(),
    };
    Ok(Outcome {
        changes: o.changes.into_iter().map(Change::from).collect(),
        interrupt,
        message: o.message,
    })
}

impl PreparedPlugin {
    /// Runs one stage in a fresh store against `host`, with `grants` checked on every call.
    ///
    /// Returns `Ok` when the plugin returned (successfully or with its own error) and
    /// [`RunError`] when the sandbox stopped it (deadline, memory, trap).
    pub async fn run(
        &self,
        stage: RunStage,
        ctx: StageContext,
        host: Arc<dyn HostOps>,
        grants: Arc<GrantSet>,
        limits: &SandboxLimits,
    ) -> Result<RunReport, RunError> {
        let log = Arc::new(Mutex::new(LogBuffer::new(limits)));
        let stdout = CapturedStream::new(log.clone(), LogSource::Stdout);
        let stderr = CapturedStream::new(log.clone(), LogSource::Stderr);
        // Nothing inherited: no env (but the node order), args, preopens or sockets
        // (wasmtime-wasi denies TCP, UDP and name lookup unless allowed); stdio goes to the
        // bounded log.
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(stdout.clone()).stderr(stderr.clone());
        if let Some(order) = ctx.node_order {
            wasi.env(NODE_ORDER_ENV, order.to_string());
        }
        let wasi = wasi.build();
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let state = HostState {
            wasi,
            table: ResourceTable::new(),
            limiter: Limiter::new(limits.memory),
            caps: CapState {
                grants,
                host,
                stage,
                log: log.clone(),
                denials: Vec::new(),
                denials_total: 0,
                issued: HashSet::new(),
                exec_limits: ExecLimits {
                    timeout: limits.exec_timeout,
                    max_output: limits.exec_max_output,
                    cancel: Some(ended.clone()),
                },
                budget: Budget::new(limits),
                reboot_requested: false,
                ended: EndOfRun(ended),
            },
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        let ticks = (limits.timeout.as_millis() / EPOCH_TICK.as_millis()) as u64 + 1;
        store.set_epoch_deadline(ticks);
        store.epoch_deadline_trap();

        let started = Instant::now();
        let timeout = |logs: Vec<LogLine>| RunError::Timeout {
            stage: stage.to_string(),
            seconds: limits.timeout.as_secs_f64(),
            logs,
        };
        let instance = tokio::time::timeout(limits.timeout, self.pre.instantiate_async(&mut store))
            .await
            .map_err(|_| timeout(Vec::new()))?
            .map_err(|e| {
                // A trap or a memory error in the component's own start code is the
                // package's fault; anything else (linking) is ours.
                if e.downcast_ref::<wasmtime::Trap>().is_some()
                    || e.downcast_ref::<MemoryLimitExceeded>().is_some()
                {
                    classify_trap(stage, e, limits, &log)
                } else {
                    RunError::Instantiate {
                        stage: stage.to_string(),
                        message: format!("{e:#}"),
                    }
                }
            })?;
        let wit_ctx = ctx.to_wit(stage);
        let remaining = limits.timeout.saturating_sub(started.elapsed());
        let call = async {
            let stages = instance.nodewright_plugin_stages();
            match stage {
                RunStage::Plan => stages.call_plan(&mut store, &wit_ctx).await,
                RunStage::Apply => stages.call_apply(&mut store, &wit_ctx).await,
                RunStage::Config => stages.call_config(&mut store, &wit_ctx).await,
                RunStage::Interrupt => stages.call_interrupt(&mut store, &wit_ctx).await,
                RunStage::PostInterrupt => stages.call_post_interrupt(&mut store, &wit_ctx).await,
                RunStage::Upgrade => stages.call_upgrade(&mut store, &wit_ctx).await,
                RunStage::Uninstall => stages.call_uninstall(&mut store, &wit_ctx).await,
                RunStage::ApplyCheck
                | RunStage::ConfigCheck
                | RunStage::PostInterruptCheck
                | RunStage::UpgradeCheck
                | RunStage::UninstallCheck => stages.call_check(&mut store, &wit_ctx).await,
            }
        };
        let called = tokio::time::timeout(remaining, call).await;
        stdout.finish();
        stderr.finish();
        let duration = started.elapsed();
        let raw = match called {
            Err(_) => return Err(timeout(log.lock().expect("log lock").take().0)),
            Ok(Err(trap)) => return Err(classify_trap(stage, trap, limits, &log)),
            Ok(Ok(result)) => result,
        };
        let memory_peak = store.data().limiter.memory_used();
        let caps = &mut store.data_mut().caps;
        let result = match raw {
            Ok(o) => check_outcome(o),
            Err(e) => Err(step_failure(e, &caps.issued)),
        };
        let (logs, logs_dropped) = log.lock().expect("log lock").take();
        let denials = std::mem::take(&mut caps.denials);
        Ok(RunReport {
            stage,
            result,
            logs,
            logs_dropped,
            denials,
            denials_total: caps.denials_total,
            duration,
            memory_peak,
        })
    }
}

fn classify_trap(
    stage: RunStage,
    err: wasmtime::Error,
    limits: &SandboxLimits,
    log: &Mutex<LogBuffer>,
) -> RunError {
    let (lines, _) = log.lock().expect("log lock").take();
    if err.downcast_ref::<MemoryLimitExceeded>().is_some() {
        return RunError::MemoryLimit {
            stage: stage.to_string(),
            limit_mib: limits.memory >> 20,
            logs: lines,
        };
    }
    if err.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::Interrupt) {
        return RunError::Timeout {
            stage: stage.to_string(),
            seconds: limits.timeout.as_secs_f64(),
            logs: lines,
        };
    }
    // A Rust guest prints its panic message to stderr before aborting; surface it.
    let panic = lines
        .iter()
        .rev()
        .find(|l| l.source == LogSource::Stderr && l.message.contains("panicked"));
    let trap = err
        .downcast_ref::<wasmtime::Trap>()
        .map(|t| t.to_string())
        .unwrap_or_else(|| format!("{err:#}"));
    let message = match panic {
        Some(line) => format!("{trap} ({})", line.message),
        None => trap,
    };
    RunError::Trap {
        stage: stage.to_string(),
        message,
        logs: lines,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_names_roundtrip_and_classify() {
        for stage in RunStage::ALL {
            assert_eq!(stage.as_str().parse::<RunStage>().unwrap(), stage);
        }
        assert!(
            "reboot"
                .parse::<RunStage>()
                .unwrap_err()
                .contains("expected one of plan, apply")
        );
        assert!(RunStage::Plan.read_only() && RunStage::ApplyCheck.read_only());
        assert!(!RunStage::Apply.read_only());
        assert!(RunStage::Interrupt.allows_reboot() && !RunStage::PostInterrupt.allows_reboot());
    }
}
