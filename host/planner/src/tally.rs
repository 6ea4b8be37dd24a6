//! The per-node part of a CR's status (`nodeStatus`, `nodeBootIds`), tallied against the
//! last written status without copying it.
//!
//! At thousands of nodes these maps are most of the status, and a steady pass changes none
//! of them: copying both maps into every pass's draft, then comparing them back, was the
//! largest cost of a pass. A [`NodeTally`] records each selected node's status this pass,
//! notes whether anything differs from what the status holds, and builds the new maps
//! only when a status write is due.

use nodewright_api::v1alpha1::{NodeWrightStatus, Status};

use crate::roster::NodeIndex;
use crate::snapshot::{Observed, ObservedNode};
use crate::states::StateCache;
use crate::work::PerNode;

/// This pass's node statuses for one CR (boot IDs are the nodes' own).
#[derive(Debug)]
pub(crate) struct NodeTally<'a> {
    written: &'a Observed<NodeWrightStatus>,
    index: &'a NodeIndex<'a>,
    /// Each selected node's status this pass (`None`: not selected).
    now: PerNode<'a, Option<Status>>,
    /// How many nodes are selected.
    len: usize,
}

impl<'a> NodeTally<'a> {
    /// Against the status as last written, for the nodes of `index`.
    pub(crate) fn new(written: &'a Observed<NodeWrightStatus>, index: &'a NodeIndex<'a>) -> Self {
        NodeTally {
            written,
            index,
            now: index.per_node(),
            len: 0,
        }
    }

    /// A selected node's status this pass.
    pub(crate) fn record(&mut self, node: &'a ObservedNode, status: Status) {
        if self.now[node].replace(status).is_none() {
            self.len += 1;
        }
    }

    /// A node's status this pass.
    pub(crate) fn get(&self, node: &ObservedNode) -> Option<Status> {
        self.now[node]
    }

