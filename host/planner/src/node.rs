//! One CR on one node in one pass: record finished Jobs, move entries along the stage
//! graph, cordon and drain when an interrupt is in scope, coalesce interrupts, start Jobs.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use nodewright_api::keys;
use nodewright_api::result::StageResult;
use nodewright_api::v1alpha1::{
    Interrupt, InterruptType, NodeState, Package, PackageStatus, Planned, Stage, State, Status,
    state_key,
};

use crate::action::{Action, Event, NodePatch, Target};
use crate::cordon::{self, Mark, NodeCordon};
use crate::drain::{self, Blocked, Drain};
use crate::hold::{self, Hold};
use crate::interrupts::{Merged, coalesce};
use crate::jobs::{interrupt_job, job_name, package_job};
use crate::packages::{after, changed_keys, done, effective, terminal, uninstall_requested};
use crate::snapshot::{Cr, Job, JobPhase, Node, Pod, Refusal, Settings, Work};
use crate::stages::Next;

/// A node's annotations and cordon as this pass has left them: the snapshot's, overlaid
/// with the write that gets there (nothing is copied until it changes).
#[derive(Clone, Debug)]
pub struct NodeWork<'a> {
    base: &'a BTreeMap<String, String>,
    /// Current `spec.unschedulable`.
    pub unschedulable: bool,
    /// The write.
    pub patch: NodePatch,
}

impl<'a> NodeWork<'a> {
    /// Starts from the snapshot.
    pub fn new(node: &'a Node) -> Self {
        NodeWork {
            base: &node.annotations,
            unschedulable: node.unschedulable,
            patch: NodePatch {
                node: node.name.clone(),
                resource_version: node.resource_version.clone(),
                ..Default::default()
            },
        }
    }

    /// An annotation's current value.
    pub fn get(&self, key: &str) -> Option<&str> {
        match self.patch.annotations.get(key) {
            Some(v) => v.as_deref(),
            None => self.base.get(key).map(String::as_str),
        }
    }

    /// Sets (`Some`) or removes (`None`) an annotation, recording the change if it is one.
    pub fn set(&mut self, key: &str, value: Option<String>) {
        if self.get(key) == value.as_deref() {
            return;
        }
        if self.base.get(key) == value.as_ref() {
            self.patch.annotations.remove(key);
        } else {
            self.patch.annotations.insert(key.into(), value);
        }
    }

    /// Sets `spec.unschedulable`.
    pub fn cordon(&mut self, on: bool) {
        if self.unschedulable != on {
            self.unschedulable = on;
            self.patch.unschedulable = Some(on);
        }
    }

    /// The cordon marks every CR holds on this node.
    pub fn cordons(&self) -> NodeCordon {
        const PREFIX: &str = "nodewright.io/cordon.";
        let keys = self
            .base
            .range::<str, _>((
                std::ops::Bound::Included(PREFIX),
                std::ops::Bound::Unbounded,
            ))
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(PREFIX))
            .chain(
                self.patch
                    .annotations
                    .keys()
                    .filter(|k| k.starts_with(PREFIX)),
            );
        let owners = keys
            .filter_map(|k| {
                Some((
                    k.strip_prefix(PREFIX)?.to_string(),
                    Mark::parse(self.get(k)?),
                ))
            })
            .collect();
        NodeCordon {
            unschedulable: self.unschedulable,
            owners,
        }
    }

    fn apply(&mut self, actions: Vec<cordon::Action>) {
        for a in actions {
            match a {
                cordon::Action::Cordon => self.cordon(true),
                cordon::Action::Uncordon => self.cordon(false),
                cordon::Action::Mark(cr, m) => {
                    self.set(&keys::cordon(&cr), Some(m.as_str().into()))
                }
                cordon::Action::Unmark(cr) => self.set(&keys::cordon(&cr), None),
            }
        }
    }

    /// Takes (or shares) the cordon for `cr`, with Karpenter told to leave the node alone.
    /// True when the cordon was already persisted, so the drain may begin.
    pub fn acquire(&mut self, cr: &str) -> bool {
        let acquired = self.cordons().acquire(cr);
        self.apply(acquired.actions);
        let mut owned: Vec<String> = self
            .get(keys::KARPENTER_OWNED)
            .map(|v| v.split(',').map(String::from).collect())
            .unwrap_or_default();
        for key in [
            keys::KARPENTER_DO_NOT_DISRUPT,
            keys::KARPENTER_DO_NOT_REPAIR,
        ] {
            if self.get(key).is_none() {
                self.set(key, Some("true".into()));
                owned.push(key.into());
            }
        }
        if !owned.is_empty() {
            self.set(keys::KARPENTER_OWNED, Some(owned.join(",")));
        }
        acquired.ready_to_drain
    }

    /// Drops `cr`'s cordon; uncordons when it was the last one and ours; removes the
    /// Karpenter annotations we added once no CR holds the node.
    pub fn release(&mut self, cr: &str) {
        let mut actions = self.cordons().release(cr);
        if self.get(keys::RUNTIME_REQUIRED_CORDON).is_some() {
            // The runtime-required cordon outlives every rollout; only an admin lifts it.
            actions.retain(|a| *a != cordon::Action::Uncordon);
        }
        self.apply(actions);
        self.set(&keys::drain_start(cr), None);
        self.set(&keys::drain_blocked(cr), None);
        if self.cordons().owners.is_empty()
            && let Some(owned) = self.get(keys::KARPENTER_OWNED).map(String::from)
        {
            for key in owned.split(',') {
                self.set(key, None);
            }
            self.set(keys::KARPENTER_OWNED, None);
        }
    }
}

