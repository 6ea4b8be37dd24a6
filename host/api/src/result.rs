//! The structured result written to the pod's termination message.
//!
//! Kubernetes keeps at most 4096 bytes of a termination message; the result is trimmed to
//! fit by dropping log lines (oldest first), then changes, never the verdict.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::agent::RunStage;
use crate::v1alpha1::{Interrupt, InterruptType};

/// Bytes Kubernetes keeps from a termination message.
pub const TERMINATION_MESSAGE_LIMIT: usize = 4096;

/// Who is to blame for a failure. The operator counts only `package` (and `denied`,
/// `config`) failures against the retry budget; `host` and `disruption` are retried freely.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Blame {
    /// Nothing failed.
    None,
    /// The plugin failed, trapped, ran out of time or memory.
    Package,
    /// A capability call was refused by the grant (or the grant check failed).
    Denied,
    /// The package configuration is unusable.
    Config,
    /// The host or the registry failed (retryable).
    Host,
    /// The stage was interrupted from outside (SIGTERM, reboot).
    Disruption,
}

impl Blame {
    /// Every blame, `none` first.
    pub const ALL: [Blame; 6] = [
        Blame::None,
        Blame::Package,
        Blame::Denied,
        Blame::Config,
        Blame::Host,
        Blame::Disruption,
    ];

    /// As the result spells it (`package`, `denied`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Blame::None => "none",
            Blame::Package => "package",
            Blame::Denied => "denied",
            Blame::Config => "config",
            Blame::Host => "host",
            Blame::Disruption => "disruption",
        }
    }

    /// The blame an agent exit code stands for ([`Blame::exit_code`] read back).
    pub fn from_exit_code(code: i32) -> Option<Blame> {
        Blame::ALL
            .into_iter()
            .find(|b| i32::from(b.exit_code()) == code)
    }

    /// Whether a failure with this blame counts against the package's retry budget
    /// (`package`, `denied`, `config`); `host` and `disruption` are retried freely.
    pub fn counts_against_budget(self) -> bool {
        matches!(self, Blame::Package | Blame::Denied | Blame::Config)
    }

    /// The agent's exit code for this blame.
    pub fn exit_code(self) -> u8 {
        match self {
            Blame::None => 0,
            Blame::Package => 1,
            Blame::Denied => 2,
            Blame::Config => 3,
            Blame::Host => 4,
            Blame::Disruption => 5,
        }
    }
}

/// What a stage reported its changes need. On the wire as the compact text a termination
/// message has room for: `none`, `reboot`, `restartAllServices`, `service:a.service,b.service`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Needs {
    /// No interrupt.
    Nothing,
    /// This interrupt.
    Interrupt(Interrupt),
}

impl Needs {
    /// `None` as [`Needs::Nothing`].
    pub fn of(interrupt: Option<&Interrupt>) -> Self {
        interrupt.map_or(Needs::Nothing, |i| Needs::Interrupt(i.clone()))
    }

    /// The interrupt needed, if any.
    pub fn interrupt(&self) -> Option<&Interrupt> {
        match self {
            Needs::Nothing => None,
            Needs::Interrupt(i) => Some(i),
        }
    }
}

impl fmt::Display for Needs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Needs::Nothing => f.write_str("none"),
            Needs::Interrupt(i) => match i.kind {
                InterruptType::Service => write!(f, "service:{}", i.services.join(",")),
                kind => f.write_str(kind.as_str()),
            },
        }
    }
}

impl FromStr for Needs {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let kind = |kind| {
            Ok(Needs::Interrupt(Interrupt {
                kind,
                services: Vec::new(),
            }))
        };
        match text {
            "none" => Ok(Needs::Nothing),
            "reboot" => kind(InterruptType::Reboot),
            "restartAllServices" => kind(InterruptType::RestartAllServices),
            _ => {
                let services = text.strip_prefix("service:").ok_or_else(|| {
                    format!(
                        "{text:?} is not an interrupt (none, reboot, restartAllServices, service:<units>)"
                    )
                })?;
                Ok(Needs::Interrupt(Interrupt {
                    kind: InterruptType::Service,
                    services: services
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect(),
                }))
            }
        }
    }
}

