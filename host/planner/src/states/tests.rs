//! The state cache: what it keeps, and for how long.

use std::cell::Cell;

use super::*;

fn node(name: &str) -> ObservedNode {
    ObservedNode::named(name)
}

/// A read of `node`'s text at `place`, `observed` or written by the pass.
fn read<'a>(
    node: &'a ObservedNode,
    place: usize,
    raw: Option<&'a str>,
    observed: bool,
) -> Read<'a, impl FnOnce() -> Option<&'a str>> {
    Read {
        node,
        place,
        raw: move || raw,
        observed,
    }
}

fn spec(version: &str) -> NodeWrightSpec {
    serde_json::from_value(serde_json::json!({
        "packages": {"p": {"version": version, "plugin": "r.example/p:1"}}
    }))
    .expect("a spec")
}

/// Asks for node n1's verdict with `raw` under `judge`; true when `decide` was run.
fn decided(cache: &StateCache, raw: Option<&str>, judge: JudgeId) -> bool {
    let ran = Cell::new(false);
    cache.judged(
        "cr",
        read(&node("n1"), 0, raw, false),
        judge,
        |_| {
            ran.set(true);
            true
        },
        KeptMarks::default,
    );
    ran.get()
}

#[test]
fn texts_are_the_same_only_when_every_byte_is() {
    let text: String = (0..100u8).map(|i| char::from(b'a' + i % 26)).collect();
    for len in [0, 1, 15, 16, 17, 31, 32, 33, 99, 100] {
        let a = &text[..len];
        assert!(same_text(a, a), "{len} bytes equal to themselves");
        assert!(!same_text(a, &text[..len.saturating_sub(1)]) || len == 0);
        for at in 0..len {
            let mut other = a.as_bytes().to_vec();
            other[at] = b'Z';
            let other = String::from_utf8(other).expect("ascii");
            assert!(!same_text(a, &other), "{len} bytes differing at {at}");
        }
    }
}

#[test]
fn an_entry_is_found_by_name_whatever_place_it_is_asked_at() {
    let cache = StateCache::default();
    // Fresh objects at every ask: found by name, not by the witness.
    let names: Vec<String> = (0..6).map(|i| format!("n{i}")).collect();
    // Each node's own text (an empty state, spelled with its number of spaces).
    let text = |i: usize| format!("{{{}}}", " ".repeat(i));
    let ask = |i: usize, place: usize| {
        cache.get("cr", read(&node(&names[i]), place, Some(&text(i)), true))
    };
    let first: Vec<_> = (0..6).map(|i| ask(i, i)).collect();
    let orders: [&[(usize, usize)]; 4] = [
        // The same order; a reversed one; hints out of range or naming another node's
        // place; a node asked twice in one pass.
        &[(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 5)],
        &[(5, 0), (4, 1), (3, 2), (2, 3), (1, 4), (0, 5)],
        &[(0, 99), (1, 0), (2, 0), (3, 7), (4, 2), (5, 5)],
        &[(3, 1), (3, 4), (0, 3), (1, 2), (2, 5), (4, 0), (5, 1)],
    ];
    for order in orders {
        for &(i, place) in order {
            let again = ask(i, place);
            assert!(
                Arc::ptr_eq(&again, &first[i]),
                "n{i} asked at place {place} in {order:?}: its own parse, not parsed again"
            );
        }
        cache.end_pass();
        assert_eq!(cache.len(), 6, "every node was asked for");
    }
    // A pass that asks for some nodes only: the others are forgotten, the rest still
    // found wherever they are asked.
    for (i, place) in [(4, 0), (1, 1)] {
        assert!(Arc::ptr_eq(&ask(i, place), &first[i]));
    }
    cache.end_pass();
    assert_eq!(cache.len(), 2);
    for (i, place) in [(1, 0), (4, 1), (1, 1), (4, 0)] {
        assert!(Arc::ptr_eq(&ask(i, place), &first[i]), "n{i} at {place}");
    }
    let changed = cache.get("cr", read(&node(&names[4]), 0, Some("{\"p-1\": 1}"), true));
    assert!(
        !Arc::ptr_eq(&changed, &first[4]),
        "new text at a kept place is parsed afresh"
    );
    assert!(
        Arc::ptr_eq(&ask(1, 0), &first[1]),
        "the other node is untouched"
    );
    let gone = cache.get("cr", read(&node(&names[2]), 1, Some(&text(2)), true));
    assert!(
        !Arc::ptr_eq(&gone, &first[2]),
        "a forgotten node is parsed afresh"
    );
}

