//! What a pass works with besides the CR and the node: the node's annotations and cordon as
//! the pass has left them ([`NodeWork`]), and the CR-wide inputs of a node's pass ([`Env`]).
//! What a pass knows per node it keeps by the node's place in the snapshot (`PerNode`),
//! finding a node by name once ([`NodeIndex`]).

use std::cell::{OnceCell, Ref, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Taint;
use nodewright_api::keys::{self, CrKeys, CrMark};
use nodewright_api::pinned::PinnedRef;
use nodewright_api::v1alpha1::Status;

use crate::action::NodePatch;
use crate::cordon::{self, Mark, NodeCordon};
use crate::hold::Hold;
use crate::places::Grouping;
use crate::roster::NodeIndex;
use crate::snapshot::{ObservedNode, Refusal, Settings};

/// A node's annotations and cordon as this pass has left them: the snapshot's, overlaid
/// with the write that gets there (nothing is copied until it changes).
#[derive(Clone, Debug)]
pub struct NodeWork<'a> {
    node: &'a ObservedNode,
    /// Current `spec.unschedulable`.
    pub unschedulable: bool,
    /// The write, as far as the pass has got: what it changes, `None` until it changes
    /// something. Its node and resourceVersion are filled in by [`NodeWork::into_patch`]. Most
    /// nodes have nothing to write, and every sweep of a pass reads each node's work: kept
    /// behind a pointer, a node's work is three words, not a whole patch (at 10,000 nodes,
    /// 240 KB against 1.4 MB, which a sweep no longer finds in the core's L2 cache).
    patch: Option<Box<NodePatch>>,
}

impl<'a> NodeWork<'a> {
    /// Starts from the snapshot: `node`, whose `spec.unschedulable` is `unschedulable` (as
    /// the pass's index read it: see `roster`).
    pub fn new(node: &'a ObservedNode, unschedulable: bool) -> Self {
        NodeWork {
            node,
            unschedulable,
            patch: None,
        }
    }

    /// The write the pass decided on, addressed to the node as observed: `None` when there
    /// is nothing to write.
    pub fn into_patch(self) -> Option<NodePatch> {
        let patch = *self.patch?;
        (!patch.is_empty()).then(|| NodePatch {
            node: self.node.name.clone(),
            resource_version: self.node.resource_version.clone(),
            ..patch
        })
    }

    /// The write, started on the first change.
    fn patch_mut(&mut self) -> &mut NodePatch {
        self.patch.get_or_insert_default()
    }

    /// What the pass has written to annotation `key` (`Some(None)`: removed it).
    fn written(&self, key: &str) -> Option<&Option<String>> {
        self.patch.as_ref()?.annotations.get(key)
    }

    /// The annotation keys the pass has written.
    fn written_keys(&self) -> impl Iterator<Item = &String> {
        self.patch.iter().flat_map(|p| p.annotations.keys())
    }

    /// An annotation's current value.
    pub fn get(&self, key: &str) -> Option<&str> {
        match self.written(key) {
            Some(v) => v.as_deref(),
            None => self.node.annotations.get(key).map(String::as_str),
        }
    }

    /// Whether annotation `key` is as the node was observed: this pass has not written it.
    pub fn observed(&self, key: &str) -> bool {
        self.written(key).is_none()
    }

    /// Sets (`Some`) or removes (`None`) an annotation, recording the change if it is one.
    pub fn set(&mut self, key: &str, value: Option<String>) {
        if self.get(key) == value.as_deref() {
            return;
        }
        if self.node.annotations.get(key) == value.as_ref() {
            if let Some(p) = &mut self.patch {
                p.annotations.remove(key);
            }
        } else {
            self.patch_mut().annotations.insert(key.into(), value);
        }
    }

    /// Adds `taint` to the node, unless the pass already adds one with its key; whether it
    /// did.
    pub fn add_taint(&mut self, taint: Taint) -> bool {
        let adds = &mut self.patch_mut().add_taints;
        if adds.iter().any(|t| t.key == taint.key) {
            return false;
        }
        adds.push(taint);
        true
    }

    /// Removes the taints with `key` from the node.
    pub fn remove_taint(&mut self, key: &str) {
        self.patch_mut().remove_taints.push(key.into());
    }

