//! `plan(snapshot, now)`: one level-triggered pass over every NodeWright.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Taint, Toleration};
use nodewright_api::keys;
use nodewright_api::v1alpha1::{NodeState, Status};

use crate::action::{Action, Event, Target};
use crate::node::{self, Env, NodeOutcome, NodeWork};
use crate::packages::node_done;
use crate::rollout::{self, Standing};
use crate::select;
use crate::snapshot::{Cr, Job, Node, Plugins, Pod, Snapshot};
use crate::status;

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
    pass.finish()
}

struct Pass<'a> {
    s: &'a Snapshot,
    now: i64,
    nodes: Vec<&'a Node>,
    work: BTreeMap<String, NodeWork>,
    jobs: HashMap<(&'a str, &'a str), Vec<&'a Job>>,
    pods: HashMap<&'a str, Vec<&'a Pod>>,
    /// (CR, node) → node status this pass.
    outcome: BTreeMap<(String, String), Status>,
    actions: Vec<Action>,
}

impl<'a> Pass<'a> {
    fn new(s: &'a Snapshot, now: i64) -> Self {
        let mut nodes: Vec<&Node> = s.nodes.iter().collect();
        nodes.sort_by(|a, b| (a.created, &a.name).cmp(&(b.created, &b.name)));
        let mut jobs: HashMap<(&str, &str), Vec<&Job>> = HashMap::new();
        for j in &s.jobs {
            jobs.entry((j.cr.as_str(), j.node.as_str())).or_default().push(j);
        }
        let mut pods: HashMap<&str, Vec<&Pod>> = HashMap::new();
        for p in &s.pods {
            pods.entry(p.node.as_str()).or_default().push(p);
        }
        let work = s.nodes.iter().map(|n| (n.name.clone(), NodeWork::new(n))).collect();
        Pass { s, now, nodes, work, jobs, pods, outcome: BTreeMap::new(), actions: Vec::new() }
    }

    fn state_of(&self, cr: &str, node: &str) -> Result<NodeState, String> {
        match self.work[node].annotations.get(&keys::node_state(cr)) {
            None => Ok(NodeState::new()),
            Some(raw) => serde_json::from_str(raw).map_err(|e| format!("{node}: {}: {e}", keys::node_state(cr))),
        }
    }

    fn selects(cr: &Cr, node: &Node) -> bool {
        select::matches(cr.spec.node_selectors.as_ref(), &node.labels)
    }

    fn done_on(&self, cr: &Cr, node: &str) -> bool {
        self.state_of(&cr.name, node).is_ok_and(|st| node_done(&cr.spec, &st, cr.deleting))
    }

    /// A predecessor (lower priority value, or same and earlier name) holds this node.
    fn gated(&self, before: &[&Cr], node: &Node) -> bool {
        before.iter().filter(|p| !p.disabled && Self::selects(p, node)).any(|p| {
            p.paused
                || match p.spec.sequencing.unwrap_or_default() {
                    nodewright_api::v1alpha1::Sequencing::Node => !self.done_on(p, &node.name),
                    nodewright_api::v1alpha1::Sequencing::All => self.nodes.iter().filter(|n| Self::selects(p, n)).any(|n| !self.done_on(p, &n.name)),
                }
        })
    }

    fn busy(&self, cr: &Cr, n: &Node) -> bool {
        self.jobs.get(&(cr.name.as_str(), n.name.as_str())).is_some_and(|js| js.iter().any(|j| matches!(j.phase, crate::snapshot::JobPhase::Active { .. })))
    }

    fn tolerations(cr: &Cr) -> Vec<Toleration> {
        let mut t = cr.spec.additional_tolerations.clone();
        if cr.spec.runtime_required {
            t.push(Toleration { key: Some(keys::RUNTIME_REQUIRED_TAINT_KEY.into()), operator: Some("Exists".into()), ..Default::default() });
        }
        t
    }

