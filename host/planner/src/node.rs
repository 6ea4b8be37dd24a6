//! One CR on one node in one pass: record finished Jobs, move entries along the stage
//! graph, stage payloads first ([`crate::prestage`]), cordon and drain when an interrupt is
//! in scope, coalesce interrupts, start Jobs.
//!
//! [`pass`] runs the steps in that order; each is a function of its own here or in
//! [`record`] (finished Jobs), [`advance`] (the stage graph) and [`start`] (new Jobs).

mod advance;
mod draft;
mod record;
mod start;

pub(crate) use draft::Draft;

use nodewright_api::agent::RunStage;
use nodewright_api::keys::CrMark;
use nodewright_api::node_state::{NodeState, PackageStatus, Stage, State};
use nodewright_api::v1alpha1::{Interrupt, InterruptType, Package, Status};

use crate::action::{Action, Event, Target};
use crate::drain::{self, Blocked, Drain};
use crate::hold::{self, Hold};
use crate::packages::{done, effective, uninstall_requested};
use crate::prestage;
use crate::snapshot::{Cr, ObservedJob, ObservedNode, ObservedPod, Work};
use crate::work::{Env, NodeWork};

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
    /// Its reboot waits for this operator replica to become ready on another node (the
    /// node runs the last ready one).
    pub awaits_replica: Option<String>,
}

/// What a runnable package does next.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// A plugin's stage.
    Run(RunStage),
    /// The node's merged interrupt.
    Interrupt,
    /// A package's own interrupt after its removal.
    UninstallInterrupt,
}

/// A package that may move this pass, with the interrupts its current cycle has in scope.
#[derive(Debug)]
struct Runnable<'s> {
    name: &'s String,
    package: &'s Package,
    step: Step,
    /// The interrupts in scope for the package's cycle (empty: it disrupts nothing).
    scope: Vec<Interrupt>,
    /// The node already has an entry for it.
    tracked: bool,
}

impl Runnable<'_> {
    /// Needs the cordon and the drain first.
    fn disruptive(&self) -> bool {
        disrupts(&self.step, !self.scope.is_empty())
    }

    /// An interrupt that reboots the node.
    fn reboots(&self) -> bool {
        let reboot = |i: &Interrupt| i.kind == InterruptType::Reboot;
        match self.step {
            Step::Interrupt => self.scope.iter().any(reboot),
            Step::UninstallInterrupt => self.package.interrupt.as_ref().is_some_and(reboot),
            Step::Run(_) => false,
        }
    }
}

/// Where the cordon and drain stand for this pass's disruptive steps.
#[derive(Debug, Default)]
struct Preparation {
    /// Cordoned and drained: disruptive steps may start.
    ready: bool,
    /// Protected pods the node waits for.
    barrier: Vec<String>,
    /// Why the drain cannot proceed.
    drain_blocked: Option<Blocked>,
    /// The drain ran out of time.
    timed_out: bool,
}

/// One CR visiting one node: what every step reads.
pub(crate) struct Visit<'v, 'a> {
    /// The pass's environment.
    pub(crate) env: &'v Env<'a>,
    /// The CR.
    pub(crate) cr: &'v Cr,
    /// The node.
    pub(crate) node: &'v ObservedNode,
    /// The CR's Jobs on the node.
    pub(crate) jobs: &'v [&'v ObservedJob],
    /// The pods on the node.
    pub(crate) pods: &'v [&'v ObservedPod],
}

