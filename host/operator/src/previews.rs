//! `NodeWrightPreview`s, answered by the leader: each proposed package's `plan` stage run on
//! the nodes the rollout would reach, and the rollout forecast with their answers.
//!
//! One step per preview per pass, level-triggered like the rollout: the plugins resolved and
//! checked as the NodeWright's would be (a refusal — an untrusted signer, a grant the
//! component does not fit — fails the preview, saying why); the forecast run with every plan
//! answered so far and the rest assumed to change; the plans it asked for and nobody has
//! answered started as Jobs, at most `limit` of every preview's at once — with plans of the
//! stages the rollout starts without one (a package with no interrupt, an upgrade), whose
//! answers the report shows beside the forecast; once none is left, the report written and
//! the TTL started. A plan Job is the one the rollout would create,
//! marked as the preview's (see [`crate::jobs::build_preview`]): the agent and the engine hold
//! a `plan` stage read-only, so nothing on a node is cordoned, annotated or written.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use nodewright_api::agent::RunStage;
use nodewright_api::node_state::Stage;
use nodewright_api::v1alpha1::{
    NodeWrightPreview, NodeWrightPreviewSpec, PREVIEW_TTL_SECONDS, PackagePlan, PlanCount,
    PreviewPhase, PreviewStatus,
};
use nodewright_planner::forecast::{Assume, Forecast, forecast, planned, report};
use nodewright_planner::{Ask, JobPhase, JobRequest, ObservedJob, PluginCheck, Settings, Work};
use sha2::{Digest, Sha256};

use crate::history::History;
use crate::jobs::JobConfig;
use crate::plugins::Plugins;
use crate::world::World;

/// Wall time one preview's forecast may take in a pass.
const BUDGET: Duration = Duration::from_secs(10);

/// What the previews need beyond the world.
pub struct Previews {
    /// Writes Jobs and statuses.
    pub client: kube::Client,
    /// How plan Jobs are built.
    pub jobs: JobConfig,
    /// Most plan Jobs of all previews running at once.
    pub limit: usize,
    /// How long stages have taken here: the estimate's durations.
    pub history: Arc<History>,
    /// Counts every write a preview sends (plan Jobs, statuses, the TTL's delete).
    pub writes: prometheus_client::metrics::counter::Counter,
}

/// Time between passes over the previews.
const EVERY: Duration = Duration::from_secs(2);

impl Previews {
    /// Steps every preview every [`EVERY`], for as long as the process leads.
    pub async fn run(self, world: World, plugins: Plugins, settings: Settings) {
        loop {
            self.pass(&world, &plugins, &settings).await;
            tokio::time::sleep(EVERY).await;
        }
    }

    /// One step for every preview (a failed write is tried again at the next).
    pub async fn pass(&self, world: &World, plugins: &Plugins, settings: &Settings) {
        for p in world.previews() {
            if let Err(e) = self.step(world, plugins, settings, &p).await {
                tracing::warn!(preview = ?p.metadata.name, "preview: {e}");
            }
        }
    }

