//! Carries out the planner's actions against the apiserver.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};

use either::Either;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{
    Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy,
};
use kube::runtime::events::Recorder;
use nodewright_api::keys::{self, job as label};
use nodewright_api::v1alpha1::{NodeWright, NodeWrightStatus};
use nodewright_planner::{Action, NodePatch, Refusal};
use serde_json::json;

use crate::events::Events;
use crate::jobs::{self, JobConfig};
use crate::world::World;

/// Writes in flight at once within a wave.
const PARALLEL: usize = 16;

/// Finished Jobs deleted by one request: a selector of this many names stays a few
/// kilobytes of URL.
const DELETE_CHUNK: usize = 100;

/// How long after a CR's last status write a write that only moves counts is held back:
/// with hundreds of nodes at work the per-node statuses and counters change on nearly every
/// pass, and the next write (at most this much later) carries them all.
const STATUS_COALESCE: Duration = Duration::from_secs(2);

/// The part of a status that is not a count: the roll-up, conditions, batch state, pins,
/// the next window. A change there is written at once.
fn significant(s: &NodeWrightStatus) -> NodeWrightStatus {
    let mut s = s.without_nodes();
    s.complete_nodes = None;
    s.nodes_in_progress = None;
    for c in s.compartment_statuses.values_mut() {
        c.completed = 0;
        c.progress_percent = 0;
    }
    s
}

/// Client-side limits on the operator's API writes (`--api-qps`, `--api-burst`): a rollout
/// over a large fleet cannot flood the apiserver, whatever the planner asks for at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteLimits {
    /// Sustained writes per second.
    pub qps: u32,
    /// Writes allowed at once above the sustained rate.
    pub burst: u32,
}

/// Writes the planner's decisions.
pub struct Executor {
    client: Client,
    jobs: JobConfig,
    events: Events,
    world: World,
    limiter: Arc<governor::DefaultDirectRateLimiter>,
    /// Counts each write request as it goes out.
    sent: prometheus_client::metrics::counter::Counter,
    /// Each CR's last written status (its [`significant`] part) and when it was written.
    statuses: Mutex<HashMap<String, (Instant, NodeWrightStatus)>>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("jobs", &self.jobs)
            .finish_non_exhaustive()
    }
}

/// What a pass wrote, for the loop's pacing.
#[derive(Debug, Default)]
pub struct PassWrites {
    /// Writes made (not counting events).
    pub writes: usize,
    /// Writes that failed (conflicts, transient errors): run another pass soon.
    pub failures: usize,
}

impl Executor {
    /// An executor writing as `reporter`, within `limits`.
    pub fn new(
        client: Client,
        jobs: JobConfig,
        world: World,
        reporter: &str,
        limits: WriteLimits,
        sent: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        let recorder = Recorder::new(client.clone(), reporter.to_string().into());
        let per_second = std::num::NonZeroU32::new(limits.qps.max(1)).expect("at least 1");
        let burst = std::num::NonZeroU32::new(limits.burst.max(1)).expect("at least 1");
        let limiter = Arc::new(governor::RateLimiter::direct(
            governor::Quota::per_second(per_second).allow_burst(burst),
        ));
        let events = Events::start(recorder, world.clone(), limiter.clone(), sent.clone());
        Executor {
            client,
            jobs,
            events,
            world,
            limiter,
            sent,
            statuses: Mutex::default(),
        }
    }

    /// Waits for the rate limit to allow one more write.
    async fn throttle(&self) {
        self.limiter.until_ready().await;
        self.sent.inc();
    }

