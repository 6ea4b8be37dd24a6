//! What a stage run reports: the plugin's outcome or failure as the host judged it, the
//! captured logs and the denials the host recorded.

use std::time::Duration;

use nodewright_api::v1alpha1::{Interrupt, InterruptType};
use serde::{Deserialize, Serialize};

use crate::bindings::types as wit;
use crate::stage::RunStage;

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
pub enum RequestedInterrupt {
    /// Nothing.
    None,
    /// Restart these units.
    Service(Vec<String>),
    /// Restart all configured services.
    RestartAllServices,
    /// Reboot.
    Reboot,
}

impl RequestedInterrupt {
    /// As the API writes an interrupt (`None`: no interrupt).
    pub fn to_api(&self) -> Option<Interrupt> {
        let bare = |kind| {
            Some(Interrupt {
                kind,
                services: Vec::new(),
            })
        };
        match self {
            RequestedInterrupt::None => None,
            RequestedInterrupt::Service(units) => Some(Interrupt {
                kind: InterruptType::Service,
                services: units.clone(),
            }),
            RequestedInterrupt::RestartAllServices => bare(InterruptType::RestartAllServices),
            RequestedInterrupt::Reboot => bare(InterruptType::Reboot),
        }
    }
}

/// A successful stage's report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageOutcome {
    /// Changes made or planned.
    pub changes: Vec<Change>,
    /// The interrupt the changes need.
    pub interrupt: RequestedInterrupt,
    /// Summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl StageOutcome {
    /// No change, no interrupt.
    pub fn is_converged(&self) -> bool {
        self.changes.is_empty() && self.interrupt == RequestedInterrupt::None
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
    pub result: Result<StageOutcome, StepFailure>,
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

/// Denials kept in a [`RunReport`]; the rest are only counted.
pub const MAX_DENIALS_KEPT: usize = 32;

impl From<wit::Change> for Change {
    fn from(c: wit::Change) -> Self {
        Change {
            kind: c.kind,
            target: c.target,
            detail: c.detail,
        }
    }
}

impl From<wit::Interrupt> for RequestedInterrupt {
    fn from(i: wit::Interrupt) -> Self {
        match i {
            wit::Interrupt::None => RequestedInterrupt::None,
            wit::Interrupt::Services(s) => RequestedInterrupt::Service(s),
            wit::Interrupt::RestartAllServices => RequestedInterrupt::RestartAllServices,
            wit::Interrupt::Reboot => RequestedInterrupt::Reboot,
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

/// Most distinct units one service interrupt may name.
const MAX_INTERRUPT_UNITS: usize = 64;

/// Checks what the plugin reports before anything acts on it: the units of a service
/// interrupt are passed to `systemctl restart` by the agent.
pub(crate) fn check_outcome(o: wit::Outcome) -> Result<StageOutcome, StepFailure> {
    let interrupt = match o.interrupt {
        wit::Interrupt::Services(units) => {
            // Deduplicated with a set and refused as soon as too many distinct units are
            // named: linear in what the plugin sent, so no outcome outlasts the stage here.
            let (mut seen, mut kept) = (std::collections::HashSet::new(), Vec::new());
            for unit in units {
                if let Err(why) = nodewright_api::hostargs::ServiceUnit::parse(&unit) {
                    return Err(StepFailure::Failed(format!(
                        "the outcome's service interrupt names an invalid unit: {why}"
                    )));
                }
                if seen.insert(unit.clone()) {
                    kept.push(unit);
                }
                if kept.len() > MAX_INTERRUPT_UNITS {
                    return Err(StepFailure::Failed(format!(
                        "the outcome's service interrupt names more than {MAX_INTERRUPT_UNITS} units"
                    )));
                }
            }
            RequestedInterrupt::Service(kept)
        }
        other => other.into(),
    };
    Ok(StageOutcome {
        changes: o.changes.into_iter().map(Change::from).collect(),
        interrupt,
        message: o.message,
    })
}
