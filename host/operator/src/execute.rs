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
use nodewright_planner::{Action, NodePatch, ObservedNode, Refusal};
use serde_json::json;

use crate::events::Events;
use crate::jobs::{self, JobConfig};
use crate::world::World;

/// Nodes (or CR-wide writes) written at once. The write rate is the rate limit's; this
/// only hides the apiserver's latency (at 16 the 1,000-node rollout bench waited 0.4 s a
/// write on this 2-core machine's loaded apiserver).
const PARALLEL: usize = 48;

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

/// Why a node patch failed.
#[derive(Debug, thiserror::Error)]
enum PatchError {
    /// The node changed since the pass read it.
    #[error("the node changed since the pass read it (a conflict); the next pass plans again")]
    Conflict,
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// One node's writes in a pass, in the order they go.
#[derive(Debug, Default)]
struct NodeWrites {
    /// The node patch (the record of what this pass starts and finishes).
    patch: Option<NodePatch>,
    /// Running Jobs stopped, and finished ones made again under the same name.
    clear: Vec<Action>,
    /// Job creates and evictions.
    then: Vec<Action>,
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

    /// Executes `actions`: each node's writes in order, [`PARALLEL`] nodes side by side —
    /// the node patch first, then (rarely any) running Jobs stopped and finished ones this
    /// pass makes again under the same name, then its Job creates and evictions. A node
    /// whose patch failed (a conflict: the pass saw an old node) gets none of its other
    /// actions this pass. Nodes that start work go before nodes whose patch only records a
    /// status. Then the CR-wide writes (status, finalizers), with the finished Jobs of the
    /// nodes whose patch held deleted beside them, many to a request — a finished Job whose
    /// result a failed patch was recording stays. Events are queued (see [`Events`]).
    pub async fn run(&self, actions: Vec<Action>, planned_from: &[ObservedNode]) -> PassWrites {
        let planned: HashMap<&str, &ObservedNode> =
            planned_from.iter().map(|n| (n.name.as_str(), n)).collect();
        let recreated: HashSet<String> = actions
            .iter()
            .filter_map(|a| match a {
                Action::CreateJob(req) => Some(req.name.clone()),
                _ => None,
            })
            .collect();
        let mut nodes: HashMap<String, NodeWrites> = HashMap::new();
        let mut finished: Vec<(String, String)> = Vec::new();
        let mut rest = Vec::new();
        for a in actions {
            match a {
                Action::PatchNode(p) => {
                    let node = p.node.clone();
                    nodes.entry(node).or_default().patch = Some(p);
                }
                Action::DeleteJob {
                    name,
                    node,
                    running: false,
                } if !recreated.contains(&name) => finished.push((node, name)),
                Action::DeleteJob { ref node, .. } => {
                    nodes.entry(node.clone()).or_default().clear.push(a)
                }
                Action::CreateJob(ref req) => {
                    nodes.entry(req.node.clone()).or_default().then.push(a)
                }
                Action::Evict { ref node, .. } => {
                    nodes.entry(node.clone()).or_default().then.push(a)
                }
                a => rest.push(a),
            }
        }
        let mut order: Vec<(String, NodeWrites)> = nodes.into_iter().collect();
        order.sort_by_key(|(_, w)| w.clear.is_empty() && w.then.is_empty());
        let per_node: Vec<(String, bool, Vec<anyhow::Result<()>>)> =
            stream::iter(order.into_iter().map(|(node, w)| {
                let planned = planned.get(node.as_str()).copied();
                async move { self.node_writes(node, w, planned).await }
            }))
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        let failed_nodes: HashSet<&str> = per_node
            .iter()
            .filter(|(_, patched, _)| !patched)
            .map(|(n, _, _)| n.as_str())
            .collect();
        let finished: Vec<String> = finished
            .into_iter()
            .filter(|(node, _)| !failed_nodes.contains(node.as_str()))
            .map(|(_, name)| name)
            .collect();
        let (deleted, rest) = futures::join!(self.delete_finished(&finished), self.wave(rest));
        let mut out = PassWrites::default();
        let results = per_node
            .into_iter()
            .flat_map(|(_, _, r)| r)
            .chain(deleted)
            .chain(rest.into_iter().flatten());
        for r in results {
            out.writes += 1;
            if let Err(e) = r {
                tracing::warn!("{e:#}");
                out.failures += 1;
            }
        }
        out
    }

