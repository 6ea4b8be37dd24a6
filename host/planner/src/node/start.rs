//! Starting the pass's Jobs on a node: package stages first, then the node's merged
//! interrupt (which must see every Job this pass starts), and uninstall interrupts.

use std::collections::BTreeMap;

use nodewright_api::agent::RunStage;
use nodewright_api::node_state::{PackageStatus, Stage, State, state_key};
use nodewright_api::v1alpha1::Interrupt;

use crate::action::{Action, Event, Target};
use crate::interrupts::{Merged, coalesce};
use crate::jobs::{interrupt_job, package_job};
use crate::snapshot::Work;

use super::draft::Draft;
use super::{Runnable, Step, Visit};

/// Starts what may start: a disruptive step only once the node is `ready` (cordoned and
/// drained), an interrupt only once no package stage runs, a reboot only when it is not
/// `reboots_held` (the operator replicas on the node are still being fenced).
pub(super) fn start(
    v: &Visit<'_, '_>,
    state: &mut Draft<'_>,
    runnable: &[Runnable<'_>],
    ready: bool,
    reboots_held: bool,
    actions: &mut Vec<Action>,
) {
    // The node's merged interrupt among runnable packages that are not uninstalling.
    let candidates: BTreeMap<String, Vec<Interrupt>> = runnable
        .iter()
        .filter(|r| {
            !matches!(
                r.step,
                Step::UninstallInterrupt | Step::Run(RunStage::Uninstall | RunStage::PostInterrupt)
            )
        })
        .filter(|r| !r.scope.is_empty())
        .map(|r| (r.name.clone(), r.scope.clone()))
        .collect();
    let merged = coalesce(&candidates);
    let mut busy = v
        .jobs
        .iter()
        .any(|j| matches!(j.work, Work::Package { .. }) && j.running());
    let mut order: Vec<&Runnable<'_>> = runnable.iter().collect();
    order.sort_by_key(|r| r.step == Step::Interrupt);
    for r in order {
        if (r.disruptive() && !ready) || (reboots_held && r.reboots()) {
            continue;
        }
        match &r.step {
            Step::Run(stage) => {
                if stage_job(v, state, r, *stage, actions) {
                    busy = true;
                }
            }
            Step::Interrupt => merged_interrupt(v, state, r, merged.as_ref(), busy, actions),
            Step::UninstallInterrupt => uninstall_interrupt(v, state, r, actions),
        }
    }
}

/// A Job is the same work when it would have the same name (one merged interrupt per node,
/// whoever owns it); the node's Jobs are already this CR's on this node.
fn has_job(v: &Visit<'_, '_>, w: &Work) -> bool {
    v.jobs.iter().any(|j| j.work.same_job(w))
}

/// A package stage's Job, unless it has one. True when it started one.
fn stage_job(
    v: &Visit<'_, '_>,
    state: &mut Draft<'_>,
    r: &Runnable<'_>,
    run: RunStage,
    actions: &mut Vec<Action>,
) -> bool {
    let (cr, env, p, name) = (v.cr, v.env, r.package, r.name);
    let stage = run.stage();
    let w = Work::Package {
        package: name.clone(),
        version: p.version.clone(),
        stage,
    };
    // Every package of a CR whose plugins are ready is pinned (`CrPass::new`).
    let Some(plugin) = env.pinned.get(name) else {
        return false;
    };
    if has_job(v, &w) {
        return false;
    }
    let entry = state
        .edit()
        .entry(state_key(name, &p.version))
        .or_insert_with(|| PackageStatus {
            run: env.now,
            ..PackageStatus::new(name, &p.version, stage, cr.generation)
        });
    entry.state = State::InProgress;
    entry.generation = cr.generation;
    entry.digest = Some(plugin.clone());
    if matches!(stage, Stage::Apply | Stage::Upgrade | Stage::Plan) {
        entry.config = env.digests[name].clone();
    }
    let req = package_job(env, cr, v.node, run, p, plugin, entry);
    actions.push(Action::Event(Event {
        target: Target::Node(v.node.name.clone()),
        warning: false,
        reason: "Apply",
        message: format!(
            "{} {name} {} started ({})",
            stage.as_str(),
            p.version,
            cr.name
        ),
    }));
    actions.push(Action::CreateJob(Box::new(req)));
    true
}

/// The node's merged interrupt, started by its owner once nothing else runs; the other
/// packages at their interrupt are covered by it (skipped).
fn merged_interrupt(
    v: &Visit<'_, '_>,
    state: &mut Draft<'_>,
    r: &Runnable<'_>,
    merged: Option<&Merged>,
    busy: bool,
    actions: &mut Vec<Action>,
) {
    let key = state_key(r.name, &r.package.version);
    let Some(Merged { interrupt, owner }) = merged else {
        // Nothing in scope any more (a plan or config cycle needs none): done.
        if let Some(e) = state.get_mut_if(&key, |e| e.state != State::Complete) {
            e.state = State::Complete;
        }
        return;
    };
    if owner != r.name {
        if let Some(e) = state.get_mut_if(&key, |e| e.state != State::Skipped) {
            e.state = State::Skipped;
        }
        return;
    }
    let w = Work::Interrupt {
        stage: Stage::Interrupt,
        kind: interrupt.kind,
        owner: owner.clone(),
    };
    if has_job(v, &w) || busy {
        return;
    }
    let Some(e) = state.edit().get_mut(&key) else {
        return;
    };
    let run = e.run;
    e.state = State::InProgress;
    // The boot before this stage's reboot, recorded once: a Job made again (the first one's
    // result was lost) must not move it past the reboot.
    if e.boot_id.is_empty() {
        e.boot_id = v.node.boot_id.clone();
    }
    e.generation = v.cr.generation;
    actions.push(Action::Event(Event {
        target: Target::Node(v.node.name.clone()),
        warning: false,
        reason: "Interrupt",
        message: format!("{interrupt} for {owner} ({})", v.cr.name),
    }));
    actions.push(Action::CreateJob(Box::new(interrupt_job(
        v.env,
        v.cr,
        &v.node.name,
        /* uninstall */ false,
        owner,
        interrupt,
        run,
    ))));
}

/// The interrupt after a package's removal (its own, never merged).
fn uninstall_interrupt(
    v: &Visit<'_, '_>,
    state: &mut Draft<'_>,
    r: &Runnable<'_>,
    actions: &mut Vec<Action>,
) {
    let Some(interrupt) = r.package.interrupt.clone() else {
        return;
    };
    let w = Work::Interrupt {
        stage: Stage::UninstallInterrupt,
        kind: interrupt.kind,
        owner: r.name.clone(),
    };
    if has_job(v, &w) {
        return;
    }
    let key = state_key(r.name, &r.package.version);
    let run = state.get(&key).map_or(0, |e| e.run);
    if let Some(e) = state.edit().get_mut(&key) {
        e.state = State::InProgress;
        if e.boot_id.is_empty() {
            e.boot_id = v.node.boot_id.clone();
        }
    }
    actions.push(Action::CreateJob(Box::new(interrupt_job(
        v.env,
        v.cr,
        &v.node.name,
        /* uninstall */ true,
        r.name,
        &interrupt,
        run,
    ))));
}