    async fn step(
        &self,
        world: &World,
        plugins: &Plugins,
        settings: &Settings,
        p: &NodeWrightPreview,
    ) -> kube::Result<()> {
        let name = p.metadata.name.clone().unwrap_or_default();
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let generation = p.metadata.generation.unwrap_or(0);
        let now = k8s_openapi::jiff::Timestamp::now();
        let current = p.status.clone().unwrap_or_default();
        if current.phase.is_some_and(PreviewPhase::finished)
            && current.observed_generation == Some(generation)
        {
            if expired(p, now) {
                let api: Api<NodeWrightPreview> = Api::all(self.client.clone());
                self.writes.inc();
                api.delete(&name, &DeleteParams::background()).await?;
            }
            return Ok(());
        }
        let key = format!("preview/{name}");
        let resolved = match plugins.get(&key, &uid, generation, &p.spec.spec) {
            PluginCheck::Ready(r) => r,
            PluginCheck::Pending => {
                let status = PreviewStatus {
                    phase: Some(PreviewPhase::Resolving),
                    message: "resolving, pulling and checking the plugins".into(),
                    ..PreviewStatus::default()
                };
                self.write(&name, generation, &current, status).await?;
                return Ok(());
            }
            PluginCheck::NotReady { reason, message } => {
                let status = PreviewStatus {
                    phase: Some(PreviewPhase::Failed),
                    message: format!("{reason}: {message}"),
                    finished_at: Some(now.to_string()),
                    ..PreviewStatus::default()
                };
                self.write(&name, generation, &current, status).await?;
                plugins.forget(&key);
                return Ok(());
            }
        };
        let (snapshot, _) = crate::preview::proposed(
            world,
            settings,
            &p.spec.nodewright,
            &p.spec.spec,
            Some(&resolved),
        );
        let (jobs, running) = world.preview_jobs(&name);
        let existing: std::collections::BTreeSet<String> =
            jobs.iter().map(|j| j.name.clone()).collect();
        let answers: BTreeMap<String, JobPhase> = jobs
            .into_iter()
            .filter(|j| !matches!(j.phase, JobPhase::Active { .. }))
            .map(|j| (j.name, j.phase))
            .collect();
        let pdb_blocked = world.budget_blocked();
        let preview_uid = uid.clone();
        let history = self.history.clone();
        let durations = Durations::of(&history);
        let (timed, fallback, evicts_for) =
            (durations.known, durations.fallback, durations.eviction);
        let (mut f, answers) = tokio::task::spawn_blocking(move || {
            let outcome = |j: &ObservedJob| match &j.work {
                Work::Package {
                    package,
                    version,
                    stage: Stage::Plan,
                } => answers
                    .get(&plan_job_name(
                        &preview_uid,
                        generation,
                        &j.node,
                        package,
                        version,
                    ))
                    .cloned()
                    .unwrap_or_else(|| crate::preview::succeeds(j, true)),
                _ => crate::preview::succeeds(j, false),
            };
            let started = Instant::now();
            let enough = || started.elapsed() > BUDGET;
            let runs_for = |j: &ObservedJob| {
                history
                    .get(&j.work)
                    .map_or(fallback, |s| s.mean.round() as i64)
            };
            let assume = Assume {
                outcome: &outcome,
                runs_for: timed.then_some(&runs_for as &dyn Fn(&ObservedJob) -> i64),
                evicts_for,
                pdb_blocked,
                step_seconds: 2,
                max_passes: 5_000,
                enough: Some(&enough),
            };
            (forecast(&snapshot, now.as_second(), &assume), answers)
        })
        .await
        .expect("the forecast does not panic");
        let wanted = wanted(&f, &p.spec, &uid, generation);
        let done = wanted
            .iter()
            .filter(|w| answers.contains_key(&w.name))
            .count();
        let failed = wanted
            .iter()
            .filter(|w| matches!(answers.get(&w.name), Some(JobPhase::Failed { .. })))
            .count();
        let plans = PlanCount::new(wanted.len() as u32, done as u32, failed as u32);
        if done == wanted.len() {
            for w in wanted.iter().filter(|w| w.report_only) {
                let (Some(ask), Some(phase)) = (w.req.stage(), answers.get(&w.name)) else {
                    continue;
                };
                let plan = PackagePlan {
                    report_only: true,
                    ..planned(&ask.package, phase)
                };
                let node = f.nodes.entry(w.req.node.clone()).or_default();
                node.plans.insert(ask.package.clone(), plan);
            }
            let mut report = report(&f, &p.spec.nodewright, &|n| p.spec.reports(n));
            report.assumed = vec![
                "every stage after the plan succeeds".into(),
                durations.text,
                durations.eviction_text,
            ];
            let status = PreviewStatus {
                phase: Some(PreviewPhase::Ready),
                message: String::new(),
                plans,
                finished_at: Some(now.to_string()),
                report: Some(report),
                observed_generation: None,
            };
            self.write(&name, generation, &current, status).await?;
            plugins.forget(&key);
            return Ok(());
        }
        let room = self.limit.saturating_sub(running);
        let api: Api<Job> = Api::namespaced(self.client.clone(), &self.jobs.namespace);
        for w in wanted
            .iter()
            .filter(|w| !answers.contains_key(&w.name) && !existing.contains(&w.name))
            .take(room)
        {
            let Some(job) = crate::jobs::build_preview(&w.req, &self.jobs, &name, &uid, &w.name)
            else {
                continue;
            };
            self.writes.inc();
            match api.create(&PostParams::default(), &job).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        let status = PreviewStatus {
            phase: Some(PreviewPhase::Planning),
            message: format!("running plan stages: {done} of {} answered", wanted.len()),
            plans,
            ..PreviewStatus::default()
        };
        self.write(&name, generation, &current, status).await
    }

    /// Writes `status` (answering `generation`) unless it is what `current` already says.
    async fn write(
        &self,
        name: &str,
        generation: i64,
        current: &PreviewStatus,
        mut status: PreviewStatus,
    ) -> kube::Result<()> {
        status.observed_generation = Some(generation);
        if *current == status {
            return Ok(());
        }
        let api: Api<NodeWrightPreview> = Api::all(self.client.clone());
        // A merge patch keeps what it does not name: every field is named, unset ones as
        // null, so an edited preview's old report does not linger.
        let mut body = serde_json::to_value(&status).expect("a status serializes");
        if let Some(fields) = body.as_object_mut() {
            for key in [
                "phase",
                "message",
                "finishedAt",
                "report",
                "observedGeneration",
            ] {
                fields.entry(key).or_insert(serde_json::Value::Null);
            }
        }
        let patch = serde_json::json!({ "status": body });
        self.writes.inc();
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }
}

/// One plan Job a preview runs.
struct Wanted {
    /// The Job's name ([`plan_job_name`]).
    name: String,
    /// The plan stage asked.
    req: JobRequest,
    /// The rollout does not run this plan: its answer is reported only.
    report_only: bool,
}

/// The plan Jobs preview `spec` runs on its reported nodes: the plans the rollout runs
/// (their answers steer the forecast), then plans of the stages it starts without one.
fn wanted(f: &Forecast, spec: &NodeWrightPreviewSpec, uid: &str, generation: i64) -> Vec<Wanted> {
    let mut wanted: Vec<Wanted> = Vec::new();
    let asks = f.plan_asks.iter().map(|r| (Some(r.clone()), false));
    let unplanned = f.unplanned.iter().map(|r| (as_plan(r), true));
    for (req, report_only) in asks.chain(unplanned) {
        let Some(req) = req.filter(|r| spec.reports(&r.node)) else {
            continue;
        };
        let Some(ask) = req.stage() else { continue };
        let name = plan_job_name(uid, generation, &req.node, &ask.package, &ask.version);
        if !wanted.iter().any(|w| w.name == name) {
            wanted.push(Wanted {
                name,
                req,
                report_only,
            });
        }
    }
    wanted
}

/// Where a forecast's durations come from.
struct Durations {
    /// Any Job seen at all: the forecast is timed.
    known: bool,
    /// Seconds for a stage never seen: the mean of every Job seen.
    fallback: i64,
    /// Seconds from an eviction to the pod gone (their mean), if any was seen.
    eviction: Option<i64>,
    /// How the stages' were derived, for the report.
    text: String,
    /// How the evictions' were.
    eviction_text: String,
}

impl Durations {
    fn of(history: &History) -> Self {
        let evictions = history.evictions();
        let eviction = evictions.map(|s| s.mean.round() as i64);
        let eviction_text = match evictions {
            Some(s) => format!(
                "evictions: {} s from the eviction to the pod gone, the mean over {} pods seen leaving (longest {} s)",
                s.mean.round(),
                s.count,
                s.max
            ),
            None => "evictions: none seen yet, taken to end at once".into(),
        };
        let (known, fallback, text) = match history.overall() {
            Some((count, mean)) => (
                true,
                mean,
                format!(
                    "durations: each stage's mean over {count} Jobs seen to succeed; a stage never seen: {mean} s, the mean of all"
                ),
            ),
            None => (
                false,
                0,
                "durations: none seen yet (no leader has watched a Job succeed), so no time is given".into(),
            ),
        };
        Durations {
            known,
            fallback,
            eviction,
            text,
            eviction_text,
        }
    }
}

/// `req` asked as a `plan` stage instead: what a preview runs to show the host changes of
/// a stage the rollout starts without a plan.
fn as_plan(req: &JobRequest) -> Option<JobRequest> {
    let mut plan = req.clone();
    match &mut plan.ask {
        Ask::Stage { call, .. } => call.stage = RunStage::Plan,
        Ask::Interrupt { .. } | Ask::Prestage { .. } => return None,
    }
    Some(plan)
}

/// Whether a finished preview has outlived its TTL.
fn expired(p: &NodeWrightPreview, now: k8s_openapi::jiff::Timestamp) -> bool {
    let ttl = p
        .spec
        .ttl_seconds_after_finished
        .unwrap_or(PREVIEW_TTL_SECONDS);
    p.status
        .as_ref()
        .and_then(|s| s.finished_at.as_deref())
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .is_some_and(|at| now.as_second() - at.as_second() >= i64::from(ttl))
}

/// A plan Job's name: one per (preview generation, node, package version), so an edited
/// preview plans again and a pass finds the Jobs an earlier one started.
fn plan_job_name(uid: &str, generation: i64, node: &str, package: &str, version: &str) -> String {
    let digest = Sha256::digest(format!("{uid}/{generation}/{node}/{package}/{version}"));
    let hex: String = digest[..10].iter().map(|b| format!("{b:02x}")).collect();
    format!("nodewright-preview-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stage the rollout starts without a plan is planned as the same request; what
    /// becomes a preview's Job is a plan stage or nothing, marked and owned as the
    /// preview's, so no rollout pass reads it and it goes with the preview.
    #[test]
    fn a_preview_job_is_a_plan_stage_marked_and_owned_as_the_previews() {
        let apply = crate::jobs::tests::request();
        let cfg = crate::jobs::tests::cfg();
        assert!(
            crate::jobs::build_preview(&apply, &cfg, "p", "uid-p", "nodewright-preview-a")
                .is_none(),
            "an apply never becomes a preview's Job"
        );
        let plan = as_plan(&apply).unwrap();
        let ask = plan.stage().unwrap();
        assert_eq!(ask.stage, RunStage::Plan);
        assert_eq!((ask.package.as_str(), plan.node.as_str()), ("tuning", "n1"));
        assert_eq!(ask.limits, apply.stage().unwrap().limits);
        let job =
            crate::jobs::build_preview(&plan, &cfg, "p", "uid-p", "nodewright-preview-a").unwrap();
        let labels = job.metadata.labels.clone().unwrap();
        let pod = job
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap();
        for l in [&labels, pod.labels.as_ref().unwrap()] {
            assert_eq!(l[nodewright_api::keys::job::MANAGED], "preview");
            assert_eq!(l[nodewright_api::keys::job::PREVIEW], "p");
            assert_eq!(l[nodewright_api::keys::job::STAGE], "plan");
            assert!(nodewright_api::keys::job::is_ours(l), "never drained");
        }
        assert_eq!(job.metadata.name.as_deref(), Some("nodewright-preview-a"));
        let owner = &job.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("NodeWrightPreview", "uid-p")
        );
        let read = crate::jobs::read(&job, &[]).unwrap();
        assert!(matches!(
            read.work,
            Work::Package {
                stage: Stage::Plan,
                ..
            }
        ));
    }

    #[test]
    fn a_plan_jobs_name_is_a_valid_label_value_and_differs_per_node_package_and_edit() {
        let a = plan_job_name("u", 1, "n1", "driver", "1.0");
        assert!(a.len() <= 63 && a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        assert_eq!(a, plan_job_name("u", 1, "n1", "driver", "1.0"));
        for other in [
            plan_job_name("u", 2, "n1", "driver", "1.0"),
            plan_job_name("u", 1, "n2", "driver", "1.0"),
            plan_job_name("u", 1, "n1", "tools", "1.0"),
            plan_job_name("u", 1, "n1", "driver", "1.1"),
        ] {
            assert_ne!(a, other);
        }
    }
}
