//! Which node each pod is on, by the node's place in the snapshot, kept across passes.
//!
//! A pass groups every bound pod by node, and finding a pod's node by name costs two
//! scattered reads per pod (the pod's node name, the node's own name to compare it with):
//! with 50,000 pods in the operator's hash order that was a fifth of a 10k-node pass. The
//! operator hands the same shared pod and node objects ([`crate::Observed`]) to pass after
//! pass until they change, so [`PodPlaces`] keeps, for each pod object, the node object it
//! was found on and that node's place: while the pod is the same object and the node at
//! that place is too, the answer stands without reading either (shared objects do not
//! change: a write copies one first). Like the state cache it is a memo: an empty one
//! gives the same places.

use std::sync::Mutex;

use rustc_hash::FxHashMap as HashMap;

use crate::snapshot::{ObservedNode, ObservedPod};
use crate::work::NodeIndex;

/// Each pod's node place as last found, by pod object.
#[derive(Debug, Default)]
pub struct PodPlaces(Mutex<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// By the address of the pod's shared object, which the entry holds (so the address
    /// names no other object while the entry lives).
    by_pod: HashMap<usize, Entry>,
    pass: u64,
}

#[derive(Debug)]
struct Entry {
    /// The pod, held.
    _pod: ObservedPod,
    /// The node it was found on, and where that node was in the snapshot.
    node: ObservedNode,
    place: u32,
    /// The last pass that asked.
    seen: u64,
}

impl PodPlaces {
    /// Where each of `pods`' nodes is among `index`'s nodes (`None`: not among them).
    /// Forgets the pods it was not asked about.
    pub(crate) fn places(&self, index: &NodeIndex<'_>, pods: &[ObservedPod]) -> Vec<Option<u32>> {
        let mut inner = self.0.lock().expect("pod places lock");
        inner.pass += 1;
        let pass = inner.pass;
        let nodes = index.nodes();
        let places = pods
            .iter()
            .map(|pod| {
                let key = std::ptr::from_ref(&**pod) as usize;
                if let Some(e) = inner.by_pod.get_mut(&key)
                    && nodes
                        .get(e.place as usize)
                        .is_some_and(|n| ObservedNode::ptr_eq(n, &e.node))
                {
                    e.seen = pass;
                    return Some(e.place);
                }
                let node = index.node(&pod.node)?;
                let place = u32::try_from(index.place(node)).expect("fewer than 2^32 nodes");
                let entry = Entry {
                    _pod: pod.clone(),
                    node: node.clone(),
                    place,
                    seen: pass,
                };
                inner.by_pod.insert(key, entry);
                Some(place)
            })
            .collect();
        inner.by_pod.retain(|_, e| e.seen == pass);
        places
    }

    /// How many pods it holds.
    pub fn len(&self) -> usize {
        self.0.lock().expect("pod places lock").by_pod.len()
    }

    /// Holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{NodeFacts, PodFacts};

    fn node(name: &str) -> ObservedNode {
        ObservedNode::new(NodeFacts {
            name: name.into(),
            ..Default::default()
        })
    }

    fn pod(on: &str) -> ObservedPod {
        ObservedPod::new(PodFacts {
            node: on.into(),
            ..Default::default()
        })
    }

    /// The places by name, as an empty memo finds them.
    fn by_name(nodes: &[ObservedNode], pods: &[ObservedPod]) -> Vec<Option<u32>> {
        PodPlaces::default().places(&NodeIndex::new(nodes), pods)
    }

    #[test]
    fn a_place_is_kept_while_pod_and_node_are_the_same_objects_and_found_again_otherwise() {
        let memo = PodPlaces::default();
        let mut nodes = vec![node("a"), node("b"), node("c")];
        let pods = vec![pod("c"), pod("a"), pod("gone"), pod("c")];
        let first = memo.places(&NodeIndex::new(&nodes), &pods);
        assert_eq!(first, [Some(2), Some(0), None, Some(2)]);
        assert_eq!(first, by_name(&nodes, &pods));
        assert_eq!(memo.len(), 3, "a pod on no node is not kept");
        assert_eq!(memo.places(&NodeIndex::new(&nodes), &pods), first);

        // The same node objects in another order: every place found again.
        nodes.reverse();
        let moved = memo.places(&NodeIndex::new(&nodes), &pods);
        assert_eq!(moved, [Some(0), Some(2), None, Some(0)]);
        assert_eq!(moved, by_name(&nodes, &pods));

        // A node replaced by a new object at the same place, a pod moved by a write (a new
        // object), a node that left: each answered as by name.
        nodes[0] = node("c");
        let mut pods = pods;
        pods[1].node = "b".into();
        nodes.retain(|n| n.name != "a");
        pods.push(pod("a"));
        let changed = memo.places(&NodeIndex::new(&nodes), &pods);
        assert_eq!(changed, by_name(&nodes, &pods));
        assert_eq!(changed, [Some(0), Some(1), None, Some(0), None]);
        assert_eq!(memo.len(), 3, "only this pass's pods on a node are kept");
    }
}