    /// Whether some CR's [`keys::CrMark::FenceOperator`] is on the node, as this pass has
    /// left it.
    pub fn fences_operator(&self) -> bool {
        let mut keys = self.node.annotations.keys().chain(self.written_keys());
        keys.any(|k| {
            matches!(CrMark::parse(k), Some((CrMark::FenceOperator, _))) && self.get(k).is_some()
        })
    }

    /// Sets `spec.unschedulable`.
    pub fn cordon(&mut self, on: bool) {
        if self.unschedulable != on {
            self.unschedulable = on;
            self.patch_mut().unschedulable = Some(on);
        }
    }

    /// The cordon marks every CR holds on this node.
    pub fn cordons(&self) -> NodeCordon {
        const PREFIX: &str = "nodewright.io/cordon.";
        let keys = self
            .node
            .annotations
            .range::<str, _>((
                std::ops::Bound::Included(PREFIX),
                std::ops::Bound::Unbounded,
            ))
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(PREFIX))
            .chain(self.written_keys().filter(|k| k.starts_with(PREFIX)));
        let owners = keys
            .filter_map(|k| {
                Some((
                    k.strip_prefix(PREFIX)?.to_string(),
                    Mark::parse(self.get(k)?),
                ))
            })
            .collect();
        NodeCordon {
            unschedulable: self.unschedulable,
            owners,
        }
    }

    fn apply(&mut self, actions: Vec<cordon::Action>) {
        for a in actions {
            match a {
                cordon::Action::Cordon => self.cordon(true),
                cordon::Action::Uncordon => self.cordon(false),
                cordon::Action::Mark(cr, m) => {
                    self.set(&keys::cordon(&cr), Some(m.as_str().into()))
                }
                cordon::Action::Unmark(cr) => self.set(&keys::cordon(&cr), None),
            }
        }
    }

    /// Takes (or shares) the cordon for the CR whose marks are `marks`, with Karpenter told
    /// to leave the node alone. True when the cordon was already persisted, so the drain
    /// may begin.
    pub(crate) fn acquire(&mut self, marks: &CrMarks<'_>) -> bool {
        // Held already on a cordoned node, Karpenter told — every pass of a node at work —
        // the cordon rule answers "ready, nothing to write" (`NodeCordon::acquire`): asked
        // of the marks as read, without collecting every CR's or searching the annotations.
        let kept = marks.on(self.node, self);
        let ready = if self.unschedulable && kept.cordon {
            true
        } else {
            let acquired = self.cordons().acquire(marks.keys().cr());
            self.apply(acquired.actions);
            acquired.ready_to_drain
        };
        if !kept.karpenter {
            let missing = KARPENTER.map(|key| self.get(key).is_none());
            let mut owned: Vec<String> = self
                .get(keys::KARPENTER_OWNED)
                .map(|v| v.split(',').map(String::from).collect())
                .unwrap_or_default();
            for key in KARPENTER
                .iter()
                .zip(missing)
                .filter_map(|(k, m)| m.then_some(*k))
            {
                self.set(key, Some("true".into()));
                owned.push(key.into());
            }
            if !owned.is_empty() {
                self.set(keys::KARPENTER_OWNED, Some(owned.join(",")));
            }
        }
        ready
    }

    /// Drops the cordon of the CR whose keys are `keys`; uncordons when it was the last one
    /// and ours; removes the Karpenter annotations we added once no CR holds the node.
    pub fn release(&mut self, keys: &CrKeys) {
        let mut actions = self.cordons().release(keys.cr());
        if self.get(keys::RUNTIME_REQUIRED_CORDON).is_some() {
            // The runtime-required cordon outlives every rollout; only an admin lifts it.
            actions.retain(|a| *a != cordon::Action::Uncordon);
        }
        self.apply(actions);
        self.set(keys.get(CrMark::DrainStart), None);
        self.set(keys.get(CrMark::DrainBlocked), None);
        if self.cordons().owners.is_empty()
            && let Some(owned) = self.get(keys::KARPENTER_OWNED).map(String::from)
        {
            for key in owned.split(',') {
                self.set(key, None);
            }
            self.set(keys::KARPENTER_OWNED, None);
        }
    }
}

