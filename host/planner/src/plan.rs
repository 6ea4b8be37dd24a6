//! `plan(snapshot, now)`: one level-triggered pass over every NodeWright.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use k8s_openapi::api::core::v1::{Taint, Toleration};
use nodewright_api::keys;
use nodewright_api::node_state::{Malformed, NodeState};
use nodewright_api::v1alpha1::Status;

use crate::action::{Action, Event, Target};
use crate::hold;
use crate::node::{self, NodeOutcome};
use crate::packages::node_done;
use crate::rollout::{self, Standing};
use crate::select;
use crate::snapshot::{Cr, ObservedJob, ObservedNode, ObservedPod, PluginCheck, Snapshot};
use crate::status;
use crate::work::{Env, NodeWork};

/// Decides what to do next. Pure: the same snapshot and clock give the same actions.
pub fn plan(s: &Snapshot, now: i64) -> Vec<Action> {
    let mut pass = Pass::new(s, now);
    pass.auto_taint();
    let mut order: Vec<&Cr> = s.nodewrights.iter().collect();
    order.sort_by(|a, b| (a.spec.priority(), &a.name).cmp(&(b.spec.priority(), &b.name)));
    for (i, cr) in order.iter().enumerate() {
        pass.cr(cr, &order[..i]);
    }
    pass.runtime_required();
    pass.orphans();
    pass.finish()
}

struct Pass<'a> {
    s: &'a Snapshot,
    now: i64,
    nodes: Vec<&'a ObservedNode>,
    work: HashMap<&'a str, NodeWork<'a>>,
    jobs: HashMap<(&'a str, &'a str), Vec<&'a ObservedJob>>,
    pods: HashMap<&'a str, Vec<&'a ObservedPod>>,
    /// (CR, node) → node status this pass.
    outcome: BTreeMap<(String, String), Status>,
    /// (CR, node) pairs done in the snapshot.
    done_on: HashSet<(&'a str, &'a str)>,
    /// CRs done on every node they select, in the snapshot.
    done_everywhere: HashSet<&'a str>,
    /// Node states parsed for [`Pass::completion`], reused by the CR's pass.
    parsed: HashMap<(&'a str, &'a str), Result<NodeState, Malformed>>,
    actions: Vec<Action>,
}

