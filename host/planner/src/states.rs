//! Node states parsed once per annotation text, kept across passes.
//!
//! Every pass needs every selected node's state for every CR (is it done? parked?), and at
//! thousands of nodes parsing those JSON annotations again each pass is most of its cost.
//! A [`StateCache`] remembers each (CR, node)'s last annotation text and what it parsed to;
//! a pass parses only the states whose text changed. It is a memo, not an input: a pass
//! with a warm cache returns exactly what it returns with an empty one (a test holds the
//! planner to that), so `plan` stays a function of the snapshot and the clock. The operator
//! keeps one cache for its lifetime and hands it to every snapshot; tests may share one or
//! start empty.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use nodewright_api::node_state::{Malformed, NodeState};

/// One (CR, node)'s state as last parsed.
#[derive(Debug)]
struct Entry {
    /// The annotation text it was parsed from (`None`: no annotation).
    raw: Option<String>,
    parsed: Arc<Result<NodeState, Malformed>>,
    /// The last pass that asked for it.
    seen: u64,
}

#[derive(Debug, Default)]
struct Inner {
    /// CR → node → entry.
    entries: HashMap<String, HashMap<String, Entry>>,
    pass: u64,
}

/// Parsed node states by CR and node, reused while their annotation text is unchanged.
#[derive(Debug, Default)]
pub struct StateCache(Mutex<Inner>);

impl StateCache {
    /// `cr`'s state on `node`, whose annotation reads `raw` (`None`: none): the earlier
    /// parse when the text is the same, a fresh one otherwise.
    pub fn get(
        &self,
        node: &str,
        cr: &str,
        raw: Option<&str>,
    ) -> Arc<Result<NodeState, Malformed>> {
        let mut inner = self.0.lock().expect("state cache lock");
        let pass = inner.pass;
        let by_node = match inner.entries.get_mut(cr) {
            Some(m) => m,
            None => inner.entries.entry(cr.to_string()).or_default(),
        };
        if let Some(e) = by_node.get_mut(node)
            && e.raw.as_deref() == raw
        {
            e.seen = pass;
            return e.parsed.clone();
        }
        let parsed = Arc::new(NodeState::from_annotation(node, cr, raw));
        by_node.insert(
            node.to_string(),
            Entry {
                raw: raw.map(String::from),
                parsed: parsed.clone(),
                seen: pass,
            },
        );
        parsed
    }

    /// Ends a pass: forgets what this pass did not ask for (nodes and CRs that are gone, or
    /// no longer selected), so the cache holds no more than one pass needs.
    pub(crate) fn end_pass(&self) {
        let mut inner = self.0.lock().expect("state cache lock");
        let pass = inner.pass;
        for by_node in inner.entries.values_mut() {
            by_node.retain(|_, e| e.seen == pass);
        }
        inner.entries.retain(|_, by_node| !by_node.is_empty());
        inner.pass += 1;
    }

    /// How many states it holds (for tests and the operator's metrics).
    pub fn len(&self) -> usize {
        let inner = self.0.lock().expect("state cache lock");
        inner.entries.values().map(HashMap::len).sum()
    }

    /// Holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
