//! A fenced leader's way out. A leader whose node is about to reboot lets go of the Lease
//! and ends (its restart waits as a standby); but the webhook Service may still send it
//! admission requests until its readiness probe has seen the fence and the EndpointSlices
//! have dropped it — a process that ended before that leaves the API server dialling a
//! closed port, and the fail-closed webhook refuses those writes. So it ends only once no
//! EndpointSlice of the Service lists its pod as ready.

use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ListParams};
use tokio::time::Instant;

/// The longest a fenced leader waits for the Service to stop routing to it (its readiness
/// probe asks every 2 s in the chart); past it, it ends anyway and says so.
const LIMIT: Duration = Duration::from_secs(30);
/// How often it looks.
const EVERY: Duration = Duration::from_millis(200);

/// The webhook Service as one replica sees it.
pub struct Routing {
    slices: Api<EndpointSlice>,
    service: String,
    pod: String,
}

impl Routing {
    /// The Service `service` in `namespace`, as it routes to the pod `pod`.
    pub fn new(client: Client, namespace: &str, service: &str, pod: &str) -> Routing {
        Routing {
            slices: Api::namespaced(client, namespace),
            service: service.into(),
            pod: pod.into(),
        }
    }

    /// Whether an EndpointSlice of the Service lists the pod as ready (an endpoint without
    /// a `ready` condition counts as ready, as the API says).
    async fn routes_here(&self) -> kube::Result<bool> {
        let selector = format!("kubernetes.io/service-name={}", self.service);
        let slices = self
            .slices
            .list(&ListParams::default().labels(&selector))
            .await?;
        Ok(slices
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .any(|e| {
                e.target_ref.as_ref().and_then(|r| r.name.as_deref()) == Some(self.pod.as_str())
                    && e.conditions.as_ref().and_then(|c| c.ready) != Some(false)
            }))
    }

    /// Waits until the Service no longer routes to this replica, at most [`LIMIT`]. A
    /// Service it cannot read (no `list` on `endpointslices` in its namespace) is said, and
    /// not waited for.
    pub async fn wait_out(&self) {
        let started = Instant::now();
        let mut said = false;
        loop {
            match self.routes_here().await {
                Ok(false) => return,
                Ok(true) if started.elapsed() >= LIMIT => {
                    tracing::warn!(
                        service = %self.service,
                        pod = %self.pod,
                        "the webhook Service still routes to this fenced replica after {}s; ending anyway",
                        LIMIT.as_secs()
                    );
                    return;
                }
                Ok(true) if !said => {
                    said = true;
                    tracing::info!(
                        service = %self.service,
                        pod = %self.pod,
                        "waiting for the webhook Service to stop routing to this replica before it ends"
                    );
                }
                Ok(true) => {}
                Err(e) => {
                    tracing::warn!(
                        service = %self.service,
                        "cannot read the webhook Service's EndpointSlices (the operator needs get and list on discovery.k8s.io endpointslices in its namespace); ending without waiting for it: {e}"
                    );
                    return;
                }
            }
            tokio::time::sleep(EVERY).await;
        }
    }
}