impl TryFrom<String> for Needs {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl From<Needs> for String {
    fn from(n: Needs) -> String {
        n.to_string()
    }
}

/// What a stage run produced: its verdict is its [`Blame`] (`none`: it succeeded).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageResult {
    /// The stage run (`None`: none ran, the agent refused its arguments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<RunStage>,
    /// Package, or `node` for a merged interrupt.
    pub package: String,
    /// Blame when failed; `none` when it succeeded.
    pub blame: Blame,
    /// Summary.
    pub message: String,
    /// The interrupt the changes need (`None`: the stage did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupt: Option<Needs>,
    /// How many changes were made or planned (`changes` may be trimmed to fit).
    #[serde(default)]
    pub change_count: u32,
    /// Changes made or planned (`kind target: detail`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
    /// The pinned plugin run.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub plugin: String,
    /// Last log lines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<String>,
}

impl StageResult {
    /// A failure of `stage` (`None`: no stage ran).
    pub fn failed(
        stage: impl Into<Option<RunStage>>,
        package: &str,
        blame: Blame,
        message: impl Into<String>,
    ) -> Self {
        StageResult {
            stage: stage.into(),
            package: package.into(),
            blame,
            message: message.into(),
            interrupt: None,
            change_count: 0,
            changes: Vec::new(),
            plugin: String::new(),
            logs: Vec::new(),
        }
    }

    /// A success of `stage`.
    pub fn passed(stage: RunStage, package: &str, message: impl Into<String>) -> Self {
        StageResult::failed(stage, package, Blame::None, message)
    }

    /// It succeeded.
    pub fn is_ok(&self) -> bool {
        self.blame == Blame::None
    }

    /// `ok` or `failed`, as people read it.
    pub fn verdict(&self) -> &'static str {
        if self.is_ok() { "ok" } else { "failed" }
    }

    /// Bounds every field to what a termination message can carry: the first
    /// [`MAX_CHANGES`] changes, the last [`MAX_LOG_LINES`] log lines, each line and the
    /// message cut to a bounded length. Called when the result is built, so nothing later
    /// handles more than a few kilobytes whatever the plugin returned.
    pub fn bounded(mut self) -> Self {
        self.message = cut(&self.message, MAX_MESSAGE);
        self.changes.truncate(MAX_CHANGES);
        for c in &mut self.changes {
            *c = cut(c, MAX_LINE);
        }
        let skip = self.logs.len().saturating_sub(MAX_LOG_LINES);
        self.logs = self.logs.drain(skip..).map(|l| cut(&l, MAX_LINE)).collect();
        self
    }

    /// JSON of at most [`TERMINATION_MESSAGE_LIMIT`] bytes: log lines are dropped oldest
    /// first, then changes from the end, then the message is cut; the verdict is kept.
    /// Each step finds how much to drop by bisection, so the cost is a few serialisations
    /// whatever the input size.
    pub fn to_termination_message(&self) -> String {
        let fits = |r: &StageResult| {
            serde_json::to_string(r).expect("results serialize").len() <= TERMINATION_MESSAGE_LIMIT
        };
        let mut r = self.clone().bounded();
        if fits(&r) {
            return serde_json::to_string(&r).expect("results serialize");
        }
        // Fewest oldest log lines to drop.
        let logs = std::mem::take(&mut r.logs);
        let keep = largest(logs.len(), |n| {
            fits(&StageResult {
                logs: logs[logs.len() - n..].to_vec(),
                ..r.clone()
            })
        });
        r.logs = logs[logs.len() - keep..].to_vec();
        if !fits(&r) {
            let changes = std::mem::take(&mut r.changes);
            let keep = largest(changes.len(), |n| {
                fits(&StageResult {
                    changes: changes[..n].to_vec(),
                    ..r.clone()
                })
            });
            r.changes = changes[..keep].to_vec();
        }
        if !fits(&r) {
            let message = std::mem::take(&mut r.message);
            let keep = largest(message.len(), |n| {
                fits(&StageResult {
                    message: cut(&message, n),
                    ..r.clone()
                })
            });
            r.message = cut(&message, keep);
        }
        serde_json::to_string(&r).expect("results serialize")
    }
}

/// Most changes kept in a result (`change_count` has the true number).
pub const MAX_CHANGES: usize = 100;
/// Most log lines kept in a result.
pub const MAX_LOG_LINES: usize = 20;
const MAX_MESSAGE: usize = 2048;
const MAX_LINE: usize = 512;

/// `s` cut to at most `max` bytes on a character boundary.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The largest `n` in `0..=max` with `ok(n)`, for `ok` true at 0 and monotone.
fn largest(max: usize, ok: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, max);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if ok(mid) { lo = mid } else { hi = mid - 1 }
    }
    lo
}

#[cfg(test)]
mod tests {