    /// Executes `actions` in waves, each [`PARALLEL`] writes at a time: node patches; then
    /// (rarely any) running Jobs stopped and finished ones this pass makes again under the
    /// same name; then everything else, with the other finished Jobs deleted beside it, many
    /// to a request. A node whose patch failed (a conflict: the pass saw an old node) gets
    /// none of its other actions this pass — a finished Job whose result that patch was
    /// recording stays. Within a wave the writes are independent (different nodes, Jobs,
    /// CRs), so their order does not matter; events are queued (see [`Events`]).
    pub async fn run(&self, actions: Vec<Action>) -> PassWrites {
        let mut out = PassWrites::default();
        let patches = actions.iter().filter_map(|a| {
            if let Action::PatchNode(p) = a {
                Some(p)
            } else {
                None
            }
        });
        let results: Vec<(String, anyhow::Result<()>)> = stream::iter(
            patches.map(|p| async move { (p.node.clone(), self.patch_node(p).await) }),
        )
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
        let mut failed_nodes: HashSet<String> = HashSet::new();
        for (node, r) in results {
            out.writes += 1;
            if let Err(e) = r {
                tracing::warn!(%node, "node patch: {e}");
                out.failures += 1;
                failed_nodes.insert(node);
            }
        }
        let held_back = |a: &Action| match a {
            Action::PatchNode(_) => true,
            Action::CreateJob(req) => failed_nodes.contains(&req.node),
            Action::Evict { node, .. } | Action::DeleteJob { node, .. } => {
                failed_nodes.contains(node)
            }
            _ => false,
        };
        let kept: Vec<Action> = actions.into_iter().filter(|a| !held_back(a)).collect();
        let recreated: HashSet<String> = kept
            .iter()
            .filter_map(|a| match a {
                Action::CreateJob(req) => Some(req.name.clone()),
                _ => None,
            })
            .collect();
        // Finished Jobs not made again this pass are deleted beside the last wave, many to a
        // request; stopping a running Job, or removing one this pass makes again under the
        // same name, comes first.
        let mut finished = Vec::new();
        let (first, rest): (Vec<Action>, Vec<Action>) = kept
            .into_iter()
            .filter_map(|a| match a {
                Action::DeleteJob {
                    name,
                    running: false,
                    ..
                } if !recreated.contains(&name) => {
                    finished.push(name);
                    None
                }
                a => Some(a),
            })
            .partition(|a| matches!(a, Action::DeleteJob { .. }));
        let first = self.wave(first).await;
        let (deleted, rest) = futures::join!(self.delete_finished(&finished), self.wave(rest));
        let waves = [first, rest, deleted.into_iter().map(Some).collect()];
        for r in waves.into_iter().flatten().flatten() {
            out.writes += 1;
            if let Err(e) = r {
                tracing::warn!("{e:#}");
                out.failures += 1;
            }
        }
        out
    }

    /// Actions side by side, [`PARALLEL`] at a time.
    async fn wave(&self, actions: Vec<Action>) -> Vec<Option<anyhow::Result<()>>> {
        stream::iter(actions.into_iter().map(|a| self.one(a)))
            .buffer_unordered(PARALLEL)
            .collect()
            .await
    }

    /// One action other than a node patch; `None` for events (not counted as writes).
    async fn one(&self, a: Action) -> Option<anyhow::Result<()>> {
        Some(match a {
            Action::PatchNode(_) => return None,
            Action::CreateJob(req) => self.create_job(&req).await,
            Action::DeleteJob { name, running, .. } => self.delete_job(&name, running).await,
            Action::Evict {
                node: _,
                namespace,
                pod,
                delete,
                grace_seconds,
            } => self.evict(&namespace, &pod, delete, grace_seconds).await,
            Action::SetStatus { cr, status } => {
                if self.held_back(&cr, &status) {
                    return None;
                }
                self.set_status(&cr, &status).await
            }
            Action::Event(e) => {
                self.events.send(e).await;
                return None;
            }
            Action::AddFinalizer { cr } => self.finalizer(&cr, true).await,
            Action::RemoveFinalizer { cr } => self.finalizer(&cr, false).await,
        })
    }

    /// Whether a status write changes only counts and the CR's last write is recent (see
    /// [`STATUS_COALESCE`]); the planner asks again on the next pass.
    fn held_back(&self, cr: &str, status: &NodeWrightStatus) -> bool {
        let statuses = self.statuses.lock().expect("status lock");
        statuses.get(cr).is_some_and(|(at, last)| {
            at.elapsed() < STATUS_COALESCE && *last == significant(status)
        })
    }

