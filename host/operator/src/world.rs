//! What the operator sees: reflector caches of NodeWrights, DeploymentPolicies,
//! PluginTrustPolicies, nodes, our Jobs and every bound pod — each object slimmed to what
//! the planner reads (see docs/operator.md, "Caches") — overlaid with the operator's own
//! recent writes until the caches catch up, and the planner snapshot built from them.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Node, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Pod, PodSpec, PodStatus, Volume,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use nodewright_api::keys;
use nodewright_api::trust::PluginTrustPolicy;
use nodewright_api::v1alpha1::{DeploymentPolicy, NodeWright, NodeWrightPreview};
use nodewright_planner::{
    AgentPods, JobPlaces, ObservedNode, ObservedPod, PodPlaces, Refusal, Roster, Settings,
    Snapshot, StateCache,
};
use tokio::sync::Notify;

use crate::convert::Memo;
use crate::gates::Gates;
use crate::plugins::Plugins;

/// The caches.
#[derive(Clone)]
pub struct World {
    nodewrights: Store<NodeWright>,
    policies: Store<DeploymentPolicy>,
    trust: Store<PluginTrustPolicy>,
    nodes: Store<Node>,
    jobs: Store<Job>,
    pods: Store<Pod>,
    /// The operator's own replicas (empty without `--replica-selector`).
    replicas: Store<Pod>,
    /// Previews asked for.
    previews: Store<NodeWrightPreview>,
    /// Previews' plan Jobs (never in `jobs`: no rollout pass reads them).
    preview_jobs: Store<Job>,
    /// PodDisruptionBudgets: which evictions a preview foretells as refused.
    budgets: Store<PodDisruptionBudget>,
    /// Our own writes the caches have not shown yet.
    overlay: Arc<Mutex<Overlay>>,
    /// Evictions a PodDisruptionBudget refused, by `namespace/name`.
    refusals: Arc<Mutex<BTreeMap<String, Refusal>>>,
    /// Node states parsed by earlier passes, handed to every snapshot.
    states: Arc<StateCache>,
    /// The pods' grouping by node as earlier passes found it, handed to every snapshot.
    pod_places: Arc<PodPlaces>,
    /// The Jobs' grouping by node as earlier passes found it, handed to every snapshot.
    job_places: Arc<JobPlaces>,
    /// The node list's index as earlier passes made it, handed to every snapshot.
    roster: Arc<Roster>,
    /// Cached nodes and pods as the planner reads them.
    converted: Arc<Mutex<Converted>>,
}

/// Cached objects converted for the planner, each once per version (see [`Memo`]).
#[derive(Debug, Default)]
struct Converted {
    /// NodeWrights as [`crate::convert::bare`] reads them (their status shared).
    crs: Memo<NodeWright, nodewright_planner::Cr>,
    nodes: Memo<Node, ObservedNode>,
    /// Pods as the planner reads them (`None`: not bound), and whether each runs one of our
    /// Jobs.
    pods: Memo<Pod, (Option<ObservedPod>, bool)>,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World").finish_non_exhaustive()
    }
}

/// Writes not yet seen by the caches ("expectations"): a pass must not act on a world
/// older than its own last write.
#[derive(Debug, Default)]
struct Overlay {
    /// Nodes as our patches returned them.
    nodes: HashMap<String, Node>,
    /// Jobs we created.
    created: HashMap<String, Job>,
    /// Jobs we deleted.
    deleted: HashSet<String>,
}

