//! Node states parsed once per annotation text, kept across passes.
//!
//! Every pass needs every selected node's state for every CR (is it done? parked?), and at
//! thousands of nodes parsing those JSON annotations again each pass is most of its cost.
//! A [`StateCache`] remembers each (CR, node)'s last annotation text and what it parsed to;
//! a pass parses only the states whose text changed. What every pass asks of every state is
//! answered with the parse ([`Reading`]), and whether the CR is done on the node — a scan of
//! every package's entry — is kept beside it for the spec it was judged against
//! ([`StateCache::judged`]). It is a memo, not an input: a pass with a warm cache returns
//! exactly what it returns with an empty one (a test holds the planner to that), so `plan`
//! stays a function of the snapshot and the clock. The operator keeps one cache for its
//! lifetime and hands it to every snapshot; tests may share one or start empty.
//!
//! A snapshot's nodes are shared objects ([`crate::Observed`]), and the operator hands the
//! same one to pass after pass until the node changes. An entry keeps the node it last read
//! its text from (its *witness*); asked again for that very node's own text, it knows the
//! text is the same without reading it — at thousands of nodes, comparing kilobytes of text
//! per node was most of what the cache cost a pass. While it is the witness, the entry also
//! keeps the CR's marks on it (`work::KeptMarks`), so a steady pass does not
//! search the node's annotations at all; and per CR, the cache keeps whether its status's
//! per-node maps stood for the last pass's nodes and statuses (`StateCache::maps_stand`).

use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap as HashMap;

use nodewright_api::node_state::{Malformed, NodeState, Stage, State};
use nodewright_api::v1alpha1::{NodeWrightSpec, NodeWrightStatus, Status};

use crate::snapshot::{Observed, ObservedNode};
use crate::work::KeptMarks;

/// A node's state for a CR as parsed, with what a pass asks of every node's state answered
/// once per text: at thousands of nodes, walking each state's entries every pass to find
/// that none is erroring or uninstalling costs more than anything else about a node that
/// has nothing to do.
#[derive(Debug)]
pub(crate) struct Reading {
    /// The state, or why it does not parse.
    pub state: Result<NodeState, Malformed>,
    /// The highest generation of an erroring entry (`None`: no entry is erroring).
    pub erroring: Option<i64>,
    /// Some entry is at an uninstall stage.
    pub uninstalling: bool,
}

impl Reading {
    fn new(state: Result<NodeState, Malformed>) -> Self {
        let entries = || state.iter().flat_map(|st| st.values());
        let erroring = entries()
            .filter(|e| e.state == State::Erroring)
            .map(|e| e.generation)
            .max();
        let uninstalling =
            entries().any(|e| matches!(e.stage, Stage::Uninstall | Stage::UninstallInterrupt));
        Reading {
            state,
            erroring,
            uninstalling,
        }
    }
}

/// One (CR, node)'s state as last parsed.
#[derive(Debug)]
struct Entry {
    /// The annotation text it was parsed from (`None`: no annotation).
    raw: Option<String>,
    /// A node whose own annotation (as observed, not a pass's write) reads `raw`. Shared
    /// objects do not change (a write copies a shared one first), so while this one is the
    /// node asked about, its own text is `raw` without comparing.
    witness: Option<ObservedNode>,
    parsed: Arc<Reading>,
    /// Whether the CR is done with this state, and under which [`Judge`] that was decided.
    done: Option<(u64, bool)>,
    /// The CR's marks on the witness, as read from it (`None` while not read, and whenever
    /// the witness changes): the witness does not change, so neither do they.
    marks: Option<KeptMarks>,
    /// The last pass that asked for it.
    seen: u64,
}

impl Entry {
    /// Whether `node` is this entry's witness (the very object, not an equal one).
    fn witnessed_by(&self, node: &ObservedNode) -> bool {
        self.witness
            .as_ref()
            .is_some_and(|w| ObservedNode::ptr_eq(w, node))
    }
}

/// What a CR's "done on this node" is judged against — its spec and whether it is being
/// deleted — and that judge's number: a new number for every change, so a verdict recorded
/// under one is never read under another.
#[derive(Debug)]
struct Judge {
    spec: NodeWrightSpec,
    deleting: bool,
    id: u64,
    seen: u64,
}

/// A CR's per-node status maps (`nodeStatus`, `nodeBootIds`) found standing: against which
/// written status, over which nodes, for which statuses. Held objects do not change (a write
/// copies a shared one first), so while the pass asks about the same ones the answer stands
/// without walking the maps again.
#[derive(Debug)]
struct Stands {
    written: Observed<NodeWrightStatus>,
    nodes: Vec<ObservedNode>,
    statuses: Vec<Option<Status>>,
    seen: u64,
}

/// One CR's entries, each kept where its node was in the last snapshot that asked for it:
/// a pass over a snapshot in the same order finds each at the node's own place, in order,
/// without hashing its name (at thousands of nodes, a hash map's scattered slots were most
/// of what the cache cost a pass).
#[derive(Debug, Default)]
struct Table {
    slots: Vec<(String, Entry)>,
    /// Node → slot.
    at: HashMap<String, usize>,
}

