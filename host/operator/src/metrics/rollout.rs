//! Rollout state as gauges, recomputed from the planner's snapshot: per NodeWright, per
//! node, per package stage/state, per compartment, conditions, Jobs and plugin readiness.
//! Every gauge family is cleared and refilled, so a node, package or CR that goes away
//! leaves no stale series. Failed stage Jobs are counted once each, by blame.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use nodewright_api::node_state::NodeState;
use nodewright_api::v1alpha1::Status;
use nodewright_planner::{Cr, JobPhase, ObservedNode, PluginCheck, Snapshot, Work};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// `nodewright`, `status`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CrStatus {
    pub nodewright: String,
    pub status: String,
}

/// `nodewright`, `node`, `status`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeStatus {
    pub nodewright: String,
    pub node: String,
    pub status: String,
}

/// `nodewright`, `package`, `version`, `stage`, `state`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PackageStage {
    pub nodewright: String,
    pub package: String,
    pub version: String,
    pub stage: String,
    pub state: String,
}

/// `nodewright`, `compartment`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CompartmentLabels {
    pub nodewright: String,
    pub compartment: String,
}

/// `nodewright`, `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginError {
    pub nodewright: String,
    pub reason: String,
}

/// `nodewright`, `condition` (its type), `status`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Condition {
    pub nodewright: String,
    pub condition: String,
    pub status: String,
}

/// `nodewright`, `phase`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    pub nodewright: String,
    pub phase: &'static str,
}

/// `nodewright`, `package`, `stage`, `blame`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Failure {
    pub nodewright: String,
    pub package: String,
    pub stage: String,
    pub blame: String,
}

/// The rollout gauges.
#[derive(Debug, Default)]
pub struct Rollout {
    cr_status: Family<CrStatus, Gauge>,
    nodes: Family<CrStatus, Gauge>,
    node_status: Family<NodeStatus, Gauge>,
    packages: Family<PackageStage, Gauge>,
    compartment_matched: Family<CompartmentLabels, Gauge>,
    compartment_completed: Family<CompartmentLabels, Gauge>,
    compartment_in_progress: Family<CompartmentLabels, Gauge>,
    compartment_batch: Family<CompartmentLabels, Gauge>,
    compartment_stopped: Family<CompartmentLabels, Gauge>,
    conditions: Family<Condition, Gauge>,
    plugin_errors: Family<PluginError, Gauge>,
    jobs: Family<JobLabels, Gauge>,
    job_attempts_failed: Family<JobLabels, Gauge>,
    stage_failures: Family<Failure, Counter>,
    /// Failed Jobs already counted (forgotten once the Job is gone).
    counted: Mutex<HashSet<String>>,
    /// The stage-failure series that exist (a counter is never cleared with the gauges:
    /// each goes when its NodeWright, or its package there, is gone).
    failure_series: Mutex<HashSet<Failure>>,
}