/// What the planner needs besides the CR and node.
#[derive(Debug)]
pub struct Env<'a> {
    /// Settings.
    pub settings: &'a Settings,
    /// Clock (unix seconds).
    pub now: i64,
    /// Refused evictions.
    pub refusals: &'a BTreeMap<String, Refusal>,
    /// Pinned plugin per package.
    pub pinned: &'a BTreeMap<String, String>,
    /// Config digests per package.
    pub digests: &'a crate::packages::Digests,
    /// What a node that has not started may begin (windows, gates).
    pub hold: Hold,
    /// Each batch member's rollout order (see [`crate::JobRequest::node_order`]).
    pub orders: &'a HashMap<String, u32>,
}

/// How the node ended the pass, for the roll-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeOutcome {
    /// Node status for this CR.
    pub status: Status,
    /// Pods holding the drain (`podNonInterruptLabels`).
    pub barrier: Vec<String>,
    /// Why the drain cannot proceed (PDB refusals, blockers).
    pub drain_blocked: Option<Blocked>,
    /// Failure messages of parked packages.
    pub failures: Vec<String>,
    /// A window or gate kept this node from starting.
    pub held: bool,
}

/// What a runnable package does next.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Run(Stage),
    Interrupt,
    UninstallInterrupt,
}

/// One CR on one node. Without `may_start` (the node is not in a batch) only finished Jobs
/// are recorded and a done node's cordon released: no new Jobs, cordons or evictions.
#[expect(
    clippy::too_many_arguments,
    reason = "the pass's inputs; grouping them would only rename them"
)]
pub fn pass(
    env: &Env<'_>,
    cr: &Cr,
    node: &Node,
    work: &mut NodeWork<'_>,
    state: &mut NodeState,
    jobs: &[&Job],
    pods: &[&Pod],
    may_start: bool,
    actions: &mut Vec<Action>,
) -> NodeOutcome {
    let spec = &cr.spec;
    let first_action = actions.len();
    let mut failures = Vec::new();
    record_jobs(cr, node, state, jobs, actions, &mut failures);
    advance(cr, env.digests, state);

    // Parked stages: a terminal failure at this generation.
    let parked = |e: &PackageStatus| e.state == State::Erroring && e.generation >= cr.generation;
    for e in state.values().filter(|e| parked(e)) {
        failures.push(format!("{}: {}", e.name, e.message));
    }
    if let Some(why) = drain::timed_out(
        cr,
        drain::started(work.get(&keys::drain_start(&cr.name))),
        env.now,
    ) {
        if work.get(&keys::node_status(&cr.name)) != Some("erroring") {
            actions.push(Action::Event(Event {
                target: Target::Node(node.name.clone()),
                warning: true,
                reason: "DrainTimeout",
                message: format!("{why} ({}); the node stays cordoned", cr.name),
            }));
        }
        failures.push(why);
    }
    failures.sort();
    failures.dedup();

    // Which packages run: uninstalls first, then installs whose dependencies are done.
    let mut runnable: Vec<(&String, &Package, Step)> = Vec::new();
    for (name, p) in &spec.packages {
        let key = state_key(name, &p.version);
        let entry = state.get(&key);
        if entry.is_some_and(&parked) || done(name, p, &env.digests[name], state, cr.deleting) {
            continue;
        }
        let uninstalling =
            entry.is_some_and(|e| matches!(e.stage, Stage::Uninstall | Stage::UninstallInterrupt));
        let deps_done = p.depends_on.iter().all(|(d, v)| {
            spec.packages
                .get(d)
                .is_some_and(|dp| dp.version == *v && done(d, dp, &env.digests[d], state, false))
        });
        if !uninstalling && !uninstall_requested(p, cr.deleting) && !deps_done {
            continue;
        }
        let step = match entry {
            None if uninstall_requested(p, cr.deleting) => continue,
            None if effective(p, None).is_empty() => Step::Run(Stage::Apply),
            None => Step::Run(Stage::Plan),
            Some(e) => match e.stage {
                Stage::Interrupt => Step::Interrupt,
                Stage::UninstallInterrupt => Step::UninstallInterrupt,
                s => Step::Run(s),
            },
        };
        runnable.push((name, p, step));
    }
    runnable.sort_by_key(|(name, p, _)| {
        (
            !state
                .get(&state_key(name, &p.version))
                .is_some_and(|e| matches!(e.stage, Stage::Uninstall | Stage::UninstallInterrupt)),
            name.as_str(),
        )
    });
    if spec.serial {
        runnable.truncate(1);
    }
    if !may_start || !failures.is_empty() {
        // Not in a batch, or failed: a failed node gets no more work (and no more
        // disruption) until a new generation or a reset re-arms it.
        runnable.clear();
    }
    // A window or a gate: a node that has not started begins only what the hold allows.
    // One past its cordon finishes its whole chain; one with a Job of ours, the
    // non-disruptive part of it.
    let cordoned = work.get(&keys::cordon(&cr.name)).is_some();
    let before_hold = runnable.len();
    if !cordoned && env.hold != Hold::Open {
        runnable.retain(|(n, p, step)| {
            let disruptive = disrupts(
                step,
                !effective(p, state.get(&state_key(n, &p.version))).is_empty(),
            );
            env.hold.allows(disruptive) || (!disruptive && !jobs.is_empty())
        });
    }
    let held = runnable.len() < before_hold;

    let scope: BTreeMap<String, Vec<Interrupt>> = runnable
        .iter()
        .map(|(n, p, _)| {
            (
                (*n).clone(),
                effective(p, state.get(&state_key(n, &p.version))),
            )
        })
        .collect();
    let tracked: Vec<bool> = runnable
        .iter()
        .map(|(n, p, _)| state.contains_key(&state_key(n, &p.version)))
        .collect();
    let interrupting = |name: &str| scope.get(name).is_some_and(|i| !i.is_empty());
    let disruptive = |name: &String, step: &Step| disrupts(step, interrupting(name));

    // Cordon → (next pass) barrier → drain, when any runnable step disrupts. With
    // `cordonAfterBarrier` the barrier is waited for before the cordon too.
    let mut ready = false;
    let mut outcome_barrier = Vec::new();
    let mut drain_blocked = None;
    let mut timed_out = false;
    if runnable.iter().any(|(n, _, s)| disruptive(n, s)) {
        let uncordoned_wait = if spec.cordon_after_barrier && !cordoned {
            drain::barrier(cr, pods)
        } else {
            Vec::new()
        };
        if !uncordoned_wait.is_empty() {
            outcome_barrier = uncordoned_wait;
        } else if work.acquire(&cr.name) {
            let start = drain::started(work.get(&keys::drain_start(&cr.name)));
            match drain::drain(env, cr, &node.name, pods, start, actions) {
                Drain::Drained => {
                    ready = true;
                    work.set(&keys::drain_start(&cr.name), None);
                    work.set(&keys::drain_blocked(&cr.name), None);
                }
                Drain::Barrier(held) => outcome_barrier = held,
                Drain::InProgress(blocked) => {
                    if start.is_none() {
                        work.set(&keys::drain_start(&cr.name), Some(env.now.to_string()));
                    }
                    work.set(
                        &keys::drain_blocked(&cr.name),
                        blocked.as_ref().map(|b| b.message.clone()),
                    );
                    drain_blocked = blocked;
                }
                // Found above on the next pass (the start time is persisted by now).
                Drain::TimedOut => timed_out = true,
            }
        }
    } else if runnable
        .iter()
        .zip(&tracked)
        .any(|((n, _, s), t)| *t && interrupting(n) && *s == Step::Run(Stage::PostInterrupt))
    {
        // Mid-interrupt-cycle (post-interrupt): keep the cordon, re-cordon if it was lifted.
        // (A plan still running is not mid-cycle: it disrupts nothing.)
        work.acquire(&cr.name);
    }

    // The node's merged interrupt among runnable packages that are not uninstalling.
    let candidates: BTreeMap<String, Vec<Interrupt>> = runnable
        .iter()
        .filter(|(_, _, s)| {
            !matches!(
                s,
                Step::UninstallInterrupt | Step::Run(Stage::Uninstall | Stage::PostInterrupt)
            )
        })
        .map(|(n, _, _)| ((*n).clone(), scope[*n].clone()))
        .filter(|(_, i)| !i.is_empty())
        .collect();
    let merged = coalesce(&candidates);
    let mut busy = jobs
        .iter()
        .any(|j| matches!(j.work, Work::Package { .. }) && j.running());
    // A Job is the same work when it has the same name: the name already says that one
    // merged interrupt per node exists whoever owns it.
    let has_job = |w: &Work| {
        let name = job_name(&cr.name, &node.name, w);
        jobs.iter().any(|j| j.name == name)
    };

    // Package stages first: the merged interrupt must see every Job this pass starts.
    runnable.sort_by_key(|(_, _, step)| *step == Step::Interrupt);
    if !timed_out {
        for (name, p, step) in &runnable {
            let key = state_key(name, &p.version);
            let needs_ready = disruptive(name, step);
            if needs_ready && !ready {
                continue;
            }
            match step {
                Step::Run(stage) => {
                    let w = Work::Package {
                        package: (*name).clone(),
                        version: p.version.clone(),
                        stage: *stage,
                    };
                    if has_job(&w) {
                        continue;
                    }
                    let entry = state.entry(key.clone()).or_insert_with(|| PackageStatus {
                        run: env.now,
                        ..PackageStatus::new(name, &p.version, *stage, cr.generation)
                    });
                    entry.state = State::InProgress;
                    entry.generation = cr.generation;
                    entry.digest = env.pinned.get(*name).cloned().unwrap_or_default();
                    if matches!(stage, Stage::Apply | Stage::Upgrade | Stage::Plan) {
                        entry.config = env.digests[*name].clone();
                    }
                    let req = package_job(env, cr, &node.name, w, p, entry);
                    actions.push(Action::Event(Event {
                        target: Target::Node(node.name.clone()),
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
                    busy = true;
                }
                Step::Interrupt => {
                    let Some(Merged { interrupt, owner }) = &merged else {
                        // Nothing in scope any more (a plan or config cycle needs none): done.
                        if let Some(e) = state.get_mut(&key) {
                            e.state = State::Complete;
                        }
                        continue;
                    };
                    if owner != *name {
                        if let Some(e) = state.get_mut(&key)
                            && e.state != State::Skipped
                        {
                            e.state = State::Skipped;
                        }
                        continue;
                    }
                    let w = Work::Interrupt {
                        stage: Stage::Interrupt,
                        kind: interrupt.kind,
                        owner: owner.clone(),
                    };
                    if has_job(&w) || busy {
                        continue;
                    }
                    let Some(e) = state.get_mut(&key) else {
                        continue;
                    };
                    let run = e.run;
                    e.state = State::InProgress;
                    // The boot before this stage's reboot, recorded once: a Job made again
                    // (the first one's result was lost) must not move it past the reboot.
                    if e.boot_id.is_empty() {
                        e.boot_id = node.boot_id.clone();
                    }
                    e.generation = cr.generation;
                    actions.push(Action::Event(Event {
                        target: Target::Node(node.name.clone()),
                        warning: false,
                        reason: "Interrupt",
                        message: format!("{} for {} ({})", describe(interrupt), owner, cr.name),
                    }));
                    actions.push(Action::CreateJob(Box::new(interrupt_job(
                        env, cr, &node.name, w, interrupt, run,
                    ))));
                }
                Step::UninstallInterrupt => {
                    let Some(interrupt) = p.interrupt.clone() else {
                        continue;
                    };
                    let w = Work::Interrupt {
                        stage: Stage::UninstallInterrupt,
                        kind: interrupt.kind,
                        owner: (*name).clone(),
                    };
                    if has_job(&w) {
                        continue;
                    }
                    let run = state.get(&key).map_or(0, |e| e.run);
                    if let Some(e) = state.get_mut(&key) {
                        e.state = State::InProgress;
                        if e.boot_id.is_empty() {
                            e.boot_id = node.boot_id.clone();
                        }
                    }
                    actions.push(Action::CreateJob(Box::new(interrupt_job(
                        env, cr, &node.name, w, &interrupt, run,
                    ))));
                }
            }
        }
    }

    let done = crate::packages::node_done(spec, env.digests, state, cr.deleting);
    if done && work.get(&keys::cordon(&cr.name)).is_some() {
        // Finishing a disruption: the node shows the conditions `nodeHealth` asks for before
        // the rollout lets go of it (it stays cordoned, erroring, until it does).
        let unmet = hold::unhealthy(cr, node);
        if !unmet.is_empty() {
            failures.push(format!(
                "node health after its interrupt: {}",
                unmet.join(", ")
            ));
        }
    }
    let status = if timed_out || !failures.is_empty() {
        Status::Erroring
    } else if done {
        // The cordon goes only once nothing of this CR runs on the node (a Job being
        // stopped keeps it until its pods are gone).
        if !jobs.iter().any(|j| j.running()) {
            work.release(&cr.name);
        }
        Status::Complete
    } else if !outcome_barrier.is_empty() {
        Status::Blocked
    } else if held
        && !jobs.iter().any(|j| j.running())
        && !actions[first_action..]
            .iter()
            .any(|a| matches!(a, Action::CreateJob(_)))
    {
        Status::Waiting
    } else {
        Status::InProgress
    };
    if timed_out && failures.is_empty() {
        failures.push("drain timed out".into());
    }
    NodeOutcome {
        status,
        barrier: outcome_barrier,
        drain_blocked,
        failures,
        held,
    }
}

/// Whether a step disrupts the node (needs the cordon and drain first): a stage with an
/// interrupt in scope, other than `plan` and `post-interrupt`, or an interrupt.
fn disrupts(step: &Step, interrupting: bool) -> bool {
    match step {
        Step::Run(Stage::Plan | Stage::PostInterrupt) => false,
        Step::Run(_) | Step::Interrupt => interrupting,
        Step::UninstallInterrupt => true,
    }
}

/// Folds finished Jobs into the node state; deletes Jobs that are done or no longer match
/// (stopping the ones still running). Jobs already stopping are left to finish stopping.
fn record_jobs(
    cr: &Cr,
    node: &Node,
    state: &mut NodeState,
    jobs: &[&Job],
    actions: &mut Vec<Action>,
    failures: &mut Vec<String>,
) {
    for job in jobs.iter().filter(|j| !j.stopping) {
        let delete = |actions: &mut Vec<Action>| {
            actions.push(Action::DeleteJob {
                name: job.name.clone(),
                node: node.name.clone(),
                running: job.running(),
            })
        };
        match &job.work {
            Work::Package {
                package,
                version,
                stage,
            } => {
                let current = cr
                    .spec
                    .packages
                    .get(package)
                    .is_some_and(|p| p.version == *version);
                let key = state_key(package, version);
                let Some(e) = state.get_mut(&key).filter(|e| {
                    current
                        && e.stage == *stage
                        && matches!(e.state, State::InProgress | State::Unknown)
                }) else {
                    // Stale: recorded already, superseded, or the package left the spec.
                    delete(actions);
                    continue;
                };
                match &job.phase {
                    JobPhase::Active { failed, last } => {
                        e.attempts = *failed as i32;
                        if let Some(r) = last {
                            e.message = summary(r);
                        }
                    }
                    JobPhase::Succeeded(result) => {
                        e.state = State::Complete;
                        e.message.clear();
                        if *stage == Stage::Plan {
                            e.planned = Some(planned(result.as_ref()));
                        }
                        delete(actions);
                    }
                    JobPhase::Failed {
                        genuine: true,
                        attempts,
                        reason,
                        last,
                    } => {
                        e.state = State::Erroring;
                        e.attempts = *attempts as i32;
                        e.message = last.as_ref().map(summary).unwrap_or_else(|| reason.clone());
                        failures.push(format!("{package}: {}", e.message));
                        actions.push(Action::Event(Event {
                            target: Target::Cr(cr.name.clone()),
                            warning: true,
                            reason: "StageFailed",
                            message: format!("{} of {package} {version} failed on {} after {attempts} attempt(s): {}", stage.as_str(), node.name, e.message),
                        }));
                        delete(actions);
                    }
                    JobPhase::Failed { genuine: false, .. } => delete(actions), // disruptions only: run again
                }
            }
            Work::Interrupt { stage, kind, owner } => {
                let at_stage: Vec<String> = state
                    .iter()
                    .filter(|(_, e)| {
                        e.stage == *stage
                            && matches!(
                                e.state,
                                State::InProgress | State::Skipped | State::Unknown
                            )
                    })
                    .map(|(k, _)| k.clone())
                    .collect();
                let owner_key = at_stage.iter().find(|k| state[*k].name == *owner).cloned();
                let Some(owner_key) = owner_key else {
                    delete(actions);
                    continue;
                };
                match &job.phase {
                    JobPhase::Active { .. } => {}
                    JobPhase::Succeeded(_) => {
                        if *kind == InterruptType::Reboot
                            && state[&owner_key].boot_id == node.boot_id
                        {
                            continue; // the node has not come back with a new boot ID yet
                        }
                        if *stage == Stage::UninstallInterrupt {
                            state.remove(&owner_key);
                        } else {
                            for k in at_stage {
                                if let Some(e) = state.get_mut(&k) {
                                    e.state = State::Complete;
                                }
                            }
                        }
                        delete(actions);
                    }
                    JobPhase::Failed {
                        genuine,
                        reason,
                        last,
                        ..
                    } => {
                        if *genuine
                            || *kind == InterruptType::Reboot
                            || reason == "DeadlineExceeded"
                        {
                            let e = state.get_mut(&owner_key).expect("found above");
                            e.state = State::Erroring;
                            e.message =
                                last.as_ref().map(summary).unwrap_or_else(|| reason.clone());
                            failures.push(format!("{owner}: {}", e.message));
                        }
                        delete(actions);
                    }
                }
            }
        }
    }
}

/// Moves completed entries to their next stage; starts config, upgrade and uninstall cycles;
/// re-arms parked stages on a newer generation.
fn advance(cr: &Cr, all_digests: &crate::packages::Digests, state: &mut NodeState) {
    let generation = cr.generation;
    for (name, p) in &cr.spec.packages {
        let key = state_key(name, &p.version);
        let wants_uninstall = uninstall_requested(p, cr.deleting);
        // Version change: upgrade from a completed older version.
        if !state.contains_key(&key) && !wants_uninstall && !cr.deleting {
            let older = state
                .values()
                .filter(|e| e.name == *name && older_than(&e.version, &p.version))
                .max_by(|a, b| cmp_versions(&a.version, &b.version));
            if let Some(old) = older.filter(|o| terminal(p, o) || o.state == State::Complete) {
                let mut e = PackageStatus::new(name, &p.version, Stage::Upgrade, generation);
                e.previous_version = Some(old.version.clone());
                state.insert(key.clone(), e);
            }
        }
        let Some(e) = state.get_mut(&key) else {
            continue;
        };
        if e.state == State::Erroring && e.generation < generation {
            e.state = State::InProgress;
            e.attempts = 0;
            e.message.clear();
            e.generation = generation;
        }
        // Deleting the CR uninstalls even a package whose install failed (NodeWright would
        // wait for a `complete` install that never comes, and the deletion would hang).
        if cr.deleting
            && wants_uninstall
            && e.state == State::Erroring
            && !matches!(e.stage, Stage::Uninstall | Stage::UninstallInterrupt)
        {
            *e = PackageStatus {
                config: e.config.clone(),
                ..PackageStatus::new(name, &p.version, Stage::Uninstall, generation)
            };
        }
        // Cancelled uninstall: back to installing (an uninstall interrupt runs to its end).
        if e.stage == Stage::Uninstall && !wants_uninstall && e.state != State::Complete {
            *e = PackageStatus {
                config: e.config.clone(),
                ..PackageStatus::new(name, &p.version, Stage::Apply, generation)
            };
        }
        if e.state == State::Complete {
            if wants_uninstall
                && !matches!(e.stage, Stage::Uninstall | Stage::UninstallInterrupt)
                && terminal(p, e)
            {
                *e = PackageStatus {
                    config: e.config.clone(),
                    ..PackageStatus::new(name, &p.version, Stage::Uninstall, generation)
                };
                continue;
            }
            if e.stage == Stage::Plan {
                let converged = e
                    .planned
                    .as_ref()
                    .is_some_and(|pl| pl.changes == 0 && pl.interrupt.is_none());
                let (stage, state_) = if converged {
                    (Stage::Config, State::Complete)
                } else {
                    (Stage::Apply, State::InProgress)
                };
                e.stage = stage;
                e.state = state_;
                continue;
            }
            match after(p, e) {
                Next::Stage(next) => {
                    e.stage = next;
                    e.state = State::InProgress;
                    e.attempts = 0;
                    // A new interrupt stage records its own pre-reboot boot ID (an older
                    // cycle's is stale). Later stages keep it: it marks the reboot as ours.
                    if matches!(next, Stage::Interrupt | Stage::UninstallInterrupt) {
                        e.boot_id.clear();
                    }
                }
                Next::Remove => {
                    state.remove(&key);
                    continue;
                }
                Next::Done => {}
            }
        }
        // Config change at a settled point: the package complete, or parked after config.
        let Some(e) = state.get_mut(&key) else {
            continue;
        };
        let settled = terminal(p, e)
            || (e.state == State::Erroring
                && matches!(
                    e.stage,
                    Stage::Config | Stage::Interrupt | Stage::PostInterrupt
                ));
        let digests = all_digests[name].clone();
        if settled && !wants_uninstall && e.config != digests {
            let mut keys = changed_keys(&e.config, &digests);
            if e.state == State::Erroring {
                keys.extend(e.changed_keys.iter().cloned());
                keys.sort();
                keys.dedup();
            }
            *e = PackageStatus {
                config: digests,
                changed_keys: keys,
                digest: e.digest.clone(),
                ..PackageStatus::new(name, &p.version, Stage::Config, generation)
            };
        }
        // Upgrade done: drop the older versions' entries.
        if state.get(&key).is_some_and(|e| terminal(p, e)) {
            state.retain(|_, o| {
                o.name != *name || o.version == p.version || !older_than(&o.version, &p.version)
            });
        }
    }
}

fn cmp_versions(a: &str, b: &str) -> std::cmp::Ordering {
    match (semver::Version::parse(a), semver::Version::parse(b)) {
        (Ok(a), Ok(b)) => a.cmp(&b),
        _ => a.cmp(b),
    }
}

fn older_than(a: &str, b: &str) -> bool {
    cmp_versions(a, b) == std::cmp::Ordering::Less
}

fn planned(result: Option<&StageResult>) -> Planned {
    match result {
        Some(r) => Planned {
            changes: r.change_count.max(r.changes.len() as u32),
            interrupt: r.reported_interrupt().unwrap_or(Some(Interrupt {
                kind: InterruptType::Reboot,
                services: vec![],
            })),
        },
        // No readable result: assume the worst (the spec caps it).
        None => Planned {
            changes: 1,
            interrupt: Some(Interrupt {
                kind: InterruptType::Reboot,
                services: vec![],
            }),
        },
    }
}

fn summary(r: &StageResult) -> String {
    format!("[{}] {}", r.blame.as_str(), r.message)
}

fn describe(i: &Interrupt) -> String {
    match i.kind {
        InterruptType::Service => format!("restart {}", i.services.join(", ")),
        k => k.as_str().to_string(),
    }
}
