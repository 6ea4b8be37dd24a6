//! A rollout forecast: [`plan`] run forward on a copy of the world.
//!
//! The planner is pure, so what a rollout will do can be found by doing it on a copy:
//! each pass's actions applied as the API server would apply them ([`apply`]), every Job
//! finishing as the caller assumes ([`Assume::outcome`]), the clock moving between passes,
//! until a pass asks for nothing new. What each node went through — the order its work
//! started in, its cordon, the pods evicted or refused, its interrupts and stages, where it
//! ended — is the [`Forecast`]. Nothing of the real world is touched: the snapshot is
//! cloned, with a state cache of its own.
//!
//! [`Report`] reads a forecast for an admin: a summary, nodes with the same outcome
//! grouped, each node's batch and pods.
//!
//! This is the core of a preview. What each package's `plan` stage answered on each node is
//! kept with the node ([`NodeForecast::plans`]), and every plan stage the rollout asked for
//! is listed ([`Forecast::plan_asks`]): a preview runs those as Jobs that never write and
//! feeds their answers back in as [`Assume::outcome`] until nothing is left to ask. The
//! stages that start work without a plan are listed too ([`Forecast::unplanned`]): the
//! preview plans them for the report alone.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use nodewright_api::node_state::Stage;
use nodewright_api::result::{Needs, StageResult};
use nodewright_api::v1alpha1::{InterruptType, PackagePlan, Status};

mod report;

pub use report::report;

use crate::action::{Action, JobRequest, NodePatch};
use crate::plan::plan;
use crate::snapshot::{JobPhase, ObservedJob, ObservedPod, Refusal, Snapshot, Work};

/// What a forecast takes for granted about the world it cannot see.
#[derive(Clone)]
pub struct Assume<'a> {
    /// How each Job ends, asked once, at the first pass after it has run for
    /// [`Assume::runs_for`].
    pub outcome: &'a dyn Fn(&ObservedJob) -> JobPhase,
    /// How long each Job runs, in seconds (from the cluster's history, or a guess). A Job
    /// already running when the forecast starts is taken to have just started. `None`: not
    /// known — each Job ends by the next pass, and the forecast says nothing of time.
    pub runs_for: Option<&'a dyn Fn(&ObservedJob) -> i64>,
    /// Seconds from a pod's eviction (or deletion) to its being gone, from the cluster's
    /// history. `None` or 0: gone at once. A pod on its way out still holds its node's
    /// drain, as a terminating pod does.
    pub evicts_for: Option<i64>,
    /// Pods (`namespace/name`) whose eviction a PodDisruptionBudget refuses now.
    pub pdb_blocked: BTreeSet<String>,
    /// Seconds the clock moves between passes.
    pub step_seconds: i64,
    /// Most passes before the forecast stops (a rollout held by a refusal never settles).
    pub max_passes: usize,
    /// Asked before each pass: `true` stops the forecast there (the caller's budget of wall
    /// time; the planner reads no clock).
    pub enough: Option<&'a dyn Fn() -> bool>,
}

impl std::fmt::Debug for Assume<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assume")
            .field("evicts_for", &self.evicts_for)
            .field("pdb_blocked", &self.pdb_blocked)
            .field("step_seconds", &self.step_seconds)
            .field("max_passes", &self.max_passes)
            .finish_non_exhaustive()
    }
}

/// What a rollout does, node by node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Forecast {
    /// The clock the forecast started at.
    pub starts_at: i64,
    /// Every node any pass acted on, by name.
    pub nodes: BTreeMap<String, NodeForecast>,
    /// Passes run.
    pub passes: usize,
    /// Whether the last pass asked for nothing new; false when `max_passes` ran out first.
    pub settled: bool,
    /// The clock at the last pass that asked for anything: when the rollout ends.
    pub ends_at: i64,
    /// Whether the Jobs' durations were known ([`Assume::runs_for`]), so the times mean
    /// something.
    pub timed: bool,
    /// Every `plan` stage the rollout asked for, in the order it asked.
    pub plan_asks: Vec<JobRequest>,
    /// The stages that start a package's work on a node without a plan (`apply` of a
    /// package with no interrupt, `upgrade`): a preview plans these too, for the report.
    pub unplanned: Vec<JobRequest>,
    /// Each NodeWright's conditions at the end: what holds a rollout that did not finish.
    pub conditions: BTreeMap<String, Vec<Condition>>,
}