    fn cr(&mut self, cr: &'a Cr, before: &[&Cr]) {
        if !cr.deleting && !cr.has_finalizer {
            self.actions.push(Action::AddFinalizer { cr: cr.name.clone() });
        }
        if cr.deleting && !cr.has_finalizer {
            return;
        }
        let selected: Vec<&Node> = self.nodes.iter().copied().filter(|n| Self::selects(cr, n) || (cr.deleting && self.work[&n.name].annotations.contains_key(&keys::node_state(&cr.name)))).collect();
        let policy = cr.spec.deployment_policy.as_ref().map(|name| (name, self.s.policies.get(name)));
        let mut report = status::Report::new(cr, self.now);
        report.plugins(&cr.plugins);
        if let Some((name, None)) = policy {
            report.policy_missing(name);
        }
        let pinned = match &cr.plugins {
            Plugins::Ready(p) => Some(p),
            Plugins::Pending | Plugins::NotReady { .. } => None,
        };
        let unusable = pinned.is_none() || matches!(policy, Some((_, None)));
        let blocked_cr = unusable || (cr.paused && !cr.deleting) || cr.disabled;
        let tolerations = Self::tolerations(cr);

        // Every node's standing before batching.
        let mut standing: BTreeMap<String, (Standing, Status)> = BTreeMap::new();
        let mut states: BTreeMap<String, NodeState> = BTreeMap::new();
        for n in &selected {
            self.reboot_reset(cr, n);
            let st = match self.state_of(&cr.name, &n.name) {
                Ok(st) => st,
                Err(e) => {
                    report.malformed(e);
                    standing.insert(n.name.clone(), (Standing::Ineligible, Status::Unknown));
                    continue;
                }
            };
            let parked = st.values().any(|e| e.state == nodewright_api::v1alpha1::State::Erroring && e.generation >= cr.generation)
                || crate::drain::timed_out(cr, &self.work[&n.name].annotations, self.now).is_some();
            let untolerated = select::untolerated(&n.taints, &tolerations);
            let s = if node_done(&cr.spec, &st, cr.deleting) {
                (Standing::Done, Status::Complete)
            } else if cr.disabled {
                (Standing::Ineligible, Status::Disabled)
            } else if cr.paused && !cr.deleting {
                (Standing::Ineligible, Status::Paused)
            } else if parked && self.busy(cr, n) {
                // Failed, but other Jobs still run: the batch waits for them.
                (Standing::Eligible, Status::Erroring)
            } else if parked {
                (Standing::Failed, Status::Erroring)
            } else if n.labels.get(keys::IGNORE).is_some_and(|v| v == "true") || !untolerated.is_empty() {
                report.node_blocked(&n.name, untolerated.iter().map(|t| t.key.clone()).collect());
                (Standing::Ineligible, Status::Blocked)
            } else if !cr.deleting && self.gated(before, n) {
                (Standing::Ineligible, Status::Waiting)
            } else {
                (Standing::Eligible, Status::Waiting)
            };
            standing.insert(n.name.clone(), s);
            states.insert(n.name.clone(), st);
        }

        // Batches per compartment; members (and done or parked nodes, to record and release) run.
        let comp_rules = rollout::rules(policy.and_then(|(_, p)| p), cr.spec.interruption_budget.as_ref());
        let mut members: Vec<String> = Vec::new();
        if !blocked_cr {
            for (name, nodes) in rollout::assign(policy.and_then(|(_, p)| p), &selected) {
                let rules = &comp_rules[&name];
                let list: Vec<(&str, Standing)> = nodes.iter().map(|n| (n.name.as_str(), standing[&n.name].0)).collect();
                let b = rollout::batch(rules, cr.status.compartment_statuses.get(&name), &list);
                members.extend(b.members.iter().cloned());
                report.compartment(&name, b.status);
            }
        }
        let env = Env { settings: &self.s.settings, now: self.now, refusals: &self.s.refusals, pinned: pinned.unwrap_or(&EMPTY) };
        for n in &selected {
            let Some((stand, mut node_status)) = standing.get(&n.name).copied() else { continue };
            let runs = !blocked_cr && (members.contains(&n.name) || matches!(stand, Standing::Done | Standing::Failed));
            if runs && let Some(mut st) = states.remove(&n.name) {
                let before_state = st.clone();
                let jobs = self.jobs.get(&(cr.name.as_str(), n.name.as_str())).cloned().unwrap_or_default();
                let pods = self.pods.get(n.name.as_str()).cloned().unwrap_or_default();
                let work = self.work.get_mut(&n.name).expect("every node has work");
                let out: NodeOutcome = node::pass(&env, cr, n, work, &mut st, &jobs, &pods, members.contains(&n.name), &mut self.actions);
                if st != before_state {
                    let value = (!st.is_empty()).then(|| serde_json::to_string(&st).expect("node state serializes"));
                    work.set(&keys::node_state(&cr.name), value);
                }
                node_status = if members.contains(&n.name) || out.status != Status::InProgress { out.status } else { node_status };
                report.node(&n.name, &out);
            }
            if !unusable {
                self.set_node_status(cr, n, node_status);
            }
            report.node_status(&n.name, node_status, &n.boot_id);
        }
        if cr.deleting && selected.iter().all(|n| standing.get(&n.name).is_some_and(|(s, _)| *s == Standing::Done)) {
            self.cleanup(cr, &selected);
            self.actions.push(Action::RemoveFinalizer { cr: cr.name.clone() });
            return;
        }
        self.actions.extend(report.finish());
    }