/// One CR on one node (what it reads in `v`; what it changes: the node's `work` and the
/// CR's `state` there; what it asks: `actions`). Without `may_start` (the node is not in a
/// batch) only finished Jobs are recorded and a done node's cordon released: no new Jobs,
/// cordons or evictions.
pub(crate) fn pass(
    v: &Visit<'_, '_>,
    work: &mut NodeWork<'_>,
    state: &mut Draft<'_>,
    may_start: bool,
    actions: &mut Vec<Action>,
) -> NodeOutcome {
    let (cr, node, jobs) = (v.cr, v.node, v.jobs);
    let first_action = actions.len();
    let mut failures = Vec::new();
    record::record_jobs(cr, node, state, jobs, actions, &mut failures);
    prestage::record(v, work, actions, &mut failures);
    advance::advance(cr, v.env.digests, state);
    v.failures(work, state, actions, &mut failures);
    let mut runnable = v.runnable(state);
    let wanted = failures.is_empty() && !runnable.is_empty();
    if !may_start || !failures.is_empty() {
        // Not in a batch, or failed: a failed node gets no more work (and no more
        // disruption) until a new generation or a reset re-arms it.
        runnable.clear();
    }
    let (held, awaits_replica) = v.hold(work, &mut runnable);
    if prestage::holds(v, work, wanted, may_start, actions) {
        // Its payloads first: nothing of the CR starts, and the node is not cordoned,
        // until they are staged.
        runnable.clear();
    }
    let prep = v.prepare(work, &runnable, actions);
    let reboots_held = v.fence(work, &runnable, prep.ready, actions);
    if !prep.timed_out {
        start::start(v, state, &runnable, prep.ready, reboots_held, actions);
    }
    let started = actions[first_action..]
        .iter()
        .any(|a| matches!(a, Action::CreateJob(_)));
    let mut out = v.conclude(work, state, failures, prep, held, started);
    out.awaits_replica = awaits_replica;
    out
}

/// Whether a step disrupts the node (needs the cordon and drain first): a stage with an
/// interrupt in scope, other than `plan` and `post-interrupt`, or an interrupt.
fn disrupts(step: &Step, interrupting: bool) -> bool {
    match step {
        Step::Run(RunStage::Plan | RunStage::PostInterrupt) => false,
        Step::Run(_) | Step::Interrupt => interrupting,
        Step::UninstallInterrupt => true,
    }
}

/// A terminal failure at this generation: the entry waits for a new one (or a reset).
fn parked(cr: &Cr, e: &PackageStatus) -> bool {
    e.state == State::Erroring && e.generation >= cr.generation
}

impl Visit<'_, '_> {
    /// The CR's marks on the node as `work` has them (as read with its state, unless this
    /// pass wrote one).
    fn marks(&self, work: &NodeWork<'_>) -> crate::work::KeptMarks {
        self.env.marks.on(self.node, work)
    }

    /// Adds what holds the node failed: parked stages, a drain past its timeout.
    fn failures(
        &self,
        work: &NodeWork<'_>,
        state: &NodeState,
        actions: &mut Vec<Action>,
        failures: &mut Vec<String>,
    ) {
        let cr = self.cr;
        for e in state.values().filter(|e| parked(cr, e)) {
            failures.push(format!("{}: {}", e.name, e.message));
        }
        // A Job whose pod cannot start: nothing new starts on the node, and it reads
        // erroring until the kubelet succeeds (it keeps trying; the Job stays).
        failures.extend(self.jobs.iter().filter_map(|j| j.stuck.clone()));
        let marks = self.marks(work);
        if let Some(why) = drain::timed_out(cr, marks.drain_started, self.env.now) {
            if marks.status != Some(Status::Erroring) {
                actions.push(Action::Event(Event {
                    target: Target::Node(self.node.name.clone()),
                    warning: true,
                    reason: "DrainTimeout",
                    message: format!("{why} ({}); the node stays cordoned", cr.name),
                }));
            }
            failures.push(why);
        }
        failures.sort();
        failures.dedup();
    }

