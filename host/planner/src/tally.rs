//! The per-node part of a CR's status (`nodeStatus`, `nodeBootIds`), tallied against the
//! last written status without copying it.
//!
//! At thousands of nodes these maps are most of the status, and a steady pass changes none
//! of them: copying both maps into every pass's draft, then comparing them back, was the
//! largest cost of a pass. A [`NodeTally`] records each selected node's status this pass,
//! notes whether anything differs from what the status holds, and builds the new maps
//! only when a status write is due.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use nodewright_api::v1alpha1::{NodeWrightStatus, Status};

/// This pass's node statuses and boot IDs for one CR.
#[derive(Debug)]
pub(crate) struct NodeTally<'a> {
    old_status: &'a BTreeMap<String, Status>,
    old_boot_ids: &'a BTreeMap<String, String>,
    /// Each selected node's status this pass.
    now: HashMap<&'a str, Status>,
    /// Each selected node's boot ID this pass (those that report one).
    boot_ids: HashMap<&'a str, &'a str>,
}

impl<'a> NodeTally<'a> {
    /// Against the status as last written.
    pub(crate) fn new(written: &'a NodeWrightStatus) -> Self {
        NodeTally {
            old_status: &written.node_status,
            old_boot_ids: &written.node_boot_ids,
            now: HashMap::default(),
            boot_ids: HashMap::default(),
        }
    }

    /// A selected node's status this pass, and its boot ID (empty: none known).
    pub(crate) fn record(&mut self, node: &'a str, status: Status, boot_id: &'a str) {
        self.now.insert(node, status);
        if !boot_id.is_empty() {
            self.boot_ids.insert(node, boot_id);
        }
    }

    /// A node's status this pass.
    pub(crate) fn get(&self, node: &str) -> Option<Status> {
        self.now.get(node).copied()
    }

    /// Every selected node's status this pass.
    pub(crate) fn statuses(&self) -> impl Iterator<Item = Status> + '_ {
        self.now.values().copied()
    }

    /// How many nodes the CR selects.
    pub(crate) fn len(&self) -> usize {
        self.now.len()
    }

    /// Whether the maps differ from the written ones: a node's status changed, a node came
    /// or left, a boot ID is new or changed. (The written maps are walked in order and the
    /// pass's looked up by hash: cheaper than searching the written maps per node.)
    pub(crate) fn changed(&self) -> bool {
        if self.now.len() != self.old_status.len()
            || self
                .old_status
                .iter()
                .any(|(n, s)| self.now.get(n.as_str()) != Some(s))
        {
            return true;
        }
        let mut same = 0;
        for (n, b) in self.old_boot_ids {
            match self.boot_ids.get(n.as_str()) {
                Some(now) if now == b => same += 1,
                Some(_) => return true,
                None => {}
            }
        }
        same != self.boot_ids.len()
    }

    /// The maps as this pass leaves them: the recorded statuses, and the written boot IDs
    /// with this pass's (a boot ID is kept after its node leaves, as it always was).
    pub(crate) fn write_into(self, status: &mut NodeWrightStatus) {
        status.node_status = self
            .now
            .into_iter()
            .map(|(n, s)| (n.to_string(), s))
            .collect();
        let mut boot_ids = self.old_boot_ids.clone();
        for (n, b) in self.boot_ids {
            match boot_ids.get_mut(n) {
                Some(old) if old == b => {}
                Some(old) => *old = b.to_string(),
                None => {
                    boot_ids.insert(n.to_string(), b.to_string());
                }
            }
        }
        status.node_boot_ids = boot_ids;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn tally<'a>(w: &'a NodeWrightStatus, nodes: &[(&'a str, Status, &'a str)]) -> NodeTally<'a> {
        let mut t = NodeTally::new(w);
        for (n, s, b) in nodes {
            t.record(n, *s, b);
        }
        t
    }

    #[test]
    fn only_a_real_difference_is_a_change_and_the_maps_are_rebuilt_as_before() {
        let w = written();
        let same = [
            ("a", Status::Complete, "boot-a"),
            ("b", Status::InProgress, "boot-b"),
        ];
        assert!(!tally(&w, &same).changed());
        let no_boot = [("a", Status::Complete, ""), ("b", Status::InProgress, "")];
        assert!(
            !tally(&w, &no_boot).changed(),
            "an unknown boot ID changes nothing"
        );
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
            let t = tally(&w, &nodes);
            assert!(t.changed(), "{why}");
            let mut out = NodeWrightStatus::default();
            t.write_into(&mut out);
            assert_eq!(out.node_status.len(), nodes.len(), "{why}");
            assert_eq!(
                out.node_boot_ids["gone"], "boot-g",
                "boot IDs outlive their node"
            );
        }
        let mut out = NodeWrightStatus::default();
        tally(&w, &[("a", Status::Complete, "boot-a2")]).write_into(&mut out);
        assert_eq!(out.node_boot_ids["a"], "boot-a2");
        assert!(!out.node_status.contains_key("b"));
    }
}
