//! The snapshot's nodes as every pass needs them — found by name, in rollout order, and the
//! facts that whole-cluster sweeps read (`Brief`) — kept across passes while the list
//! holds the same node objects.
//!
//! Each of those answers reads every node's own object: its name (hashed into the index),
//! its creation time (the rollout sort), `spec.unschedulable` (each node's work), its
//! taints (the runtime-required sweep, each CR's tolerations) and its ignore label, each in
//! another cache line of the object. At 10,000 nodes the objects are scattered and out of
//! the core's cache by the next pass, so each sweep paid a miss per node, and a cluster ten
//! times larger cost more than ten times as much. The operator hands the same shared node objects ([`crate::Observed`]) to pass
//! after pass until one changes, so [`Roster`] keeps the last pass's list (holding its
//! objects, so no address names another node while kept) with the answers: a pass compares
//! addresses front to back and reads only the objects that are new. A node replaced by a
//! newer object of the same name and creation time (a status update) costs a fresh
//! `Brief`; a node that came, went or was renamed, the whole listing again. Like the state
//! cache it is a memo: an empty one gives the same answers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap as HashMap;

use nodewright_api::keys;

use crate::snapshot::ObservedNode;
use crate::work::{PerNode, place};

/// The last pass's nodes and their `Listing`.
#[derive(Debug, Default)]
pub struct Roster(Mutex<Option<Kept>>);

#[derive(Debug)]
struct Kept {
    /// The list the listing was made from, in its order.
    nodes: Vec<ObservedNode>,
    listing: Arc<Listing>,
}

/// What a pass reads of its node list as a whole, by each node's place in the snapshot.
#[derive(Clone, Debug)]
struct Listing {
    /// Which names are at which places: the same number for as long as they are (a
    /// refresh keeps it), another for every listing made afresh.
    names: u64,
    by_name: HashMap<Box<str>, u32>,
    /// Places in rollout order (`NodeFacts::rollout_key`).
    rollout: Vec<u32>,
    briefs: Vec<Brief>,
}

/// What sweeps over every node read of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Brief {
    /// `spec.unschedulable`.
    pub(crate) unschedulable: bool,
    /// It carries a taint (one a CR may not tolerate).
    pub(crate) tainted: bool,
    /// It carries the runtime-required taint.
    pub(crate) runtime_tainted: bool,
    /// Its `nodewright.io/ignore` label is `true`: no CR touches it.
    pub(crate) ignored: bool,
}

impl Brief {
    fn of(node: &ObservedNode) -> Self {
        Brief {
            unschedulable: node.unschedulable,
            tainted: !node.taints.is_empty(),
            runtime_tainted: node
                .taints
                .iter()
                .any(|t| t.key == keys::RUNTIME_REQUIRED_TAINT_KEY),
            ignored: node.labels.get(keys::IGNORE).is_some_and(|v| v == "true"),
        }
    }
}

impl Listing {
    fn new(nodes: &[ObservedNode]) -> Self {
        let place = |i: usize| u32::try_from(i).expect("fewer than 2^32 nodes");
        let mut rollout: Vec<u32> = (0..nodes.len()).map(place).collect();
        rollout.sort_by(|&a, &b| {
            let key = |p: u32| nodes[p as usize].rollout_key();
            key(a).cmp(&key(b))
        });
        // Numbers no listing in this process had before.
        static LISTED: AtomicU64 = AtomicU64::new(0);
        Listing {
            names: LISTED.fetch_add(1, Ordering::Relaxed),
            by_name: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name.as_str().into(), place(i)))
                .collect(),
            rollout,
            briefs: nodes.iter().map(Brief::of).collect(),
        }
    }
}

