//! The stage graph of one package on one node.
//!
//! ```text
//! no interrupt in scope:   apply → config ▪          upgrade → config ▪
//! interrupt in scope:      plan → apply|upgrade → config → interrupt → post-interrupt ▪
//! uninstall:               uninstall ▪ (entry removed)
//!                          uninstall → uninstall-interrupt ▪ (entry removed)
//! ```
//! Transitions happen only from state `complete`. `post-interrupt` is always terminal;
//! `config` is terminal only without an interrupt in scope.

use nodewright_api::node_state::{Stage, State};

/// Where a package goes after a stage completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Run this stage next.
    Stage(Stage),
    /// The package is complete on the node.
    Done,
    /// The package is uninstalled: remove its entry from the node state.
    Remove,
}

/// The stage after `stage` completes.
pub fn next_on_success(stage: Stage, interrupt_in_scope: bool) -> Next {
    match (stage, interrupt_in_scope) {
        (Stage::Plan, _) => Next::Stage(Stage::Apply),
        (Stage::Apply | Stage::Upgrade, _) => Next::Stage(Stage::Config),
        (Stage::Config, true) => Next::Stage(Stage::Interrupt),
        (Stage::Config, false) => Next::Done,
        (Stage::Interrupt, _) => Next::Stage(Stage::PostInterrupt),
        (Stage::PostInterrupt, _) => Next::Done,
        (Stage::Uninstall, true) => Next::Stage(Stage::UninstallInterrupt),
        (Stage::Uninstall, false) | (Stage::UninstallInterrupt, _) => Next::Remove,
    }
}

/// Whether the stage is an interrupt (run by the node's merged interrupt Job).
pub fn is_interrupt(stage: Stage) -> bool {
    match stage {
        Stage::Interrupt | Stage::UninstallInterrupt => true,
        Stage::Plan
        | Stage::Apply
        | Stage::Config
        | Stage::PostInterrupt
        | Stage::Upgrade
        | Stage::Uninstall => false,
    }
}

/// The stage an executor (re)starts at for a node-state entry (`None`: the package is not
/// on the node yet). An unfinished stage re-runs; `config`, `upgrade` and the uninstall
/// stages are kept; a completed stage moves on.
pub fn entry_stage(entry: Option<(Stage, State)>, interrupt_in_scope: bool) -> Next {
    match entry {
        None => Next::Stage(Stage::Apply),
        Some((stage, State::Complete)) => next_on_success(stage, interrupt_in_scope),
        Some((stage, State::InProgress | State::Erroring | State::Unknown | State::Skipped)) => {
            Next::Stage(stage)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodewright_api::agent::RunStage;

    #[test]
    fn install_lanes() {
        // Without an interrupt: apply → config ▪.
        assert_eq!(
            next_on_success(Stage::Apply, false),
            Next::Stage(Stage::Config)
        );
        assert_eq!(next_on_success(Stage::Config, false), Next::Done);
        assert_eq!(
            next_on_success(Stage::Upgrade, false),
            Next::Stage(Stage::Config)
        );
        // With one: … config → interrupt → post-interrupt ▪.
        assert_eq!(
            next_on_success(Stage::Config, true),
            Next::Stage(Stage::Interrupt)
        );
        assert_eq!(
            next_on_success(Stage::Interrupt, true),
            Next::Stage(Stage::PostInterrupt)
        );
        assert_eq!(next_on_success(Stage::PostInterrupt, true), Next::Done);
        assert_eq!(
            next_on_success(Stage::PostInterrupt, false),
            Next::Done,
            "post-interrupt is unconditionally terminal"
        );
    }

    #[test]
    fn uninstall_lanes() {
        assert_eq!(next_on_success(Stage::Uninstall, false), Next::Remove);
        assert_eq!(
            next_on_success(Stage::Uninstall, true),
            Next::Stage(Stage::UninstallInterrupt)
        );
        assert_eq!(
            next_on_success(Stage::UninstallInterrupt, true),
            Next::Remove
        );
    }

    #[test]
    fn every_stage_but_the_interrupts_has_a_check() {
        // The interrupt has no check of its own: `post-interrupt` verifies it (and the
        // reboot protocol checks the boot ID). A plan changes nothing, so nothing to verify.
        for stage in Stage::ALL.into_iter().filter(|s| *s != Stage::Plan) {
            let check = RunStage::of(stage).and_then(RunStage::check);
            assert_eq!(is_interrupt(stage), check.is_none(), "{stage:?}");
        }
    }

    #[test]
    fn executors_restart_unfinished_stages_and_move_past_finished_ones() {
        assert_eq!(entry_stage(None, true), Next::Stage(Stage::Apply));
        assert_eq!(
            entry_stage(Some((Stage::Apply, State::Erroring)), true),
            Next::Stage(Stage::Apply)
        );
        assert_eq!(
            entry_stage(Some((Stage::Config, State::InProgress)), false),
            Next::Stage(Stage::Config)
        );
        assert_eq!(
            entry_stage(Some((Stage::Apply, State::Complete)), false),
            Next::Stage(Stage::Config)
        );
        assert_eq!(
            entry_stage(Some((Stage::Config, State::Complete)), false),
            Next::Done
        );
        assert_eq!(
            entry_stage(Some((Stage::Interrupt, State::Skipped)), true),
            Next::Stage(Stage::Interrupt)
        );
    }
}