impl Table {
    /// `node`'s slot, moved to `place` (where the node is in this snapshot) when it is
    /// elsewhere and the table is that long.
    fn find(&mut self, node: &ObservedNode, place: usize) -> Option<usize> {
        if self
            .slots
            .get(place)
            .is_some_and(|(n, e)| e.witnessed_by(node) || *n == node.name)
        {
            return Some(place);
        }
        let node = node.name.as_str();
        let found = *self.at.get(node)?;
        if place >= self.slots.len() {
            return Some(found);
        }
        self.slots.swap(found, place);
        for i in [found, place] {
            *self
                .at
                .get_mut(&self.slots[i].0)
                .expect("every slot is indexed") = i;
        }
        Some(place)
    }

    /// Adds `node`'s entry (absent), at `place` when it can be.
    fn add(&mut self, node: &ObservedNode, place: usize, entry: Entry) -> usize {
        self.at.insert(node.name.clone(), self.slots.len());
        self.slots.push((node.name.clone(), entry));
        self.find(node, place).expect("just added")
    }

    /// Keeps the entries asked for in `pass`.
    fn retain(&mut self, pass: u64) {
        if self.slots.iter().all(|(_, e)| e.seen == pass) {
            return;
        }
        self.slots.retain(|(_, e)| e.seen == pass);
        self.at = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (n.clone(), i))
            .collect();
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// CR → its entries.
    entries: HashMap<String, Table>,
    /// CR → its per-node status maps, as the last pass that asked found them standing.
    standing: HashMap<String, Stands>,
    /// CR → the spec its verdicts were judged against.
    judges: HashMap<String, Judge>,
    /// The last judge's number.
    judged: u64,
    pass: u64,
}

/// A CR's judge for this pass ([`StateCache::judge`]): names the spec the verdicts of
/// [`StateCache::judged`] hold for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct JudgeId(u64);

/// Parsed node states by CR and node, reused while their annotation text is unchanged (with
/// the marks read beside them, and each CR's status maps' verdict).
#[derive(Debug, Default)]
pub struct StateCache(Mutex<Inner>);

/// A node's state annotation for one CR, as a pass reads it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Read<'a, F> {
    /// The node, from the snapshot.
    pub node: &'a ObservedNode,
    /// Where the node is in the snapshot (a hint: any value gives the same answer).
    pub place: usize,
    /// Looks up the text (`None`: no annotation). Asked only when the node's entry cannot
    /// vouch for its text without it: a steady pass does not search the node's annotations.
    pub raw: F,
    /// The text is the node's own, as observed — not a write of this pass's.
    pub observed: bool,
}