impl Roster {
    /// `nodes` indexed, from what the last pass left where the objects are the same.
    pub(crate) fn index<'a>(&self, nodes: &'a [ObservedNode]) -> NodeIndex<'a> {
        let mut kept = self.0.lock().expect("roster lock");
        if !kept.as_mut().is_some_and(|k| Self::refresh(k, nodes)) {
            *kept = Some(Kept {
                nodes: nodes.to_vec(),
                listing: Arc::new(Listing::new(nodes)),
            });
        }
        let listing = kept.as_ref().expect("just kept").listing.clone();
        NodeIndex { nodes, listing }
    }

    /// Brings `kept` up to `nodes` where only objects changed, each keeping its name and
    /// creation time; whether it could.
    fn refresh(kept: &mut Kept, nodes: &[ObservedNode]) -> bool {
        if kept.nodes.len() != nodes.len() {
            return false;
        }
        for (place, (was, now)) in kept.nodes.iter_mut().zip(nodes).enumerate() {
            if ObservedNode::ptr_eq(was, now) {
                continue;
            }
            if was.rollout_key() != now.rollout_key() {
                return false;
            }
            // The last pass's index is dropped with its pass: this copies only when a
            // pass still holds one.
            Arc::make_mut(&mut kept.listing).briefs[place] = Brief::of(now);
            *was = now.clone();
        }
        true
    }

    /// How many nodes it holds.
    pub fn len(&self) -> usize {
        let kept = self.0.lock().expect("roster lock");
        kept.as_ref().map_or(0, |k| k.nodes.len())
    }

    /// Holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A pass's nodes: the snapshot's, each found by its name, in rollout order, with their
/// briefs (`Brief`).
#[derive(Debug)]
pub struct NodeIndex<'a> {
    nodes: &'a [ObservedNode],
    listing: Arc<Listing>,
}

impl<'a> NodeIndex<'a> {
    /// Indexes `nodes` afresh (a pass takes its index from the snapshot's [`Roster`]).
    pub fn new(nodes: &'a [ObservedNode]) -> Self {
        NodeIndex {
            nodes,
            listing: Arc::new(Listing::new(nodes)),
        }
    }

