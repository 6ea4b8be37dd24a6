//! Kubernetes objects → the planner's snapshot types.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use nodewright_api::keys;
use nodewright_api::v1alpha1::NodeWright;
use nodewright_planner::select;

use crate::gates::Gates;
use crate::plugins::Plugins;

/// A NodeWright as the planner sees it ([`bare`]), with its plugin verdict and its failing
/// health gates.
pub fn cr(
    bare: nodewright_planner::Cr,
    plugins: &Plugins,
    gates: &Gates,
) -> nodewright_planner::Cr {
    let mut cr = bare;
    cr.plugins = plugins.get(&cr.name, &cr.uid, cr.generation, &cr.spec);
    cr.failing_gates = gates.failing(
        &cr.name,
        cr.spec
            .health_gates
            .as_ref()
            .and_then(|g| g.prometheus.as_ref()),
    );
    cr
}

/// A NodeWright ([`bare`]) as its status recorded it, for a preview: the plugins its last
/// check pinned (`status.resolvedPlugins`), no health gate failing (a preview asks no
/// Prometheus).
pub fn cr_as_recorded(bare: nodewright_planner::Cr) -> nodewright_planner::Cr {
    let mut cr = bare;
    let pinned: std::collections::BTreeMap<_, _> = cr
        .status
        .resolved_plugins
        .iter()
        .filter_map(|(p, r)| Some((p.clone(), r.parse().ok()?)))
        .collect();
    cr.plugins = nodewright_planner::PluginCheck::Ready(pinned.into());
    cr
}

/// Everything of a NodeWright but its plugin verdict and health gates (the parts that
/// change without the object changing).
pub fn bare(nw: &NodeWright) -> nodewright_planner::Cr {
    let meta = &nw.metadata;
    let flag = |k: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .is_some_and(|v| v == "true")
    };
    let mut spec = nw.spec.clone();
    nodewright_api::validate::default_nodewright(&mut spec);
    nodewright_planner::Cr {
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        generation: meta.generation.unwrap_or(0),
        spec,
        status: nw.status.clone().unwrap_or_default().into(),
        paused: flag(keys::PAUSE),
        disabled: flag(keys::DISABLE),
        deleting: meta.deletion_timestamp.is_some(),
        has_finalizer: meta
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == keys::FINALIZER),
        ..Default::default()
    }
}

/// A node.
pub fn node(n: &Node) -> nodewright_planner::ObservedNode {
    let meta = &n.metadata;
    nodewright_planner::ObservedNode::new(nodewright_planner::NodeFacts {
        name: meta.name.clone().unwrap_or_default(),
        created: meta
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second())
            .unwrap_or(0),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta.annotations.clone().unwrap_or_default(),
        unschedulable: n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
        taints: n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default(),
        boot_id: n
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.clone())
            .unwrap_or_default(),
        conditions: n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|cs| {
                cs.iter()
                    .map(|c| (c.type_.clone(), c.status.clone()))
                    .collect()
            })
            .unwrap_or_default(),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
    })
}

/// `nodes` sorted by [`nodewright_planner::NodeFacts::rollout_key`], on a contiguous copy of
/// the keys, so the comparisons do not reach into every node's heap object.
pub fn in_rollout_order(
    nodes: Vec<nodewright_planner::ObservedNode>,
) -> Vec<nodewright_planner::ObservedNode> {
    let mut keyed: Vec<((i64, &str), usize)> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.rollout_key(), i))
        .collect();
    keyed.sort_unstable();
    let order: Vec<usize> = keyed.into_iter().map(|(_, i)| i).collect();
    let mut slots: Vec<Option<nodewright_planner::ObservedNode>> =
        nodes.into_iter().map(Some).collect();
    order
        .into_iter()
        .map(|i| slots[i].take().expect("each node once"))
        .collect()
}

/// A pod bound to a node.
pub fn pod(p: &Pod) -> Option<nodewright_planner::ObservedPod> {
    let spec = p.spec.as_ref()?;
    let node = spec.node_name.clone()?;
    let meta = &p.metadata;
    let phase = p
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    // Built once: a pass converts every bound pod.
    static CORDON: std::sync::LazyLock<Taint> = std::sync::LazyLock::new(|| Taint {
        key: "node.kubernetes.io/unschedulable".into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    });
    Some(nodewright_planner::ObservedPod::new(
        nodewright_planner::PodFacts {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            node,
            labels: meta.labels.clone().unwrap_or_default(),
            active: matches!(phase, "Pending" | "Running" | "Unknown"),
            terminating: meta.deletion_timestamp.is_some(),
            controller: meta
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .map(|o| o.kind.clone()),
            mirror: meta
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror")),
            empty_dir: spec.volumes.iter().flatten().any(|v| v.empty_dir.is_some()),
            tolerates_unschedulable: spec
                .tolerations
                .iter()
                .flatten()
                .any(|t| select::tolerates(t, &CORDON)),
            ours: meta.labels.as_ref().is_some_and(keys::job::is_ours),
        },
    ))
}

/// One of the operator's replicas, once bound to a node.
pub fn replica(p: &Pod) -> Option<nodewright_planner::Replica> {
    let ready = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    Some(nodewright_planner::Replica {
        pod: p.metadata.name.clone()?,
        node: p.spec.as_ref()?.node_name.clone()?,
        ready: ready && p.metadata.deletion_timestamp.is_none(),
    })
}

/// Each cached object's conversion, kept while the cache holds that same object.
///
/// A reflector cache hands its objects out as `Arc`s and puts a new `Arc` in when an object
/// changes, so an `Arc` this memo holds names one version of one object: its conversion is
/// reused, and a snapshot's copy of it is a reference count (converting every cached node
/// and pod again for each pass was most of a pass at thousands of nodes). An entry that a
/// pass does not ask for — its object changed or left the cache — is dropped when the pass
/// ends ([`Memo::finish`]).
#[derive(Debug)]
pub struct Memo<K, V> {
    /// By the address of the cache's `Arc`, which the entry holds: the address cannot name
    /// another object while the entry lives.
    last: HashMap<usize, (Arc<K>, V)>,
    /// What this pass asked for.
    next: HashMap<usize, (Arc<K>, V)>,
}

impl<K, V> Default for Memo<K, V> {
    fn default() -> Self {
        Memo {
            last: HashMap::new(),
            next: HashMap::new(),
        }
    }
}

impl<K, V: Clone> Memo<K, V> {
    /// `object` converted: the earlier conversion of this same object, or `convert`'s.
    pub fn get(&mut self, object: &Arc<K>, convert: impl FnOnce(&K) -> V) -> V {
        let key = Arc::as_ptr(object) as usize;
        let (held, converted) = match self.last.remove(&key) {
            Some(entry) => entry,
            None => (Arc::clone(object), convert(object)),
        };
        self.next.insert(key, (held, converted.clone()));
        converted
    }

    /// Ends a pass: what it did not ask for is forgotten.
    pub fn finish(&mut self) {
        self.last = std::mem::take(&mut self.next);
    }

    /// How many objects the last pass converted or reused.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.last.len()
    }
}