#[test]
fn a_pass_forgets_exactly_the_entries_it_did_not_ask_for_however_often_it_asked() {
    let cache = StateCache::default();
    let nodes: Vec<ObservedNode> = (0..4).map(|i| node(&format!("n{i}"))).collect();
    let ask = |i: usize, text: &str| cache.get("cr", read(&nodes[i], i, Some(text), true));
    for i in 0..3 {
        ask(i, "{}");
    }
    cache.end_pass();
    assert_eq!(cache.len(), 3);
    // n0 asked twice, its entry replaced in between (new text), n1 once, n2 not at all:
    // three asks of a table of three, but two entries asked for.
    ask(0, "{}");
    ask(0, "{ }");
    ask(1, "{}");
    cache.end_pass();
    assert_eq!(cache.len(), 2, "n2 was not asked for");
    let kept = ask(0, "{ }");
    ask(1, "{}");
    ask(3, "{}");
    cache.end_pass();
    assert_eq!(
        cache.len(),
        3,
        "every entry asked for, a new one among them"
    );
    assert!(Arc::ptr_eq(&kept, &ask(0, "{ }")), "kept, not parsed again");
    cache.end_pass();
    cache.end_pass();
    assert!(
        cache.is_empty(),
        "a pass that asks for nothing forgets everything"
    );
}

#[test]
fn a_verdict_is_kept_only_while_the_text_the_spec_and_the_deletion_are_the_same() {
    let cache = StateCache::default();
    let v1 = cache.judge("cr", &spec("1"), false);
    assert!(decided(&cache, Some("{}"), v1), "the first ask decides");
    assert!(
        !decided(&cache, Some("{}"), v1),
        "the same text and judge reuse it"
    );
    cache.end_pass();

    assert_eq!(
        cache.judge("cr", &spec("1"), false),
        v1,
        "an unchanged spec"
    );
    assert!(!decided(&cache, Some("{}"), v1), "kept across passes");
    assert!(decided(&cache, Some("{ }"), v1), "new text decides again");

    let v2 = cache.judge("cr", &spec("2"), false);
    assert_ne!(v2, v1, "a changed spec is a new judge");
    assert!(decided(&cache, Some("{ }"), v2));
    let deleting = cache.judge("cr", &spec("2"), true);
    assert_ne!(deleting, v2, "deletion is a new judge");
    assert!(decided(&cache, Some("{ }"), deleting));

    let (_, done, _) = cache.judged(
        "cr",
        read(&node("n1"), 0, Some("not json"), false),
        deleting,
        |_| true,
        KeptMarks::default,
    );
    assert!(!done, "a state that does not parse is never done");
}