    /// The node named `name` (`None`: not in the snapshot).
    pub fn node(&self, name: &str) -> Option<&'a ObservedNode> {
        let nodes = self.nodes;
        let place = *self.listing.by_name.get(name)?;
        Some(&nodes[place as usize])
    }

    /// Where the node named `name` is in the snapshot ([`crate::places::NOWHERE`]: not in
    /// it), as the memos keep places.
    pub(crate) fn place_named(&self, name: &str) -> u32 {
        self.listing
            .by_name
            .get(name)
            .map_or(crate::places::NOWHERE, |&p| p)
    }

    /// Names which node names are at which places: two indexes with the same number find
    /// every name at the same place (a memo keyed by it may keep places found by name).
    pub(crate) fn names(&self) -> u64 {
        self.listing.names
    }

    /// The snapshot's nodes.
    pub(crate) fn nodes(&self) -> &'a [ObservedNode] {
        self.nodes
    }

    /// The snapshot's nodes in rollout order: by creation time, then name.
    pub(crate) fn rollout(&self) -> impl Iterator<Item = &'a ObservedNode> + '_ {
        let nodes = self.nodes;
        self.listing
            .rollout
            .iter()
            .map(move |&p| &nodes[p as usize])
    }

    /// `node`'s [`Brief`].
    pub(crate) fn brief(&self, node: &ObservedNode) -> Brief {
        self.listing.briefs[self.place(node)]
    }

    /// Where `node` is in the snapshot (see [`PerNode`]).
    pub(crate) fn place(&self, node: &ObservedNode) -> usize {
        place(self.nodes, node)
    }

    /// A default value for each node.
    pub(crate) fn per_node<T: Default>(&self) -> PerNode<'a, T> {
        PerNode::new(self.nodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::NodeFacts;
    use k8s_openapi::api::core::v1::Taint;

    fn node(name: &str, created: i64) -> ObservedNode {
        ObservedNode::new(NodeFacts {
            name: name.into(),
            created,
            ..Default::default()
        })
    }

    /// Everything an index answers, by name: the rollout order, each node's brief, and
    /// where each of a few names is found.
    type Answers = (Vec<String>, Vec<(String, Brief)>, Vec<Option<usize>>);

    fn answers(index: &NodeIndex<'_>) -> Answers {
        let rollout = index.rollout().map(|n| n.name.clone()).collect();
        let briefs = index
            .nodes()
            .iter()
            .map(|n| (n.name.clone(), index.brief(n)))
            .collect();
        let found = ["a", "b", "c", "d", "gone"]
            .iter()
            .map(|name| index.node(name).map(|n| index.place(n)))
            .collect();
        (rollout, briefs, found)
    }

    #[test]
    fn the_listing_is_kept_for_the_same_objects_and_answers_as_a_fresh_one() {
        let roster = Roster::default();
        let mut nodes = vec![node("c", 3), node("a", 1), node("b", 1)];
        let first = roster.index(&nodes);
        assert_eq!(answers(&first), answers(&NodeIndex::new(&nodes)));
        assert_eq!(answers(&first).0, ["a", "b", "c"], "by creation, then name");
        drop(first);

        // The same objects: the same listing, not a new one.
        let kept = Arc::as_ptr(&roster.index(&nodes).listing);
        assert_eq!(Arc::as_ptr(&roster.index(&nodes).listing), kept);

        // A node replaced by a newer object (cordoned, tainted, ignored): its brief read
        // again, the rest kept.
        nodes[2] = ObservedNode::new(NodeFacts {
            unschedulable: true,
            taints: vec![Taint {
                key: keys::RUNTIME_REQUIRED_TAINT_KEY.into(),
                ..Default::default()
            }],
            labels: [(keys::IGNORE.to_string(), "true".to_string())].into(),
            ..(*nodes[2]).clone()
        });
        let updated = roster.index(&nodes);
        assert_eq!(answers(&updated), answers(&NodeIndex::new(&nodes)));
        assert_eq!(
            updated.brief(&nodes[2]),
            Brief {
                unschedulable: true,
                tainted: true,
                runtime_tainted: true,
                ignored: true,
            }
        );
        assert_eq!(Arc::as_ptr(&updated.listing), kept, "changed in place");
        let names = updated.names();

        // While a pass still holds the index, an update copies rather than change it.
        let mut later = nodes.clone();
        later[1] = ObservedNode::new(NodeFacts {
            unschedulable: true,
            ..(*later[1]).clone()
        });
        let next = roster.index(&later);
        assert!(!updated.brief(&nodes[1]).unschedulable);
        assert!(next.brief(&later[1]).unschedulable);
        assert_ne!(Arc::as_ptr(&next.listing), kept);
        assert_eq!(
            next.names(),
            names,
            "a copy for new facts keeps the names' number"
        );
        drop((updated, next));
        let mut nodes = later;

        // Created later, renamed, joined, left, reordered: answered as afresh.
        nodes[0] = node("c", 0);
        assert_ne!(
            roster.index(&nodes).names(),
            names,
            "made afresh: a new number"
        );
        assert_eq!(
            answers(&roster.index(&nodes)),
            answers(&NodeIndex::new(&nodes))
        );
        nodes[1] = node("d", 1);
        assert_eq!(
            answers(&roster.index(&nodes)),
            answers(&NodeIndex::new(&nodes))
        );
        nodes.push(node("a", 5));
        assert_eq!(
            answers(&roster.index(&nodes)),
            answers(&NodeIndex::new(&nodes))
        );
        assert_eq!(roster.len(), 4);
        nodes.remove(0);
        nodes.reverse();
        assert_eq!(
            answers(&roster.index(&nodes)),
            answers(&NodeIndex::new(&nodes))
        );
        assert_eq!(answers(&roster.index(&nodes)).0, ["b", "d", "a"]);
    }
}