/// What a rollout does to one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeForecast {
    /// The pass that started its first Job: nodes in rollout order.
    pub first_work: Option<usize>,
    /// Cordoned at some point.
    pub cordoned: bool,
    /// When it was first cordoned.
    pub cordoned_at: Option<i64>,
    /// When it was last uncordoned after that.
    pub uncordoned_at: Option<i64>,
    /// Pods evicted (or deleted), `namespace/name`, in order.
    pub evicted: Vec<String>,
    /// Pods whose eviction was refused.
    pub refused: Vec<String>,
    /// Interrupts run, in order.
    pub interrupts: Vec<InterruptType>,
    /// Package stages run, `package:stage`, in order.
    pub stages: Vec<String>,
    /// Each NodeWright's status for the node at the end.
    pub status: BTreeMap<String, Status>,
    /// What each package's `plan` stage answered (as [`Assume::outcome`] said), by package.
    pub plans: BTreeMap<String, PackagePlan>,
    /// Where each NodeWright placed the node: the compartment and the batch it joined.
    pub placed: BTreeMap<String, Placement>,
}

/// A node's place in a NodeWright's rollout: the first batch it joined.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// The compartment ([`crate::rollout::DEFAULT`] for nodes no compartment selects).
    pub compartment: String,
    /// The compartment's batch (1-based).
    pub batch: i32,
}

/// Runs the rollout forward from `snapshot` at `now`, under `assume`. A pass that asks for
/// something is followed by the next one `step_seconds` later; one that asks for nothing
/// while Jobs run, by the next one when the first of them ends.
pub fn forecast(snapshot: &Snapshot, now: i64, assume: &Assume<'_>) -> Forecast {
    let mut snap = Snapshot {
        states: Default::default(),
        ..snapshot.clone()
    };
    let mut out = Forecast {
        starts_at: now,
        ends_at: now,
        timed: assume.runs_for.is_some(),
        ..Forecast::default()
    };
    let mut started: BTreeMap<String, i64> =
        snap.jobs.iter().map(|j| (j.name.clone(), now)).collect();
    let ends = |started: &BTreeMap<String, i64>, j: &ObservedJob| {
        started.get(&j.name).copied().unwrap_or(now) + assume.runs_for.map_or(0, |f| f(j).max(0))
    };
    let mut now = now;
    // Evicted pods on their way out, and when each is gone.
    let mut leaving: BTreeMap<String, i64> = BTreeMap::new();
    let drain = assume.evicts_for.unwrap_or(0).max(0);
    while out.passes < assume.max_passes && !assume.enough.is_some_and(|stop| stop()) {
        if leaving.values().any(|gone| *gone <= now) {
            let gone: BTreeSet<String> = leaving
                .extract_if(.., |_, gone| *gone <= now)
                .map(|(key, _)| key)
                .collect();
            snap.pods
                .retain(|p| !p.terminating || !gone.contains(&p.key()));
        }
        finish_jobs(&mut snap, &mut |j| {
            let phase = (now >= ends(&started, j)).then(|| (assume.outcome)(j))?;
            if let Work::Package {
                package,
                stage: Stage::Plan,
                ..
            } = &j.work
            {
                let node = out.nodes.entry(j.node.clone()).or_default();
                node.plans.insert(package.clone(), planned(package, &phase));
            }
            Some(phase)
        });
        let actions = plan(&snap, now);
        out.passes += 1;
        let pass = out.passes;
        let mut moved = false;
        for a in &actions {
            moved |= !matches!(a, Action::Event(_));
            record(&mut out, pass, now, &assume.pdb_blocked, a);
            if let Action::CreateJob(req) = a {
                started.entry(req.name.clone()).or_insert(now);
                if let Work::Package { package, stage, .. } = req.work() {
                    let planned = |r: &JobRequest| {
                        r.node == req.node && r.stage().is_some_and(|s| s.package == package)
                    };
                    match stage {
                        Stage::Plan => out.plan_asks.push((**req).clone()),
                        Stage::Apply | Stage::Upgrade
                            if !out.plan_asks.iter().any(planned)
                                && !out.unplanned.iter().any(planned) =>
                        {
                            out.unplanned.push((**req).clone());
                        }
                        _ => {}
                    }
                }
            }
            match a {
                Action::Evict {
                    namespace,
                    pod,
                    delete,
                    ..
                } if drain > 0 => {
                    let key = format!("{namespace}/{pod}");
                    if !refused(&assume.pdb_blocked, *delete, &key) {
                        let evicted =
                            |p: &&mut ObservedPod| p.namespace == *namespace && p.name == *pod;
                        if let Some(p) = snap.pods.iter_mut().find(evicted) {
                            p.terminating = true;
                            leaving.entry(key).or_insert(now + drain);
                        }
                    } else {
                        apply(&mut snap, now, &assume.pdb_blocked, a);
                    }
                }
                _ => apply(&mut snap, now, &assume.pdb_blocked, a),
            }
        }
        if moved {
            out.ends_at = now;
            place(&mut out, &snap);
        }
        let running = snap
            .jobs
            .iter()
            .any(|j| matches!(j.phase, JobPhase::Active { .. }) || j.stopping)
            || !leaving.is_empty();
        if !moved && !running {
            out.settled = true;
            break;
        }
        let next_end = snap
            .jobs
            .iter()
            .filter(|j| matches!(j.phase, JobPhase::Active { .. }))
            .map(|j| ends(&started, j))
            .chain(leaving.values().copied())
            .min();
        now = match next_end {
            Some(end) if !moved => end.max(now + assume.step_seconds),
            _ => now + assume.step_seconds,
        };
    }
    for cr in &snap.nodewrights {
        out.conditions
            .insert(cr.name.clone(), cr.status.conditions.clone());
        for (node, status) in &cr.status.node_status {
            out.nodes
                .entry(node.clone())
                .or_default()
                .status
                .insert(cr.name.clone(), *status);
        }
    }
    out
}