/// One value per node of a pass's snapshot, found by the node itself: a `Vec` in snapshot
/// order, indexed by the node's place in the snapshot's node slice. At thousands of nodes a
/// pass looks a node up a few dozen times; keyed by name, every lookup hashed and compared
/// the name, and the maps' scattered entries were a third of a pass.
#[derive(Debug)]
pub(crate) struct PerNode<'a, T> {
    nodes: &'a [ObservedNode],
    values: Vec<T>,
}

impl<'a, T> PerNode<'a, T> {
    /// A value for each of `nodes`, as `value` makes it.
    pub(crate) fn with(
        nodes: &'a [ObservedNode],
        value: impl FnMut(&'a ObservedNode) -> T,
    ) -> Self {
        PerNode {
            nodes,
            values: nodes.iter().map(value).collect(),
        }
    }

    /// The default value for each of `nodes`.
    pub(crate) fn new(nodes: &'a [ObservedNode]) -> Self
    where
        T: Default,
    {
        Self::with(nodes, |_| T::default())
    }

    fn place(&self, node: &ObservedNode) -> usize {
        place(self.nodes, node)
    }

    /// Each node with its value, in snapshot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'a ObservedNode, &T)> {
        self.nodes.iter().zip(&self.values)
    }

    /// The values, in snapshot order.
    pub(crate) fn values(&self) -> &[T] {
        &self.values
    }

    fn into_values(self) -> std::vec::IntoIter<T> {
        self.values.into_iter()
    }
}

/// Items grouped by node, as a [`Grouping`] of their indexes has them: each node's in the
/// order the snapshot lists them. A pass groups every bound pod this way, and keeps the
/// grouping across passes (`PodPlaces`).
#[derive(Debug)]
pub(crate) struct Grouped<'a, T> {
    nodes: &'a [ObservedNode],
    items: &'a [T],
    grouping: Arc<Grouping>,
}

impl<'a, T> Grouped<'a, T> {
    /// `items` by node, as `grouping` (of these items among these nodes) has them.
    pub(crate) fn new(nodes: &'a [ObservedNode], items: &'a [T], grouping: Arc<Grouping>) -> Self {
        Grouped {
            nodes,
            items,
            grouping,
        }
    }

    /// `node`'s items.
    pub(crate) fn of(&self, node: &ObservedNode) -> Vec<&'a T> {
        self.indexed(node).map(|(_, item)| item).collect()
    }

    /// `node`'s items, each with its index in the snapshot's list.
    pub(crate) fn indexed(
        &self,
        node: &ObservedNode,
    ) -> impl Iterator<Item = (usize, &'a T)> + use<'_, 'a, T> {
        let items = self.items;
        let at = self.grouping.at(place(self.nodes, node));
        at.iter().map(move |&i| (i as usize, &items[i as usize]))
    }
}

/// Where `node` is in `nodes`. Every node a pass handles is one of its snapshot's (found by
/// address, so a copy of a node is a planner bug, not a lookup miss).
pub(crate) fn place(nodes: &[ObservedNode], node: &ObservedNode) -> usize {
    nodes
        .element_offset(node)
        .expect("a node of the pass's own snapshot")
}

impl<T> std::ops::Index<&ObservedNode> for PerNode<'_, T> {
    type Output = T;

    fn index(&self, node: &ObservedNode) -> &T {
        &self.values[self.place(node)]
    }
}

impl<T> std::ops::IndexMut<&ObservedNode> for PerNode<'_, T> {
    fn index_mut(&mut self, node: &ObservedNode) -> &mut T {
        let at = self.place(node);
        &mut self.values[at]
    }
}

/// Every node's [`NodeWork`] for a pass, found by the node (by its place in the snapshot).
#[derive(Debug)]
pub struct Works<'a> {
    work: PerNode<'a, NodeWork<'a>>,
}

impl<'a> Works<'a> {
    /// Each node's work as the snapshot has it (its cordon as `index` read it).
    pub fn new(index: &NodeIndex<'a>) -> Self {
        let work = PerNode::with(index.nodes(), |node| {
            NodeWork::new(node, index.brief(node).unschedulable)
        });
        Works { work }
    }

