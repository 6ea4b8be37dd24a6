//! Health gates: checks that must pass before a rollout disrupts another node.
//!
//! A `prometheus` gate holds new disruptive work while a matching alert fires (or while
//! Prometheus cannot be asked: it fails closed). A `nodeHealth` gate names node conditions
//! a node must show after its interrupt cycle before the rollout lets go of it. The operator
//! evaluates the first (it needs the network); the planner the second (it needs only the
//! node). Both are validated here, with field paths below `spec.healthGates`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The gates of a NodeWright.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthGates {
    /// Hold while matching Prometheus alerts fire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusGate>,
    /// Node conditions that must hold after a node's interrupt cycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_health: Option<NodeHealthGate>,
}

/// Alerts that hold the rollout.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrometheusGate {
    /// Base URL of the Prometheus (or Thanos/Mimir querier) HTTP API, e.g.
    /// `http://prometheus.monitoring:9090`.
    pub url: String,
    /// Regular expression alert names must match in full (unset: every alert).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_names: Option<String>,
    /// Labels a matching alert carries, all of them, with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Pending alerts hold the rollout too (default: only firing ones).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub include_pending: bool,
    /// How long one query may take (default `10s`, at most `60s`); a query that takes
    /// longer holds the rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Secret (in the operator's namespace) with the bearer token, key `token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_secret: Option<String>,
    /// Secret (in the operator's namespace) with the PEM CA bundle, key `ca.crt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret: Option<String>,
}

/// Node conditions required after an interrupt cycle.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeHealthGate {
    /// Each condition type with the status it must have, e.g. `Ready: "True"`,
    /// `KernelDeadlock: "False"`.
    pub conditions: BTreeMap<String, String>,
}

/// The default query timeout, seconds.
pub const DEFAULT_TIMEOUT_SECS: u64 = 10;
const MAX_TIMEOUT_SECS: u64 = 60;

impl PrometheusGate {
    /// The query timeout.
    pub fn timeout(&self) -> std::time::Duration {
        let secs = self
            .timeout
            .as_deref()
            .and_then(|t| crate::units::parse_duration(t).ok())
            .unwrap_or(DEFAULT_TIMEOUT_SECS as f64);
        std::time::Duration::from_secs_f64(secs.clamp(1.0, MAX_TIMEOUT_SECS as f64))
    }

    /// The alert-name pattern, anchored.
    pub fn names(&self) -> Result<Option<regex::Regex>, regex::Error> {
        self.alert_names
            .as_deref()
            .map(|n| regex::Regex::new(&format!("^(?:{n})$")))
            .transpose()
    }
}

impl NodeHealthGate {
    /// The required conditions that `conditions` (type → status) does not show, as
    /// `Type=Status (is Actual)` findings.
    pub fn unmet(&self, conditions: &BTreeMap<String, String>) -> Vec<String> {
        self.conditions
            .iter()
            .filter(|(t, want)| conditions.get(*t) != Some(want))
            .map(|(t, want)| {
                format!(
                    "{t}={want} (is {})",
                    conditions.get(t).map_or("absent", String::as_str)
                )
            })
            .collect()
    }
}

impl HealthGates {
    /// Problems, each with its field path below `healthGates`.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut errs = Vec::new();
        if let Some(p) = &self.prometheus {
            match url::Url::parse(&p.url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                Ok(_) => errs.push((
                    "prometheus.url".into(),
                    format!("{:?} must be an http(s) URL with a host", p.url),
                )),
                Err(e) => errs.push((
                    "prometheus.url".into(),
                    format!("{:?} is not a URL: {e}", p.url),
                )),
            }
            if let Err(e) = p.names() {
                errs.push((
                    "prometheus.alertNames".into(),
                    format!("not a regular expression: {e}"),
                ));
            }
            if let Some(t) = &p.timeout {
                match crate::units::parse_duration(t) {
                    Ok(s) if (1.0..=MAX_TIMEOUT_SECS as f64).contains(&s) => {}
                    Ok(_) => errs.push((
                        "prometheus.timeout".into(),
                        format!("{t:?} must be between 1s and 60s"),
                    )),
                    Err(e) => errs.push(("prometheus.timeout".into(), e)),
                }
            }
            for (field, secret) in [
                ("bearerTokenSecret", &p.bearer_token_secret),
                ("caSecret", &p.ca_secret),
            ] {
                if let Some(s) = secret
                    && !crate::names::is_dns_label(s, 253)
                {
                    errs.push((
                        format!("prometheus.{field}"),
                        format!("{s:?} is not a Secret name"),
                    ));
                }
            }
        }
        if let Some(h) = &self.node_health {
            if h.conditions.is_empty() {
                errs.push((
                    "nodeHealth.conditions".into(),
                    "name at least one condition (remove nodeHealth to check none)".into(),
                ));
            }
            for (t, s) in &h.conditions {
                if !matches!(s.as_str(), "True" | "False" | "Unknown") {
                    errs.push((
                        format!("nodeHealth.conditions.{t}"),
                        format!("{s:?} must be True, False or Unknown"),
                    ));
                }
            }
        }
        errs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_health_names_what_is_unmet() {
        let gate = NodeHealthGate {
            conditions: [
                ("Ready".to_string(), "True".to_string()),
                ("KernelDeadlock".to_string(), "False".to_string()),
            ]
            .into(),
        };
        let seen: BTreeMap<String, String> = [("Ready".to_string(), "True".to_string())].into();
        assert_eq!(gate.unmet(&seen), ["KernelDeadlock=False (is absent)"]);
        let seen: BTreeMap<String, String> = [
            ("Ready".to_string(), "False".to_string()),
            ("KernelDeadlock".to_string(), "False".to_string()),
        ]
        .into();
        assert_eq!(gate.unmet(&seen), ["Ready=True (is False)"]);
    }

    #[test]
    fn invalid_gates_name_their_field() {
        let gates = HealthGates {
            prometheus: Some(PrometheusGate {
                url: "ftp://x".into(),
                alert_names: Some("(".into()),
                timeout: Some("5m".into()),
                ca_secret: Some("Bad_Name".into()),
                ..Default::default()
            }),
            node_health: Some(NodeHealthGate {
                conditions: [("Ready".to_string(), "yes".to_string())].into(),
            }),
        };
        let paths: Vec<String> = gates.validate().into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            paths,
            [
                "prometheus.url",
                "prometheus.alertNames",
                "prometheus.timeout",
                "prometheus.caSecret",
                "nodeHealth.conditions.Ready"
            ]
        );
        let ok = PrometheusGate {
            url: "http://prom:9090".into(),
            alert_names: Some("Node.*|GPU".into()),
            ..Default::default()
        };
        let re = ok.names().unwrap().unwrap();
        assert!(
            re.is_match("GPU") && re.is_match("NodeDown") && !re.is_match("MyGPU"),
            "anchored"
        );
        assert_eq!(
            ok.timeout(),
            std::time::Duration::from_secs(DEFAULT_TIMEOUT_SECS)
        );
    }
}