    fn set_node_status(&mut self, cr: &Cr, n: &Node, status: Status) {
        let text = serde_json::to_value(status).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
        let work = self.work.get_mut(&n.name).expect("every node has work");
        let old = work.annotations.get(&keys::node_status(&cr.name)).cloned();
        if old.as_deref() != Some(text.as_str()) {
            if status == Status::Erroring && old.as_deref() != Some("erroring") {
                self.actions.push(Action::Event(Event { target: Target::Node(n.name.clone()), warning: true, reason: "Erroring", message: format!("{} is erroring on this node", cr.name) }));
            }
            work.set(&keys::node_status(&cr.name), Some(text));
        }
        self.outcome.insert((cr.name.clone(), n.name.clone()), status);
    }

    /// `reapplyOnReboot`: a boot ID change that is not our own reboot resets the node for this CR.
    fn reboot_reset(&mut self, cr: &'a Cr, n: &'a Node) {
        if !self.s.settings.reapply_on_reboot {
            return;
        }
        let Some(seen) = cr.status.node_boot_ids.get(&n.name) else { return };
        if seen.is_empty() || *seen == n.boot_id {
            return;
        }
        let ours = self.state_of(&cr.name, &n.name).is_ok_and(|st| st.values().any(|e| !e.boot_id.is_empty() && e.state != nodewright_api::v1alpha1::State::Complete));
        if ours {
            return;
        }
        let work = self.work.get_mut(&n.name).expect("every node has work");
        work.set(&keys::node_state(&cr.name), None);
        for j in self.jobs.remove(&(cr.name.as_str(), n.name.as_str())).unwrap_or_default() {
            self.actions.push(Action::DeleteJob { name: j.name.clone() });
        }
        self.actions.push(Action::Event(Event { target: Target::Node(n.name.clone()), warning: false, reason: "Reboot", message: format!("boot ID changed; {} re-applies its packages", cr.name) }));
    }

    fn cleanup(&mut self, cr: &Cr, nodes: &[&Node]) {
        for n in nodes {
            let work = self.work.get_mut(&n.name).expect("every node has work");
            work.release(&cr.name);
            work.set(&keys::node_status(&cr.name), None);
            let empty = work.annotations.get(&keys::node_state(&cr.name)).is_none_or(|raw| serde_json::from_str::<NodeState>(raw).is_ok_and(|st| st.is_empty()));
            if empty {
                work.set(&keys::node_state(&cr.name), None);
            }
        }
    }

    fn auto_taint(&mut self) {
        for cr in self.s.nodewrights.iter().filter(|c| c.spec.runtime_required && c.spec.auto_taint_new_nodes && !c.deleting) {
            for n in self.nodes.iter().filter(|n| Self::selects(cr, n)) {
                let touched = n.annotations.keys().any(|k| k.starts_with("nodewright.io/"));
                let tainted = n.taints.iter().any(|t| t.key == keys::RUNTIME_REQUIRED_TAINT_KEY);
                let work = self.work.get_mut(&n.name).expect("every node has work");
                if !touched && !tainted && !work.patch.add_taints.iter().any(|t| t.key == keys::RUNTIME_REQUIRED_TAINT_KEY) {
                    work.patch.add_taints.push(runtime_taint());
                    work.set(&format!("nodewright.io/auto-taint.{}", cr.name), Some("true".into()));
                }
            }
        }
    }

    /// Removes the runtime-required taint from nodes where every `runtimeRequired` CR that
    /// selects them is complete.
    fn runtime_required(&mut self) {
        for n in &self.nodes {
            if !n.taints.iter().any(|t| t.key == keys::RUNTIME_REQUIRED_TAINT_KEY) {
                continue;
            }
            let crs: Vec<&Cr> = self.s.nodewrights.iter().filter(|c| c.spec.runtime_required && !c.disabled && Self::selects(c, n)).collect();
            if crs.is_empty() || !crs.iter().all(|c| self.outcome.get(&(c.name.clone(), n.name.clone())) == Some(&Status::Complete)) {
                continue;
            }
            let work = self.work.get_mut(&n.name).expect("every node has work");
            work.patch.remove_taints.push(keys::RUNTIME_REQUIRED_TAINT_KEY.into());
            if crs.iter().any(|c| c.spec.runtime_required_cordon_after) {
                work.cordon(true);
                work.set(keys::RUNTIME_REQUIRED_CORDON, Some("true".into()));
            }
        }
    }

    fn finish(mut self) -> Vec<Action> {
        let mut out: Vec<Action> = self.work.into_values().filter(|w| !w.patch.is_empty()).map(|w| Action::PatchNode(w.patch)).collect();
        out.append(&mut self.actions);
        out
    }
}

static EMPTY: BTreeMap<String, String> = BTreeMap::new();

fn runtime_taint() -> Taint {
    Taint { key: keys::RUNTIME_REQUIRED_TAINT_KEY.into(), value: Some(keys::RUNTIME_REQUIRED_TAINT_VALUE.into()), effect: "NoSchedule".into(), time_added: None }
}