    /// The writes the pass decided on, in no particular order.
    pub fn into_patches(self) -> impl Iterator<Item = NodePatch> + 'a {
        self.work.into_values().filter_map(NodeWork::into_patch)
    }
}

impl<'a> std::ops::Index<&ObservedNode> for Works<'a> {
    type Output = NodeWork<'a>;

    /// `node`'s work.
    fn index(&self, node: &ObservedNode) -> &NodeWork<'a> {
        &self.work[node]
    }
}

impl std::ops::IndexMut<&ObservedNode> for Works<'_> {
    /// `node`'s work, to change.
    fn index_mut(&mut self, node: &ObservedNode) -> &mut Self::Output {
        &mut self.work[node]
    }
}

/// The nodes whose operator replicas are being fenced, as the pass has left them, shared by
/// every CR's pass over them (see [`crate::hold::fence`]). Found from the snapshot's
/// annotations when first asked for or changed: only a node about to reboot asks, and a
/// pass that reboots nothing — most passes — never reads every node's annotations for it
/// (at 10,000 nodes that sweep was 4 % of a steady pass).
#[derive(Clone, Debug)]
pub struct Fencing<'a>(Rc<LazyFencing<'a>>);

#[derive(Debug)]
struct LazyFencing<'a> {
    nodes: &'a [ObservedNode],
    set: OnceCell<RefCell<BTreeSet<String>>>,
}

impl<'a> Fencing<'a> {
    /// The fencing nodes among `nodes`, when first asked.
    pub(crate) fn new(nodes: &'a [ObservedNode]) -> Self {
        Fencing(Rc::new(LazyFencing {
            nodes,
            set: OnceCell::new(),
        }))
    }

    fn set(&self) -> &RefCell<BTreeSet<String>> {
        let nodes = self.0.nodes;
        self.0.set.get_or_init(|| {
            let fencing = nodes
                .iter()
                .filter(|n| keys::fences_operator(n.annotations.keys()))
                .map(|n| n.name.clone());
            RefCell::new(fencing.collect())
        })
    }

    /// The fencing nodes' names.
    pub fn names(&self) -> Ref<'_, BTreeSet<String>> {
        self.set().borrow()
    }

    /// `node` has started fencing.
    pub fn insert(&self, node: &str) {
        self.set().borrow_mut().insert(node.to_string());
    }

    /// `node` has stopped fencing.
    pub fn remove(&self, node: &str) {
        self.set().borrow_mut().remove(node);
    }
}

/// What the planner needs besides the CR and node.
#[derive(Debug)]
pub struct Env<'a> {
    /// Settings.
    pub settings: &'a Settings,
    /// Clock (unix seconds).
    pub now: i64,
    /// Refused evictions.
    pub refusals: &'a BTreeMap<String, Refusal>,
    /// Pinned plugin per package.
    pub pinned: &'a BTreeMap<String, PinnedRef>,
    /// Payloads from container images per package, pinned.
    pub images: &'a BTreeMap<String, Vec<nodewright_api::payload::ImagePayload>>,
    /// Config digests per package.
    pub digests: &'a crate::packages::Digests,
    /// The CR's node annotations' keys, and its marks on each node as read.
    pub(crate) marks: &'a CrMarks<'a>,
    /// What a node that has not started may begin (windows, gates).
    pub hold: Hold,
    /// Each batch member's rollout order (see [`crate::JobRequest::node_order`]).
    pub(crate) orders: &'a PerNode<'a, Option<u32>>,
    /// The operator's replicas (a reboot of the last ready one's node waits).
    pub replicas: &'a [crate::snapshot::Replica],
    /// The nodes whose operator replicas are being fenced before a reboot, as this pass
    /// has left them (one node at a time, whichever CR reboots it).
    pub fencing: Fencing<'a>,
    /// The payloads the CR stages before a node's cordon.
    pub prestage: Option<&'a crate::prestage::PayloadSet>,
    /// Every NodeWright (what else a node's cache must keep).
    pub nodewrights: &'a [crate::snapshot::Cr],
}

impl Env<'_> {
    /// The CR's node annotations' keys.
    pub fn keys(&self) -> &CrKeys {
        self.marks.keys()
    }
}