#[test]
fn a_witness_vouches_only_for_its_own_observed_text() {
    let cache = StateCache::default();
    let key = "nodewright.io/state";
    let first = node("n1");
    let mut on = first.clone();
    on.annotations.insert(key.into(), "{}".into());
    assert!(Observed::ptr_eq(&first, &first.clone()));
    assert!(
        !Observed::ptr_eq(&first, &on),
        "a write copies a shared node"
    );
    let own = |n: &ObservedNode| n.annotations.get(key).cloned();
    let ask = |n: &ObservedNode, raw: Option<&str>, observed: bool| {
        cache.get("cr", read(n, 0, raw, observed))
    };

    let parsed = ask(&on, own(&on).as_deref(), true);
    assert!(Arc::ptr_eq(&ask(&on, own(&on).as_deref(), true), &parsed));
    // This pass's own write to the same node object: the witness does not vouch for it.
    let written = ask(&on, Some("{ }"), false);
    assert!(!Arc::ptr_eq(&written, &parsed), "a written text is read");
    assert!(
        Arc::ptr_eq(&ask(&on, Some("{ }"), false), &written),
        "the same write again is kept (and vouched for by no node: not the node's own)"
    );
    assert!(
        !Arc::ptr_eq(&ask(&on, own(&on).as_deref(), true), &written),
        "the node's own text again, after a write: parsed again"
    );
    // A copy changed: another object, its text compared and found new.
    let mut changed = on.clone();
    changed.annotations.insert(key.into(), "{  }".into());
    let fresh = ask(&changed, own(&changed).as_deref(), true);
    assert!(fresh.state.as_ref().is_ok_and(|s| s.is_empty()));
    assert!(!Arc::ptr_eq(&fresh, &parsed));
    // A copy with the same text: compared, kept, and now the witness.
    let mut same = changed.clone();
    same.labels.insert("l".into(), "v".into());
    assert!(!Observed::ptr_eq(&same, &changed));
    assert!(Arc::ptr_eq(
        &ask(&same, own(&same).as_deref(), true),
        &fresh
    ));
    // No annotation at all on a node that had one: parsed as none.
    let mut none = same.clone();
    none.annotations.remove(key);
    let empty = ask(&none, own(&none).as_deref(), true);
    assert!(!Arc::ptr_eq(&empty, &fresh));
    assert!(Arc::ptr_eq(&ask(&none, None, true), &empty));
}

/// The marks read beside a state are kept while the node is the same object, as
/// observed, and read again from a changed copy or beside a pass's own write; and a
/// steady ask does not look the text up at all.
#[test]
fn marks_are_kept_with_their_witness_and_the_text_is_not_looked_up_again() {
    let cache = StateCache::default();
    let judge = cache.judge("cr", &spec("1"), false);
    let mut on = node("n1");
    on.annotations
        .insert("nodewright.io/state".into(), "{}".into());
    let marked = KeptMarks {
        cordon: true,
        ..KeptMarks::default()
    };
    // Asks with `marks` as what reading the node gives; whether the text was looked up
    // and the marks read.
    let ask = |n: &ObservedNode, observed: bool, marks: KeptMarks| {
        let (looked, read) = (Cell::new(false), Cell::new(false));
        let raw = || {
            looked.set(true);
            n.annotations.get("nodewright.io/state").map(String::as_str)
        };
        let (_, _, got) = cache.judged(
            "cr",
            Read {
                node: n,
                place: 0,
                raw,
                observed,
            },
            judge,
            |_| true,
            || {
                read.set(true);
                marks
            },
        );
        (got, looked.get(), read.get())
    };
    assert_eq!(ask(&on, true, marked), (marked, true, true));
    assert_eq!(
        ask(&on, true, KeptMarks::default()),
        (marked, false, false),
        "the same object: neither text nor marks read again"
    );
    let written = ask(&on, false, KeptMarks::default());
    assert_eq!(written.0, KeptMarks::default(), "beside a write: read");
    let mut copy = on.clone();
    copy.labels.insert("l".into(), "v".into());
    assert_eq!(
        ask(&copy, true, KeptMarks::default()),
        (KeptMarks::default(), true, true),
        "a changed copy with the same text: compared, and its marks read"
    );
    assert_eq!(ask(&copy, true, marked).0, KeptMarks::default());
}

