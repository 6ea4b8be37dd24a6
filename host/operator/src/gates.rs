//! Health gates that need the network: a CR's `prometheus` gate is asked, in the
//! background, for the alerts that hold its rollout. The planner sees the last answer (at
//! most one interval, `--health-gate-interval`, old) as failing gates; until the first
//! answer, and whenever Prometheus cannot be asked, the gate fails closed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use nodewright_api::gates::PrometheusGate;
use nodewright_planner::GateFinding;
use serde::Deserialize;
use tokio::sync::Notify;

/// Why a Prometheus gate could not be evaluated.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The HTTP request failed or timed out.
    #[error("Prometheus at {url} is unreachable: {source}")]
    Unreachable {
        /// The gate's URL.
        url: String,
        /// What failed.
        source: reqwest::Error,
    },
    /// Prometheus answered, but not with alerts.
    #[error("Prometheus at {url} answered {status}: {body}")]
    BadAnswer {
        /// The gate's URL.
        url: String,
        /// HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// A Secret the gate names is missing or lacks its key.
    #[error("spec.healthGates.prometheus.{field}: {message}")]
    Secret {
        /// `bearerTokenSecret` or `caSecret`.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The gate itself is invalid (the webhook refuses these).
    #[error("spec.healthGates.prometheus: {0}")]
    Invalid(String),
}

impl GateError {
    fn reason(&self) -> &'static str {
        match self {
            GateError::Unreachable { .. } | GateError::BadAnswer { .. } => "PrometheusUnreachable",
            GateError::Secret { .. } | GateError::Invalid(_) => "GateMisconfigured",
        }
    }
}

/// The background evaluator and its last answers, per CR.
#[derive(Clone)]
pub struct Gates {
    client: Client,
    namespace: String,
    interval: Duration,
    answers: Arc<Mutex<HashMap<String, Answer>>>,
    notify: Arc<Notify>,
}

impl std::fmt::Debug for Gates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gates").finish_non_exhaustive()
    }
}

struct Answer {
    gate: PrometheusGate,
    findings: Option<Vec<GateFinding>>,
    asked: Instant,
    in_flight: bool,
}

impl Gates {
    /// An evaluator reading gate Secrets from `namespace` and asking every `interval`; a
    /// changed answer wakes `notify`.
    pub fn new(client: Client, namespace: &str, interval: Duration, notify: Arc<Notify>) -> Self {
        Gates {
            client,
            namespace: namespace.into(),
            interval,
            answers: Arc::default(),
            notify,
        }
    }

    /// Forgets the answers for CRs not in `live` (deleted ones).
    pub fn keep(&self, live: &[&str]) {
        self.answers
            .lock()
            .expect("gates lock")
            .retain(|name, _| live.contains(&name.as_str()));
    }

    /// How long the loop may sleep before a gate is due again (`None`: no gates).
    pub fn due_in(&self) -> Option<Duration> {
        let answers = self.answers.lock().expect("gates lock");
        answers
            .values()
            .map(|a| self.interval.saturating_sub(a.asked.elapsed()))
            .min()
    }

    /// The failing gates of CR `name` as last seen (asking again when the answer is old).
    pub fn failing(&self, name: &str, gate: Option<&PrometheusGate>) -> Vec<GateFinding> {
        let mut answers = self.answers.lock().expect("gates lock");
        let Some(gate) = gate else {
            answers.remove(name);
            return Vec::new();
        };
        let entry = answers.entry(name.to_string()).or_insert_with(|| Answer {
            gate: gate.clone(),
            findings: None,
            asked: Instant::now(),
            in_flight: false,
        });
        if entry.gate != *gate {
            *entry = Answer {
                gate: gate.clone(),
                findings: None,
                asked: Instant::now(),
                in_flight: false,
            };
        }
        if !entry.in_flight && (entry.findings.is_none() || entry.asked.elapsed() >= self.interval)
        {
            entry.in_flight = true;
            entry.asked = Instant::now();
            let this = self.clone();
            let (name, gate) = (name.to_string(), gate.clone());
            tokio::spawn(async move {
                let findings = match this.ask(&gate).await {
                    Ok(f) => f,
                    Err(e) => vec![GateFinding {
                        gate: "prometheus".into(),
                        reason: e.reason().into(),
                        message: format!("{e} (the gate fails closed)"),
                    }],
                };
                let mut answers = this.answers.lock().expect("gates lock");
                let Some(a) = answers.get_mut(&name).filter(|a| a.gate == gate) else {
                    return;
                };
                let changed = a.findings.as_ref() != Some(&findings);
                a.findings = Some(findings);
                a.in_flight = false;
                drop(answers);
                if changed {
                    this.notify.notify_one();
                }
            });
        }
        entry.findings.clone().unwrap_or_else(|| {
            vec![GateFinding {
                gate: "prometheus".into(),
                reason: "Evaluating".into(),
                message: format!("asking {} for the first time", gate.url),
            }]
        })
    }

