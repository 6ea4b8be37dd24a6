//! Leader election on a `coordination.k8s.io/v1` Lease: one replica plans at a time.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodewright_api::keys;
use serde_json::json;

/// A held (or wanted) lease.
#[derive(Debug)]
pub struct Leader {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

fn micro_now() -> String {
    Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

impl Leader {
    /// A candidate for `name` in `namespace`.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        Leader {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity: identity.into(),
            duration,
        }
    }

    /// The Lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Blocks until this process holds the lease.
    pub async fn acquire(&self) -> anyhow::Result<()> {
        loop {
            if self.try_take().await? {
                tracing::info!(lease = %self.name, identity = %self.identity, "leading");
                return Ok(());
            }
            tokio::time::sleep(self.duration / 4).await;
        }
    }

    /// Renews the lease; false when someone else took it.
    pub async fn renew(&self) -> anyhow::Result<bool> {
        self.try_take().await
    }

    /// Lets go of the lease, if this process holds it: a standby takes it at its next try
    /// rather than after the lease runs out.
    pub async fn release(&self) -> anyhow::Result<()> {
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref());
        if holder != Some(self.identity.as_str()) {
            return Ok(());
        }
        let body = json!({
            "metadata": {"resourceVersion": lease.metadata.resource_version},
            "spec": {"holderIdentity": null, "renewTime": null},
        });
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(body))
            .await
        {
            // Someone renewed or took it meanwhile: not ours to release any more.
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn try_take(&self) -> anyhow::Result<bool> {
        let spec = json!({
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration.as_secs(),
            "renewTime": micro_now(),
        });
        let labels = json!({ keys::OPERATOR_LEASE: "true" });
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            let mut body = json!({"metadata": {"name": self.name, "labels": labels}, "spec": spec});
            body["spec"]["acquireTime"] = json!(micro_now());
            return match self
                .api
                .create(&PostParams::default(), &serde_json::from_value(body)?)
                .await
            {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            };
        };
        let current = lease.spec.clone().unwrap_or_default();
        let ours = current.holder_identity.as_deref() == Some(self.identity.as_str());
        let expired = match (&current.renew_time, current.lease_duration_seconds) {
            (Some(t), Some(d)) => t.0.as_second() + i64::from(d) < Timestamp::now().as_second(),
            _ => true,
        };
        if !ours && !expired {
            return Ok(false);
        }
        // The label too: a Lease an earlier operator made gets it on the next renewal.
        let metadata =
            json!({"resourceVersion": lease.metadata.resource_version, "labels": labels});
        let mut body = json!({"metadata": metadata, "spec": spec});
        if !ours {
            body["spec"]["acquireTime"] = json!(micro_now());
        }
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(body))
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}
