//! Which pods are on which node, grouped by node, kept across passes.
//!
//! A pass groups every bound pod by node, and finding a pod's node by name costs two
//! scattered reads per pod (the pod's node name, the node's name to compare it with): with
//! 50,000 pods in the operator's hash order that was a fifth of a 10k-node pass. The
//! operator hands the same shared pod objects ([`crate::Observed`]) to pass after pass until
//! they change, and keeps them in one order; a pod's node is found by its name, and while
//! the node list's names stay at the same places (`NodeIndex::names`) a name is found at the
//! same place. So [`PodPlaces`] keeps the last pass's pods (held, so an address names no
//! other pod while kept), each one's node place, and their grouping by node. A pass over
//! the very same pods under the same names takes the grouping as it is, having compared
//! addresses only (at 50,000 pods, rebuilding the places and the grouping every pass
//! streamed some 6 MB through the cache, more than ten times the 1k pass's share); one
//! where pods came, went or changed finds each kept pod near its own position and the rest
//! by name. Like the state cache it is a memo: an empty one gives the same grouping.

use std::sync::{Arc, Mutex};

use crate::roster::NodeIndex;
use crate::snapshot::{ObservedJob, ObservedPod};

/// The last snapshot's pods, their node places and their grouping by node.
#[derive(Debug, Default)]
pub struct PodPlaces(Mutex<Option<Kept>>);

#[derive(Debug)]
struct Kept {
    /// The node names' number (`NodeIndex::names`) the places were found under.
    names: u64,
    /// The pods, in the last snapshot's order (`None`: moved to the next list).
    pods: Vec<Option<ObservedPod>>,
    /// Each pod's node place ([`NOWHERE`]: on no node of that snapshot).
    places: Vec<u32>,
    grouping: Arc<Grouping>,
}

/// On no node of the snapshot.
pub(crate) const NOWHERE: u32 = u32::MAX;

/// How far from its position a pod is looked for among the last pass's: pods that came
/// or went since shift the ones after them (the operator's cache keeps its order
/// otherwise).
const WINDOW: isize = 8;

/// A snapshot's pods (or Jobs) by node place: node `p`'s are
/// `order[starts[p]..starts[p + 1]]`, each the item's index in the snapshot, in snapshot
/// order. Items on no node are left out.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Grouping {
    starts: Vec<u32>,
    order: Vec<u32>,
}

impl Grouping {
    /// Groups items by `places` (one per item, [`NOWHERE`] for none) among `nodes` places.
    pub(crate) fn new(nodes: usize, places: &[u32]) -> Self {
        let mut starts = vec![0u32; nodes + 1];
        for &p in places.iter().filter(|&&p| p != NOWHERE) {
            starts[p as usize + 1] += 1;
        }
        for i in 1..starts.len() {
            starts[i] += starts[i - 1];
        }
        let mut next = starts.clone();
        let mut order = vec![0u32; starts[nodes] as usize];
        for (i, &p) in places.iter().enumerate().filter(|(_, p)| **p != NOWHERE) {
            let at = &mut next[p as usize];
            order[*at as usize] = u32::try_from(i).expect("fewer than 2^32 items");
            *at += 1;
        }
        Grouping { starts, order }
    }

    /// The snapshot indexes of the items on the node at `place`.
    pub(crate) fn at(&self, place: usize) -> &[u32] {
        &self.order[self.starts[place] as usize..self.starts[place + 1] as usize]
    }
}

impl PodPlaces {
    /// `pods` grouped by their nodes among `index`'s: the last pass's grouping when the
    /// pods are the same objects in the same order and the names at the same places;
    /// otherwise each pod kept near its own position keeps its place (the names being at
    /// the same places) and the rest are found by their node's name.
    pub(crate) fn grouping(&self, index: &NodeIndex<'_>, pods: &[ObservedPod]) -> Arc<Grouping> {
        let mut memo = self.0.lock().expect("pod places lock");
        let names = index.names();
        if let Some(kept) = memo.as_ref()
            && kept.names == names
            && kept.pods.len() == pods.len()
            && kept.pods.iter().zip(pods).all(|(was, now)| {
                was.as_ref()
                    .is_some_and(|was| ObservedPod::ptr_eq(was, now))
            })
        {
            return kept.grouping.clone();
        }
        let (mut last, last_places) = match memo.take() {
            Some(kept) if kept.names == names => (kept.pods, kept.places),
            _ => (Vec::new(), Vec::new()),
        };
        // How far the last pass's list is shifted against this one, as last seen.
        let mut shift: isize = 0;
        let mut next = Vec::with_capacity(pods.len());
        let places: Vec<u32> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                // A kept pod moves from the last list to the next: a reference count
                // changed for every pod would touch every pod's heap object.
                let near = (0..=WINDOW).flat_map(|d| [d, -d]).find_map(|d| {
                    let at = usize::try_from(i as isize + shift + d).ok()?;
                    let slot = last.get_mut(at)?;
                    let same = slot.as_ref().is_some_and(|p| ObservedPod::ptr_eq(p, pod));
                    same.then(|| (d, at, slot.take().expect("just checked")))
                });
                match near {
                    Some((d, at, kept)) => {
                        shift += d;
                        next.push(Some(kept));
                        last_places[at]
                    }
                    None => {
                        next.push(Some(pod.clone()));
                        index.place_named(&pod.node)
                    }
                }
            })
            .collect();
        let grouping = Arc::new(Grouping::new(index.nodes().len(), &places));
        *memo = Some(Kept {
            names,
            pods: next,
            places,
            grouping: grouping.clone(),
        });
        grouping
    }

    /// How many pods it holds.
    pub fn len(&self) -> usize {
        let memo = self.0.lock().expect("pod places lock");
        memo.as_ref().map_or(0, |k| k.pods.len())
    }

    /// Holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The last snapshot's Jobs' node places and their grouping by node, kept across passes.
