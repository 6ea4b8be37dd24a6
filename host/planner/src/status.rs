//! The CR's status, conditions and transition events, derived from the pass.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use nodewright_api::keys::{self, condition, reason};
use nodewright_api::node_state::{NodeState, Stage, State};
use nodewright_api::v1alpha1::{CompartmentStatus, NodeWrightStatus, Status};
use nodewright_api::windows::WindowState;

use crate::action::{Action, Event, Target};
use crate::hold::Holds;
use crate::node::NodeOutcome;
use crate::roster::NodeIndex;
use crate::snapshot::{Cr, ObservedNode, PluginCheck};
use crate::states::StateCache;
use crate::tally::NodeTally;

/// Collects what a CR's pass found and turns it into a status write and events.
pub struct Report<'a> {
    cr: &'a Cr,
    now: i64,
    status: NodeWrightStatus,
    plugins: Option<(bool, String, String)>,
    policy_missing: Option<String>,
    malformed: Vec<String>,
    barrier: Vec<String>,
    blocked_nodes: Vec<String>,
    /// `(reason, "node: message")` per drain-blocked node.
    drain_blocked: Vec<(&'static str, String)>,
    failures: Vec<String>,
    holds: Holds,
    /// How many nodes a window or gate kept from starting.
    held: usize,
    /// Nodes whose reboot waits for an operator replica to become ready elsewhere.
    awaiting_replicas: Vec<String>,
    /// Nodes uninstalling a package, and nodes whose uninstall failed.
    uninstalling: Vec<String>,
    uninstall_failed: Vec<String>,
    /// A deletion its pause or disable holds: the reason, and each node with its packages.
    deletion_blocked: Option<(&'static str, Vec<String>)>,
    /// Each compartment's nodes, to count completions after the node passes.
    compartment_nodes: Vec<(String, Vec<&'a ObservedNode>)>,
    /// The batch counters' era (and whether completion resets them).
    era: crate::rollout::Era,
    /// Each selected node's status and boot ID this pass.
    nodes: NodeTally<'a>,
}

impl<'a> Report<'a> {
    /// Starts from the CR's current status (conditions and batch state carry over).
    pub fn new(cr: &'a Cr, now: i64, era: crate::rollout::Era, index: &'a NodeIndex<'a>) -> Self {
        // The per-node maps are tallied apart ([`NodeTally`]) and written only when they
        // change: at thousands of nodes they are most of the status.
        let status = cr.status.without_nodes_or_batches();
        Report {
            cr,
            now,
            status,
            plugins: None,
            policy_missing: None,
            malformed: vec![],
            barrier: vec![],
            blocked_nodes: vec![],
            drain_blocked: vec![],
            failures: vec![],
            holds: Holds::default(),
            awaiting_replicas: Vec::new(),
            held: 0,
            uninstalling: vec![],
            uninstall_failed: vec![],
            deletion_blocked: None,
            compartment_nodes: vec![],
            era,
            nodes: NodeTally::new(&cr.status, index),
        }
    }

    /// Outcome of the operator's resolve/pull/grant check.
    pub fn plugins(&mut self, p: &PluginCheck) {
        self.plugins = match p {
            PluginCheck::Pending => None,
            PluginCheck::Ready(r) => {
                self.status.resolved_plugins = r
                    .pinned
                    .iter()
                    .map(|(name, pin)| (name.clone(), pin.to_string()))
                    .collect();
                self.status.resolved_payloads = r
                    .images
                    .iter()
                    .flat_map(|(package, images)| {
                        images
                            .iter()
                            .map(move |i| (format!("{package}/{}", i.name), i.image.to_string()))
                    })
                    .collect();
                self.status.plugin_signers = r.signers.clone();
                let mut message = format!(
                    "{} plugin(s) pinned and their grants cover their imports",
                    r.pinned.len()
                );
                if !r.signers.is_empty() {
                    message.push_str("; signatures verified");
                }
                if r.warnings.is_empty() {
                    Some((true, "Resolved".into(), message))
                } else {
                    // A `warn` trust policy: rolled out, and the findings stay visible.
                    Some((
                        true,
                        "ResolvedWithTrustWarnings".into(),
                        format!(
                            "{message}; trust policy warnings: {}",
                            r.warnings.join("; ")
                        ),
                    ))
                }
            }
            PluginCheck::NotReady { reason, message } => {
                Some((false, reason.clone(), message.clone()))
            }
        };
    }

    /// The windows and gates that hold new disruptive work this pass.
    pub fn holds(&mut self, holds: &Holds) {
        self.status.next_window = match &holds.window {
            Some(WindowState::Closed { next }) => {
                Some(next.map_or_else(|| "none within a year".to_string(), |t| t.to_string()))
            }
            _ => None,
        };
        self.holds = holds.clone();
    }

    /// A deleting CR that is paused or disabled: the nodes (`"node: packages"`) whose
    /// uninstalls it keeps from running, which hold the deletion.
    pub fn deletion_blocked(&mut self, pending: Vec<String>) {
        let why = if self.cr.disabled {
            reason::DISABLED_WITH_PENDING_UNINSTALL
        } else {
            reason::PAUSED_WITH_PENDING_UNINSTALL
        };
        self.deletion_blocked = (!pending.is_empty()).then_some((why, pending));
    }

    /// A node's package entries, for the uninstall conditions.
    pub fn uninstalls(&mut self, node: &str, state: &NodeState) {
        let uninstalling = |e: &&nodewright_api::node_state::PackageStatus| {
            matches!(e.stage, Stage::Uninstall | Stage::UninstallInterrupt)
        };
        if let Some(e) = state
            .values()
            .filter(uninstalling)
            .find(|e| e.state == State::Erroring)
        {
            self.uninstall_failed
                .push(format!("{node} ({} {}: {})", e.name, e.version, e.message));
        } else if let Some(e) = state
            .values()
            .filter(uninstalling)
            .find(|e| e.state != State::Complete)
        {
            self.uninstalling
                .push(format!("{node} ({} {})", e.name, e.version));
        }
    }

    /// `spec.deploymentPolicy` names no policy.
    pub fn policy_missing(&mut self, name: &str) {
        self.policy_missing = Some(name.into());
    }

    /// A node's state annotation does not parse.
    pub fn malformed(&mut self, message: String) {
        self.malformed.push(message);
    }

    /// A node is ignored or has taints the CR does not tolerate.
    pub fn node_blocked(&mut self, node: &str, taints: Vec<String>) {
        self.blocked_nodes.push(if taints.is_empty() {
            format!("{node} (ignored)")
        } else {
            format!("{node} (untolerated taints: {})", taints.join(", "))
        });
    }

    /// A compartment's batch.
    /// A compartment's batch state carried over unchanged (the CR is held this pass: plugins
    /// pending for a new generation, paused, disabled), so a stopped compartment stays
    /// stopped and batches resume where they were.
    pub fn keep_compartment(&mut self, name: &str, status: CompartmentStatus) {
        self.status.compartment_statuses.insert(name.into(), status);
    }

    /// A compartment's batch, over `nodes`. Its completed count is taken again at
    /// [`Report::finish`], after this pass's node work.
    pub fn compartment(
        &mut self,
        name: &str,
        status: CompartmentStatus,
        nodes: Vec<&'a ObservedNode>,
    ) {
        self.status.compartment_statuses.insert(name.into(), status);
        self.compartment_nodes.push((name.into(), nodes));
    }

    /// What a node's pass reported.
    pub fn node(&mut self, node: &str, out: &NodeOutcome) {
        if !out.barrier.is_empty() {
            self.barrier
                .push(format!("{node} ({})", out.barrier.join(", ")));
        }
        if let Some(d) = &out.drain_blocked {
            self.drain_blocked
                .push((d.reason, format!("{node}: {}", d.message)));
        }
        self.held += usize::from(out.held);
        if let Some(replica) = &out.awaits_replica {
            self.awaiting_replicas
                .push(format!("{node} waits for operator replica {replica}"));
        }
        for f in &out.failures {
            self.failures.push(format!("{node}: {f}"));
        }
    }

    /// A node's final status.
    pub fn node_status(&mut self, node: &'a ObservedNode, status: Status) {
        self.nodes.record(node, status);
    }

    fn roll_up(&self) -> Status {
        let cr = self.cr;
        if cr.disabled {
            return Status::Disabled;
        }
        if cr.paused {
            return Status::Paused;
        }
        if self.policy_missing.is_some() || self.plugins.as_ref().is_some_and(|p| !p.0) {
            return Status::Blocked;
        }
        let all: Vec<Status> = self.nodes.statuses().collect();
        if all.iter().all(|s| *s == Status::Complete) {
            return Status::Complete;
        }
        let rest: Vec<Status> = all.into_iter().filter(|s| *s != Status::Complete).collect();
        if rest.contains(&Status::InProgress) {
            return Status::InProgress;
        }
        for s in [
            Status::Erroring,
            Status::Blocked,
            Status::Unknown,
            Status::Waiting,
        ] {
            if rest.iter().all(|r| *r == s) {
                return s;
            }
        }
        if rest.contains(&Status::Erroring) {
            Status::Erroring
        } else {
            Status::Unknown
        }
    }

    fn condition(&mut self, kind: &str, on: bool, reason: &str, message: String) {
        let status = if on { "True" } else { "False" }.to_string();
        let generation = Some(self.cr.generation);
        let conditions = &mut self.status.conditions;
        let time = match conditions.iter().find(|c| c.type_ == kind) {
            Some(c) if c.status == status => c.last_transition_time.clone(),
            _ => {
                Time(jiff::Timestamp::from_second(self.now).unwrap_or(jiff::Timestamp::UNIX_EPOCH))
            }
        };
        conditions.retain(|c| c.type_ != kind);
        conditions.push(Condition {
            type_: kind.into(),
            status,
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: time,
        });
        conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    }

    /// The status write (if anything changed; whether the per-node maps did is remembered
    /// in `states` while nothing they depend on changes) and transition events.
    pub fn finish(mut self, states: &StateCache) -> Vec<Action> {
        let rolled = self.roll_up();
        let (complete, total) = self.counts(rolled);
        let mut actions: Vec<Action> = self.transition(rolled).into_iter().collect();
        self.ready_condition(rolled, complete, total);
        self.gates_condition();
        self.uninstall_conditions();
        actions.extend(self.deletion_condition());
        self.blocked_condition(rolled);
        self.drain_condition();
        if let Some((ok, why, msg)) = self.plugins.clone() {
            self.condition(condition::PLUGINS_READY, ok, &why, msg);
        }
        self.malformed_condition();
        let cr = self.cr;
        if self.nodes.changed(states, &cr.name) || !self.status.same_without_nodes(&cr.status) {
            self.nodes.write_into(&mut self.status);
            actions.insert(
                0,
                Action::SetStatus {
                    cr: cr.name.clone(),
                    status: Box::new(self.status),
                },
            );
        }
        actions
    }

    /// Compartment progress and the fleet's counts; returns (complete, total) nodes.
    fn counts(&mut self, rolled: Status) -> (usize, usize) {
        let cr = self.cr;
        for (name, nodes) in &self.compartment_nodes {
            let done = nodes
                .iter()
                .filter(|&&n| self.nodes.get(n) == Some(Status::Complete))
                .count() as i32;
            if let Some(c) = self.status.compartment_statuses.get_mut(name) {
                c.completed = done;
                c.progress_percent = if c.matched == 0 {
                    100
                } else {
                    done * 100 / c.matched
                };
            }
        }
        let total = self.nodes.len();
        let complete = self
            .nodes
            .statuses()
            .filter(|s| *s == Status::Complete)
            .count();
        self.status.complete_nodes = Some(format!("{complete}/{total}"));
        self.status.nodes_in_progress = Some(
            self.nodes
                .statuses()
                .filter(|s| matches!(s, Status::InProgress | Status::Erroring))
                .count() as i32,
        );
        self.status.package_list = Some(self.era.versions.clone());
        if rolled == Status::Complete {
            self.status.observed_generation = Some(cr.generation);
        }
        (complete, total)
    }

    /// The roll-up's new value, and the event when it changed.
    fn transition(&mut self, rolled: Status) -> Option<Action> {
        let cr = self.cr;
        let old = cr.status.status.unwrap_or_default();
        self.status.status = Some(rolled);
        if old == rolled {
            return None;
        }
        if rolled == Status::Complete {
            self.reset_batches();
        }
        Some(Action::Event(Event {
            target: Target::Cr(cr.name.clone()),
            warning: rolled == Status::Erroring,
            reason: "State",
            message: format!(
                "NodeWright transitioned [{}] -> [{}]",
                old.as_str(),
                rolled.as_str()
            ),
        }))
    }

    /// `Ready`: the roll-up in words, and what holds the rollout when it waits.
    fn ready_condition(&mut self, rolled: Status, complete: usize, total: usize) {
        let ready_msg = match rolled {
            Status::Complete => format!("all {total} node(s) complete"),
            Status::Erroring => format!(
                "{complete}/{total} node(s) complete; failing: {}",
                self.failures.join("; ")
            ),
            s => format!("{complete}/{total} node(s) complete; {}", s.as_str()),
        };
        let mut ready_reason = match rolled {
            Status::Complete => reason::NODES_CONVERGED,
            Status::Erroring => "Erroring",
            Status::Blocked => "Blocked",
            Status::Paused => "Paused",
            Status::Disabled => "Disabled",
            Status::Waiting | Status::Unknown | Status::InProgress => reason::PROGRESSING,
        };
        let mut ready_msg = ready_msg;
        let waiting = if self.held == 0 {
            String::new()
        } else {
            format!(" ({} node(s) wait)", self.held)
        };
        if matches!(
            rolled,
            Status::Waiting | Status::InProgress | Status::Unknown
        ) {
            if let Some(why) = &self.holds.agent_pods_refused {
                ready_reason = reason::AGENT_PODS_REFUSED;
                ready_msg = format!("{ready_msg}; {why}{waiting}");
            } else if let Some(WindowState::Closed { .. }) = &self.holds.window {
                ready_reason = reason::OUTSIDE_MAINTENANCE_WINDOW;
                let next = self.status.next_window.clone().unwrap_or_default();
                ready_msg = format!(
                    "{ready_msg}; every maintenance window is closed, the next opens at {next}{waiting}"
                );
            } else if !self.holds.gates.is_empty() {
                ready_reason = reason::HEALTH_GATE_FAILING;
                ready_msg = format!("{ready_msg}; held by health gates{waiting}");
            } else if !self.awaiting_replicas.is_empty() {
                ready_reason = reason::OPERATOR_REPLICA_STARTING;
                ready_msg = format!(
                    "{ready_msg}; {} (its node runs the last ready one: rebooting it now would \
                     leave no replica to serve the webhook)",
                    self.awaiting_replicas.join("; ")
                );
            }
        }
        self.condition(
            condition::READY,
            rolled == Status::Complete,
            ready_reason,
            ready_msg,
        );
    }

    /// `HealthGatesPassing`, when the CR has Prometheus gates.
    fn gates_condition(&mut self) {
        let cr = self.cr;
        if cr
            .spec
            .health_gates
            .as_ref()
            .is_some_and(|g| g.prometheus.is_some())
        {
            match self.holds.gates.first() {
                None => self.condition(
                    condition::HEALTH_GATES_PASSING,
                    true,
                    "Passing",
                    String::new(),
                ),
                Some(first) => {
                    let msg = self
                        .holds
                        .gates
                        .iter()
                        .map(|g| format!("{}: {}", g.gate, g.message))
                        .collect::<Vec<_>>()
                        .join("; ");
                    let why = first.reason.clone();
                    self.condition(condition::HEALTH_GATES_PASSING, false, &why, msg);
                }
            }
        }
    }

    /// `UninstallInProgress` and `UninstallFailed`, set while they apply, cleared once after.
    fn uninstall_conditions(&mut self) {
        for (kind, nodes, why) in [
            (
                condition::UNINSTALL_IN_PROGRESS,
                self.uninstalling.clone(),
                "UninstallInProgress",
            ),
            (
                condition::UNINSTALL_FAILED,
                self.uninstall_failed.clone(),
                "UninstallPodFailing",
            ),
        ] {
            if !nodes.is_empty() {
                self.condition(kind, true, why, nodes.join("; "));
            } else if self.status.conditions.iter().any(|c| c.type_ == kind) {
                self.condition(kind, false, "None", String::new());
            }
        }
    }

    /// `DeletionBlocked` while a pause or disable holds a deletion's uninstalls (with a
    /// warning event when it starts to), cleared once after.
    fn deletion_condition(&mut self) -> Option<Action> {
        let kind = condition::DELETION_BLOCKED;
        let was = self
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == kind && c.status == "True");
        let Some((why, nodes)) = self.deletion_blocked.take() else {
            if self.status.conditions.iter().any(|c| c.type_ == kind) {
                self.condition(kind, false, "NotBlocked", String::new());
            }
            return None;
        };
        let (annotation, verb) = if why == reason::DISABLED_WITH_PENDING_UNINSTALL {
            (keys::DISABLE, "enable")
        } else {
            (keys::PAUSE, "resume")
        };
        let message = format!(
            "deletion waits for uninstalls that the {annotation} annotation keeps from running \
             ({}); `nodewright {verb} {}` (or removing the annotation) lets them run and the \
             NodeWright go",
            nodes.join("; "),
            self.cr.name
        );
        self.condition(kind, true, why, message.clone());
        (!was).then(|| {
            Action::Event(Event {
                target: Target::Cr(self.cr.name.clone()),
                warning: true,
                reason: condition::DELETION_BLOCKED,
                message,
            })
        })
    }

    /// `Blocked`: a missing policy, an uninstalled dependency, a barrier, blocked nodes.
    fn blocked_condition(&mut self, rolled: Status) {
        let cr = self.cr;
        let (blocked, why, msg) = if let Some(p) = &self.policy_missing {
            (
                true,
                "DeploymentPolicyNotFound",
                format!("spec.deploymentPolicy: DeploymentPolicy {p:?} does not exist"),
            )
        } else if let Some(m) = (rolled != Status::Complete)
            .then(|| dependency_uninstalled(cr))
            .flatten()
        {
            (true, reason::DEPENDENCY_UNINSTALLED, m)
        } else if let Some(why) = self
            .holds
            .agent_pods_refused
            .as_ref()
            .filter(|_| rolled != Status::Complete)
        {
            (true, reason::AGENT_PODS_REFUSED, why.clone())
        } else if !self.barrier.is_empty() {
            (
                true,
                reason::NON_INTERRUPT_PODS_RUNNING,
                format!(
                    "pods matching podNonInterruptLabels hold the drain on: {}",
                    self.barrier.join("; ")
                ),
            )
        } else if !self.blocked_nodes.is_empty() {
            (true, "NodesBlocked", self.blocked_nodes.join("; "))
        } else {
            (false, "NotBlocked", String::new())
        };
        self.condition(condition::BLOCKED, blocked, why, msg);
    }

    /// `DrainBlocked`: every node whose drain cannot finish, under one reason or several.
    fn drain_condition(&mut self) {
        let drain = self
            .drain_blocked
            .iter()
            .map(|(_, m)| m.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        let mut reasons: Vec<&str> = self.drain_blocked.iter().map(|(r, _)| *r).collect();
        reasons.sort();
        reasons.dedup();
        let drain_reason = match reasons.as_slice() {
            [] => "NotBlocked",
            [one] => one,
            _ => reason::MULTIPLE_CAUSES,
        };
        self.condition(
            condition::DRAIN_BLOCKED,
            !drain.is_empty(),
            drain_reason,
            drain,
        );
    }

    /// `NodeStateMalformed`, set while a node's state cannot be parsed, cleared once after.
    fn malformed_condition(&mut self) {
        if !self.malformed.is_empty() {
            let m = self.malformed.join("; ");
            self.condition(condition::NODE_STATE_MALFORMED, true, "ParseError", m);
        } else if self
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == condition::NODE_STATE_MALFORMED)
        {
            self.condition(
                condition::NODE_STATE_MALFORMED,
                false,
                "Parsed",
                String::new(),
            );
        }
    }

    fn reset_batches(&mut self) {
        if self.era.reset_on_version_change {
            for c in self.status.compartment_statuses.values_mut() {
                c.batch_state = Some(self.era.carry(None));
                c.batch_nodes.clear();
            }
        }
    }
}

/// A package that depends on one the spec uninstalls: it can never install again.
fn dependency_uninstalled(cr: &Cr) -> Option<String> {
    let spec = &cr.spec;
    let found: Vec<String> = spec
        .packages
        .iter()
        .filter(|(_, p)| !crate::packages::uninstall_requested(p, cr.deleting))
        .flat_map(|(name, p)| {
            p.depends_on
                .keys()
                .filter(|d| {
                    spec.packages
                        .get(*d)
                        .is_none_or(|dp| crate::packages::uninstall_requested(dp, cr.deleting))
                })
                .map(move |d| format!("{name} depends on {d}, which is uninstalled"))
        })
        .collect();
    (!found.is_empty()).then(|| found.join("; "))
}
