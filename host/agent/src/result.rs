//! The structured result written to the pod's termination message.
//!
//! Kubernetes keeps at most 4096 bytes of a termination message; the result is trimmed to
//! fit by dropping log lines (oldest first), then changes, never the verdict.

use serde::{Deserialize, Serialize};

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

/// What a stage run produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageResult {
    /// `ok` or `failed`.
    pub outcome: String,
    /// The stage run.
    pub stage: String,
    /// Package, or `node` for a merged interrupt.
    pub package: String,
    /// Blame when failed.
    pub blame: Blame,
    /// Summary.
    pub message: String,
    /// Interrupt the changes need (`none`, `reboot`, `service:a,b`, `restartAllServices`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupt: Option<String>,
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
    /// A failure.
    pub fn failed(stage: &str, package: &str, blame: Blame, message: impl Into<String>) -> Self {
        StageResult {
            outcome: "failed".into(),
            stage: stage.into(),
            package: package.into(),
            blame,
            message: message.into(),
            interrupt: None,
            changes: Vec::new(),
            plugin: String::new(),
            logs: Vec::new(),
        }
    }

    /// JSON of at most [`TERMINATION_MESSAGE_LIMIT`] bytes.
    pub fn to_termination_message(&self) -> String {
        let mut r = self.clone();
        loop {
            let json = serde_json::to_string(&r).expect("results serialize");
            if json.len() <= TERMINATION_MESSAGE_LIMIT {
                return json;
            }
            if !r.logs.is_empty() {
                r.logs.remove(0);
            } else if !r.changes.is_empty() {
                r.changes.pop();
            } else {
                r.message.truncate(r.message.len().saturating_sub(256));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termination_message_fits_and_keeps_the_verdict() {
        let mut r = StageResult::failed("apply", "p", Blame::Package, "boom");
        r.logs = (0..500).map(|i| format!("line {i} {}", "x".repeat(40))).collect();
        let msg = r.to_termination_message();
        assert!(msg.len() <= TERMINATION_MESSAGE_LIMIT);
        let back: StageResult = serde_json::from_str(&msg).unwrap();
        assert_eq!((back.outcome.as_str(), back.blame), ("failed", Blame::Package));
        assert_eq!(back.logs.last().unwrap(), r.logs.last().unwrap(), "the newest lines are kept");
    }
}