/// Notes, for each node in a compartment's current batch, the batch it joined first.
fn place(out: &mut Forecast, snap: &Snapshot) {
    for cr in &snap.nodewrights {
        for (compartment, c) in &cr.status.compartment_statuses {
            let batch = c.batch_state.as_ref().map_or(1, |b| b.current_batch);
            for node in &c.batch_nodes {
                out.nodes
                    .entry(node.clone())
                    .or_default()
                    .placed
                    .entry(cr.name.clone())
                    .or_insert_with(|| Placement {
                        compartment: compartment.clone(),
                        batch,
                    });
            }
        }
    }
}

/// A plan stage's answer as a report shows it. A plan that did not say what its changes
/// need is read as the planner reads it: as needing the worst (the spec caps it).
pub fn planned(package: &str, phase: &JobPhase) -> PackagePlan {
    let of = |r: &StageResult| {
        let changes = r.change_count.max(r.changes.len() as u32);
        PackagePlan {
            package: package.into(),
            converged: changes == 0 && r.interrupt == Some(Needs::Nothing),
            failed: false,
            report_only: false,
            interrupt: r
                .interrupt
                .as_ref()
                .map_or("reboot".into(), Needs::to_string),
            change_count: changes,
            changes: r.changes.clone(),
            message: r.message.clone(),
        }
    };
    match phase {
        JobPhase::Succeeded(Some(r)) => of(r),
        JobPhase::Succeeded(None) => PackagePlan {
            package: package.into(),
            interrupt: "reboot".into(),
            message: "the plan said nothing".into(),
            ..PackagePlan::default()
        },
        JobPhase::Failed { last, reason, .. } => PackagePlan {
            failed: true,
            message: last
                .as_ref()
                .map_or_else(|| reason.clone(), |r| r.message.clone()),
            ..last.as_deref().map(of).unwrap_or_else(|| PackagePlan {
                package: package.into(),
                ..PackagePlan::default()
            })
        },
        JobPhase::Active { .. } => PackagePlan {
            package: package.into(),
            failed: true,
            message: "still running".into(),
            ..PackagePlan::default()
        },
    }
}

fn record(out: &mut Forecast, pass: usize, now: i64, pdb_blocked: &BTreeSet<String>, a: &Action) {
    match a {
        Action::CreateJob(req) => {
            let node = out.nodes.entry(req.node.clone()).or_default();
            node.first_work.get_or_insert(pass);
            match req.work() {
                Work::Package { package, stage, .. } => {
                    node.stages.push(format!("{package}:{}", stage.as_str()));
                }
                Work::Interrupt { kind, .. } => node.interrupts.push(kind),
                Work::Prestage { .. } => {}
            }
        }
        Action::PatchNode(p) => {
            let node = out.nodes.entry(p.node.clone()).or_default();
            match p.unschedulable {
                Some(true) => {
                    node.cordoned = true;
                    node.cordoned_at.get_or_insert(now);
                }
                Some(false) if node.cordoned => node.uncordoned_at = Some(now),
                _ => {}
            }
        }
        Action::Evict {
            node,
            namespace,
            pod,
            delete,
            ..
        } => {
            let key = format!("{namespace}/{pod}");
            let node = out.nodes.entry(node.clone()).or_default();
            if refused(pdb_blocked, *delete, &key) {
                if !node.refused.contains(&key) {
                    node.refused.push(key);
                }
            } else {
                node.evicted.push(key);
            }
        }
        _ => {}
    }
}

