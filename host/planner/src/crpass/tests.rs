//! What a CR's pass reads of a node, as the pass has left it.

use super::*;
use crate::snapshot::NodeFacts;

/// A CR's mark is read beside its state, once per pass; once the pass writes the mark, it
/// reads as written (set or removed), as `NodeWork::get` would.
#[test]
fn a_mark_reads_as_the_pass_has_left_it() {
    let cordon = keys::cordon("c");
    let s = Snapshot {
        nodes: vec![ObservedNode::new(NodeFacts {
            name: "n".into(),
            annotations: [(cordon.clone(), "true".to_string())].into(),
            ..Default::default()
        })],
        nodewrights: vec![Cr {
            name: "c".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let index = NodeIndex::new(&s.nodes);
    let mut pass = Pass::new(&s, &index, 0);
    let mut c = CrPass::new(&s.nodewrights[0], &s, &index, 0);
    c.marks = pass.marks.remove("c");
    let n = &s.nodes[0];
    assert!(
        c.marks
            .as_ref()
            .and_then(|marks| marks.get(n, CrMark::Cordon))
            .is_some_and(|(_, read)| read.is_some())
    );
    assert_eq!(pass.mark(&c, n, CrMark::Cordon), Some("true"));
    assert_eq!(pass.mark(&c, n, CrMark::DrainStart), None);
    pass.work[n].set(&cordon, None);
    assert_eq!(pass.mark(&c, n, CrMark::Cordon), None);
    pass.work[n].set(&cordon, Some("found".into()));
    assert_eq!(pass.mark(&c, n, CrMark::Cordon), Some("found"));
    pass.work[n].set(&keys::drain_start("c"), Some("5".into()));
    assert_eq!(pass.mark(&c, n, CrMark::DrainStart), Some("5"));
}