impl StateCache {
    /// `cr`'s state as `read`: the earlier parse when the text is the same, a fresh one
    /// otherwise.
    pub(crate) fn get<'r>(
        &self,
        cr: &str,
        read: Read<'r, impl FnOnce() -> Option<&'r str>>,
    ) -> Arc<Reading> {
        let mut inner = self.0.lock().expect("state cache lock");
        inner.entry(cr, read).parsed.clone()
    }

    /// The judge of `cr`'s verdicts this pass: the same as the last pass's while its spec
    /// and deletion are, a new one otherwise.
    pub(crate) fn judge(&self, cr: &str, spec: &NodeWrightSpec, deleting: bool) -> JudgeId {
        let mut inner = self.0.lock().expect("state cache lock");
        let pass = inner.pass;
        if let Some(j) = inner.judges.get_mut(cr)
            && j.deleting == deleting
            && j.spec == *spec
        {
            j.seen = pass;
            return JudgeId(j.id);
        }
        inner.judged += 1;
        let id = inner.judged;
        let judge = Judge {
            spec: spec.clone(),
            deleting,
            id,
            seen: pass,
        };
        inner.judges.insert(cr.to_string(), judge);
        JudgeId(id)
    }

    /// [`StateCache::get`], whether the CR is done with that state, and its marks on the
    /// node. Done is `decide`'s verdict (`false` for a state that does not parse), kept while
    /// the text and `judge` are the same; `decide` must be a function of the state and the
    /// judge's spec alone. The marks are `marks`' reading of the node, kept while the node
    /// is the same object as observed; `marks` must read the node as observed.
    pub(crate) fn judged<'r>(
        &self,
        cr: &str,
        read: Read<'r, impl FnOnce() -> Option<&'r str>>,
        judge: JudgeId,
        decide: impl FnOnce(&NodeState) -> bool,
        marks: impl FnOnce() -> KeptMarks,
    ) -> (Arc<Reading>, bool, KeptMarks) {
        let (node, observed) = (read.node, read.observed);
        let mut inner = self.0.lock().expect("state cache lock");
        let e = inner.entry(cr, read);
        let done = match e.done {
            Some((id, done)) if id == judge.0 => done,
            _ => {
                let done = e.parsed.state.as_ref().is_ok_and(decide);
                e.done = Some((judge.0, done));
                done
            }
        };
        let witnessed = observed && e.witnessed_by(node);
        let marks = match e.marks {
            Some(kept) if witnessed => kept,
            _ => {
                let read = marks();
                if witnessed {
                    e.marks = Some(read);
                }
                read
            }
        };
        (e.parsed.clone(), done, marks)
    }

    /// Whether `cr`'s per-node status maps as `written` stand for `statuses`, one for each
    /// of `nodes` in order: `walk`'s answer, kept while the written status and every node
    /// are the same objects and every status is the same. `walk` must be a function of
    /// those alone.
    pub(crate) fn maps_stand(
        &self,
        cr: &str,
        written: &Observed<NodeWrightStatus>,
        nodes: &[ObservedNode],
        statuses: &[Option<Status>],
        walk: impl FnOnce() -> bool,
    ) -> bool {
        let mut inner = self.0.lock().expect("state cache lock");
        let pass = inner.pass;
        if let Some(s) = inner.standing.get_mut(cr)
            && Observed::ptr_eq(&s.written, written)
            && s.nodes.len() == nodes.len()
            && s.nodes
                .iter()
                .zip(nodes)
                .all(|(a, b)| Observed::ptr_eq(a, b))
            && s.statuses == statuses
        {
            s.seen = pass;
            return true;
        }
        let stands = walk();
        if stands {
            let kept = Stands {
                written: written.clone(),
                nodes: nodes.to_vec(),
                statuses: statuses.to_vec(),
                seen: pass,
            };
            inner.standing.insert(cr.to_string(), kept);
        } else {
            inner.standing.remove(cr);
        }
        stands
    }

    /// Ends a pass: forgets what this pass did not ask for (nodes and CRs that are gone, or
    /// no longer selected), so the cache holds no more than one pass needs.
    pub(crate) fn end_pass(&self) {
        let mut inner = self.0.lock().expect("state cache lock");
        let pass = inner.pass;
        for table in inner.entries.values_mut() {
            table.retain(pass);
        }
        inner.entries.retain(|_, table| !table.slots.is_empty());
        inner.judges.retain(|_, j| j.seen == pass);
        inner.standing.retain(|_, s| s.seen == pass);
        inner.pass += 1;
    }

    /// How many states it holds (for tests and the operator's metrics).
    pub fn len(&self) -> usize {
        let inner = self.0.lock().expect("state cache lock");
        inner.entries.values().map(|t| t.slots.len()).sum()
    }

    /// Holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    /// `cr`'s entry for the node `read`, parsed afresh unless its text is the one parsed
    /// last; marks it asked for this pass.
    fn entry<'r>(
        &mut self,
        cr: &str,
        read: Read<'r, impl FnOnce() -> Option<&'r str>>,
    ) -> &mut Entry {
        let Read {
            node,
            place,
            raw,
            observed,
        } = read;
        // The text, looked up once if at all.
        let (mut lookup, mut text) = (Some(raw), None);
        let mut raw = || *text.get_or_insert_with(|| lookup.take().expect("looked up once")());
        let pass = self.pass;
        if !self.entries.contains_key(cr) {
            self.entries.insert(cr.to_string(), Table::default());
        }
        let table = self.entries.get_mut(cr).expect("present or just inserted");
        let found = table.find(node, place);
        let kept = found.filter(|&i| {
            let e = &mut table.slots[i].1;
            if observed && e.witnessed_by(node) {
                return true;
            }
            let same = match (e.raw.as_deref(), raw()) {
                (Some(kept), Some(raw)) => same_text(kept, raw),
                (kept, raw) => kept.is_none() && raw.is_none(),
            };
            if same && observed {
                e.witness = Some(node.clone());
                e.marks = None;
            }
            same
        });
        let at = match kept {
            Some(at) => at,
            None => {
                let raw = raw();
                let entry = Entry {
                    raw: raw.map(String::from),
                    witness: observed.then(|| node.clone()),
                    parsed: Arc::new(Reading::new(NodeState::from_annotation(
                        &node.name, cr, raw,
                    ))),
                    done: None,
                    marks: None,
                    seen: pass,
                };
                match found {
                    Some(at) => {
                        table.slots[at].1 = entry;
                        at
                    }
                    None => table.add(node, place, entry),
                }
            }
        };
        let e = &mut table.slots[at].1;
        e.seen = pass;
        e
    }
}

/// Whether two texts are the same, compared sixteen bytes at a step. `==` on strings ends in
/// `memcmp`, which in the static musl build compares one byte per step, and a node's state
/// annotation is kilobytes long: that comparison was a tenth of a pass (2026-12-06).
fn same_text(a: &str, b: &str) -> bool {
    const STEP: usize = 16;
    let word = |c: &[u8]| u128::from_ne_bytes(c.try_into().expect("a whole step"));
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (x, y) = (a.chunks_exact(STEP), b.chunks_exact(STEP));
    a.len() == b.len()
        && x.remainder() == y.remainder()
        && x.zip(y).all(|(x, y)| word(x) == word(y))
}

#[cfg(test)]
mod tests {
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
        let ask =
            |w: &Observed<NodeWrightStatus>, n: &[ObservedNode], s: &[Option<Status>], stands| {
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
}