    async fn secret(
        &self,
        field: &'static str,
        name: &str,
        key: &str,
    ) -> Result<Vec<u8>, GateError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = api.get(name).await.map_err(|e| GateError::Secret {
            field,
            message: format!("Secret {}/{name}: {e}", self.namespace),
        })?;
        secret
            .data
            .and_then(|d| d.get(key).map(|b| b.0.clone()))
            .ok_or_else(|| GateError::Secret {
                field,
                message: format!("Secret {}/{name} has no key {key:?}", self.namespace),
            })
    }

    async fn ask(&self, gate: &PrometheusGate) -> Result<Vec<GateFinding>, GateError> {
        let names = gate
            .names()
            .map_err(|e| GateError::Invalid(format!("alertNames: {e}")))?;
        let mut http = reqwest::Client::builder().timeout(gate.timeout());
        if let Some(s) = &gate.ca_secret {
            let pem = self.secret("caSecret", s, "ca.crt").await?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| GateError::Secret {
                    field: "caSecret",
                    message: format!("ca.crt is not a PEM bundle: {e}"),
                })?;
            http = http.tls_certs_merge(certs);
        }
        let http = http
            .build()
            .map_err(|e| GateError::Invalid(format!("HTTP client: {e}")))?;
        let url = format!("{}/api/v1/alerts", gate.url.trim_end_matches('/'));
        let mut req = http.get(&url);
        if let Some(s) = &gate.bearer_token_secret {
            let token = self.secret("bearerTokenSecret", s, "token").await?;
            req = req.bearer_auth(String::from_utf8_lossy(&token).trim());
        }
        let unreachable = |source| GateError::Unreachable {
            url: gate.url.clone(),
            source,
        };
        let resp = req.send().await.map_err(unreachable)?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(unreachable)?;
        let parsed: Result<AlertsReply, _> = serde_json::from_slice(&body);
        let alerts = match parsed {
            Ok(r) if status.is_success() && r.status == "success" => r.data.alerts,
            _ => {
                return Err(GateError::BadAnswer {
                    url: gate.url.clone(),
                    status: status.as_u16(),
                    body: String::from_utf8_lossy(&body[..body.len().min(200)]).into(),
                });
            }
        };
        let matching: Vec<String> = alerts
            .iter()
            .filter(|a| a.state == "firing" || (gate.include_pending && a.state == "pending"))
            .filter(|a| {
                names
                    .as_ref()
                    .is_none_or(|re| a.labels.get("alertname").is_some_and(|n| re.is_match(n)))
            })
            .filter(|a| {
                gate.match_labels
                    .iter()
                    .all(|(k, v)| a.labels.get(k) == Some(v))
            })
            .map(describe)
            .collect();
        Ok(if matching.is_empty() {
            Vec::new()
        } else {
            vec![GateFinding {
                gate: "prometheus".into(),
                reason: "AlertsFiring".into(),
                message: matching.join(", "),
            }]
        })
    }
}

#[derive(Deserialize)]
struct AlertsReply {
    status: String,
    data: AlertsData,
}

#[derive(Deserialize)]
struct AlertsData {
    alerts: Vec<Alert>,
}

#[derive(Deserialize)]
struct Alert {
    labels: BTreeMap<String, String>,
    state: String,
}

/// `Name{label="value",...} firing`, without the name among the labels.
fn describe(a: &Alert) -> String {
    let name = a
        .labels
        .get("alertname")
        .map_or("(unnamed)", String::as_str);
    let labels: Vec<String> = a
        .labels
        .iter()
        .filter(|(k, _)| *k != "alertname")
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect();
    format!("{name}{{{}}} {}", labels.join(","), a.state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alerts_are_described_by_name_labels_and_state() {
        let a = Alert {
            labels: [
                ("alertname".to_string(), "NodeDown".to_string()),
                ("node".to_string(), "n1".to_string()),
            ]
            .into(),
            state: "firing".into(),
        };
        assert_eq!(describe(&a), "NodeDown{node=\"n1\"} firing");
    }
}
