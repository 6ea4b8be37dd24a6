//! Grouping, cordons and Karpenter's marks as a node's work does them.

use super::*;
use crate::snapshot::{ObservedPod, PodFacts};

/// `acquire` as the cordon rule and the Karpenter marks spell it, every owner collected
/// and the owned list rebuilt on every call (the code before the held-cordon shortcut).
fn acquire_by_the_rule(work: &mut NodeWork<'_>, cr: &str) -> bool {
    let acquired = work.cordons().acquire(cr);
    work.apply(acquired.actions);
    let mut owned: Vec<String> = work
        .get(keys::KARPENTER_OWNED)
        .map(|v| v.split(',').map(String::from).collect())
        .unwrap_or_default();
    for key in [
        keys::KARPENTER_DO_NOT_DISRUPT,
        keys::KARPENTER_DO_NOT_REPAIR,
    ] {
        if work.get(key).is_none() {
            work.set(key, Some("true".into()));
            owned.push(key.into());
        }
    }
    if !owned.is_empty() {
        work.set(keys::KARPENTER_OWNED, Some(owned.join(",")));
    }
    acquired.ready_to_drain
}

#[test]
fn acquiring_a_cordon_answers_and_writes_as_the_cordon_rule_on_every_kind_of_node() {
    let marks = [None, Some("true"), Some("found"), Some("")];
    let owned = [
        None,
        Some(""),
        Some("x"),
        Some("x,karpenter.sh/do-not-disrupt"),
    ];
    let mut shapes = 0;
    for unschedulable in [false, true] {
        for (mine, theirs) in marks.iter().flat_map(|m| marks.iter().map(move |t| (m, t))) {
            for (disrupt, repair) in [(false, false), (false, true), (true, false), (true, true)] {
                for owned in owned {
                    let mut annotations = BTreeMap::new();
                    let mut put = |k: &str, v: Option<&str>| {
                        if let Some(v) = v {
                            annotations.insert(k.to_string(), v.to_string());
                        }
                    };
                    put(&keys::cordon("a"), *mine);
                    put(&keys::cordon("b"), *theirs);
                    put(keys::KARPENTER_DO_NOT_DISRUPT, disrupt.then_some("true"));
                    put(keys::KARPENTER_DO_NOT_REPAIR, repair.then_some("true"));
                    put(keys::KARPENTER_OWNED, owned);
                    let node = ObservedNode::new(crate::snapshot::NodeFacts {
                        name: "n".into(),
                        annotations,
                        unschedulable,
                        ..Default::default()
                    });
                    let nodes = [node];
                    let index = NodeIndex::new(&nodes);
                    let shape =
                        format!("{unschedulable} {mine:?} {theirs:?} {disrupt} {repair} {owned:?}");
                    // The marks unread (asked of the annotations) and as a sweep read
                    // and kept them.
                    for kept in [false, true] {
                        let mut marks = CrMarks::new("a", &index);
                        let (mut fast, mut rule) = (
                            NodeWork::new(&nodes[0], unschedulable),
                            NodeWork::new(&nodes[0], unschedulable),
                        );
                        if kept {
                            let read = marks.read(|k| fast.get(k));
                            marks.set(&nodes[0], read);
                        }
                        let ready = fast.acquire(&marks);
                        let expected = acquire_by_the_rule(&mut rule, "a");
                        assert_eq!(ready, expected, "{shape} kept {kept}");
                        assert_eq!(fast.into_patch(), rule.into_patch(), "{shape} {kept}");
                        shapes += 1;
                    }
                }
            }
        }
    }
    assert_eq!(shapes, 2 * 16 * 4 * 4 * 2);
}

#[test]
fn items_are_grouped_by_node_in_snapshot_order_and_strays_left_out() {
    let nodes: Vec<ObservedNode> = ["a", "b", "c"].map(ObservedNode::named).into();
    let pods: Vec<ObservedPod> = [
        ("c", "1"),
        ("a", "2"),
        ("gone", "3"),
        ("c", "4"),
        ("a", "5"),
    ]
    .into_iter()
    .map(|(node, name)| {
        ObservedPod::new(PodFacts {
            node: node.into(),
            name: name.into(),
            ..Default::default()
        })
    })
    .collect();
    let index = NodeIndex::new(&nodes);
    let grouping = crate::places::PodPlaces::default().grouping(&index, &pods);
    let grouped = Grouped::new(&nodes, &pods, grouping);
    let names =
        |n: &ObservedNode| -> Vec<&str> { grouped.of(n).iter().map(|p| p.name.as_str()).collect() };
    assert_eq!(names(&nodes[0]), ["2", "5"]);
    assert!(names(&nodes[1]).is_empty());
    assert_eq!(names(&nodes[2]), ["1", "4"]);
}