impl<'a> Pass<'a> {
    fn new(s: &'a Snapshot, now: i64) -> Self {
        let mut nodes: Vec<&ObservedNode> = s.nodes.iter().collect();
        nodes.sort_by(|a, b| (a.created, &a.name).cmp(&(b.created, &b.name)));
        let mut jobs: HashMap<(&str, &str), Vec<&ObservedJob>> = HashMap::default();
        for j in &s.jobs {
            jobs.entry((j.cr.as_str(), j.node.as_str()))
                .or_default()
                .push(j);
        }
        let mut pods: HashMap<&str, Vec<&ObservedPod>> = HashMap::default();
        for p in &s.pods {
            pods.entry(p.node.as_str()).or_default().push(p);
        }
        let work = s
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), NodeWork::new(n)))
            .collect();
        let mut pass = Pass {
            s,
            now,
            nodes,
            work,
            jobs,
            pods,
            outcome: BTreeMap::new(),
            done_on: Default::default(),
            done_everywhere: Default::default(),
            parsed: HashMap::default(),
            actions: Vec::new(),
        };
        pass.completion();
        pass
    }

    /// `cr`'s state on `node` as this pass has left it.
    fn state_of(&self, cr: &str, node: &str) -> Result<NodeState, Malformed> {
        NodeState::from_annotation(node, cr, self.work[node].get(&keys::node_state(cr)))
    }

    fn selects(cr: &Cr, node: &ObservedNode) -> bool {
        select::matches(cr.spec.node_selectors.as_ref(), &node.labels)
    }

    /// Which selected nodes each CR is done on, and whether it is done everywhere — from the
    /// snapshot, for sequencing.
    fn completion(&mut self) {
        for cr in &self.s.nodewrights {
            let digests = crate::packages::digests(&cr.spec);
            let mut everywhere = true;
            for n in self.nodes.iter().filter(|n| Self::selects(cr, n)) {
                let st = self.state_of(&cr.name, &n.name);
                let done = st
                    .as_ref()
                    .is_ok_and(|st| node_done(&cr.spec, &digests, st, cr.deleting));
                self.parsed.insert((cr.name.as_str(), n.name.as_str()), st);
                everywhere &= done;
                if done {
                    self.done_on.insert((cr.name.as_str(), n.name.as_str()));
                }
            }
            if everywhere {
                self.done_everywhere.insert(cr.name.as_str());
            }
        }
    }

    /// A predecessor (lower priority value, or same and earlier name) holds this node.
    fn gated(&self, before: &[&Cr], node: &ObservedNode) -> bool {
        before
            .iter()
            .filter(|p| !p.disabled && Self::selects(p, node))
            .any(|p| {
                p.paused
                    || match p.spec.sequencing.unwrap_or_default() {
                        nodewright_api::v1alpha1::Sequencing::Node => !self
                            .done_on
                            .contains(&(p.name.as_str(), node.name.as_str())),
                        nodewright_api::v1alpha1::Sequencing::All => {
                            !self.done_everywhere.contains(p.name.as_str())
                        }
                    }
            })
    }

    /// A done node still has something of this CR's to clean up: Jobs, a cordon, a drain.
    fn holds_anything(&self, cr: &Cr, n: &ObservedNode, cordon_key: &str, drain_key: &str) -> bool {
        let work = &self.work[n.name.as_str()];
        self.jobs.contains_key(&(cr.name.as_str(), n.name.as_str()))
            || work.get(cordon_key).is_some()
            || work.get(drain_key).is_some()
    }

    fn busy(&self, cr: &Cr, n: &ObservedNode) -> bool {
        self.jobs
            .get(&(cr.name.as_str(), n.name.as_str()))
            .is_some_and(|js| {
                js.iter()
                    .any(|j| matches!(j.phase, crate::snapshot::JobPhase::Active { .. }))
            })
    }

    fn tolerations(cr: &Cr) -> Vec<Toleration> {
        let mut t = cr.spec.additional_tolerations.clone();
        if cr.spec.runtime_required {
            t.push(Toleration {
                key: Some(keys::RUNTIME_REQUIRED_TAINT_KEY.into()),
                operator: Some("Exists".into()),
                ..Default::default()
            });
        }
        t
    }

    fn cr(&mut self, cr: &'a Cr, before: &[&Cr]) {
        if !cr.deleting && !cr.has_finalizer {
            self.actions.push(Action::AddFinalizer {
                cr: cr.name.clone(),
            });
        }
        if cr.deleting && !cr.has_finalizer {
            return;
        }
        let selected: Vec<&ObservedNode> = self
            .nodes
            .iter()
            .copied()
            .filter(|n| {
                Self::selects(cr, n)
                    || (cr.deleting
                        && self.work[n.name.as_str()]
                            .get(&keys::node_state(&cr.name))
                            .is_some())
            })
            .collect();
        // Nodes that left the selector: the CR lets go of them, whatever it was doing there.
        let chosen: HashSet<&str> = selected.iter().map(|n| n.name.as_str()).collect();
        let withdrawn: Vec<&ObservedNode> = self
            .nodes
            .iter()
            .copied()
            .filter(|n| !chosen.contains(n.name.as_str()) && self.holds_any(cr, n))
            .collect();
        for n in withdrawn {
            self.withdraw(cr, n, true);
        }
        let policy = cr
            .spec
            .deployment_policy
            .as_ref()
            .map(|name| (name, self.s.policies.get(name)));
        let era = rollout::Era {
            generation: cr.generation,
            versions: crate::packages::version_list(&cr.spec),
            reset_on_version_change: rollout::resets_batch_state(cr, policy.and_then(|(_, p)| p)),
        };
        let mut report = status::Report::new(cr, self.now, era.clone());
        report.plugins(&cr.plugins);
        let holds = hold::evaluate(cr, policy.and_then(|(_, p)| p), self.now);
        report.holds(&holds);
        if let Some((name, None)) = policy {
            report.policy_missing(name);
        }
        let pinned = match &cr.plugins {
            PluginCheck::Ready(r) => Some(&r.pinned),
            PluginCheck::Pending | PluginCheck::NotReady { .. } => None,
        };
        let unusable = pinned.is_none() || matches!(policy, Some((_, None)));
        let blocked_cr = unusable || (cr.paused && !cr.deleting) || cr.disabled;
        let tolerations = Self::tolerations(cr);
        let digests = crate::packages::digests(&cr.spec);
        let (state_key, status_key, cordon_key, drain_key) = (
            keys::node_state(&cr.name),
            keys::node_status(&cr.name),
            keys::cordon(&cr.name),
            keys::drain_start(&cr.name),
        );

        let in_batch: HashSet<&str> = cr
            .status
            .compartment_statuses
            .values()
            .flat_map(|c| c.batch_nodes.iter().map(String::as_str))
            .collect();

        // Every node's standing before batching.
        let mut standing: HashMap<&str, (Standing, Status)> = HashMap::default();
        let mut states: HashMap<&str, NodeState> = HashMap::default();
        for n in &selected {
            let reset = self.reboot_reset(cr, n);
            let parsed = match self.parsed.remove(&(cr.name.as_str(), n.name.as_str())) {
                Some(p) if !reset => p,
                _ => self.state_of(&cr.name, &n.name),
            };
            let st = match parsed {
                Ok(st) => st,
                Err(e) => {
                    report.malformed(e.to_string());
                    standing.insert(n.name.as_str(), (Standing::Ineligible, Status::Unknown));
                    continue;
                }
            };
            let parked = st.values().any(|e| {
                e.state == nodewright_api::node_state::State::Erroring
                    && e.generation >= cr.generation
            }) || crate::drain::timed_out(
                cr,
                crate::drain::started(self.work[n.name.as_str()].get(&drain_key)),
                self.now,
            )
            .is_some();
            let mut untolerated = select::untolerated(&n.taints, &tolerations);
            if in_batch.contains(n.name.as_str()) {
                // A node we are working on goes not-ready while it reboots; that is ours.
                untolerated.retain(|t| {
                    !matches!(
                        t.key.as_str(),
                        "node.kubernetes.io/not-ready" | "node.kubernetes.io/unreachable"
                    )
                });
            }
            let s = if node_done(&cr.spec, &digests, &st, cr.deleting) {
                if self.work[n.name.as_str()].get(&cordon_key).is_some()
                    && !hold::unhealthy(cr, n).is_empty()
                {
                    // Through its interrupt but not healthy: failed for the batch, kept cordoned.
                    (Standing::Failed, Status::Erroring)
                } else {
                    (Standing::Done, Status::Complete)
                }
            } else if cr.disabled {
                (Standing::Ineligible, Status::Disabled)
            } else if cr.paused && !cr.deleting {
                (Standing::Ineligible, Status::Paused)
            } else if parked && self.busy(cr, n) {
                // Failed, but other Jobs still run: the batch waits for them.
                (Standing::Eligible, Status::Erroring)
            } else if parked {
                (Standing::Failed, Status::Erroring)
            } else if n.labels.get(keys::IGNORE).is_some_and(|v| v == "true")
                || !untolerated.is_empty()
            {
                report.node_blocked(&n.name, untolerated.iter().map(|t| t.key.clone()).collect());
                (Standing::Ineligible, Status::Blocked)
            } else if !cr.deleting && self.gated(before, n) {
                (Standing::Ineligible, Status::Waiting)
            } else {
                (Standing::Eligible, Status::Waiting)
            };
            standing.insert(n.name.as_str(), s);
            states.insert(n.name.as_str(), st);
        }

        // Batches per compartment; members (and done or parked nodes, to record and release) run.
        let comp_rules = rollout::rules(
            policy.and_then(|(_, p)| p),
            cr.spec.interruption_budget.as_ref(),
        );
        let mut members: HashSet<String> = HashSet::default();
        // Rollout order: nodes that left batches before, then the current batches' members
        // (compartments by name, each batch in its order).
        let mut orders: HashMap<String, u32> = HashMap::default();
        let mut current: Vec<String> = Vec::new();
        let mut processed = 0u32;
        if blocked_cr {
            for (name, c) in &cr.status.compartment_statuses {
                report.keep_compartment(name, c.clone());
            }
        } else {
            for (name, nodes) in rollout::assign(policy.and_then(|(_, p)| p), &selected) {
                let rules = &comp_rules[&name];
                let list: Vec<(&str, Standing)> = nodes
                    .iter()
                    .map(|n| (n.name.as_str(), standing[n.name.as_str()].0))
                    .collect();
                let b = rollout::batch(
                    rules,
                    cr.status.compartment_statuses.get(&name),
                    &list,
                    &era,
                );
                members.extend(b.members.iter().cloned());
                processed += b
                    .status
                    .batch_state
                    .as_ref()
                    .map_or(0, |s| (s.completed_nodes + s.failed_nodes).max(0) as u32);
                current.extend(b.status.batch_nodes.iter().cloned());
                report.compartment(
                    &name,
                    b.status,
                    nodes.iter().map(|n| n.name.clone()).collect(),
                );
            }
        }
        for (i, n) in current.into_iter().enumerate() {
            orders.insert(n, processed + i as u32);
        }
        let env = Env {
            settings: &self.s.settings,
            now: self.now,
            refusals: &self.s.refusals,
            pinned: pinned.unwrap_or(&EMPTY),
            digests: &digests,
            hold: holds.hold,
            orders: &orders,
        };
        for n in &selected {
            let Some((stand, mut node_status)) = standing.get(n.name.as_str()).copied() else {
                continue;
            };
            let runs = !blocked_cr
                && (members.contains(&n.name)
                    || stand == Standing::Failed
                    || (stand == Standing::Done
                        && self.holds_anything(cr, n, &cordon_key, &drain_key)));
            if runs && let Some(mut st) = states.remove(n.name.as_str()) {
                let before_state = st.clone();
                let jobs = self
                    .jobs
                    .get(&(cr.name.as_str(), n.name.as_str()))
                    .cloned()
                    .unwrap_or_default();
                let pods = self.pods.get(n.name.as_str()).cloned().unwrap_or_default();
                let work = self
                    .work
                    .get_mut(n.name.as_str())
                    .expect("every node has work");
                let out: NodeOutcome = node::pass(
                    &env,
                    cr,
                    n,
                    work,
                    &mut st,
                    &jobs,
                    &pods,
                    members.contains(&n.name),
                    &mut self.actions,
                );
                if st != before_state {
                    work.set(&state_key, st.annotation());
                }
                report.uninstalls(&n.name, &st);
                node_status = if members.contains(&n.name) || out.status != Status::InProgress {
                    out.status
                } else {
                    node_status
                };
                report.node(&n.name, &out);
            } else if let Some(st) = states.get(n.name.as_str()) {
                report.uninstalls(&n.name, st);
            }
            if !unusable {
                self.set_node_status(cr, n, &status_key, node_status);
            }
            report.node_status(&n.name, node_status, &n.boot_id);
        }
        if cr.deleting
            && selected.iter().all(|n| {
                standing
                    .get(n.name.as_str())
                    .is_some_and(|(s, _)| *s == Standing::Done)
            })
        {
            // Deletion, in order: the CR's Jobs stopped and gone, then its cordons and marks
            // released, then the finalizer.
            let mut released = true;
            for n in &selected {
                released &= self.withdraw(cr, n, false);
            }
            // Jobs elsewhere (a node that left the selector, or left the cluster) are being
            // let go of above or by the orphan sweep: the finalizer waits for them too.
            if released && !self.s.jobs.iter().any(|j| j.cr == cr.name) {
                self.actions.push(Action::RemoveFinalizer {
                    cr: cr.name.clone(),
                });
                return;
            }
        }
        self.actions.extend(report.finish());
    }

    fn set_node_status(&mut self, cr: &Cr, n: &ObservedNode, key: &str, status: Status) {
        let text = status.as_str();
        let work = self
            .work
            .get_mut(n.name.as_str())
            .expect("every node has work");
        let old = work.get(key).map(String::from);
        if old.as_deref() != Some(text) {
            if status == Status::Erroring && old.as_deref() != Some("erroring") {
                self.actions.push(Action::Event(Event {
                    target: Target::Node(n.name.clone()),
                    warning: true,
                    reason: "Erroring",
                    message: format!("{} is erroring on this node", cr.name),
                }));
            }
            work.set(key, Some(text.into()));
        }
        self.outcome
            .insert((cr.name.clone(), n.name.clone()), status);
    }

    /// `reapplyOnReboot`: a boot ID change that is not our own reboot resets the node for this CR.
    fn reboot_reset(&mut self, cr: &'a Cr, n: &'a ObservedNode) -> bool {
        if !self.s.settings.reapply_on_reboot {
            return false;
        }
        let Some(seen) = cr.status.node_boot_ids.get(&n.name) else {
            return false;
        };
        if seen.is_empty() || *seen == n.boot_id {
            return false;
        }
        let ours = self.state_of(&cr.name, &n.name).is_ok_and(|st| {
            st.values().any(|e| {
                !e.boot_id.is_empty() && e.state != nodewright_api::node_state::State::Complete
            })
        });
        if ours {
            return false;
        }
        let work = self
            .work
            .get_mut(n.name.as_str())
            .expect("every node has work");
        work.set(&keys::node_state(&cr.name), None);
        for j in self
            .jobs
            .remove(&(cr.name.as_str(), n.name.as_str()))
            .unwrap_or_default()
        {
            self.actions.push(Action::DeleteJob {
                name: j.name.clone(),
                node: n.name.clone(),
                running: j.running(),
            });
        }
        self.actions.push(Action::Event(Event {
            target: Target::Node(n.name.clone()),
            warning: false,
            reason: "Reboot",
            message: format!("boot ID changed; {} re-applies its packages", cr.name),
        }));
        true
    }

    /// Whether the CR has anything on `n`: a Job or one of its per-CR annotations.
    fn holds_any(&self, cr: &Cr, n: &ObservedNode) -> bool {
        let work = &self.work[n.name.as_str()];
        self.jobs.contains_key(&(cr.name.as_str(), n.name.as_str()))
            || nodewright_api::node_state::keys(&cr.name)
                .iter()
                .any(|k| work.get(k).is_some())
    }

    /// Lets go of `n`: stops the CR's Jobs there (a running stage gets its graceful
    /// shutdown; a requested reboot still happens), and once none is left releases the
    /// cordon, the drain marks and the Karpenter annotations and removes the status. A node
    /// that left the selector (`forget`) loses its state too; on deletion a state that still
    /// lists packages is kept as the record of what is installed, as NodeWright does. True
    /// when nothing of the CR's is left to wait for.
    fn withdraw(&mut self, cr: &Cr, n: &ObservedNode, forget: bool) -> bool {
        let jobs = self
            .jobs
            .get(&(cr.name.as_str(), n.name.as_str()))
            .cloned()
            .unwrap_or_default();
        for j in jobs.iter().filter(|j| !j.stopping) {
            self.actions.push(Action::DeleteJob {
                name: j.name.clone(),
                node: n.name.clone(),
                running: j.running(),
            });
        }
        if !jobs.is_empty() {
            return false;
        }
        let work = self
            .work
            .get_mut(n.name.as_str())
            .expect("every node has work");
        let held = work.get(&keys::cordon(&cr.name)).is_some()
            || work.get(&keys::node_status(&cr.name)).is_some();
        work.release(&cr.name);
        work.set(&keys::node_status(&cr.name), None);
        let empty = work
            .get(&keys::node_state(&cr.name))
            .is_none_or(|raw| NodeState::parse(raw).is_ok_and(|st| st.is_empty()));
        if forget || empty {
            work.set(&keys::node_state(&cr.name), None);
        }
        if forget && held {
            self.actions.push(Action::Event(Event {
                target: Target::Node(n.name.clone()),
                warning: false,
                reason: "Released",
                message: format!("{} no longer selects this node; released it", cr.name),
            }));
        }
        true
    }

    /// Jobs of a NodeWright that no longer exists, or on a node that no longer exists, are
    /// nobody's work: delete them (the garbage collector is the backstop for the first).
    fn orphans(&mut self) {
        for j in self.s.jobs.iter().filter(|j| !j.stopping) {
            let cr_gone = !self.s.nodewrights.iter().any(|c| c.name == j.cr);
            let node_gone = !self.work.contains_key(j.node.as_str());
            if cr_gone || node_gone {
                self.actions.push(Action::DeleteJob {
                    name: j.name.clone(),
                    node: j.node.clone(),
                    running: j.running() && !node_gone,
                });
            }
        }
    }

    fn auto_taint(&mut self) {
        for cr in self
            .s
            .nodewrights
            .iter()
            .filter(|c| c.spec.runtime_required && c.spec.auto_taint_new_nodes && !c.deleting)
        {
            for n in self.nodes.iter().filter(|n| Self::selects(cr, n)) {
                let touched = n
                    .annotations
                    .keys()
                    .any(|k| k.starts_with("nodewright.io/"));
                let tainted = n
                    .taints
                    .iter()
                    .any(|t| t.key == keys::RUNTIME_REQUIRED_TAINT_KEY);
                let work = self
                    .work
                    .get_mut(n.name.as_str())
                    .expect("every node has work");
                if !touched
                    && !tainted
                    && !work
                        .patch
                        .add_taints
                        .iter()
                        .any(|t| t.key == keys::RUNTIME_REQUIRED_TAINT_KEY)
                {
                    work.patch.add_taints.push(runtime_taint());
                    work.set(
                        &format!("nodewright.io/auto-taint.{}", cr.name),
                        Some("true".into()),
                    );
                }
            }
        }
    }

    /// Removes the runtime-required taint from nodes where every `runtimeRequired` CR that
    /// selects them is complete.
    fn runtime_required(&mut self) {
        for n in &self.nodes {
            if !n
                .taints
                .iter()
                .any(|t| t.key == keys::RUNTIME_REQUIRED_TAINT_KEY)
            {
                continue;
            }
            let crs: Vec<&Cr> = self
                .s
                .nodewrights
                .iter()
                .filter(|c| c.spec.runtime_required && !c.disabled && Self::selects(c, n))
                .collect();
            if crs.is_empty()
                || !crs.iter().all(|c| {
                    self.outcome.get(&(c.name.clone(), n.name.clone())) == Some(&Status::Complete)
                })
            {
                continue;
            }
            let work = self
                .work
                .get_mut(n.name.as_str())
                .expect("every node has work");
            work.patch
                .remove_taints
                .push(keys::RUNTIME_REQUIRED_TAINT_KEY.into());
            if crs.iter().any(|c| c.spec.runtime_required_cordon_after) {
                work.cordon(true);
                work.set(keys::RUNTIME_REQUIRED_CORDON, Some("true".into()));
            }
        }
    }

    fn finish(mut self) -> Vec<Action> {
        let mut patches: Vec<_> = self
            .work
            .into_values()
            .filter(|w| !w.patch.is_empty())
            .map(|w| w.patch)
            .collect();
        patches.sort_by(|a, b| a.node.cmp(&b.node));
        let mut out: Vec<Action> = patches.into_iter().map(Action::PatchNode).collect();
        // A Job may be let go of twice in one pass (its node's pass, then a withdrawal).
        let mut deleted = HashSet::default();
        self.actions.retain(
            |a| !matches!(a, Action::DeleteJob { name, .. } if !deleted.insert(name.clone())),
        );
        out.append(&mut self.actions);
        out
    }
}

static EMPTY: BTreeMap<String, String> = BTreeMap::new();

fn runtime_taint() -> Taint {
    Taint {
        key: keys::RUNTIME_REQUIRED_TAINT_KEY.into(),
        value: Some(keys::RUNTIME_REQUIRED_TAINT_VALUE.into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}