///
/// A pass found each Job's node by its name: at 5,000 Jobs over 10,000 nodes, two scattered
/// reads each (the hash table's slot, the node's name to compare), a twentieth of the
/// pass. The operator makes its Jobs afresh for every snapshot, so they cannot be known by
/// address as pods are ([`PodPlaces`]); their node names are compared instead, against a
/// copy of the last pass's kept in one string: while every Job names the node the Job at
/// its position named, and the names are at the same places (`NodeIndex::names`), the
/// places and the grouping stand. Otherwise each is found by name again. A memo: an empty
/// one gives the same grouping.
#[derive(Debug, Default)]
pub struct JobPlaces(Mutex<Option<KeptJobs>>);

#[derive(Debug)]
struct KeptJobs {
    /// The node names' number (`NodeIndex::names`) the places were found under.
    names: u64,
    /// The Jobs' node names back to back, in snapshot order.
    nodes: String,
    /// Where each Job's node name ends in `nodes`.
    ends: Vec<u32>,
    placed: Arc<Placed>,
}

/// Each item's node place ([`NOWHERE`]: on no node of the snapshot) and the items grouped
/// by them.
#[derive(Debug)]
pub(crate) struct Placed {
    pub(crate) places: Vec<u32>,
    pub(crate) grouping: Arc<Grouping>,
}

impl KeptJobs {
    /// Whether `jobs` name the nodes the kept Jobs named, position by position.
    fn same_nodes(&self, jobs: &[ObservedJob]) -> bool {
        self.ends.len() == jobs.len()
            && jobs
                .iter()
                .zip(&self.ends)
                .try_fold(0usize, |start, (j, &end)| {
                    let end = end as usize;
                    (self.nodes.get(start..end) == Some(j.node.as_str())).then_some(end)
                })
                .is_some()
    }
}

