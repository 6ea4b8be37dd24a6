//! A node's state as its pass changes it, copied on the first change.

use std::borrow::Cow;

use nodewright_api::node_state::{NodeState, PackageStatus};

/// A CR's state on a node as the node's pass has left it: the state the pass was given, read
/// in place, until a step changes it — then a copy of its own. Most passes change nothing
/// (a node whose Jobs still run reads as it did), and copying every running node's state
/// to compare it afterwards was a tenth of a 10,000-node pass: each copy allocates the
/// entries, their strings and config maps anew, none of which stays in the cache between
/// passes at that size.
///
/// Reads go through `Deref`; every change through [`Draft::edit`] (or the guarded
/// [`Draft::find_mut_if`] / [`Draft::get_mut_if`], which copy only when the entry reads as
/// needing the change). There is no `DerefMut`: a step cannot change the state without
/// asking for the copy.
#[derive(Debug)]
pub(crate) struct Draft<'s>(Cow<'s, NodeState>);

impl<'s> Draft<'s> {
    /// `state`, unchanged.
    pub(crate) fn new(state: &'s NodeState) -> Self {
        Draft(Cow::Borrowed(state))
    }

    /// The state to change: copied on the first call.
    pub(crate) fn edit(&mut self) -> &mut NodeState {
        self.0.to_mut()
    }

    /// Package `name`'s entry at `version` to change, when it has one and `wants` says it
    /// needs the change (the state is copied only then).
    pub(crate) fn find_mut_if(
        &mut self,
        name: &str,
        version: &str,
        wants: impl FnOnce(&PackageStatus) -> bool,
    ) -> Option<&mut PackageStatus> {
        if !self.find(name, version).is_some_and(wants) {
            return None;
        }
        self.edit().find_mut(name, version)
    }

    /// [`Draft::find_mut_if`] for the entry under state key `key`.
    pub(crate) fn get_mut_if(
        &mut self,
        key: &str,
        wants: impl FnOnce(&PackageStatus) -> bool,
    ) -> Option<&mut PackageStatus> {
        if !self.get(key).is_some_and(wants) {
            return None;
        }
        self.edit().get_mut(key)
    }

    /// The state as the pass changed it: `None` when nothing asked for a change.
    pub(crate) fn into_changed(self) -> Option<NodeState> {
        match self.0 {
            Cow::Borrowed(_) => None,
            Cow::Owned(state) => Some(state),
        }
    }
}

impl std::ops::Deref for Draft<'_> {
    type Target = NodeState;

    fn deref(&self) -> &NodeState {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use nodewright_api::node_state::{Stage, State, state_key};

    use super::*;

    #[test]
    fn a_draft_is_copied_only_for_a_change_its_guard_asks_for() {
        let before = NodeState::from([(
            state_key("p", "1"),
            PackageStatus::new("p", "1", Stage::Apply, 1),
        )]);
        let mut draft = Draft::new(&before);
        assert!(draft.find("p", "1").is_some());
        assert!(
            draft
                .find_mut_if("p", "1", |e| e.state == State::Complete)
                .is_none()
        );
        assert!(draft.get_mut_if(&state_key("p", "1"), |_| false).is_none());
        assert!(draft.find_mut_if("q", "1", |_| true).is_none());
        assert!(
            matches!(draft.0, Cow::Borrowed(_)),
            "no guard asked: nothing copied"
        );

        let e = draft.find_mut_if("p", "1", |e| e.state == State::InProgress);
        e.expect("the guard asks").state = State::Complete;
        let changed = draft.into_changed().expect("copied on the change");
        assert_eq!(changed.find("p", "1").unwrap().state, State::Complete);
        assert_eq!(
            before.find("p", "1").unwrap().state,
            State::InProgress,
            "the given state is left as it was"
        );
    }
}
