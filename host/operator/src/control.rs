//! The control loop: wake on a watch event or a timer, plan one pass from a snapshot of the
//! world, execute it, and pace the next pass by what this one did.

use std::sync::Arc;
use std::time::Duration;

use nodewright_planner::{Action, Settings, plan};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::admission::Admission;
use crate::execute::{Executor, PassWrites};
use crate::gates::Gates;
use crate::handover::Routing;
use crate::leader::Leader;
use crate::metrics::Metrics;
use crate::plugins::Plugins;
use crate::world::World;

/// How long a burst of watch events may keep arriving before a pass starts: one pass for
/// the burst, not one per event.
pub const SETTLE: Duration = Duration::from_millis(150);
/// How long the leader's lease lasts unrenewed; a standby takes over after it.
pub const LEASE: Duration = Duration::from_secs(15);
/// How often the leader renews its lease: well inside [`LEASE`], so a slow pass or two
/// never lets it lapse.
pub const RENEW_EVERY: Duration = Duration::from_secs(5);
/// How often the fleet gauges are recomputed (they walk every node of every NodeWright;
/// the Job gauges are recomputed every pass).
pub const OBSERVE_EVERY: Duration = Duration::from_secs(2);
/// The next pass after a write failed (a conflict with a newer node, a transient error).
pub const AFTER_FAILURE: Duration = Duration::from_millis(500);
/// The next pass while Jobs run or the last pass wrote: progress is read from Jobs and
/// pods, whose watch events also wake the loop sooner.
pub const WHILE_BUSY: Duration = Duration::from_secs(2);
/// The soonest a health gate coming due brings the next pass.
pub const GATE_MIN: Duration = Duration::from_millis(200);

/// Everything a pass reads and writes through.
pub struct Loop {
    /// The watched cluster.
    pub world: World,
    /// Whether the agent's pods are admitted.
    pub admission: Admission,
    /// Plugin resolution and checks.
    pub plugins: Plugins,
    /// Health gates.
    pub gates: Gates,
    /// Writes the passes' actions.
    pub executor: Executor,
    /// The operator's metrics.
    pub metrics: Arc<Metrics>,
    /// The planner's settings.
    pub settings: Settings,
    /// The leader lease, when elected (held already).
    pub lease: Option<Leader>,
    /// The webhook Service as it routes to this replica (known when the replica knows its
    /// pod): a fenced leader ends only once it no longer does.
    pub routing: Option<Routing>,
    /// What wakes the loop: watch events, resolutions finishing, gates answering.
    pub notify: Arc<Notify>,
    /// The longest the loop sleeps with nothing to do.
    pub resync: Duration,
    /// The durations of the Jobs that succeeded, read before each pass deletes them.
    pub history: Arc<crate::history::History>,
}

impl Loop {
    /// Runs passes until Ctrl-C, or until the lease is lost.
    pub async fn run(self) -> anyhow::Result<()> {
        let mut last_renew = Instant::now();
        let mut last_observed = Instant::now() - OBSERVE_EVERY;
        let mut wait = Duration::ZERO;
        loop {
            tokio::select! {
                _ = self.notify.notified() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = tokio::signal::ctrl_c() => {
                    tracing::info!("interrupted; stopping");
                    return Ok(());
                }
            }
            tokio::time::sleep(SETTLE).await;
            if let Some(l) = &self.lease
                && last_renew.elapsed() > RENEW_EVERY
            {
                if !l.renew().await.unwrap_or(false) {
                    anyhow::bail!(
                        "lost the leader lease {}; exiting so a fresh start re-acquires it",
                        l.name()
                    );
                }
                last_renew = Instant::now();
            }
            let observe = last_observed.elapsed() >= OBSERVE_EVERY;
            if observe {
                last_observed = Instant::now();
            }
            let (out, busy) = self.pass(observe).await;
            if let Some(l) = &self.lease
                && self.metrics.is_fenced()
            {
                // This replica's node reboots once its replicas are out: hand over now, not
                // a lease duration after the node went down. The process ends once the
                // webhook Service no longer routes to it; its restart waits as a standby
                // until the node is through.
                tracing::info!(
                    lease = l.name(),
                    "this replica's node is fenced for a reboot; handing over the lease"
                );
                l.release().await?;
                if let Some(routing) = &self.routing {
                    routing.wait_out().await;
                }
                return Ok(());
            }
            wait = next_wait(&out, busy, self.resync, self.gates.due_in());
        }
    }