/// The marks a CR's pass asks of every node it selects — status, cordon, drain start — and
/// a node's pass of a node at work — drain blocked, operator fence — in their places in
/// [`CrMarks`].
const KEPT: [CrMark; 5] = [
    CrMark::Status,
    CrMark::Cordon,
    CrMark::DrainStart,
    CrMark::DrainBlocked,
    CrMark::FenceOperator,
];

/// Karpenter's annotations a cordon sets (the node's, whichever CR set them).
const KARPENTER: [&str; 2] = [
    keys::KARPENTER_DO_NOT_DISRUPT,
    keys::KARPENTER_DO_NOT_REPAIR,
];

/// What a CR's pass asks of its [`KEPT`] marks and of [`KARPENTER`]'s annotations on a
/// node, read: small and without references, so the state cache can keep it beside the state
/// it was read with (see `StateCache::judged`) and a pass need not search the node's
/// annotations for it again — a steady pass of a node at work asks them nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeptMarks {
    /// The status mark's status (`None`: no mark, or one that spells no status).
    pub status: Option<Status>,
    /// A cordon mark is set.
    pub cordon: bool,
    /// A drain-start mark is set.
    pub drain_marked: bool,
    /// When the drain started, as the drain-start mark reads.
    pub drain_started: Option<i64>,
    /// A drain-blocked mark is set.
    pub drain_blocked: bool,
    /// An operator-fence mark is set.
    pub fenced: bool,
    /// Both of Karpenter's annotations are set.
    pub karpenter: bool,
}

impl KeptMarks {
    /// From the marks' values, in [`KEPT`]'s order, and Karpenter's, in [`KARPENTER`]'s.
    fn of(
        [status, cordon, drain, blocked, fence]: [Option<&str>; KEPT.len()],
        karpenter: [Option<&str>; KARPENTER.len()],
    ) -> Self {
        KeptMarks {
            status: status.and_then(Status::parse),
            cordon: cordon.is_some(),
            drain_marked: drain.is_some(),
            drain_started: crate::drain::started(drain),
            drain_blocked: blocked.is_some(),
            fenced: fence.is_some(),
            karpenter: karpenter.iter().all(Option::is_some),
        }
    }
}

/// A CR's [`KEPT`] marks on each node it selects, as the snapshot has them, read in the
/// sweep that reads the CR's state there. Each later sweep asked them of the node's
/// annotation map again, by then out of the cache at ten thousand nodes (see `Pass::marks`,
/// which overlays the pass's own writes).
#[derive(Debug)]
pub(crate) struct CrMarks<'a> {
    /// The CR's keys, spelled once per pass (its pass reads them here too).
    keys: CrKeys,
    /// The marks on each node read (`None`: the node was not read).
    on: PerNode<'a, Option<KeptMarks>>,
}

impl<'a> CrMarks<'a> {
    /// `cr`'s marks, none read yet.
    pub(crate) fn new(cr: &str, index: &NodeIndex<'a>) -> Self {
        CrMarks {
            keys: CrKeys::new(cr),
            on: index.per_node(),
        }
    }

    /// The CR's keys.
    pub(crate) fn keys(&self) -> &CrKeys {
        &self.keys
    }

    /// The marks as `get` reads each of their keys.
    pub(crate) fn read<'v>(&self, get: impl Fn(&str) -> Option<&'v str>) -> KeptMarks {
        KeptMarks::of(KEPT.map(|m| get(self.keys.get(m))), KARPENTER.map(&get))
    }

    /// Records `marks` as read on `node`.
    pub(crate) fn set(&mut self, node: &ObservedNode, marks: KeptMarks) {
        self.on[node] = Some(marks);
    }

    /// The marks on `node` as `work` has them: as read, unless the pass has written one
    /// of them since (or the node was not read).
    pub(crate) fn on(&self, node: &ObservedNode, work: &NodeWork<'_>) -> KeptMarks {
        let unwritten = || {
            KEPT.iter().all(|&m| work.observed(self.keys.get(m)))
                && KARPENTER.iter().all(|k| work.observed(k))
        };
        match self.on[node] {
            Some(read) if unwritten() => read,
            _ => self.read(|k| work.get(k)),
        }
    }
}

#[cfg(test)]
mod tests;
