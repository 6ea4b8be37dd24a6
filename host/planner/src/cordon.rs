//! Shared cordon ownership.
//!
//! Each NodeWright that needs a node cordoned records itself in the node annotation
//! `nodewright.io/cordon.<cr>`, with one of two marks:
//! - [`Mark::Ours`]: nodewright cordoned the node;
//! - [`Mark::Found`]: the node was already cordoned by someone else (an admin, another
//!   tool) — that cordon is never released by nodewright.
//!
//! Guarantees:
//! - the node is uncordoned only when the last owner releases it and no owner ever found
//!   it cordoned by someone else (a `Found` mark is inherited by later owners, so it
//!   survives the CR that recorded it);
//! - a cordon lifted by someone else while a CR still owns it is put back;
//! - drain starts only once the cordon is persisted: in the pass after nodewright cordons,
//!   or at once when the node was already cordoned.

use std::collections::BTreeMap;

/// How a CR holds a cordon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// nodewright made the cordon.
    Ours,
    /// The cordon predates nodewright's owners: never released by nodewright.
    Found,
}

impl Mark {
    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            Mark::Ours => "true",
            Mark::Found => "external",
        }
    }

    /// Parses an annotation value (anything unknown is treated as `Found`: when in doubt,
    /// do not release).
    pub fn parse(value: &str) -> Mark {
        if value == "true" {
            Mark::Ours
        } else {
            Mark::Found
        }
    }
}

/// A change to the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Set `spec.unschedulable: true`.
    Cordon,
    /// Set `spec.unschedulable: false`.
    Uncordon,
    /// Write the CR's mark.
    Mark(String, Mark),
    /// Remove the CR's mark.
    Unmark(String),
}

/// What acquiring the cordon needs, and whether draining may start now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acquire {
    /// Changes to make.
    pub actions: Vec<Action>,
    /// True when the cordon is already in place and recorded: drain may start this pass.
    pub ready_to_drain: bool,
}

/// The node's cordon as observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeCordon {
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// Marks by CR name.
    pub owners: BTreeMap<String, Mark>,
}

impl NodeCordon {
    /// `cr` needs the node cordoned.
    pub fn acquire(&self, cr: &str) -> Acquire {
        match self.owners.get(cr) {
            Some(_) if self.unschedulable => Acquire {
                actions: vec![],
                ready_to_drain: true,
            },
            // Someone lifted our cordon mid-work: put it back, drain next pass.
            Some(_) => Acquire {
                actions: vec![Action::Cordon],
                ready_to_drain: false,
            },
            None if self.unschedulable => {
                let found =
                    self.owners.is_empty() || self.owners.values().any(|m| *m == Mark::Found);
                let mark = if found { Mark::Found } else { Mark::Ours };
                Acquire {
                    actions: vec![Action::Mark(cr.into(), mark)],
                    ready_to_drain: true,
                }
            }
            None => {
                let inherited = if self.owners.values().any(|m| *m == Mark::Found) {
                    Mark::Found
                } else {
                    Mark::Ours
                };
                Acquire {
                    actions: vec![Action::Mark(cr.into(), inherited), Action::Cordon],
                    ready_to_drain: false,
                }
            }
        }
    }

    /// `cr` no longer needs the cordon.
    pub fn release(&self, cr: &str) -> Vec<Action> {
        let Some(mine) = self.owners.get(cr) else {
            return vec![];
        };
        let others = self.owners.iter().filter(|(k, _)| k.as_str() != cr).count();
        let mut actions = vec![Action::Unmark(cr.into())];
        if others == 0 && *mine == Mark::Ours && self.unschedulable {
            actions.push(Action::Uncordon);
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(unschedulable: bool, owners: &[(&str, Mark)]) -> NodeCordon {
        NodeCordon {
            unschedulable,
            owners: owners.iter().map(|(k, m)| (k.to_string(), *m)).collect(),
        }
    }

    #[test]
    fn nodewright_cordons_then_drains_next_pass_and_releases() {
        let n = node(false, &[]);
        assert_eq!(
            n.acquire("a"),
            Acquire {
                actions: vec![Action::Mark("a".into(), Mark::Ours), Action::Cordon],
                ready_to_drain: false
            }
        );
        let n = node(true, &[("a", Mark::Ours)]);
        assert!(n.acquire("a").ready_to_drain && n.acquire("a").actions.is_empty());
        assert_eq!(
            n.release("a"),
            [Action::Unmark("a".into()), Action::Uncordon]
        );
    }

    #[test]
    fn an_external_cordon_is_kept_after_completion() {
        let n = node(true, &[]);
        let acq = n.acquire("a");
        assert_eq!(
            acq,
            Acquire {
                actions: vec![Action::Mark("a".into(), Mark::Found)],
                ready_to_drain: true
            },
            "already cordoned: drain now"
        );
        assert_eq!(
            node(true, &[("a", Mark::Found)]).release("a"),
            [Action::Unmark("a".into())]
        );
    }

    #[test]
    fn shared_cordons_stay_until_the_last_owner_and_found_marks_are_inherited() {
        // Two CRs share nodewright's cordon: the first to finish leaves it.
        let n = node(true, &[("a", Mark::Ours)]);
        assert_eq!(
            n.acquire("b").actions,
            [Action::Mark("b".into(), Mark::Ours)]
        );
        assert_eq!(
            node(true, &[("a", Mark::Ours), ("b", Mark::Ours)]).release("a"),
            [Action::Unmark("a".into())]
        );
        assert_eq!(
            node(true, &[("b", Mark::Ours)]).release("b"),
            [Action::Unmark("b".into()), Action::Uncordon]
        );
        // An external cordon found by A is inherited by B, so B never releases it either.
        assert_eq!(
            node(true, &[("a", Mark::Found)]).acquire("b").actions,
            [Action::Mark("b".into(), Mark::Found)]
        );
        assert_eq!(
            node(true, &[("b", Mark::Found)]).release("b"),
            [Action::Unmark("b".into())]
        );
    }

    #[test]
    fn a_cordon_lifted_mid_work_is_put_back() {
        let n = node(false, &[("a", Mark::Ours)]);
        assert_eq!(
            n.acquire("a"),
            Acquire {
                actions: vec![Action::Cordon],
                ready_to_drain: false
            }
        );
        // Releasing when someone already uncordoned: just drop the mark.
        assert_eq!(n.release("a"), [Action::Unmark("a".into())]);
        assert_eq!(node(false, &[]).release("a"), Vec::<Action>::new());
    }

    #[test]
    fn unknown_marks_are_never_released() {
        assert_eq!(Mark::parse("true"), Mark::Ours);
        assert_eq!(Mark::parse("external"), Mark::Found);
        assert_eq!(Mark::parse("???"), Mark::Found);
    }
}