/// Whether the eviction of pod `key` (`namespace/name`) is refused: a budget in
/// `pdb_blocked` holds it, unless the pod is deleted rather than evicted.
fn refused(pdb_blocked: &BTreeSet<String>, delete: bool, key: &str) -> bool {
    !delete && pdb_blocked.contains(key)
}

/// Applies one action to `snap` as the API server would at `now`: Jobs created and
/// deleted (a running one is stopped and stays until [`finish_jobs`]), node patches,
/// evictions (refused for a pod in `pdb_blocked`, as a PodDisruptionBudget does), status,
/// finalizers.
pub fn apply(snap: &mut Snapshot, now: i64, pdb_blocked: &BTreeSet<String>, a: &Action) {
    match a {
        Action::CreateJob(req) => {
            if !snap.jobs.iter().any(|j| j.name == req.name) {
                snap.jobs.push(ObservedJob {
                    name: req.name.clone(),
                    cr: req.cr.clone(),
                    node: req.node.clone(),
                    generation: req.generation,
                    run: req.run,
                    work: req.work(),
                    phase: JobPhase::Active {
                        failed: 0,
                        last: None,
                    },
                    stopping: false,
                    stuck: None,
                });
            }
        }
        Action::DeleteJob { name, .. } => {
            for j in snap.jobs.iter_mut().filter(|j| j.name == *name) {
                j.stopping = true;
            }
            snap.jobs.retain(|j| j.name != *name || j.running());
        }
        Action::PatchNode(p) => patch(snap, p),
        Action::Evict {
            namespace,
            pod,
            delete,
            ..
        } => {
            let key = format!("{namespace}/{pod}");
            if refused(pdb_blocked, *delete, &key) {
                let message = "Cannot evict pod as it would violate the pod's disruption budget.";
                snap.refusals.insert(
                    key,
                    Refusal {
                        at: now,
                        message: message.into(),
                    },
                );
            } else {
                snap.pods
                    .retain(|p| p.namespace != *namespace || p.name != *pod);
            }
        }
        Action::SetStatus { cr, status } => {
            if let Some(c) = snap.nodewrights.iter_mut().find(|c| c.name == *cr) {
                c.status = (**status).clone().into();
            }
        }
        Action::Event(_) => {}
        Action::AddFinalizer { cr } => {
            if let Some(c) = snap.nodewrights.iter_mut().find(|c| c.name == *cr) {
                c.has_finalizer = true;
            }
        }
        Action::RemoveFinalizer { cr } => snap.nodewrights.retain(|c| c.name != *cr),
    }
}

fn patch(snap: &mut Snapshot, p: &NodePatch) {
    let Some(n) = snap.nodes.iter_mut().find(|n| n.name == p.node) else {
        return;
    };
    for (k, v) in &p.annotations {
        match v {
            Some(v) => n.annotations.insert(k.clone(), v.clone()),
            None => n.annotations.remove(k),
        };
    }
    if let Some(u) = p.unschedulable {
        n.unschedulable = u;
    }
    n.taints.retain(|t| !p.remove_taints.contains(&t.key));
    n.taints.extend(p.add_taints.iter().cloned());
}

/// Ends what stopping Jobs left, and finishes each active Job as `outcome` says (`None`:
/// still running); a reboot that succeeded gives its node a new boot ID, as a node coming
/// back does.
pub fn finish_jobs(snap: &mut Snapshot, outcome: &mut dyn FnMut(&ObservedJob) -> Option<JobPhase>) {
    snap.jobs.retain(|j| !j.stopping);
    let mut rebooted = Vec::new();
    for j in &mut snap.jobs {
        if !matches!(j.phase, JobPhase::Active { .. }) {
            continue;
        }
        let Some(phase) = outcome(j) else {
            continue;
        };
        if let (
            Work::Interrupt {
                kind: InterruptType::Reboot,
                ..
            },
            JobPhase::Succeeded(_),
        ) = (&j.work, &phase)
        {
            rebooted.push(j.node.clone());
        }
        j.phase = phase;
    }
    for node in rebooted {
        if let Some(n) = snap.nodes.iter_mut().find(|n| n.name == node) {
            n.boot_id = format!("{}+rebooted", n.boot_id);
        }
    }
}