impl JobPlaces {
    /// `jobs`' node places among `index`'s, and the Jobs grouped by them: the last pass's when every
    /// Job names the node its position named then, under the same names; otherwise each
    /// found by its node's name.
    pub(crate) fn placed(&self, index: &NodeIndex<'_>, jobs: &[ObservedJob]) -> Arc<Placed> {
        let mut memo = self.0.lock().expect("job places lock");
        let names = index.names();
        if let Some(kept) = memo.as_ref()
            && kept.names == names
            && kept.same_nodes(jobs)
        {
            return kept.placed.clone();
        }
        let places: Vec<u32> = jobs.iter().map(|j| index.place_named(&j.node)).collect();
        let grouping = Arc::new(Grouping::new(index.nodes().len(), &places));
        let placed = Arc::new(Placed { places, grouping });
        let mut nodes = String::new();
        let ends = jobs
            .iter()
            .map(|j| {
                nodes.push_str(&j.node);
                u32::try_from(nodes.len()).expect("under 4 GiB of node names")
            })
            .collect();
        *memo = Some(KeptJobs {
            names,
            nodes,
            ends,
            placed: placed.clone(),
        });
        placed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roster::Roster;
    use crate::snapshot::{NodeFacts, ObservedNode, PodFacts};

    fn node(name: &str) -> ObservedNode {
        ObservedNode::named(name)
    }

    fn pod(on: &str) -> ObservedPod {
        ObservedPod::new(PodFacts {
            node: on.into(),
            ..Default::default()
        })
    }

    /// Each node's pods (their snapshot indexes), as `grouping` has them.
    fn groups(nodes: &[ObservedNode], grouping: &Grouping) -> Vec<Vec<u32>> {
        (0..nodes.len()).map(|p| grouping.at(p).to_vec()).collect()
    }

    /// The groups by name, as an empty memo and a fresh index find them.
    fn by_name(nodes: &[ObservedNode], pods: &[ObservedPod]) -> Vec<Vec<u32>> {
        let grouping = PodPlaces::default().grouping(&NodeIndex::new(nodes), pods);
        groups(nodes, &grouping)
    }

    #[test]
    fn the_grouping_is_kept_for_the_same_pods_and_names_and_found_again_otherwise() {
        let (memo, roster) = (PodPlaces::default(), Roster::default());
        let ask = |nodes: &[ObservedNode], pods: &[ObservedPod]| {
            let grouping = memo.grouping(&roster.index(nodes), pods);
            assert_eq!(groups(nodes, &grouping), by_name(nodes, pods));
            grouping
        };
        let mut nodes = vec![node("a"), node("b"), node("c")];
        let pods = vec![pod("c"), pod("a"), pod("gone"), pod("c")];
        let first = ask(&nodes, &pods);
        assert_eq!(groups(&nodes, &first), [vec![1], vec![], vec![0, 3]]);
        assert_eq!(memo.len(), 4, "every pod is kept, in order");
        assert!(
            Arc::ptr_eq(&ask(&nodes, &pods), &first),
            "the same pods under the same names: kept as it is"
        );

        // A node updated (a newer object, the same name at the same place): the names
        // stand, and so does the grouping.
        nodes[1] = ObservedNode::new(NodeFacts {
            unschedulable: true,
            ..(*nodes[1]).clone()
        });
        assert!(Arc::ptr_eq(&ask(&nodes, &pods), &first));

        // The same node objects in another order: every place found again.
        nodes.reverse();
        let moved = ask(&nodes, &pods);
        assert_eq!(groups(&nodes, &moved), [vec![0, 3], vec![], vec![1]]);

        // A pod moved by a write (a new object), a node that left, a pod that came: each
        // answered as by name.
        let mut pods = pods;
        pods[1].node = "b".into();
        nodes.retain(|n| n.name != "a");
        pods.push(pod("a"));
        ask(&nodes, &pods);
        assert_eq!(memo.len(), 5, "only this pass's pods are kept");

        // Pods that came and went shift the others: found near where they were, or by name.
        let mut shifted = vec![pod("b")];
        shifted.extend(pods.iter().cloned());
        shifted.remove(3);
        shifted.insert(3, pod("c"));
        shifted.insert(3, pod("b"));
        ask(&nodes, &shifted);
        let kept = ask(&nodes, &shifted);
        assert!(Arc::ptr_eq(&ask(&nodes, &shifted), &kept));
        let reversed: Vec<ObservedPod> = shifted.iter().rev().cloned().collect();
        ask(&nodes, &reversed);

        // A node renamed at its place: the names changed, every pod found by name again.
        nodes[0] = node("a");
        ask(&nodes, &reversed);
    }

    fn job(name: &str, on: &str) -> ObservedJob {
        ObservedJob {
            name: name.into(),
            cr: "cr".into(),
            node: on.into(),
            generation: 1,
            run: 0,
            work: crate::snapshot::Work::Prestage { set: "s".into() },
            phase: crate::snapshot::JobPhase::Active {
                failed: 0,
                last: None,
            },
            stopping: false,
            stuck: None,
        }
    }

    #[test]
    fn the_jobs_places_are_kept_while_they_name_the_same_nodes_and_found_again_otherwise() {
        let (memo, roster) = (JobPlaces::default(), Roster::default());
        let ask = |nodes: &[ObservedNode], jobs: &[ObservedJob]| {
            let placed = memo.placed(&roster.index(nodes), jobs);
            let fresh = JobPlaces::default().placed(&NodeIndex::new(nodes), jobs);
            assert_eq!(placed.places, fresh.places, "as found by name");
            assert_eq!(placed.grouping, fresh.grouping);
            placed
        };
        let mut nodes = vec![node("a"), node("b"), node("c")];
        let jobs = vec![
            job("1", "c"),
            job("2", "a"),
            job("3", "gone"),
            job("4", "c"),
        ];
        let first = ask(&nodes, &jobs);
        assert_eq!(first.places, [2, 0, NOWHERE, 2]);
        assert_eq!(
            groups(&nodes, &first.grouping),
            [vec![1], vec![], vec![0, 3]]
        );
        // Made afresh, as the operator makes its Jobs every pass: the same nodes named.
        let again: Vec<ObservedJob> = jobs.iter().map(|j| job(&j.name, &j.node)).collect();
        assert!(Arc::ptr_eq(&ask(&nodes, &again), &first), "kept");

        // A Job on another node; names that split differently over the same text ("ab" +
        // "c" against "a" + "bc"); one more Job; one fewer: each found again.
        let mut moved = again.clone();
        moved[1].node = "b".into();
        assert_eq!(ask(&nodes, &moved).places, [2, 1, NOWHERE, 2]);
        let split = [job("1", "a"), job("2", "bc")];
        ask(&nodes, &[job("1", "ab"), job("2", "c")]);
        assert_eq!(ask(&nodes, &split).places, [0, NOWHERE]);
        moved.push(job("5", "a"));
        ask(&nodes, &moved);
        moved.truncate(2);
        ask(&nodes, &moved);

        // The nodes in another order: the names moved, every place found again.
        let kept = ask(&nodes, &moved);
        assert!(Arc::ptr_eq(&ask(&nodes, &moved), &kept));
        nodes.reverse();
        assert_eq!(ask(&nodes, &moved).places, [0, 1]);
    }
}
