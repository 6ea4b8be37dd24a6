//! `NodeWrightPreview`s, answered by the leader: each proposed package's `plan` stage run on
//! the nodes the rollout would reach, and the rollout forecast with their answers.
//!
//! One step per preview per pass, level-triggered like the rollout: the plugins resolved and
//! checked as the NodeWright's would be (a refusal — an untrusted signer, a grant the
//! component does not fit — fails the preview, saying why); the forecast run with every plan
//! answered so far and the rest assumed to change; the plans it asked for and nobody has
//! answered started as Jobs, at most `limit` of every preview's at once; once none is left,
//! the report written and the TTL started. A plan Job is the one the rollout would create,
//! marked as the preview's (see [`crate::jobs::build_preview`]): the agent and the engine hold
//! a `plan` stage read-only, so nothing on a node is cordoned, annotated or written.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use nodewright_api::node_state::Stage;
use nodewright_api::v1alpha1::{
    NodeWrightPreview, PREVIEW_TTL_SECONDS, PlanCount, PreviewPhase, PreviewStatus,
};
use nodewright_planner::forecast::{Assume, forecast, report};
use nodewright_planner::{JobPhase, JobRequest, ObservedJob, PluginCheck, Settings, Work};
use sha2::{Digest, Sha256};

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

    /// One step for every preview; returns whether any is still under way.
    pub async fn pass(&self, world: &World, plugins: &Plugins, settings: &Settings) -> bool {
        let mut busy = false;
        for p in world.previews() {
            match self.step(world, plugins, settings, &p).await {
                Ok(under_way) => busy |= under_way,
                Err(e) => {
                    tracing::warn!(preview = ?p.metadata.name, "preview: {e}");
                    busy = true;
                }
            }
        }
        busy
    }

    async fn step(
        &self,
        world: &World,
        plugins: &Plugins,
        settings: &Settings,
        p: &NodeWrightPreview,
    ) -> kube::Result<bool> {
        let name = p.metadata.name.clone().unwrap_or_default();
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let generation = p.metadata.generation.unwrap_or(0);
        let now = k8s_openapi::jiff::Timestamp::now();
        let current = p.status.clone().unwrap_or_default();
        if current.phase.is_some_and(PreviewPhase::finished) {
            if expired(p, now) {
                let api: Api<NodeWrightPreview> = Api::all(self.client.clone());
                api.delete(&name, &DeleteParams::background()).await?;
            }
            return Ok(false);
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
                self.write(&name, &current, status).await?;
                return Ok(true);
            }
            PluginCheck::NotReady { reason, message } => {
                let status = PreviewStatus {
                    phase: Some(PreviewPhase::Failed),
                    message: format!("{reason}: {message}"),
                    finished_at: Some(now.to_string()),
                    ..PreviewStatus::default()
                };
                self.write(&name, &current, status).await?;
                return Ok(false);
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
        let (f, answers) = tokio::task::spawn_blocking(move || {
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
            let assume = Assume {
                outcome: &outcome,
                runs_for: None,
                pdb_blocked,
                step_seconds: 2,
                max_passes: 5_000,
                enough: Some(&enough),
            };
            (forecast(&snapshot, now.as_second(), &assume), answers)
        })
        .await
        .expect("the forecast does not panic");
        let mut wanted: Vec<(String, &JobRequest)> = Vec::new();
        for req in f.plan_asks.iter().filter(|r| p.spec.reports(&r.node)) {
            let Some(ask) = req.stage() else { continue };
            let n = plan_job_name(&uid, generation, &req.node, &ask.package, &ask.version);
            if !wanted.iter().any(|(w, _)| *w == n) {
                wanted.push((n, req));
            }
        }
        let done = wanted
            .iter()
            .filter(|(n, _)| answers.contains_key(n))
            .count();
        let failed = wanted
            .iter()
            .filter(|(n, _)| matches!(answers.get(n), Some(JobPhase::Failed { .. })))
            .count();
        let plans = PlanCount::new(wanted.len() as u32, done as u32, failed as u32);
        if done == wanted.len() {
            let mut report = report(&f, &p.spec.nodewright, &|n| p.spec.reports(n));
            report.assumed = vec![
                "every stage after the plan succeeds".into(),
                "durations: not known (no history kept yet)".into(),
            ];
            let status = PreviewStatus {
                phase: Some(PreviewPhase::Ready),
                message: String::new(),
                plans,
                finished_at: Some(now.to_string()),
                report: Some(report),
            };
            self.write(&name, &current, status).await?;
            return Ok(false);
        }
        let room = self.limit.saturating_sub(running);
        let api: Api<Job> = Api::namespaced(self.client.clone(), &self.jobs.namespace);
        for (n, req) in wanted
            .iter()
            .filter(|(n, _)| !answers.contains_key(n) && !existing.contains(n))
            .take(room)
        {
            let Some(job) = crate::jobs::build_preview(req, &self.jobs, &name, &uid, n) else {
                continue;
            };
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
        self.write(&name, &current, status).await?;
        Ok(true)
    }

    /// Writes `status` unless it is what `current` already says.
    async fn write(
        &self,
        name: &str,
        current: &PreviewStatus,
        status: PreviewStatus,
    ) -> kube::Result<()> {
        if *current == status {
            return Ok(());
        }
        let api: Api<NodeWrightPreview> = Api::all(self.client.clone());
        let patch = serde_json::json!({ "status": status });
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }
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