/// The status maps' verdict is kept while the written status, every node and every
/// status are the same; any of them changed, or a verdict that they do not stand, walks
/// the maps again.
#[test]
fn the_maps_verdict_stands_only_for_the_same_objects_and_statuses() {
    let cache = StateCache::default();
    let written = Observed::new(NodeWrightStatus::default());
    let nodes = vec![node("a"), node("b")];
    let now = [Some(Status::Complete), None];
    let walks = Cell::new(0);
    let ask = |w: &Observed<NodeWrightStatus>, n: &[ObservedNode], s: &[Option<Status>], stands| {
        cache.maps_stand("cr", w, n, s, || {
            walks.set(walks.get() + 1);
            stands
        })
    };
    assert!(ask(&written, &nodes, &now, true));
    assert!(ask(&written, &nodes, &now, false), "kept: not walked");
    assert_eq!(walks.get(), 1);

    let other = [Some(Status::Complete), Some(Status::Waiting)];
    assert!(
        !ask(&written, &nodes, &other, false),
        "another status: walked"
    );
    assert!(
        !ask(&written, &nodes, &now, false),
        "a verdict of change is not kept"
    );
    assert!(ask(&written, &nodes, &now, true));
    let mut copied = nodes.clone();
    copied[1].labels.insert("l".into(), "v".into());
    assert!(
        !ask(&written, &copied, &now, false),
        "a changed node: walked"
    );
    assert!(ask(&written, &nodes, &now, true));
    assert!(
        !ask(&written, &nodes[..1], &now[..1], false),
        "a node left: walked"
    );
    assert!(ask(&written, &nodes, &now, true));
    let rewritten = Observed::new(NodeWrightStatus::default());
    assert!(
        !ask(&rewritten, &nodes, &now, false),
        "another status object: walked"
    );
    assert_eq!(walks.get(), 9);
}

/// What `judged` answers without reading the state is what the state reads: whether it
/// parses, its highest erroring generation, whether an entry uninstalls — and it follows a
/// new text.
#[test]
fn a_glance_answers_as_its_reading_and_follows_the_text() {
    use nodewright_api::node_state::{PackageStatus, state_key};
    let cache = StateCache::default();
    let judge = cache.judge("cr", &spec("1"), false);
    let n = node("n1");
    let glance = |raw: Option<&str>| {
        let (glance, _, _) = cache.judged(
            "cr",
            read(&n, 0, raw, false),
            judge,
            |_| true,
            KeptMarks::default,
        );
        assert_eq!(glance, cache.get("cr", read(&n, 0, raw, false)).glance());
        glance
    };
    let mut state = NodeState::new();
    let mut failed = PackageStatus::new("p", "1", Stage::Apply, 3);
    failed.state = State::Erroring;
    state.insert(state_key("p", "1"), failed);
    let mut older = PackageStatus::new("q", "1", Stage::Config, 2);
    older.state = State::Erroring;
    state.insert(state_key("q", "1"), older);
    let erroring = state.annotation();
    assert_eq!(
        glance(erroring.as_deref()),
        Glance {
            parses: true,
            erroring: Some(3),
            uninstalling: false
        }
    );
    state.insert(
        state_key("r", "1"),
        PackageStatus::new("r", "1", Stage::Uninstall, 3),
    );
    let uninstalling = state.annotation();
    assert!(glance(uninstalling.as_deref()).uninstalling);
    assert_eq!(
        glance(Some("not json")),
        Glance {
            parses: false,
            erroring: None,
            uninstalling: false
        }
    );
    assert_eq!(
        glance(None),
        Glance {
            parses: true,
            erroring: None,
            uninstalling: false
        }
    );
}

#[test]
fn a_crs_batch_members_are_found_again_only_for_another_status_or_other_names() {
    let cache = StateCache::default();
    let finds = Cell::new(0);
    let ask = |written: &Observed<NodeWrightStatus>, names: u64, places: Vec<Vec<u32>>| {
        cache.members("cr", written, names, || {
            finds.set(finds.get() + 1);
            places
        })
    };
    let status = Observed::new(NodeWrightStatus::default());
    let first = ask(&status, 1, vec![vec![3, 1]]);
    assert_eq!(&first[..], [vec![3, 1]]);
    assert_eq!(&ask(&status, 1, vec![vec![9]])[..], [vec![3, 1]], "kept");
    assert_eq!(finds.get(), 1);
    cache.end_pass();
    // The same content in a new object (a write), and the same object under other names:
    // each found again.
    let written = Observed::new(NodeWrightStatus::default());
    assert_eq!(&ask(&written, 1, vec![vec![2]])[..], [vec![2]]);
    assert_eq!(&ask(&written, 2, vec![vec![0]])[..], [vec![0]]);
    assert_eq!(finds.get(), 3);
    // A pass that does not ask forgets it.
    cache.end_pass();
    cache.end_pass();
    ask(&written, 2, vec![vec![5]]);
    assert_eq!(finds.get(), 4, "forgotten, found again");
}