/// A blame's serialized name (`package`, `denied`, ...).
fn blame_name(b: &nodewright_api::result::Blame) -> String {
    serde_json::to_value(b)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

impl Rollout {
    /// Registers the families in `r`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "nodewright_status",
            "1 for each NodeWright's current status",
            self.cr_status.clone(),
        );
        r.register(
            "nodewright_nodes",
            "Nodes a NodeWright selects, by their status for it",
            self.nodes.clone(),
        );
        r.register(
            "nodewright_node_status",
            "1 for each node's current status under a NodeWright",
            self.node_status.clone(),
        );
        r.register(
            "nodewright_packages",
            "Nodes at each stage and state of each package",
            self.packages.clone(),
        );
        r.register(
            "nodewright_compartment_nodes_matched",
            "Nodes in a rollout compartment",
            self.compartment_matched.clone(),
        );
        r.register(
            "nodewright_compartment_nodes_completed",
            "Nodes of a compartment that are complete",
            self.compartment_completed.clone(),
        );
        r.register(
            "nodewright_compartment_nodes_in_progress",
            "Nodes of a compartment's current batch still at work",
            self.compartment_in_progress.clone(),
        );
        r.register(
            "nodewright_compartment_batch",
            "A compartment's current batch number",
            self.compartment_batch.clone(),
        );
        r.register(
            "nodewright_compartment_stopped",
            "1 when a compartment stopped on failures",
            self.compartment_stopped.clone(),
        );
        r.register("nodewright_condition", "1 for each NodeWright condition's current status (Ready, Blocked, DrainBlocked, PluginsReady, ...)", self.conditions.clone());
        r.register(
            "nodewright_plugin_errors",
            "1 while a NodeWright's plugins cannot be used, by reason",
            self.plugin_errors.clone(),
        );
        r.register(
            "nodewright_jobs",
            "The operator's stage Jobs, by phase (active, succeeded, failed)",
            self.jobs.clone(),
        );
        r.register(
            "nodewright_job_attempts_failed",
            "Failed attempts counted so far by the Jobs still running",
            self.job_attempts_failed.clone(),
        );
        r.register("nodewright_stage_failures", "Stage Jobs that failed for good, by package, stage and blame (package, denied, config, host, disruption)", self.stage_failures.clone());
    }

    /// Refills the state gauges from `s` (not the Job ones: [`Rollout::observe_jobs`]):
    /// every family cleared, then refilled CR by CR.
    pub fn observe(&self, s: &Snapshot) {
        for f in [&self.cr_status, &self.nodes] {
            f.clear();
        }
        self.node_status.clear();
        self.packages.clear();
        for f in [
            &self.compartment_matched,
            &self.compartment_completed,
            &self.compartment_in_progress,
            &self.compartment_batch,
            &self.compartment_stopped,
        ] {
            f.clear();
        }
        self.conditions.clear();
        self.plugin_errors.clear();
        for cr in &s.nodewrights {
            self.observe_cr(cr);
            self.observe_packages(cr, &s.nodes);
        }
    }

    /// One CR's status: its roll-up, its nodes, its compartments, its conditions and a
    /// plugin check that failed.
    fn observe_cr(&self, cr: &Cr) {
        let nw = cr.name.clone();
        let status = cr.status.status.unwrap_or(Status::Unknown).as_str();
        self.cr_status
            .get_or_create(&CrStatus {
                nodewright: nw.clone(),
                status: status.to_string(),
            })
            .set(1);
        for (node, st) in &cr.status.node_status {
            self.nodes
                .get_or_create(&CrStatus {
                    nodewright: nw.clone(),
                    status: st.as_str().into(),
                })
                .inc();
            self.node_status
                .get_or_create(&NodeStatus {
                    nodewright: nw.clone(),
                    node: node.clone(),
                    status: st.as_str().into(),
                })
                .set(1);
        }
        for (name, c) in &cr.status.compartment_statuses {
            let l = CompartmentLabels {
                nodewright: nw.clone(),
                compartment: name.clone(),
            };
            self.compartment_matched
                .get_or_create(&l)
                .set(c.matched.into());
            self.compartment_completed
                .get_or_create(&l)
                .set(c.completed.into());
            self.compartment_in_progress
                .get_or_create(&l)
                .set(c.in_progress.into());
            let batch = c.batch_state.as_ref();
            self.compartment_batch
                .get_or_create(&l)
                .set(batch.map_or(0, |b| b.current_batch).into());
            self.compartment_stopped
                .get_or_create(&l)
                .set(i64::from(batch.is_some_and(|b| b.should_stop)));
        }
        for c in &cr.status.conditions {
            self.conditions
                .get_or_create(&Condition {
                    nodewright: nw.clone(),
                    condition: c.type_.clone(),
                    status: c.status.clone(),
                })
                .set(1);
        }
        if let PluginCheck::NotReady { reason, .. } = &cr.plugins {
            self.plugin_errors
                .get_or_create(&PluginError {
                    nodewright: nw,
                    reason: reason.clone(),
                })
                .set(1);
        }
    }

    /// How many nodes hold each (package, version, stage, state) of the CR.
    fn observe_packages(&self, cr: &Cr, nodes: &[ObservedNode]) {
        let mut counts: HashMap<PackageStage, i64> = HashMap::new();
        for n in nodes {
            let Ok(st) = NodeState::read(&n.name, &n.annotations, &cr.name) else {
                continue;
            };
            for e in st.values() {
                let l = PackageStage {
                    nodewright: cr.name.clone(),
                    package: e.name.clone(),
                    version: e.version.clone(),
                    stage: e.stage.as_str().into(),
                    state: e.state.as_str().into(),
                };
                *counts.entry(l).or_default() += 1;
            }
        }
        for (l, n) in counts {
            self.packages.get_or_create(&l).set(n);
        }
    }

    /// Job gauges and stage failures, from every pass's snapshot: a failed Job is seen by
    /// the one pass that records (and deletes) it.
    pub fn observe_jobs(&self, s: &Snapshot) {
        self.jobs.clear();
        self.job_attempts_failed.clear();
        // Zero series for every CR, so "no Jobs" is 0 rather than absent.
        for cr in &s.nodewrights {
            for phase in ["active", "succeeded", "failed"] {
                self.jobs
                    .get_or_create(&JobLabels {
                        nodewright: cr.name.clone(),
                        phase,
                    })
                    .set(0);
            }
            self.job_attempts_failed
                .get_or_create(&JobLabels {
                    nodewright: cr.name.clone(),
                    phase: "active",
                })
                .set(0);
        }
        let mut counted = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        let live: HashSet<&str> = s.jobs.iter().map(|j| j.name.as_str()).collect();
        counted.retain(|name| live.contains(name.as_str()));
        for j in &s.jobs {
            let (phase, failed) = match &j.phase {
                // A pod that cannot start is one failed attempt while it cannot.
                JobPhase::Active { failed, .. } => {
                    ("active", i64::from(*failed) + i64::from(j.stuck.is_some()))
                }
                JobPhase::Succeeded(_) => ("succeeded", 0),
                JobPhase::Failed { .. } => ("failed", 0),
            };
            let l = JobLabels {
                nodewright: j.cr.clone(),
                phase,
            };
            self.jobs.get_or_create(&l).inc();
            if failed > 0 {
                self.job_attempts_failed.get_or_create(&l).inc_by(failed);
            }
            if let JobPhase::Failed { last, reason, .. } = &j.phase
                && counted.insert(j.name.clone())
            {
                let (package, stage) = match &j.work {
                    Work::Package { package, stage, .. } => {
                        (package.clone(), stage.as_str().to_string())
                    }
                    Work::Interrupt { owner, stage, .. } => {
                        (owner.clone(), stage.as_str().to_string())
                    }
                    // The node's payloads, not one package's.
                    Work::Prestage { .. } => ("payloads".into(), "prestage".into()),
                };
                let blame = last
                    .as_ref()
                    .map(|r| blame_name(&r.blame))
                    .unwrap_or_else(|| reason.clone());
                let series = Failure {
                    nodewright: j.cr.clone(),
                    package,
                    stage,
                    blame,
                };
                self.stage_failures.get_or_create(&series).inc();
                self.failure_series
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(series);
            }
        }
        self.forget_failures(s);
    }

    /// Removes the stage-failure series of NodeWrights, and packages of them, that are gone.
    fn forget_failures(&self, s: &Snapshot) {
        let mut series = self
            .failure_series
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        series.retain(|f| {
            let live = s
                .nodewrights
                .iter()
                .any(|cr| cr.name == f.nodewright && cr.spec.packages.contains_key(&f.package));
            if !live {
                self.stage_failures.remove(f);
            }
            live
        });
    }
}