fn rv(o: &impl Resource) -> u64 {
    o.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Watches `api` into a reflector store of `slim`med objects, and wakes the loop only for a
/// change the planner can see: an object added, deleted, or different once slimmed (a
/// node's heartbeat, a bumped resourceVersion alone, is not). The periodic resync pass
/// still runs; this only keeps an unchanged world from driving passes.
fn watch<K>(api: Api<K>, config: watcher::Config, slim: fn(&mut K), notify: Arc<Notify>) -> Store<K>
where
    K: Resource
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config).modify(slim)).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut seen: HashMap<String, u64> = HashMap::new();
        while let Some(ev) = stream.next().await {
            let wake = match ev {
                Ok(watcher::Event::Apply(o)) => fingerprint_changed(&mut seen, &o),
                Ok(watcher::Event::InitApply(o)) => {
                    fingerprint_changed(&mut seen, &o);
                    false
                }
                Ok(watcher::Event::Delete(o)) => {
                    seen.remove(&key_of(&o));
                    true
                }
                Ok(watcher::Event::Init) => false,
                Ok(watcher::Event::InitDone) => true,
                Err(e) => {
                    tracing::warn!("watch: {e}");
                    true
                }
            };
            if wake {
                notify.notify_one();
            }
        }
    });
    reader
}

fn key_of(o: &impl Resource) -> String {
    format!(
        "{}/{}",
        o.meta().namespace.as_deref().unwrap_or_default(),
        o.meta().name.as_deref().unwrap_or_default()
    )
}

/// Records `o`'s content (all but its resourceVersion); true when it differs from the last.
fn fingerprint_changed<K: Resource + Clone + serde::Serialize>(
    seen: &mut HashMap<String, u64>,
    o: &K,
) -> bool {
    use std::hash::{Hash, Hasher};
    let mut bare = o.clone();
    bare.meta_mut().resource_version = None;
    let mut h = std::hash::DefaultHasher::new();
    serde_json::to_vec(&bare).unwrap_or_default().hash(&mut h);
    let print = h.finish();
    seen.insert(key_of(o), print) != Some(print)
}

/// Keeps what the operator reads of a node — labels, annotations, creation time, taints,
/// `unschedulable`, the boot ID, each condition's type and status — and drops the rest
/// (images, addresses, capacity, managed fields, heartbeat times), which at thousands of
/// nodes is most of the cache and every heartbeat's only change.
pub fn slim_node(n: &mut Node) {
    n.metadata.managed_fields = None;
    if let Some(spec) = &mut n.spec {
        *spec = NodeSpec {
            taints: spec.taints.take(),
            unschedulable: spec.unschedulable,
            ..Default::default()
        };
    }
    if let Some(status) = &mut n.status {
        let boot_id = status.node_info.take().map(|i| i.boot_id);
        let conditions = status.conditions.take().map(|cs| {
            cs.into_iter()
                .map(|c| NodeCondition {
                    type_: c.type_,
                    status: c.status,
                    ..Default::default()
                })
                .collect()
        });
        *status = NodeStatus {
            conditions,
            node_info: boot_id.map(|boot_id| NodeSystemInfo {
                boot_id,
                ..Default::default()
            }),
            ..Default::default()
        };
    }
}

/// Keeps what the planner and the Job reader use of a pod — its metadata (without managed
/// fields; of its annotations only the mirror-pod mark), node, tolerations, emptyDir
/// volumes and phase, and for our agent pods the conditions and the agent container's
/// state (its termination message is the stage's result).
pub fn slim_pod(p: &mut Pod) {
    const MIRROR: &str = "kubernetes.io/config.mirror";
    let meta = &mut p.metadata;
    meta.managed_fields = None;
    if let Some(a) = &mut meta.annotations {
        a.retain(|k, _| k == MIRROR);
    }
    let ours = meta.labels.as_ref().is_some_and(keys::job::is_ours);
    if let Some(spec) = &mut p.spec {
        *spec = PodSpec {
            node_name: spec.node_name.take(),
            tolerations: spec.tolerations.take(),
            volumes: spec.volumes.take().map(|vs| {
                vs.into_iter()
                    .filter(|v| v.empty_dir.is_some())
                    .map(|v| Volume {
                        name: v.name,
                        empty_dir: v.empty_dir,
                        ..Default::default()
                    })
                    .collect()
            }),
            ..Default::default()
        };
    }
    if let Some(status) = &mut p.status {
        *status = PodStatus {
            phase: status.phase.take(),
            reason: if ours { status.reason.take() } else { None },
            conditions: if ours { status.conditions.take() } else { None },
            container_statuses: if ours {
                status.container_statuses.take().map(|cs| {
                    cs.into_iter()
                        .filter(|c| c.name == crate::jobs::CONTAINER)
                        .collect()
                })
            } else {
                None
            },
            ..Default::default()
        };
    }
}

