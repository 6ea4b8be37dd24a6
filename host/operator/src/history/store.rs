//! The history kept across leaders: a ConfigMap in the operator's namespace, named after the
//! Lease (`<lease>-history`), holding the [`Record`] as JSON under [`KEY`]. The leader reads
//! it once, when it starts leading, and writes it at most every [`SAVE_EVERY`] while the
//! history changes. At most [`super::KEYS`] keys of about 80 bytes: far below a ConfigMap's
//! 1 MiB.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::{History, Record};

/// The ConfigMap key holding the record.
pub const KEY: &str = "history.json";

/// Least time between two writes.
pub const SAVE_EVERY: Duration = Duration::from_secs(10);

/// Where the history is kept.
pub struct Store {
    api: Api<ConfigMap>,
    name: String,
}

/// Why a kept history could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The API refused or failed the read.
    #[error("reading ConfigMap {0}: {1}")]
    Api(String, #[source] kube::Error),
    /// The ConfigMap holds something that is not a history.
    #[error("ConfigMap {0} key {KEY} is not a nodewright history: {1}")]
    Malformed(String, #[source] serde_json::Error),
}

impl Store {
    /// The history ConfigMap of the leader Lease `lease` in `namespace`.
    pub fn new(client: kube::Client, namespace: &str, lease: &str) -> Self {
        Store {
            api: Api::namespaced(client, namespace),
            name: format!("{lease}-history"),
        }
    }

    /// What an earlier leader kept; an empty record when nothing was.
    pub async fn load(&self) -> Result<Record, LoadError> {
        let map = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| LoadError::Api(self.name.clone(), e))?;
        match map.and_then(|m| m.data).and_then(|mut d| d.remove(KEY)) {
            Some(text) => {
                serde_json::from_str(&text).map_err(|e| LoadError::Malformed(self.name.clone(), e))
            }
            None => Ok(Record::default()),
        }
    }

    /// Writes `record` (created if missing).
    pub async fn save(&self, record: &Record) -> Result<(), kube::Error> {
        let text = serde_json::to_string(record).expect("a record serializes");
        let body = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name,
                "labels": {"app.kubernetes.io/managed-by": "nodewright-operator"},
            },
            "data": {KEY: text},
        });
        self.api
            .patch(
                &self.name,
                &PatchParams::apply("nodewright-operator").force(),
                &Patch::Apply(body),
            )
            .await
            .map(drop)
    }

    /// The history, from what an earlier leader kept: a history that cannot be read is
    /// said (a warning naming the ConfigMap) and started afresh — it only times previews.
    pub async fn open(&self) -> History {
        match self.load().await {
            Ok(record) => {
                let n = record.stages.len();
                tracing::info!(configmap = %self.name, keys = n, "stage history read");
                History::from_record(record)
            }
            Err(e) => {
                tracing::warn!(error = %e, "starting without the stage history");
                History::default()
            }
        }
    }

    /// Writes `history` whenever it changed, at most every [`SAVE_EVERY`], for as long as the
    /// process leads. A failed write is said and tried again at the next change or tick.
    pub async fn keep(self, history: Arc<History>) {
        let mut saved = 0;
        loop {
            tokio::time::sleep(SAVE_EVERY).await;
            let Some((record, changes)) = history.changed_since(saved) else {
                continue;
            };
            match self.save(&record).await {
                Ok(()) => saved = changes,
                Err(e) => {
                    tracing::warn!(configmap = %self.name, error = %e, "writing the stage history")
                }
            }
        }
    }
}