    /// Every selected node's status this pass.
    pub(crate) fn statuses(&self) -> impl Iterator<Item = Status> + '_ {
        self.now.iter().filter_map(|(_, s)| *s)
    }

    /// How many nodes the CR selects.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The selected nodes with their status this pass, in snapshot order.
    fn selected(&self) -> impl Iterator<Item = (&'a ObservedNode, Status)> + '_ {
        self.now.iter().filter_map(|(n, s)| Some((n, (*s)?)))
    }

    /// Whether the maps differ from the written ones: a node's status changed, a node came
    /// or left, a selected node's boot ID is new or changed. The answer is `states`' while
    /// the written status, the nodes and their statuses are those it found standing for
    /// `cr` (a steady pass); otherwise the written maps are walked.
    pub(crate) fn changed(&self, states: &StateCache, cr: &str) -> bool {
        let (nodes, statuses) = (self.index.nodes(), self.now.values());
        !states.maps_stand(cr, self.written, nodes, statuses, || !self.walk())
    }

    /// [`NodeTally::changed`], by walking the written maps in order, each node found by
    /// name.
    fn walk(&self) -> bool {
        let now = |name: &str| self.index.node(name).and_then(|n| self.now[n]);
        let old_status = &self.written.node_status;
        if self.len != old_status.len() || old_status.iter().any(|(n, s)| now(n) != Some(*s)) {
            return true;
        }
        let mut same = 0;
        for (name, b) in &self.written.node_boot_ids {
            match self.index.node(name) {
                Some(n) if self.now[n].is_some() && !n.boot_id.is_empty() => {
                    if n.boot_id != *b {
                        return true;
                    }
                    same += 1;
                }
                _ => {}
            }
        }
        same != self
            .selected()
            .filter(|(n, _)| !n.boot_id.is_empty())
            .count()
    }

    /// The maps as this pass leaves them: the recorded statuses, and the written boot IDs
    /// with the selected nodes' (a boot ID is kept after its node leaves, as it always was).
    pub(crate) fn write_into(self, status: &mut NodeWrightStatus) {
        status.node_status = self.selected().map(|(n, s)| (n.name.clone(), s)).collect();
        let mut boot_ids = self.written.node_boot_ids.clone();
        for (n, _) in self.selected().filter(|(n, _)| !n.boot_id.is_empty()) {
            match boot_ids.get_mut(&n.name) {
                Some(old) if *old == n.boot_id => {}
                Some(old) => old.clone_from(&n.boot_id),
                None => {
                    boot_ids.insert(n.name.clone(), n.boot_id.clone());
                }
            }
        }
        status.node_boot_ids = boot_ids;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::NodeFacts;

    fn written() -> NodeWrightStatus {
        NodeWrightStatus {
            node_status: [("a", Status::Complete), ("b", Status::InProgress)]
                .map(|(n, s)| (n.to_string(), s))
                .into(),
            node_boot_ids: [("a", "boot-a"), ("b", "boot-b"), ("gone", "boot-g")]
                .map(|(n, b)| (n.to_string(), b.to_string()))
                .into(),
            ..Default::default()
        }
    }

    /// Tallies the selected `(node, status, boot ID)` (beside a node the CR does not
    /// select): whether that changed the maps, and the maps it writes.
    fn tally(w: &NodeWrightStatus, selected: &[(&str, Status, &str)]) -> (bool, NodeWrightStatus) {
        let w = Observed::new(w.clone());
        let mut all: Vec<ObservedNode> = selected
            .iter()
            .map(|(name, _, boot)| {
                ObservedNode::new(NodeFacts {
                    name: name.to_string(),
                    boot_id: boot.to_string(),
                    ..Default::default()
                })
            })
            .collect();
        all.push(ObservedNode::new(NodeFacts {
            name: "unselected".into(),
            boot_id: "boot-u".into(),
            ..Default::default()
        }));
        let index = NodeIndex::new(&all);
        let mut t = NodeTally::new(&w, &index);
        for (n, (_, s, _)) in all.iter().zip(selected) {
            t.record(n, *s);
        }
        let changed = t.changed(&StateCache::default(), "cr");
        let mut out = NodeWrightStatus::default();
        t.write_into(&mut out);
        (changed, out)
    }

    #[test]
    fn only_a_real_difference_is_a_change_and_the_maps_are_rebuilt_as_before() {
        let w = written();
        let same = [
            ("a", Status::Complete, "boot-a"),
            ("b", Status::InProgress, "boot-b"),
        ];
        let (changed, out) = tally(&w, &same);
        assert!(!changed);
        assert_eq!(out.node_status, w.node_status);
        assert_eq!(out.node_boot_ids, w.node_boot_ids);
        let no_boot = [("a", Status::Complete, ""), ("b", Status::InProgress, "")];
        assert!(!tally(&w, &no_boot).0, "an unknown boot ID changes nothing");
        for (why, nodes) in [
            (
                "a status",
                vec![
                    ("a", Status::Complete, "boot-a"),
                    ("b", Status::Complete, "boot-b"),
                ],
            ),
            ("a node left", vec![("a", Status::Complete, "boot-a")]),
            (
                "a node came",
                vec![
                    ("a", Status::Complete, "boot-a"),
                    ("b", Status::InProgress, "boot-b"),
                    ("c", Status::Waiting, ""),
                ],
            ),
            (
                "a boot ID",
                vec![
                    ("a", Status::Complete, "boot-a2"),
                    ("b", Status::InProgress, "boot-b"),
                ],
            ),
        ] {
            let (changed, out) = tally(&w, &nodes);
            assert!(changed, "{why}");
            assert_eq!(out.node_status.len(), nodes.len(), "{why}");
            assert!(!out.node_status.contains_key("unselected"), "{why}");
            assert_eq!(
                out.node_boot_ids["gone"], "boot-g",
                "boot IDs outlive their node"
            );
        }
        let (_, out) = tally(&w, &[("a", Status::Complete, "boot-a2")]);
        assert_eq!(out.node_boot_ids["a"], "boot-a2");
        assert!(!out.node_status.contains_key("b"));
        assert!(!out.node_boot_ids.contains_key("unselected"));
    }
}