    async fn patch_node(&self, p: &NodePatch) -> anyhow::Result<()> {
        self.throttle().await;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut body = json!({"metadata": {"resourceVersion": p.resource_version, "annotations": p.annotations}});
        if let Some(u) = p.unschedulable {
            body["spec"]["unschedulable"] = json!(u);
        }
        if !p.add_taints.is_empty() || !p.remove_taints.is_empty() {
            let current = nodes.get(&p.node).await?;
            let mut taints = current.spec.and_then(|s| s.taints).unwrap_or_default();
            taints.retain(|t| !p.remove_taints.contains(&t.key));
            for t in &p.add_taints {
                if !taints
                    .iter()
                    .any(|x| x.key == t.key && x.effect == t.effect)
                {
                    taints.push(t.clone());
                }
            }
            body["spec"]["taints"] = serde_json::to_value(taints)?;
        }
        let mut patched = nodes
            .patch(&p.node, &PatchParams::default(), &Patch::Merge(body))
            .await?;
        crate::world::slim_node(&mut patched);
        self.world
            .overlay
            .lock()
            .expect("overlay lock")
            .nodes
            .insert(p.node.clone(), patched);
        Ok(())
    }

    async fn create_job(&self, req: &nodewright_planner::JobRequest) -> anyhow::Result<()> {
        self.throttle().await;
        let api: Api<Job> = Api::namespaced(self.client.clone(), &self.jobs.namespace);
        let job = jobs::build(req, &self.jobs);
        match api.create(&PostParams::default(), &job).await {
            Ok(created) => {
                tracing::info!(job = %req.name, node = %req.node, "created");
                self.world
                    .overlay
                    .lock()
                    .expect("overlay lock")
                    .created
                    .insert(req.name.clone(), created);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()), // deterministic names: it exists
            Err(e) => Err(anyhow::anyhow!("create Job {}: {e}", req.name)),
        }
    }

    /// Deletes a Job. A running one is deleted in the foreground: the Job stays (with a
    /// deletion timestamp, seen by the planner as stopping) until its pods are gone, so
    /// whatever waits for the work to stop — a release, a finalizer — waits for the pods.
    async fn delete_job(&self, name: &str, running: bool) -> anyhow::Result<()> {
        self.throttle().await;
        let api: Api<Job> = Api::namespaced(self.client.clone(), &self.jobs.namespace);
        let propagation = if running {
            PropagationPolicy::Foreground
        } else {
            PropagationPolicy::Background
        };
        let dp = DeleteParams {
            propagation_policy: Some(propagation),
            ..Default::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(anyhow::anyhow!("delete Job {name}: {e}")),
        }
        let mut overlay = self.world.overlay.lock().expect("overlay lock");
        overlay.created.remove(name);
        overlay.deleted.insert(name.into());
        Ok(())
    }

    /// Deletes finished Jobs, up to [`DELETE_CHUNK`] to a request (a set-based selector on
    /// their name label), in the background as [`Executor::delete_job`] does for one. A Job
    /// the request did not delete (made before the label existed, or already gone) is
    /// deleted by name. One result per request.
    async fn delete_finished(&self, names: &[String]) -> Vec<anyhow::Result<()>> {
        let api: Api<Job> = Api::namespaced(self.client.clone(), &self.jobs.namespace);
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        let mut results = Vec::new();
        for chunk in names.chunks(DELETE_CHUNK) {
            if let [one] = chunk {
                results.push(self.delete_job(one, false).await);
                continue;
            }
            self.throttle().await;
            let selector = format!(
                "{}=true,{} in ({})",
                label::MANAGED,
                label::JOB,
                chunk.join(",")
            );
            let lp = ListParams::default().labels(&selector);
            let gone: HashSet<String> = match api.delete_collection(&dp, &lp).await {
                Ok(Either::Left(list)) => list
                    .items
                    .into_iter()
                    .filter_map(|j| j.metadata.name)
                    .collect(),
                // A bare status does not say which went: each is deleted by name below.
                Ok(Either::Right(_)) => HashSet::new(),
                Err(e) => {
                    results.push(Err(anyhow::anyhow!(
                        "delete {} finished Jobs: {e}",
                        chunk.len()
                    )));
                    continue;
                }
            };
            results.push(Ok(()));
            {
                let mut overlay = self.world.overlay.lock().expect("overlay lock");
                for name in &gone {
                    overlay.created.remove(name);
                    overlay.deleted.insert(name.clone());
                }
            }
            for name in chunk.iter().filter(|n| !gone.contains(*n)) {
                tracing::debug!(job = %name, "not deleted by its label; deleting it by name");
                results.push(self.delete_job(name, false).await);
            }
        }
        results
    }