    /// Which packages may move: uninstalls first, then installs whose dependencies are
    /// done; one at a time for a `serial` CR.
    fn runnable<'s>(&'s self, state: &NodeState) -> Vec<Runnable<'s>> {
        let (cr, spec) = (self.cr, &self.cr.spec);
        let digests = self.env.digests;
        let mut runnable = Vec::new();
        for (name, p) in &spec.packages {
            let entry = state.find(name, &p.version);
            if entry.is_some_and(|e| parked(cr, e))
                || done(name, p, &digests[name], state, cr.deleting)
            {
                continue;
            }
            let uninstalling = entry
                .is_some_and(|e| matches!(e.stage, Stage::Uninstall | Stage::UninstallInterrupt));
            let deps_done = p.depends_on.iter().all(|(d, v)| {
                spec.packages
                    .get(d)
                    .is_some_and(|dp| dp.version == *v && done(d, dp, &digests[d], state, false))
            });
            if !uninstalling && !uninstall_requested(p, cr.deleting) && !deps_done {
                continue;
            }
            let step = match entry {
                None if uninstall_requested(p, cr.deleting) => continue,
                None if effective(p, None).is_empty() => Step::Run(RunStage::Apply),
                None => Step::Run(RunStage::Plan),
                Some(e) => match (e.stage, RunStage::of(e.stage)) {
                    (Stage::Interrupt, _) => Step::Interrupt,
                    (_, Some(run)) => Step::Run(run),
                    (_, None) => Step::UninstallInterrupt,
                },
            };
            runnable.push((
                !uninstalling,
                Runnable {
                    name,
                    package: p,
                    step,
                    scope: effective(p, entry),
                    tracked: entry.is_some(),
                },
            ));
        }
        runnable.sort_by(|(a_installs, a), (b_installs, b)| {
            (a_installs, a.name).cmp(&(b_installs, b.name))
        });
        let mut runnable: Vec<Runnable<'s>> = runnable.into_iter().map(|(_, r)| r).collect();
        if spec.serial {
            runnable.truncate(1);
        }
        runnable
    }

    /// A window or a gate: a node that has not started begins only what the hold allows.
    /// One past its cordon finishes its whole chain; one with a Job of ours, the
    /// non-disruptive part of it. True when the hold kept something back.
    /// The operator's own availability holds a node the same way when its reboot would
    /// take down the last ready replica while another is on its way (the replica waited
    /// for is returned).
    fn hold(
        &self,
        work: &NodeWork<'_>,
        runnable: &mut Vec<Runnable<'_>>,
    ) -> (bool, Option<String>) {
        if self.marks(work).cordon {
            return (false, None);
        }
        let reboots = runnable
            .iter()
            .any(|r| r.disruptive() && r.scope.iter().any(|i| i.kind == InterruptType::Reboot));
        let awaits = reboots
            .then(|| hold::operator_waits(self.env.replicas, &self.node.name))
            .flatten()
            .map(|r| r.pod.clone());
        let hold = if awaits.is_some() {
            self.env.hold.max(Hold::Disruption)
        } else {
            self.env.hold
        };
        if hold == Hold::Open {
            return (false, None);
        }
        let before = runnable.len();
        runnable.retain(|r| {
            let disruptive = r.disruptive();
            hold.allows(disruptive) || (!disruptive && !self.jobs.is_empty())
        });
        (runnable.len() < before, awaits)
    }

    /// Before a reboot of a cordoned, drained node: the ready operator replicas running
    /// there are fenced first ([`hold::fence`]) — the node's [`CrMark::FenceOperator`]
    /// names them, they report not ready (out of the webhook Service) and the leader among
    /// them hands over — and the reboot waits until none of them is ready. The mark stays
    /// while the interrupt runs (a replica restarted by the reboot stays out until the
    /// cycle is over) and goes after. True when the reboot waits.
    fn fence(
        &self,
        work: &mut NodeWork<'_>,
        runnable: &[Runnable<'_>],
        ready: bool,
        actions: &mut Vec<Action>,
    ) -> bool {
        let key = self.env.keys().get(CrMark::FenceOperator);
        let reboot_next = ready && runnable.iter().any(Runnable::reboots);
        let fence = if reboot_next {
            let fencing = self.env.fencing.names();
            hold::fence(self.env.replicas, &self.node.name, &fencing)
        } else {
            hold::Fence::Go
        };
        if let hold::Fence::Queued(_) | hold::Fence::Starting(_) = fence {
            // The replicas here serve meanwhile (a mark set earlier is taken back).
            self.unfence(work, key);
            return true;
        }
        if let hold::Fence::Fence(waiting) = fence {
            let pods: Vec<&str> = waiting.iter().map(|r| r.pod.as_str()).collect();
            let pods = pods.join(",");
            self.env.fencing.insert(&self.node.name);
            if work.get(key) != Some(pods.as_str()) {
                actions.push(Action::Event(Event {
                    target: Target::Node(self.node.name.clone()),
                    warning: false,
                    reason: "OperatorHandover",
                    message: format!(
                        "{}'s reboot of this node waits for operator replica(s) {pods} to leave the webhook Service and hand over",
                        self.cr.name
                    ),
                }));
            }
            work.set(key, Some(pods));
            return true;
        }
        let interrupting = self
            .jobs
            .iter()
            .any(|j| matches!(j.work, Work::Interrupt { .. }));
        if !reboot_next && !interrupting {
            self.unfence(work, key);
        }
        false
    }

    /// Takes this CR's fence mark off the node; the node stops fencing once no CR's is left.
    fn unfence(&self, work: &mut NodeWork<'_>, key: &str) {
        if !self.marks(work).fenced {
            return;
        }
        work.set(key, None);
        if !work.fences_operator() {
            self.env.fencing.remove(&self.node.name);
        }
    }

    /// Cordon → (next pass) barrier → drain, when any runnable step disrupts. With
    /// `cordonAfterBarrier` the barrier is waited for before the cordon too.
    fn prepare(
        &self,
        work: &mut NodeWork<'_>,
        runnable: &[Runnable<'_>],
        actions: &mut Vec<Action>,
    ) -> Preparation {
        let cr = self.cr;
        let mut prep = Preparation::default();
        if !runnable.iter().any(Runnable::disruptive) {
            if runnable.iter().any(|r| {
                r.tracked && !r.scope.is_empty() && r.step == Step::Run(RunStage::PostInterrupt)
            }) {
                // Mid-interrupt-cycle (post-interrupt): keep the cordon, re-cordon if it was
                // lifted. (A plan still running is not mid-cycle: it disrupts nothing.)
                work.acquire(self.env.marks);
            }
            return prep;
        }
        let cordoned = self.marks(work).cordon;
        if cr.spec.cordon_after_barrier && !cordoned {
            prep.barrier = drain::barrier(cr, self.pods);
            if !prep.barrier.is_empty() {
                return prep;
            }
        }
        if !work.acquire(self.env.marks) {
            return prep;
        }
        let marks = self.marks(work);
        let start = marks.drain_started;
        let keys = self.env.keys();
        match drain::drain(self.env, cr, &self.node.name, self.pods, start, actions) {
            Drain::Drained => {
                prep.ready = true;
                // Taken off only where set: a steady pass searches no annotations.
                if marks.drain_marked {
                    work.set(keys.get(CrMark::DrainStart), None);
                }
                if marks.drain_blocked {
                    work.set(keys.get(CrMark::DrainBlocked), None);
                }
            }
            Drain::Barrier(held) => prep.barrier = held,
            Drain::InProgress(blocked) => {
                if start.is_none() {
                    work.set(keys.get(CrMark::DrainStart), Some(self.env.now.to_string()));
                }
                work.set(
                    keys.get(CrMark::DrainBlocked),
                    blocked.as_ref().map(|b| b.message.clone()),
                );
                prep.drain_blocked = blocked;
            }
            // Found by `failures` on the next pass (the start time is persisted by now).
            Drain::TimedOut => prep.timed_out = true,
        }
        prep
    }

    /// The node's status for this CR once the pass's work is decided; a node done with its
    /// disruption is released (or kept, unhealthy).
    fn conclude(
        &self,
        work: &mut NodeWork<'_>,
        state: &NodeState,
        mut failures: Vec<String>,
        prep: Preparation,
        held: bool,
        started: bool,
    ) -> NodeOutcome {
        let cr = self.cr;
        let done = crate::packages::node_done(&cr.spec, self.env.digests, state, cr.deleting);
        if done && self.marks(work).cordon {
            // Finishing a disruption: the node shows the conditions `nodeHealth` asks for
            // before the rollout lets go of it (it stays cordoned, erroring, until it does).
            let unmet = hold::unhealthy(cr, self.node);
            if !unmet.is_empty() {
                failures.push(format!(
                    "node health after its interrupt: {}",
                    unmet.join(", ")
                ));
            }
        }
        let running = self.jobs.iter().any(|j| j.running());
        let status = if prep.timed_out || !failures.is_empty() {
            Status::Erroring
        } else if done {
            // The cordon goes only once nothing of this CR runs on the node (a Job being
            // stopped keeps it until its pods are gone).
            if !running {
                work.release(self.env.keys());
            }
            Status::Complete
        } else if !prep.barrier.is_empty() {
            Status::Blocked
        } else if held && !running && !started {
            Status::Waiting
        } else {
            Status::InProgress
        };
        if prep.timed_out && failures.is_empty() {
            failures.push("drain timed out".into());
        }
        NodeOutcome {
            status,
            barrier: prep.barrier,
            drain_blocked: prep.drain_blocked,
            failures,
            held,
            awaits_replica: None,
        }
    }
}
