//! Node states parsed once per annotation text, kept across passes.
//!
//! Every pass needs every selected node's state for every CR (is it done? parked?), and at
//! thousands of nodes parsing those JSON annotations again each pass is most of its cost.
//! A [`StateCache`] remembers each (CR, node)'s last annotation text and what it parsed to;
//! a pass parses only the states whose text changed. What every pass asks of every state is
//! answered with the parse ([`Reading`]) and copied into its entry (`Glance`), so a pass
//! judges a node without reading its state; whether the CR is done on the node — a scan of
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

use std::cell::LazyCell;
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

/// What a pass asks of most nodes' readings, kept in the cache's entry beside the reading:
/// a node with nothing to do is judged without reading its state. At 10,000 nodes each
/// reading is out of the core's cache by the next pass, and a pass that took a reference to
/// every one of them (and later let go of it) paid two misses a node for what fits in a few
/// bytes here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Glance {
    /// The state parses.
    pub parses: bool,
    /// As [`Reading::erroring`].
    pub erroring: Option<i64>,
    /// As [`Reading::uninstalling`].
    pub uninstalling: bool,
}

impl Reading {
    /// What [`Glance`] keeps of it.
    pub(crate) fn glance(&self) -> Glance {
        Glance {
            parses: self.state.is_ok(),
            erroring: self.erroring,
            uninstalling: self.uninstalling,
        }
    }

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
    /// `parsed`'s glance.
    glance: Glance,
    /// Whether the CR is done with this state, and under which [`Judge`] that was decided.
    done: Option<(u64, bool)>,
    /// The CR's marks on the witness, as read from it (`None` while not read, and whenever
    /// the witness changes): the witness does not change, so neither do they.
    marks: Option<KeptMarks>,
    /// The last pass that asked for it ([`NEVER`] until one does).
    seen: u64,
}

/// An entry's `seen` before any pass has asked for it.
const NEVER: u64 = u64::MAX;

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

/// A CR's last batches' members, as its written status lists them (compartment by
/// compartment, in the status's order), each found among the nodes: a node place, or
/// `places::NOWHERE`. The status object does not change (a write makes a new one), so while
/// the pass asks about the same one under the same node names, so do the places.
#[derive(Debug)]
struct Members {
    written: Observed<NodeWrightStatus>,
    /// The node names' number (`NodeIndex::names`) the places were found under.
    names: u64,
    places: Arc<[Vec<u32>]>,
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
    /// How many entries the pass named first asked for: at the end of a pass that asked for
    /// all of them, nothing is forgotten, and no entry needs looking at to know it (at
    /// 10,000 nodes a sweep of every entry for that was a megabyte and a half of reads).
    asked: (u64, usize),
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

    /// Slot `at`'s entry, asked for in `pass`.
    fn ask(&mut self, at: usize, pass: u64) -> &mut Entry {
        if self.asked.0 != pass {
            self.asked = (pass, 0);
        }
        let e = &mut self.slots[at].1;
        if e.seen != pass {
            e.seen = pass;
            self.asked.1 += 1;
        }
        e
    }

    /// Keeps the entries asked for in `pass`.
    fn retain(&mut self, pass: u64) {
        if self.asked == (pass, self.slots.len()) {
            return;
        }
        self.slots.retain(|(_, e)| e.seen == pass);
        self.asked = (pass, self.slots.len());
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
    /// CR → its last batches' members, as the last pass found them.
    members: HashMap<String, Members>,
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

    /// A glance at [`StateCache::get`]'s reading, whether the CR is done with that state,
    /// and its marks on the node; none of them reads the reading itself once kept. Done is
    /// `decide`'s verdict (`false` for a state that does not parse), kept while the text and
    /// `judge` are the same; `decide` must be a function of the state and the judge's spec
    /// alone. The marks are `marks`' reading of the node, kept while the node
    /// is the same object as observed; `marks` must read the node as observed.
    pub(crate) fn judged<'r>(
        &self,
        cr: &str,
        read: Read<'r, impl FnOnce() -> Option<&'r str>>,
        judge: JudgeId,
        decide: impl FnOnce(&NodeState) -> bool,
        marks: impl FnOnce() -> KeptMarks,
    ) -> (Glance, bool, KeptMarks) {
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
        (e.glance, done, marks)
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

    /// The places of `cr`'s last batches' members as `written` lists them, found by `find`
    /// under the node names numbered `names`: kept while the status is the same object and
    /// the names are at the same places. `find` must be a function of those alone.
    pub(crate) fn members(
        &self,
        cr: &str,
        written: &Observed<NodeWrightStatus>,
        names: u64,
        find: impl FnOnce() -> Vec<Vec<u32>>,
    ) -> Arc<[Vec<u32>]> {
        let mut inner = self.0.lock().expect("state cache lock");
        let pass = inner.pass;
        if let Some(m) = inner.members.get_mut(cr)
            && Observed::ptr_eq(&m.written, written)
            && m.names == names
        {
            m.seen = pass;
            return m.places.clone();
        }
        let places: Arc<[Vec<u32>]> = find().into();
        let kept = Members {
            written: written.clone(),
            names,
            places: places.clone(),
            seen: pass,
        };
        inner.members.insert(cr.to_string(), kept);
        places
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
        inner.members.retain(|_, m| m.seen == pass);
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
        let raw = LazyCell::new(raw);
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
            let same = match (e.raw.as_deref(), *raw) {
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
                let raw = *raw;
                let parsed = Reading::new(NodeState::from_annotation(&node.name, cr, raw));
                let entry = Entry {
                    raw: raw.map(String::from),
                    witness: observed.then(|| node.clone()),
                    glance: parsed.glance(),
                    parsed: Arc::new(parsed),
                    done: None,
                    marks: None,
                    seen: NEVER,
                };
                match found {
                    Some(at) => {
                        // Replaced: asked for as the entry it replaces was.
                        let seen = table.slots[at].1.seen;
                        table.slots[at].1 = Entry { seen, ..entry };
                        at
                    }
                    None => table.add(node, place, entry),
                }
            }
        };
        table.ask(at, pass)
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
mod tests;