    async fn evict(
        &self,
        namespace: &str,
        pod: &str,
        delete: bool,
        grace: Option<i64>,
    ) -> anyhow::Result<()> {
        self.throttle().await;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let key = format!("{namespace}/{pod}");
        let dp = DeleteParams {
            grace_period_seconds: grace.map(|g| g.max(0) as u32),
            ..Default::default()
        };
        let result = if delete {
            api.delete(pod, &dp).await.map(|_| ())
        } else {
            api.evict(
                pod,
                &EvictParams {
                    delete_options: Some(dp),
                    ..Default::default()
                },
            )
            .await
            .map(|_| ())
        };
        match result {
            Ok(()) => {
                tracing::info!(pod = %key, delete, "evicted");
                self.world
                    .refusals
                    .lock()
                    .expect("refusals lock")
                    .remove(&key);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 429 => {
                let now = k8s_openapi::jiff::Timestamp::now().as_second();
                self.world.refusals.lock().expect("refusals lock").insert(
                    key,
                    Refusal {
                        at: now,
                        message: s.message.clone(),
                    },
                );
                Ok(())
            }
            Err(e) => Err(anyhow::anyhow!("evict {key}: {e}")),
        }
    }

    async fn set_status(&self, cr: &str, status: &NodeWrightStatus) -> anyhow::Result<()> {
        self.throttle().await;
        let api: Api<NodeWright> = Api::all(self.client.clone());
        let body =
            json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "status": status});
        match api
            .patch_status(
                cr,
                &PatchParams::apply("nodewright-operator").force(),
                &Patch::Apply(body),
            )
            .await
        {
            Ok(_) => {
                self.statuses
                    .lock()
                    .expect("status lock")
                    .insert(cr.to_string(), (Instant::now(), significant(status)));
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(anyhow::anyhow!("status of {cr}: {e}")),
        }
    }

    async fn finalizer(&self, cr: &str, add: bool) -> anyhow::Result<()> {
        self.throttle().await;
        let api: Api<NodeWright> = Api::all(self.client.clone());
        let Some(current) = self.world.nodewright(cr) else {
            return Ok(());
        };
        let mut finalizers: Vec<String> = current.metadata.finalizers.clone().unwrap_or_default();
        finalizers.retain(|f| f != keys::FINALIZER);
        if add {
            finalizers.push(keys::FINALIZER.into());
        }
        let body = json!({"metadata": {"resourceVersion": current.metadata.resource_version, "finalizers": finalizers}});
        match api
            .patch(cr, &PatchParams::default(), &Patch::Merge(body))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(anyhow::anyhow!("finalizer of {cr}: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use nodewright_api::v1alpha1::{CompartmentStatus, Status};

    use super::*;

    #[test]
    fn only_counts_may_wait_for_the_next_status_write() {
        let before = NodeWrightStatus {
            status: Some(Status::InProgress),
            complete_nodes: Some("10/100".into()),
            nodes_in_progress: Some(10),
            node_status: [("n1".to_string(), Status::InProgress)].into(),
            compartment_statuses: [("__default__".to_string(), CompartmentStatus::default())]
                .into(),
            ..Default::default()
        };
        let mut counts = before.clone();
        counts.complete_nodes = Some("11/100".into());
        counts.nodes_in_progress = Some(9);
        counts.node_status.insert("n1".into(), Status::Complete);
        let c = counts.compartment_statuses.get_mut("__default__").unwrap();
        c.completed = 11;
        c.progress_percent = 11;
        assert_eq!(significant(&before), significant(&counts));
        let mut rolled = counts.clone();
        rolled.status = Some(Status::Complete);
        assert_ne!(
            significant(&before),
            significant(&rolled),
            "a roll-up is written at once"
        );
        let mut batch = counts;
        batch
            .compartment_statuses
            .get_mut("__default__")
            .unwrap()
            .batch_nodes
            .push("n2".into());
        assert_ne!(
            significant(&before),
            significant(&batch),
            "so is batch state"
        );
    }
}