#[cfg(test)]
mod tests {
    use nodewright_api::node_state::Stage;
    use nodewright_planner::ObservedJob;
    use prometheus_client::encoding::text::encode;

    use super::*;

    fn job(failed: u32, stuck: Option<&str>) -> ObservedJob {
        ObservedJob {
            name: "j".into(),
            cr: "tune".into(),
            node: "n".into(),
            generation: 1,
            run: 1,
            work: Work::Package {
                package: "p".into(),
                version: "1".into(),
                stage: Stage::Apply,
            },
            phase: JobPhase::Active { failed, last: None },
            stopping: false,
            stuck: stuck.map(String::from),
        }
    }

    fn attempts_failed(j: ObservedJob) -> String {
        let rollout = Rollout::default();
        let mut r = Registry::default();
        rollout.register(&mut r);
        rollout.observe_jobs(&Snapshot {
            jobs: vec![j],
            ..Default::default()
        });
        let mut text = String::new();
        encode(&mut text, &r).unwrap();
        text.lines()
            .find(|l| l.starts_with("nodewright_job_attempts_failed{"))
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn a_pod_that_cannot_start_is_a_failed_attempt() {
        let line = attempts_failed(job(1, Some("cannot start: ErrImagePull")));
        assert!(line.ends_with(" 2"), "{line}");
        let line = attempts_failed(job(1, None));
        assert!(line.ends_with(" 1"), "{line}");
    }
}
