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
    let marks = pass.marks.remove("c").expect("read beside the state");
    let c = CrPass::new(&s.nodewrights[0], &s, &index, 0, marks);
    let n = &s.nodes[0];
    let read = pass.marks(&c, n);
    assert!(read.cordon && !read.drain_marked && read.status.is_none());
    pass.work[n].set(&cordon, None);
    assert!(!pass.marks(&c, n).cordon, "a removal reads as written");
    pass.work[n].set(&cordon, Some("found".into()));
    assert!(pass.marks(&c, n).cordon);
    pass.work[n].set(&keys::drain_start("c"), Some("5".into()));
    let m = pass.marks(&c, n);
    assert!(m.drain_marked && m.drain_started == Some(5));
    pass.work[n].set(&keys::node_status("c"), Some("erroring".into()));
    assert_eq!(pass.marks(&c, n).status, Some(Status::Erroring));
}