    #[test]
    fn blames_read_back_from_exit_codes_and_spell_as_serialized() {
        for b in Blame::ALL {
            assert_eq!(Blame::from_exit_code(i32::from(b.exit_code())), Some(b));
            assert_eq!(serde_json::to_value(b).unwrap(), b.as_str());
        }
        assert_eq!(Blame::from_exit_code(137), None);
        let counted: Vec<Blame> = Blame::ALL
            .into_iter()
            .filter(|b| b.counts_against_budget())
            .collect();
        assert_eq!(counted, [Blame::Package, Blame::Denied, Blame::Config]);
    }

    use super::*;

    #[test]
    fn termination_message_fits_and_keeps_the_verdict() {
        let mut r = StageResult::failed(RunStage::Apply, "p", Blame::Package, "boom");
        r.logs = (0..500)
            .map(|i| format!("line {i} {}", "x".repeat(40)))
            .collect();
        let msg = r.to_termination_message();
        assert!(msg.len() <= TERMINATION_MESSAGE_LIMIT);
        let back: StageResult = serde_json::from_str(&msg).unwrap();
        assert_eq!((back.verdict(), back.blame), ("failed", Blame::Package));
        assert_eq!(
            back.logs.last().unwrap(),
            r.logs.last().unwrap(),
            "the newest lines are kept"
        );
    }

    #[test]
    fn huge_results_are_bounded_when_built() {
        let mut r = StageResult::failed(RunStage::Apply, "p", Blame::Package, "x".repeat(4 << 20));
        r.changes = (0..16_000)
            .map(|i| format!("file /etc/app/{i}: {}", "y".repeat(300)))
            .collect();
        r.change_count = 16_000;
        r.logs = (0..16_000).map(|i| format!("line {i}")).collect();
        let b = r.clone().bounded();
        assert_eq!(
            (b.changes.len(), b.logs.len(), b.change_count),
            (MAX_CHANGES, MAX_LOG_LINES, 16_000)
        );
        assert_eq!(b.logs.last().unwrap(), "line 15999");
        assert!(b.message.len() <= MAX_MESSAGE);
        let msg = r.to_termination_message();
        assert!(msg.len() <= TERMINATION_MESSAGE_LIMIT);
        let back: StageResult = serde_json::from_str(&msg).unwrap();
        assert_eq!((back.blame, back.change_count), (Blame::Package, 16_000));
    }

    #[test]
    fn a_long_multibyte_message_is_cut_on_a_character_boundary() {
        let r = StageResult::failed(RunStage::Apply, "p", Blame::Package, "é".repeat(5000));
        assert!(r.to_termination_message().len() <= TERMINATION_MESSAGE_LIMIT);
    }

    #[test]
    fn reported_interrupts_read_back_what_was_recorded_in_the_compact_text() {
        let service = Interrupt {
            kind: InterruptType::Service,
            services: vec!["a.service".into(), "b.service".into()],
        };
        let bare = |kind| Interrupt {
            kind,
            services: vec![],
        };
        for (needs, text) in [
            (Needs::Nothing, "none"),
            (Needs::Interrupt(service), "service:a.service,b.service"),
            (Needs::Interrupt(bare(InterruptType::Reboot)), "reboot"),
            (
                Needs::Interrupt(bare(InterruptType::RestartAllServices)),
                "restartAllServices",
            ),
        ] {
            let mut r = StageResult::passed(RunStage::Plan, "p", "");
            r.interrupt = Some(needs.clone());
            let wire = serde_json::to_value(&r).unwrap();
            assert_eq!(wire["interrupt"], text);
            let back: StageResult = serde_json::from_value(wire).unwrap();
            assert_eq!(back.interrupt, Some(needs));
        }
        let silent: StageResult =
            serde_json::from_str(r#"{"package":"p","blame":"none","message":""}"#).unwrap();
        assert_eq!((silent.interrupt, silent.stage), (None, None));
        assert!(
            "explode".parse::<Needs>().unwrap_err().contains("explode"),
            "an unknown interrupt is refused, naming it"
        );
    }

    #[test]
    fn results_of_earlier_agents_still_read() {
        let old = r#"{"outcome":"ok","stage":"apply-check","package":"p","blame":"none","message":"","interrupt":"service:a.service"}"#;
        let r: StageResult = serde_json::from_str(old).unwrap();
        assert_eq!(r.stage, Some(RunStage::ApplyCheck));
        assert!(r.is_ok());
        assert_eq!(
            r.interrupt
                .as_ref()
                .and_then(Needs::interrupt)
                .map(|i| i.services.clone()),
            Some(vec!["a.service".to_string()])
        );
    }
}