/// Job objects are kept whole (the operator's own, a handful per node at work).
fn keep<K>(_: &mut K) {}

/// Our pods by the Job that made them: `pods` grouped by [`job_of`].
fn pods_by_job<'p>(pods: impl IntoIterator<Item = &'p Pod>) -> HashMap<&'p str, Vec<&'p Pod>> {
    let mut by_job: HashMap<&str, Vec<&Pod>> = HashMap::new();
    for p in pods {
        if let Some(j) = job_of(p) {
            by_job.entry(j).or_default().push(p);
        }
    }
    by_job
}

/// The Job `pod` runs for, when it is one of ours: the `job-name` label the Job controller
/// sets (another namespace's Job of the same name is not ours).
fn job_of(pod: &Pod) -> Option<&str> {
    let labels = pod.metadata.labels.as_ref()?;
    keys::job::is_ours(labels)
        .then(|| labels.get("job-name"))
        .flatten()
        .map(String::as_str)
}

/// `job`'s pods in [`pods_by_job`]'s grouping.
fn pods_of<'a>(by_job: &'a HashMap<&str, Vec<&'a Pod>>, job: &Job) -> &'a [&'a Pod] {
    by_job
        .get(job.metadata.name.as_deref().unwrap_or_default())
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// NodeWrights and policies are kept whole but for their managed fields.
fn slim_meta<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

impl World {
    /// A node as our patch returned it: passes see it until the cache catches up.
    pub fn patched(&self, mut node: Node) {
        slim_node(&mut node);
        let name = node.metadata.name.clone().unwrap_or_default();
        self.overlay().nodes.insert(name, node);
    }

    /// A Job we created: passes see it until the cache does.
    pub fn created(&self, name: &str, job: Job) {
        self.overlay().created.insert(name.to_string(), job);
    }

    /// Jobs we deleted: passes no longer see them, though the cache still may.
    pub fn deleted<'n>(&self, names: impl IntoIterator<Item = &'n str>) {
        let mut overlay = self.overlay();
        for name in names {
            overlay.created.remove(name);
            overlay.deleted.insert(name.to_string());
        }
    }

    /// The eviction of pod `key` (`namespace/name`) went through: any refusal is over.
    pub fn evicted(&self, key: &str) {
        self.refusals.lock().expect("refusals lock").remove(key);
    }

    /// A PodDisruptionBudget refused the eviction of pod `key`; the planner waits before
    /// asking again.
    pub fn eviction_refused(&self, key: String, refusal: Refusal) {
        self.refusals
            .lock()
            .expect("refusals lock")
            .insert(key, refusal);
    }

    fn overlay(&self) -> std::sync::MutexGuard<'_, Overlay> {
        self.overlay.lock().expect("overlay lock")
    }

    /// A world with no watches and nothing in it, for the executor's tests.
    #[cfg(test)]
    pub fn empty() -> World {
        World {
            nodewrights: reflector::store().0,
            policies: reflector::store().0,
            trust: reflector::store().0,
            nodes: reflector::store().0,
            jobs: reflector::store().0,
            pods: reflector::store().0,
            replicas: reflector::store().0,
            previews: reflector::store().0,
            preview_jobs: reflector::store().0,
            budgets: reflector::store().0,
            overlay: Arc::default(),
            refusals: Arc::default(),
            states: Arc::default(),
            pod_places: Arc::default(),
            job_places: Arc::default(),
            roster: Arc::default(),
            converted: Arc::default(),
        }
    }

    /// Starts the watches and waits for the first list of each.
    pub async fn start(
        client: Client,
        namespace: &str,
        replica_selector: Option<&str>,
        notify: Arc<Notify>,
    ) -> anyhow::Result<World> {
        // Our Jobs only, by label; pods only once bound to a node (the planner reads pods
        // by node: drains, barriers, our agents' results).
        let jobs_cfg = watcher::Config::default().labels(&format!("{}=true", keys::job::MANAGED));
        let preview_jobs_cfg = watcher::Config::default().labels(&format!(
            "{}={}",
            keys::job::MANAGED,
            keys::job::MANAGED_PREVIEW
        ));
        let pods_cfg = watcher::Config::default().fields("spec.nodeName!=");
        let all = watcher::Config::default;
        let world = World {
            nodewrights: watch(Api::all(client.clone()), all(), slim_meta, notify.clone()),
            policies: watch(Api::all(client.clone()), all(), slim_meta, notify.clone()),
            trust: watch(Api::all(client.clone()), all(), slim_meta, notify.clone()),
            nodes: watch(Api::all(client.clone()), all(), slim_node, notify.clone()),
            jobs: watch(
                Api::namespaced(client.clone(), namespace),
                jobs_cfg,
                keep,
                notify.clone(),
            ),
            pods: watch(Api::all(client.clone()), pods_cfg, slim_pod, notify.clone()),
            previews: watch(Api::all(client.clone()), all(), slim_meta, notify.clone()),
            preview_jobs: watch(
                Api::namespaced(client.clone(), namespace),
                preview_jobs_cfg,
                keep,
                notify.clone(),
            ),
            budgets: watch(Api::all(client.clone()), all(), slim_meta, notify.clone()),
            // A handful of pods, kept whole: where each runs and whether it is ready.
            replicas: match replica_selector {
                Some(s) => watch(
                    Api::namespaced(client, namespace),
                    watcher::Config::default().labels(s),
                    keep,
                    notify,
                ),
                None => reflector::store().0,
            },
            overlay: Arc::default(),
            refusals: Arc::default(),
            states: Arc::default(),
            pod_places: Arc::default(),
            job_places: Arc::default(),
            roster: Arc::default(),
            converted: Arc::default(),
        };
        world.nodewrights.wait_until_ready().await?;
        world.policies.wait_until_ready().await?;
        world.trust.wait_until_ready().await?;
        world.nodes.wait_until_ready().await?;
        world.jobs.wait_until_ready().await?;
        world.pods.wait_until_ready().await?;
        world.previews.wait_until_ready().await?;
        world.preview_jobs.wait_until_ready().await?;
        world.budgets.wait_until_ready().await?;
        if replica_selector.is_some() {
            world.replicas.wait_until_ready().await?;
        }
        Ok(world)
    }

    /// Every succeeded Job of ours the cache shows: its name, what it did, and its seconds
    /// from start to completion.
    pub fn succeeded_jobs(&self) -> Vec<(String, nodewright_planner::Work, i64)> {
        self.jobs
            .state()
            .iter()
            .filter_map(|j| {
                let status = j.status.as_ref()?;
                let (start, end) = (
                    status.start_time.as_ref()?,
                    status.completion_time.as_ref()?,
                );
                let seconds = end.0.as_second() - start.0.as_second();
                let work = crate::jobs::read(j, &[])?.work;
                Some((j.metadata.name.clone()?, work, seconds))
            })
            .collect()
    }

    /// The previews asked for.
    pub fn previews(&self) -> Vec<Arc<NodeWrightPreview>> {
        self.previews.state()
    }

    /// The plan Jobs of preview `name`, read as the planner reads a rollout's (their pods'
    /// results included), and how many of every preview's run now.
    pub fn preview_jobs(&self, name: &str) -> (Vec<nodewright_planner::ObservedJob>, usize) {
        let jobs = self.preview_jobs.state();
        let pods = self.pods.state();
        let running = jobs
            .iter()
            .filter(|j| {
                j.status
                    .as_ref()
                    .and_then(|s| s.completion_time.as_ref())
                    .is_none()
            })
            .filter(|j| {
                !j.status
                    .iter()
                    .flat_map(|s| s.conditions.iter().flatten())
                    .any(|c| c.type_ == "Failed" && c.status == "True")
            })
            .count();
        let of_preview = |j: &&Arc<Job>| {
            j.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(keys::job::PREVIEW))
                .is_some_and(|p| p == name)
        };
        let by_job = pods_by_job(pods.iter().map(|p| &**p));
        let read = jobs
            .iter()
            .filter(of_preview)
            .filter_map(|j| crate::jobs::read(j, pods_of(&by_job, j)))
            .collect();
        (read, running)
    }

    /// Pods (`namespace/name`) a PodDisruptionBudget would refuse to evict now: those its
    /// selector picks while it allows no disruption.
    pub fn budget_blocked(&self) -> std::collections::BTreeSet<String> {
        let pods = self.pods.state();
        let mut blocked = std::collections::BTreeSet::new();
        for b in self.budgets.state().iter() {
            let allowed = b
                .status
                .as_ref()
                .and_then(|s| s.disruptions_allowed)
                .unwrap_or(0);
            let Some(selector) = b.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
                continue;
            };
            if allowed > 0 {
                continue;
            }
            let ns = b.metadata.namespace.as_deref().unwrap_or_default();
            for p in pods.iter() {
                let labels = p.metadata.labels.clone().unwrap_or_default();
                if p.metadata.namespace.as_deref() == Some(ns)
                    && !keys::job::is_ours(&labels)
                    && nodewright_planner::select::matches(Some(selector), &labels)
                {
                    blocked.insert(format!(
                        "{ns}/{}",
                        p.metadata.name.as_deref().unwrap_or_default()
                    ));
                }
            }
        }
        blocked
    }

    /// The PluginTrustPolicies.
    pub fn trust_policies(&self) -> Store<PluginTrustPolicy> {
        self.trust.clone()
    }

    /// A NodeWright by name.
    pub fn nodewright(&self, name: &str) -> Option<Arc<NodeWright>> {
        self.nodewrights
            .state()
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
    }

    /// `node name → value` of annotation `key`, on the nodes that carry it.
    pub fn node_annotations(&self, key: &str) -> BTreeMap<String, String> {
        self.nodes
            .state()
            .iter()
            .filter_map(|n| {
                Some((
                    n.metadata.name.clone()?,
                    n.metadata.annotations.as_ref()?.get(key)?.clone(),
                ))
            })
            .collect()
    }

    /// Whether `node` carries a fence mark for the operator's replicas
    /// (`nodewright.io/fence-operator.<cr>`): a rollout reboots it once they are out.
    pub fn fences_operator(&self, node: &str) -> bool {
        self.nodes
            .get(&reflector::ObjectRef::new(node))
            .is_some_and(|n| {
                n.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| keys::fences_operator(a.keys()))
            })
    }

    /// The planner's snapshot, with our unseen writes applied and seen ones forgotten.
    pub fn snapshot(
        &self,
        settings: &Settings,
        plugins: &Plugins,
        gates: &Gates,
        agent_pods: AgentPods,
    ) -> Snapshot {
        let snapshot = self.snapshot_with(settings, agent_pods, |cr| {
            crate::convert::cr(cr, plugins, gates)
        });
        gates.keep(
            &snapshot
                .nodewrights
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
        );
        snapshot
    }

    /// [`World::snapshot`] with each NodeWright, as [`crate::convert::bare`] reads it,
    /// finished by `cr`: the operator's loop adds its plugin checks and health gates, a
    /// preview what the NodeWrights' status recorded.
    // Long on purpose: the overlay rules (seen writes forgotten, unseen ones applied)
    // beside the conversion they adjust.
    pub fn snapshot_with(
        &self,
        settings: &Settings,
        agent_pods: AgentPods,
        cr: impl Fn(nodewright_planner::Cr) -> nodewright_planner::Cr,
    ) -> Snapshot {
        // A cached node or pod is converted once per version (`Memo`); what our overlay
        // replaces is converted for this pass, and a Job only copied when marked stopping.
        let mut converted = self.converted.lock().expect("conversions lock");
        let converted = &mut *converted;
        let mut overlay = self.overlay();
        let nodes: Vec<ObservedNode> = self
            .nodes
            .state()
            .iter()
            .map(|n| {
                let name = n.metadata.name.as_deref().unwrap_or_default();
                match overlay.nodes.get(name) {
                    Some(ours) if rv(ours) > rv(&**n) => crate::convert::node(ours),
                    seen => {
                        if seen.is_some() {
                            overlay.nodes.remove(name);
                        }
                        converted.nodes.get(n, crate::convert::node)
                    }
                }
            })
            .collect();
        converted.nodes.finish();
        // In the order a rollout takes them (creation time, then name; the caches hand them
        // over in hash order): a pass walks its per-node data front to back, and at
        // thousands of nodes hash order made each step of it a cache miss.
        let nodes = crate::convert::in_rollout_order(nodes);
        let cached_jobs = self.jobs.state();
        let mut jobs: Vec<Cow<'_, Job>> = cached_jobs.iter().map(|j| Cow::Borrowed(&**j)).collect();
        let cached: HashSet<&str> = cached_jobs
            .iter()
            .filter_map(|j| j.metadata.name.as_deref())
            .collect();
        overlay
            .created
            .retain(|name, _| !cached.contains(name.as_str()));
        overlay
            .deleted
            .retain(|name| cached.contains(name.as_str()));
        // A Job we deleted and the cache still shows is stopping: it no longer counts as
        // work, but it holds its node until it is gone.
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        for j in &mut jobs {
            if j.metadata
                .name
                .as_ref()
                .is_some_and(|n| overlay.deleted.contains(n))
                && j.metadata.deletion_timestamp.is_none()
            {
                j.to_mut().metadata.deletion_timestamp = Some(now.clone());
            }
        }
        jobs.extend(overlay.created.values().cloned().map(Cow::Owned));
        drop(overlay);

        // Each pod's conversion, and whether it runs one of our Jobs, once per version:
        // looking for the Job's label on every pod every pass was most of a pass.
        let cached_pods = self.pods.state();
        let mut pods = Vec::with_capacity(cached_pods.len());
        let mut agents = Vec::new();
        for p in &cached_pods {
            let (observed, agent) = converted
                .pods
                .get(p, |p| (crate::convert::pod(p), job_of(p).is_some()));
            pods.extend(observed);
            if agent {
                agents.push(&**p);
            }
        }
        converted.pods.finish();
        let by_job = pods_by_job(agents);
        // A refusal is kept while its pod is in the cache (looked up by key: the refusals
        // are few, the pods many).
        let mut refusals = self.refusals.lock().expect("refusals lock");
        refusals.retain(|k, _| {
            k.split_once('/').is_some_and(|(ns, name)| {
                self.pods
                    .get(&reflector::ObjectRef::new(name).within(ns))
                    .is_some()
            })
        });
        let nodewrights: Vec<nodewright_planner::Cr> = self
            .nodewrights
            .state()
            .iter()
            .map(|n| cr(converted.crs.get(n, crate::convert::bare)))
            .collect();
        converted.crs.finish();
        Snapshot {
            nodewrights,
            policies: self
                .policies
                .state()
                .iter()
                .filter_map(|p| Some((p.metadata.name.clone()?, p.spec.clone())))
                .collect(),
            nodes,
            jobs: jobs
                .iter()
                .filter_map(|j| crate::jobs::read(j, pods_of(&by_job, j)))
                .collect(),
            pods,
            refusals: refusals.clone(),
            settings: settings.clone(),
            states: self.states.clone(),
            pod_places: self.pod_places.clone(),
            job_places: self.job_places.clone(),
            roster: self.roster.clone(),
            agent_pods,
            replicas: self
                .replicas
                .state()
                .iter()
                .filter_map(|p| crate::convert::replica(p))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests;
