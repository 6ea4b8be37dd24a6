//! Which node each pod is on, by the node's place in the snapshot, kept across passes.
//!
//! A pass groups every bound pod by node, and finding a pod's node by name costs two
//! scattered reads per pod (the pod's node name, the node's own name to compare it with):
//! with 50,000 pods in the operator's hash order that was a fifth of a 10k-node pass. The
//! operator hands the same shared pod and node objects ([`crate::Observed`]) to pass after
//! pass until they change, and its cache keeps them in one order, so [`PodPlaces`] keeps,
//! in the last pass's pod order, each pod object with the node object it was found on and
//! that node's place: while the pod is the same object and the node at that place is too,
//! the answer stands without reading either (shared objects do not change: a write copies
//! one first), and the pass reads the memo front to back. Like the state cache it is a
//! memo: an empty one gives the same places.

use std::sync::Mutex;

use crate::roster::NodeIndex;
use crate::snapshot::{ObservedNode, ObservedPod};

/// Each pod's node place as last found, in the last snapshot's pod order.
#[derive(Debug, Default)]
pub struct PodPlaces(Mutex<Vec<Option<Entry>>>);

/// One pod's node, as the last pass found it.
#[derive(Debug)]
struct Entry {
    /// The pod, held (so its address names no other object while the entry lives).
    pod: ObservedPod,
    /// The node it was found on and where that node was in the snapshot (`None`: on no
    /// node of that snapshot).
    node: Option<(ObservedNode, u32)>,
}

impl Entry {
    /// The place it knows for its pod, while the node there is still the one it was found
    /// on.
    fn vouches(&self, nodes: &[ObservedNode]) -> Option<u32> {
        let (node, place) = self.node.as_ref()?;
        let still = nodes.get(*place as usize)?;
        ObservedNode::ptr_eq(still, node).then_some(*place)
    }
}

/// How far from its position a pod is looked for among the last pass's: pods that came
/// or went since shift the ones after them (the operator's cache keeps its order
/// otherwise).
const WINDOW: isize = 8;

impl PodPlaces {
    /// Where each of `pods`' nodes is among `index`'s nodes (`None`: not among them).
    /// Keeps these pods' answers, in their order: a snapshot that lists the same pods in
    /// about the same order finds each near its own position, front to back, comparing
    /// addresses only; a pod not found there (new, changed, or moved further) is found by
    /// its node's name.
    pub(crate) fn places(&self, index: &NodeIndex<'_>, pods: &[ObservedPod]) -> Vec<Option<u32>> {
        let mut memo = self.0.lock().expect("pod places lock");
        let mut last = std::mem::take(&mut *memo);
        let nodes = index.nodes();
        // How far the last pass's list is shifted against this one, as last seen.
        let mut shift: isize = 0;
        let mut next = Vec::with_capacity(pods.len());
        let places = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                // Entries move from the last list to the next: a reference count changed
                // for every pod of every pass would touch every pod's heap object.
                let near = (0..=WINDOW).flat_map(|d| [d, -d]).find_map(|d| {
                    let at = usize::try_from(i as isize + shift + d).ok()?;
                    let slot = last.get_mut(at)?;
                    slot.as_ref()
                        .is_some_and(|e| ObservedPod::ptr_eq(&e.pod, pod))
                        .then(|| (d, slot.take().expect("just checked")))
                });
                let (entry, vouched) = match near {
                    Some((d, entry)) => {
                        shift += d;
                        let vouched = entry.vouches(nodes);
                        (Some(entry), vouched)
                    }
                    None => (None, None),
                };
                let place = vouched.or_else(|| {
                    let node = index.node(&pod.node)?;
                    Some(u32::try_from(index.place(node)).expect("fewer than 2^32 nodes"))
                });
                let mut entry = entry.unwrap_or_else(|| Entry {
                    pod: pod.clone(),
                    node: None,
                });
                if vouched.is_none() {
                    entry.node = place.map(|p| (nodes[p as usize].clone(), p));
                }
                next.push(Some(entry));
                place
            })
            .collect();
        *memo = next;
        places
    }

    /// How many pods it holds.
    pub fn len(&self) -> usize {
        self.0.lock().expect("pod places lock").len()
    }

    /// Holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::PodFacts;

    fn node(name: &str) -> ObservedNode {
        ObservedNode::named(name)
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
        assert_eq!(memo.len(), 4, "every pod is kept, in order");
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
        assert_eq!(memo.len(), 5, "only this pass's pods are kept");

        // Pods that came and went shift the others: found near where they were, or by name.
        let mut shifted = vec![pod("b")];
        shifted.extend(pods.iter().cloned());
        shifted.remove(3);
        shifted.insert(3, pod("c"));
        shifted.insert(3, pod("b"));
        let expected = by_name(&nodes, &shifted);
        assert_eq!(memo.places(&NodeIndex::new(&nodes), &shifted), expected);
        assert_eq!(memo.places(&NodeIndex::new(&nodes), &shifted), expected);
        let reversed: Vec<ObservedPod> = shifted.iter().rev().cloned().collect();
        assert_eq!(
            memo.places(&NodeIndex::new(&nodes), &reversed),
            by_name(&nodes, &reversed)
        );
    }
}