    /// One node's writes in order; false (and nothing after it) when its patch failed.
    async fn node_writes(
        &self,
        node: String,
        w: NodeWrites,
        planned: Option<&ObservedNode>,
    ) -> (String, bool, Vec<anyhow::Result<()>>) {
        let mut results = Vec::new();
        if let Some(p) = &w.patch {
            let (sent, r) = self.patch_node(p, planned).await;
            // A conflict resolved by sending the patch again is two writes, neither failed.
            results.extend((1..sent).map(|_| Ok(())));
            let failed = r.is_err();
            results.push(r.map_err(|e| e.context(format!("node patch of {node}"))));
            if failed {
                return (node, false, results);
            }
        }
        for a in w.clear.into_iter().chain(w.then) {
            results.extend(self.one(a).await);
        }
        (node, true, results)
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

    /// Patches a node against the resourceVersion the pass planned from. When that lost a
    /// conflict and the node, read again, is the one the pass planned from in everything
    /// the planner reads (a heartbeat moved only its resourceVersion), the patch is sent
    /// once more against the new version; any other change fails it, and the next pass
    /// plans again. Returns the writes sent and the outcome.
    async fn patch_node(
        &self,
        p: &NodePatch,
        planned: Option<&ObservedNode>,
    ) -> (usize, anyhow::Result<()>) {
        let first = self.patch_at(p, &p.resource_version).await;
        let Err(PatchError::Conflict) = first else {
            return (1, first.map_err(anyhow::Error::from));
        };
        let nodes: Api<Node> = Api::all(self.client.clone());
        let fresh = match nodes.get(&p.node).await {
            Ok(mut n) => {
                crate::world::slim_node(&mut n);
                n
            }
            Err(e) => return (1, Err(anyhow::anyhow!("conflict; reading it again: {e}"))),
        };
        let seen = crate::convert::node(&fresh);
        if !planned.is_some_and(|planned| planned.same_as(&seen)) {
            return (1, Err(PatchError::Conflict.into()));
        }
        let again = self.patch_at(p, &seen.resource_version).await;
        (2, again.map_err(anyhow::Error::from))
    }

    async fn patch_at(&self, p: &NodePatch, resource_version: &str) -> Result<(), PatchError> {
        self.throttle().await;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut body = json!({"metadata": {"resourceVersion": resource_version, "annotations": p.annotations}});
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
            body["spec"]["taints"] = serde_json::to_value(taints).map_err(anyhow::Error::from)?;
        }
        let patched = match nodes
            .patch(&p.node, &PatchParams::default(), &Patch::Merge(body))
            .await
        {
            Ok(n) => n,
            Err(kube::Error::Api(s)) if s.code == 409 => return Err(PatchError::Conflict),
            Err(e) => return Err(e.into()),
        };
        self.world.patched(patched);
        Ok(())
    }

    async fn create_job(&self, req: &nodewright_planner::JobRequest) -> anyhow::Result<()> {
        self.throttle().await;
        let api: Api<Job> = Api::namespaced(self.client.clone(), &self.jobs.namespace);
        let job = jobs::build(req, &self.jobs);
        match api.create(&PostParams::default(), &job).await {
            Ok(created) => {
                tracing::info!(job = %req.name, node = %req.node, "created");
                self.world.created(&req.name, created);
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
        self.world.deleted([name]);
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
            self.world.deleted(gone.iter().map(String::as_str));
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
                self.world.evicted(&key);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 429 => {
                let now = k8s_openapi::jiff::Timestamp::now().as_second();
                self.world.eviction_refused(
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
mod tests;