    /// One pass: snapshot, plan, execute. Returns what it wrote and whether work is under
    /// way (Jobs exist, or it acted).
    async fn pass(&self, observe: bool) -> (PassWrites, bool) {
        let started = std::time::Instant::now();
        let agent_pods = self.admission.check().await;
        let snapshot = self
            .world
            .snapshot(&self.settings, &self.plugins, &self.gates, agent_pods);
        self.metrics.rollout.observe_jobs(&snapshot);
        self.history.observe(&self.world.succeeded_jobs());
        if observe {
            self.metrics.rollout.observe(&snapshot);
        }
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let actions = plan(&snapshot, now);
        self.history.drains(&snapshot, &actions, now);
        let busy =
            !snapshot.jobs.is_empty() || actions.iter().any(|a| !matches!(a, Action::Event(_)));
        let n = actions.len();
        for a in &actions {
            tracing::trace!(?a, "action");
            self.metrics.action(a);
        }
        let out = self.executor.run(actions, &snapshot.nodes).await;
        self.metrics
            .pass_duration
            .observe(started.elapsed().as_secs_f64());
        self.metrics.api_writes.inc_by(out.writes as u64);
        self.metrics.api_write_failures.inc_by(out.failures as u64);
        tracing::debug!(
            actions = n,
            writes = out.writes,
            failures = out.failures,
            nodes = snapshot.nodes.len(),
            jobs = snapshot.jobs.len(),
            pods = snapshot.pods.len(),
            "pass"
        );
        (out, busy)
    }
}

/// How long to sleep before the next pass (unless a watch event comes first): soon after a
/// failed write, every [`WHILE_BUSY`] while work is under way, else `resync` — and never
/// past a health gate coming due.
fn next_wait(
    out: &PassWrites,
    busy: bool,
    resync: Duration,
    gate_due: Option<Duration>,
) -> Duration {
    let wait = if out.failures > 0 {
        AFTER_FAILURE
    } else if busy {
        WHILE_BUSY
    } else {
        resync
    };
    match gate_due {
        Some(due) => wait.min(due.max(GATE_MIN)),
        None => wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrote(failures: usize) -> PassWrites {
        PassWrites {
            writes: 3,
            failures,
        }
    }

    #[test]
    fn the_next_pass_comes_sooner_the_more_is_going_on() {
        let resync = Duration::from_secs(300);
        assert_eq!(next_wait(&wrote(1), true, resync, None), AFTER_FAILURE);
        assert_eq!(next_wait(&wrote(0), true, resync, None), WHILE_BUSY);
        assert_eq!(next_wait(&wrote(0), false, resync, None), resync);
        assert!(AFTER_FAILURE < WHILE_BUSY && RENEW_EVERY * 2 < LEASE);
    }

    #[test]
    fn a_gate_coming_due_is_asked_on_time_but_never_in_a_busy_loop() {
        let resync = Duration::from_secs(300);
        let due = Duration::from_secs(7);
        assert_eq!(next_wait(&wrote(0), false, resync, Some(due)), due);
        assert_eq!(
            next_wait(&wrote(0), false, resync, Some(Duration::ZERO)),
            GATE_MIN,
            "a gate already due does not spin the loop"
        );
        assert_eq!(
            next_wait(&wrote(1), false, resync, Some(due)),
            AFTER_FAILURE
        );
    }
}
