//! One NodeWright's share of a pass, in named steps: the nodes it selects (letting go of
//! those it no longer does), each node's standing, the batches per compartment, each node's
//! pass, and — when it is being deleted — the release that precedes its finalizer.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use nodewright_api::keys::{self, CrKeys, CrMark};
use nodewright_api::node_state::{self, NodeState, State};
use nodewright_api::payload::ImagePayload;
use nodewright_api::pinned::PinnedRef;
use nodewright_api::v1alpha1::{CompartmentStatus, DeploymentPolicySpec, Status};

use crate::action::{Action, Event, Target};
use crate::hold::{self, Holds};
use crate::node::{self, NodeOutcome};
use crate::packages::{Digests, node_done};
use crate::places::NOWHERE;
use crate::plan::{NO_IMAGES, NO_PINS, Parsed, Pass};
use crate::prestage::{self, PayloadSet};
use crate::rollout::{self, Era, Standing};
use crate::roster::NodeIndex;
use crate::select;
use crate::snapshot::{Cr, ObservedNode, PluginCheck, Snapshot};
use crate::states::Glance;
use crate::status::Report;
use crate::work::{CrMarks, Env, KeptMarks, PerNode};

/// What one CR's pass derives once from its spec and status.
struct CrPass<'c> {
    cr: &'c Cr,
    /// The policy the CR names: `(name, None)` when it does not exist.
    policy: Option<(&'c String, Option<&'c DeploymentPolicySpec>)>,
    era: Era,
    holds: Holds,
    pinned: Option<&'c BTreeMap<String, PinnedRef>>,
    /// Each package's payloads from container images, pinned (with the pins).
    images: Option<&'c BTreeMap<String, Vec<ImagePayload>>>,
    /// Plugins not ready or the policy missing: nothing of the CR may run.
    unusable: bool,
    /// Unusable, paused or disabled: batches are kept as they are.
    blocked: bool,
    tolerations: Vec<Toleration>,
    digests: Digests,
    /// Nodes in the CR's current batches.
    in_batch: PerNode<'c, bool>,
    /// Each compartment's last batch as its status lists it, each member found by name
    /// once (`None`: not in the snapshot).
    last_batches: BTreeMap<&'c str, Vec<Option<&'c ObservedNode>>>,
    /// The payloads it stages ahead of a node's cordon.
    prestage: Option<PayloadSet>,
    /// Its marks on each node it selected in the snapshot (see [`Pass::marks`]).
    marks: CrMarks<'c>,
}

impl<'c> CrPass<'c> {
    fn new(
        cr: &'c Cr,
        s: &'c Snapshot,
        index: &NodeIndex<'c>,
        now: i64,
        marks: CrMarks<'c>,
    ) -> Self {
        let policies = &s.policies;
        let policy = cr
            .spec
            .deployment_policy
            .as_ref()
            .map(|name| (name, policies.get(name)));
        let spec_policy = policy.and_then(|(_, p)| p);
        // Each last batch's members found by name once while the status stands.
        let found = s.states.members(&cr.name, &cr.status, index.names(), || {
            let batches = cr.status.compartment_statuses.values();
            let places = |c: &CompartmentStatus| {
                c.batch_nodes.iter().map(|n| index.place_named(n)).collect()
            };
            batches.map(places).collect()
        });
        let nodes = index.nodes();
        let last_batches: BTreeMap<&str, Vec<_>> = (cr.status.compartment_statuses.keys())
            .zip(found.iter())
            .map(|(name, places)| {
                let at = |&p: &u32| (p != NOWHERE).then(|| &nodes[p as usize]);
                (name.as_str(), places.iter().map(at).collect())
            })
            .collect();
        // Ready only with a pin for every package: the node passes start a package's Job
        // with its pin and nothing else.
        let (pinned, images) = match &cr.plugins {
            PluginCheck::Ready(r) if cr.spec.packages.keys().all(|p| r.pinned.contains_key(p)) => {
                (Some(&r.pinned), Some(&r.images))
            }
            PluginCheck::Ready(_) | PluginCheck::Pending | PluginCheck::NotReady { .. } => {
                (None, None)
            }
        };
        let unusable = pinned.is_none() || matches!(policy, Some((_, None)));
        CrPass {
            cr,
            policy,
            era: Era {
                generation: cr.generation,
                versions: crate::packages::version_list(&cr.spec),
                reset_on_version_change: rollout::resets_batch_state(cr, spec_policy),
            },
            holds: hold::evaluate(cr, spec_policy, now, &s.agent_pods),
            pinned,
            images,
            unusable,
            blocked: unusable || cr.paused || cr.disabled,
            tolerations: tolerations(cr),
            digests: crate::packages::digests(&cr.spec),
            in_batch: {
                let mut in_batch = index.per_node();
                for n in last_batches.values().flatten().flatten() {
                    in_batch[*n] = true;
                }
                in_batch
            },
            last_batches,
            prestage: PayloadSet::of(cr),
            marks,
        }
    }

    /// The CR's node annotations' keys (spelled once, with its marks).
    fn keys(&self) -> &CrKeys {
        self.marks.keys()
    }

    fn spec_policy(&self) -> Option<&'c DeploymentPolicySpec> {
        self.policy.and_then(|(_, p)| p)
    }
}

/// The CR's tolerations: its own, and the runtime-required taint's when it needs one.
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

/// On a deleting CR, each node that is not through its uninstalls, with the packages it
/// still has to uninstall (`"node: a, b"`), by node name.
fn pending_uninstalls(
    cr: &Cr,
    standing: &Standings<'_>,
    states: &States<'_>,
    state_of: impl Fn(&ObservedNode) -> Parsed,
) -> Vec<String> {
    let mut out: Vec<String> = standing
        .iter()
        .filter(|(_, s)| s.is_some_and(|(s, _)| s != Standing::Done))
        .map(|(node, _)| {
            let parsed = states[node].map(|_| state_of(node));
            let installed = |name: &str, version: &str| {
                parsed
                    .as_ref()
                    .and_then(|p| p.state.as_ref().ok())
                    .is_some_and(|st| st.values().any(|e| e.name == name && e.version == version))
            };
            let packages: Vec<&str> = cr
                .spec
                .packages
                .iter()
                .filter(|(name, p)| {
                    crate::packages::uninstall_requested(p, true) && installed(name, &p.version)
                })
                .map(|(name, _)| name.as_str())
                .collect();
            format!("{}: {}", node.name, packages.join(", "))
        })
        .collect();
    out.sort();
    out
}

/// Each selected node's standing (for batching) and status.
type Standings<'a> = PerNode<'a, Option<(Standing, Status)>>;

/// A glance at the state of each selected node whose state parses (the state itself is
/// read only where a node's pass, or a report, needs it: `Pass::state_of`).
type States<'a> = PerNode<'a, Option<Glance>>;

/// The batches' outcome: each member's rollout order (a node without one is not a member
/// and may not work).
struct Batches<'a> {
    orders: PerNode<'a, Option<u32>>,
}

impl<'a> Pass<'a> {
    /// One CR: select, stand, batch, run each node, release on deletion, report.
    pub(crate) fn cr(&mut self, cr: &'a Cr, before: &[&Cr]) {
        if !cr.deleting && !cr.has_finalizer {
            self.actions.push(Action::AddFinalizer {
                cr: cr.name.clone(),
            });
        }
        if cr.deleting && !cr.has_finalizer {
            return;
        }
        let read = self.marks.remove(cr.name.as_str());
        let marks = read.unwrap_or_else(|| CrMarks::new(&cr.name, self.index));
        let c = CrPass::new(cr, self.s, self.index, self.now, marks);
        let selected = self.select(&c);
        let mut report = Report::new(cr, self.now, c.era.clone(), self.index);
        report.plugins(&cr.plugins);
        report.holds(&c.holds);
        if let Some((name, None)) = c.policy {
            report.policy_missing(name);
        }
        let (standing, states) = self.standings(&c, &selected, before, &mut report);
        if cr.deleting && (cr.paused || cr.disabled) {
            let state_of = |n: &ObservedNode| self.state_of(c.keys(), n);
            report.deletion_blocked(pending_uninstalls(cr, &standing, &states, state_of));
        }
        let batches = self.batches(&c, &selected, &standing, &mut report);
        self.node_passes(&c, &selected, &standing, states, &batches, &mut report);
        if cr.deleting && self.release_for_deletion(&c, &selected, &standing) {
            return;
        }
        self.actions.extend(report.finish(&self.s.states));
    }

    /// The nodes the CR selects (on deletion, also those that still hold its state); the
    /// CR lets go of any other node it holds, whatever it was doing there.
    fn select(&mut self, c: &CrPass<'a>) -> Vec<&'a ObservedNode> {
        let cr = c.cr;
        let selected: Vec<&ObservedNode> = self
            .nodes
            .iter()
            .copied()
            .filter(|n| {
                Self::selects(cr, n)
                    || (cr.deleting && self.work[*n].get(c.keys().get(CrMark::State)).is_some())
            })
            .collect();
        let mut chosen = self.index.per_node();
        for n in &selected {
            chosen[*n] = true;
        }
        let withdrawn: Vec<&ObservedNode> = self
            .nodes
            .iter()
            .copied()
            .filter(|n| !chosen[*n] && self.holds_any(c.keys(), n))
            .collect();
        for n in withdrawn {
            self.withdraw(c.keys(), n, true);
        }
        selected
    }

    /// Every selected node's standing (for batching) and status, before any node's pass;
    /// the parsed states of those that have one.
    fn standings(
        &mut self,
        c: &CrPass<'a>,
        selected: &[&'a ObservedNode],
        before: &[&Cr],
        report: &mut Report<'_>,
    ) -> (Standings<'a>, States<'a>) {
        let cr = c.cr;
        let mut standing = self.index.per_node();
        // The glances taken for sequencing (every node the CR selects: `selected` holds them
        // all), kept in place for the nodes whose state parses.
        let glanced = self.glanced.remove(cr.name.as_str());
        let mut states = glanced.unwrap_or_else(|| self.index.per_node());
        for &n in selected {
            let reset = self.reboot_reset(c, n);
            // Whether it is done was found for sequencing, from the same state.
            let (glance, done) = match states[n].take() {
                Some(g) if !reset => (g, self.done_on(cr, n)),
                _ => {
                    let parsed = self.state_of(c.keys(), n);
                    let done = parsed
                        .state
                        .as_ref()
                        .is_ok_and(|st| node_done(&cr.spec, &c.digests, st, cr.deleting));
                    (parsed.glance(), done)
                }
            };
            if !glance.parses {
                if let Err(e) = &self.state_of(c.keys(), n).state {
                    report.malformed(e.to_string());
                }
                standing[n] = Some((Standing::Ineligible, Status::Unknown));
                continue;
            }
            let erroring = glance.erroring.is_some_and(|g| g >= cr.generation);
            standing[n] = Some(self.standing(c, n, erroring, done, before, report));
            states[n] = Some(glance);
        }
        (standing, states)
    }

    /// One node's standing and status for the CR, from its state (`erroring`: an entry of
    /// this generation or later is erroring; `done`) and the node itself.
    fn standing(
        &self,
        c: &CrPass<'a>,
        n: &ObservedNode,
        erroring: bool,
        done: bool,
        before: &[&Cr],
        report: &mut Report<'_>,
    ) -> (Standing, Status) {
        let cr = c.cr;
        let parked = erroring
            || crate::drain::timed_out(cr, self.marks(c, n).drain_started, self.now).is_some()
            || {
                let jobs = self.jobs_of(&cr.name, n);
                !jobs.is_empty() && prestage::failed_for_good(cr, c.prestage.as_ref(), &jobs)
            };
        let brief = self.index.brief(n);
        // (An untainted node's object is not read: see `roster`.)
        let mut untolerated = if brief.tainted {
            select::untolerated(&n.taints, &c.tolerations)
        } else {
            Vec::new()
        };
        if c.in_batch[n] {
            // A node we are working on goes not-ready while it reboots; that is ours.
            untolerated.retain(|t| {
                !matches!(
                    t.key.as_str(),
                    "node.kubernetes.io/not-ready" | "node.kubernetes.io/unreachable"
                )
            });
        }
        if done {
            if self.marks(c, n).cordon && !hold::unhealthy(cr, n).is_empty() {
                // Through its interrupt but not healthy: failed for the batch, kept cordoned.
                (Standing::Failed, Status::Erroring)
            } else {
                (Standing::Done, Status::Complete)
            }
        } else if cr.disabled {
            (Standing::Ineligible, Status::Disabled)
        } else if cr.paused {
            (Standing::Ineligible, Status::Paused)
        } else if parked && self.busy(cr, n) {
            // Failed, but other Jobs still run: the batch waits for them.
            (Standing::Eligible, Status::Erroring)
        } else if parked {
            (Standing::Failed, Status::Erroring)
        } else if brief.ignored || !untolerated.is_empty() {
            report.node_blocked(&n.name, untolerated.iter().map(|t| t.key.clone()).collect());
            (Standing::Ineligible, Status::Blocked)
        } else if !cr.deleting && self.gated(before, n) {
            (Standing::Ineligible, Status::Waiting)
        } else {
            (Standing::Eligible, Status::Waiting)
        }
    }

    /// Batches per compartment: their members (and done or parked nodes, to record and
    /// release) run. The rollout order: nodes that left batches before, then the current
    /// batches' members (compartments by name, each batch in its order).
    fn batches(
        &self,
        c: &CrPass<'a>,
        selected: &[&'a ObservedNode],
        standing: &Standings<'_>,
        report: &mut Report<'a>,
    ) -> Batches<'a> {
        let cr = c.cr;
        let mut out = Batches {
            orders: self.index.per_node(),
        };
        if c.blocked {
            for (name, comp) in &cr.status.compartment_statuses {
                report.keep_compartment(name, comp.clone());
            }
            return out;
        }
        let rules = rollout::rules(c.spec_policy(), cr.spec.interruption_budget.as_ref());
        // The members of every batch in order.
        let mut current: Vec<&'a ObservedNode> = Vec::new();
        let mut processed = 0u32;
        let compartments = rollout::assign(c.spec_policy(), selected);
        // A last batch's member is counted only in its own compartment: with more than one,
        // each node's (its place among them) is noted (with one, it holds every selected
        // node, and only those stand).
        let home = (compartments.len() > 1).then(|| {
            let mut home: PerNode<Option<u32>> = self.index.per_node();
            for (i, nodes) in compartments.values().enumerate() {
                for &n in nodes {
                    home[n] = Some(i as u32);
                }
            }
            home
        });
        for (i, (name, nodes)) in compartments.into_iter().enumerate() {
            let here =
                |n: &ObservedNode| home.as_ref().is_none_or(|home| home[n] == Some(i as u32));
            let last: Vec<Option<(&ObservedNode, Standing)>> = (c.last_batches.get(name.as_str()))
                .into_iter()
                .flatten()
                .map(|n| {
                    let n = (*n).filter(|n| here(n))?;
                    standing[n].map(|(s, _)| (n, s))
                })
                .collect();
            // Each node's standing, by the node: a name is read only for a new member.
            let list: Vec<(&ObservedNode, Standing)> = nodes
                .iter()
                .map(|&n| (n, standing[n].expect("selected nodes stand").0))
                .collect();
            let previous = cr.status.compartment_statuses.get(&name);
            let (b, members) =
                rollout::batch_of(&rules[&name], previous, &list, &last, |n| &n.name, &c.era);
            processed += b
                .status
                .batch_state
                .as_ref()
                .map_or(0, |s| (s.completed_nodes + s.failed_nodes).max(0) as u32);
            current.extend(members);
            report.compartment(&name, b.status, nodes);
        }
        for (i, n) in current.into_iter().enumerate() {
            out.orders[n] = Some(processed + i as u32);
        }
        out
    }

    /// Each selected node's pass (members, and done or parked nodes with something to
    /// record or release), then its status for the CR.
    fn node_passes(
        &mut self,
        c: &CrPass<'a>,
        selected: &[&'a ObservedNode],
        standing: &Standings<'_>,
        mut states: States<'_>,
        batches: &Batches<'_>,
        report: &mut Report<'a>,
    ) {
        let cr = c.cr;
        let env = Env {
            settings: &self.s.settings,
            now: self.now,
            refusals: &self.s.refusals,
            pinned: c.pinned.unwrap_or(&NO_PINS),
            images: c.images.unwrap_or(&NO_IMAGES),
            digests: &c.digests,
            marks: &c.marks,
            hold: c.holds.hold,
            orders: &batches.orders,
            replicas: &self.s.replicas,
            fencing: self.fencing.clone(),
            prestage: c.prestage.as_ref(),
            nodewrights: &self.s.nodewrights,
        };
        for &n in selected {
            let Some((stand, mut node_status)) = standing[n] else {
                continue;
            };
            let member = batches.orders[n].is_some();
            let runs = !c.blocked
                && (member
                    || stand == Standing::Failed
                    || (stand == Standing::Done && self.holds_anything(cr, n, c))
                    || (stand == Standing::Eligible
                        && prestage::ahead(env.prestage, &cr.name, &self.work[n])));
            match states[n].take() {
                Some(_) if runs => {
                    let parsed = self.state_of(c.keys(), n);
                    let Ok(before) = &parsed.state else {
                        continue;
                    };
                    let (out, st) = self.node_pass(&env, cr, n, before, member);
                    report.uninstalls(&n.name, st.as_ref().unwrap_or(before));
                    if member || out.status != Status::InProgress {
                        node_status = out.status;
                    }
                    report.node(&n.name, &out);
                }
                Some(glance) if glance.uninstalling => {
                    if let Ok(st) = &self.state_of(c.keys(), n).state {
                        report.uninstalls(&n.name, st);
                    }
                }
                Some(_) | None => {}
            }
            if !c.unusable {
                self.set_node_status(c, n, node_status);
            }
            report.node_status(n, node_status);
        }
    }

    /// One node's pass, and its state written back when the pass changed it (returned
    /// then: `None` when it did not). The pass reads `before` in place and copies it only
    /// to change it ([`node::Draft`]).
    fn node_pass(
        &mut self,
        env: &Env<'_>,
        cr: &'a Cr,
        n: &'a ObservedNode,
        before: &NodeState,
        member: bool,
    ) -> (NodeOutcome, Option<NodeState>) {
        let mut st = node::Draft::new(before);
        let jobs = self.jobs_of(&cr.name, n);
        let pods = self.pods.of(n);
        let work = &mut self.work[n];
        let visit = node::Visit {
            env,
            cr,
            node: n,
            jobs: &jobs,
            pods: &pods,
        };
        let out = node::pass(&visit, work, &mut st, member, &mut self.actions);
        let changed = st.into_changed().filter(|st| st != before);
        if let Some(st) = &changed {
            work.set(env.keys().get(CrMark::State), st.annotation());
        }
        (out, changed)
    }

    /// Deletion, in order: the CR's Jobs stopped and gone, then its cordons and marks
    /// released, then the finalizer. True when the finalizer is removed this pass.
    fn release_for_deletion(
        &mut self,
        c: &CrPass<'a>,
        selected: &[&'a ObservedNode],
        standing: &Standings<'_>,
    ) -> bool {
        let cr = c.cr;
        let all_done = selected
            .iter()
            .all(|&n| standing[n].is_some_and(|(s, _)| s == Standing::Done));
        if !all_done {
            return false;
        }
        let mut released = true;
        for n in selected {
            released &= self.withdraw(c.keys(), n, false);
        }
        // Jobs elsewhere (a node that left the selector, or left the cluster) are being let
        // go of by the withdrawal or the orphan sweep: the finalizer waits for them too.
        if released && !self.s.jobs.iter().any(|j| j.cr == cr.name) {
            self.actions.push(Action::RemoveFinalizer {
                cr: cr.name.clone(),
            });
            return true;
        }
        false
    }

    /// A done node still has something of this CR's to clean up: Jobs, a cordon, a drain.
    fn holds_anything(&self, cr: &Cr, n: &ObservedNode, c: &CrPass<'a>) -> bool {
        let marks = self.marks(c, n);
        self.has_jobs(&cr.name, n) || marks.cordon || marks.drain_marked
    }

    /// The CR's status, cordon and drain-start marks on `n` as this pass has left them: as
    /// read beside its state, unless the pass has written one of them since.
    fn marks(&self, c: &CrPass<'a>, n: &ObservedNode) -> KeptMarks {
        c.marks.on(n, &self.work[n])
    }

    /// A Job of the CR still runs on the node.
    fn busy(&self, cr: &Cr, n: &ObservedNode) -> bool {
        self.jobs.on(n).any(|j| j.cr == cr.name && j.running())
    }

    fn set_node_status(&mut self, c: &CrPass<'a>, n: &'a ObservedNode, status: Status) {
        let cr = c.cr;
        let old = self.marks(c, n).status;
        let (changed, was_erroring) = (old != Some(status), old == Some(Status::Erroring));
        if changed {
            if status == Status::Erroring && !was_erroring {
                self.actions.push(Action::Event(Event {
                    target: Target::Node(n.name.clone()),
                    warning: true,
                    reason: "Erroring",
                    message: format!("{} is erroring on this node", cr.name),
                }));
            }
            let key = c.keys().get(CrMark::Status);
            self.work[n].set(key, Some(status.as_str().into()));
        }
        let index = self.index;
        self.outcome
            .entry(cr.name.as_str())
            .or_insert_with(|| index.per_node())[n] = Some(status);
    }

    /// `reapplyOnReboot`: a boot ID change that is not our own reboot resets the node for
    /// this CR.
    fn reboot_reset(&mut self, c: &CrPass<'a>, n: &'a ObservedNode) -> bool {
        let cr = c.cr;
        if !self.s.settings.reapply_on_reboot {
            return false;
        }
        let Some(seen) = cr.status.node_boot_ids.get(&n.name) else {
            return false;
        };
        if seen.is_empty() || *seen == n.boot_id {
            return false;
        }
        let ours = self.state_of(c.keys(), n).state.as_ref().is_ok_and(|st| {
            st.values()
                .any(|e| !e.boot_id.is_empty() && e.state != State::Complete)
        });
        if ours {
            return false;
        }
        self.work[n].set(c.keys().get(CrMark::State), None);
        let jobs = self.jobs_of(&cr.name, n);
        self.jobs.forget(&cr.name, n);
        for j in jobs {
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

    /// Whether the CR whose keys are `keys` has anything on `n`: a Job or one of its
    /// per-CR annotations.
    fn holds_any(&self, keys: &CrKeys, n: &ObservedNode) -> bool {
        let work = &self.work[n];
        self.has_jobs(keys.cr(), n)
            || node_state::MARKS
                .iter()
                .any(|&m| work.get(keys.get(m)).is_some())
    }

    /// Lets go of `n`: stops the CR's Jobs there (a running stage gets its graceful
    /// shutdown; a requested reboot still happens), and once none is left releases the
    /// cordon, the drain marks and the Karpenter annotations and removes the status. A node
    /// that left the selector (`forget`) loses its state too; on deletion a state that
    /// still lists packages is kept as the record of what is installed, as NodeWright does.
    /// True when nothing of the CR's is left to wait for.
    fn withdraw(&mut self, keys: &CrKeys, n: &ObservedNode, forget: bool) -> bool {
        let cr = keys.cr();
        let jobs = self.jobs_of(cr, n);
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
        let work = &mut self.work[n];
        let held = work.get(keys.get(CrMark::Cordon)).is_some()
            || work.get(keys.get(CrMark::Status)).is_some();
        work.release(keys);
        // Every other mark of the CR's goes with it (the record stays while it says what is
        // installed): one list, so a mark added later is let go of too.
        for mark in CrMark::ALL.into_iter().filter(|m| *m != CrMark::State) {
            work.set(keys.get(mark), None);
        }
        let state = keys.get(CrMark::State);
        let empty = work
            .get(state)
            .is_none_or(|raw| NodeState::parse(raw).is_ok_and(|st| st.is_empty()));
        if forget || empty {
            work.set(state, None);
        }
        if forget && held {
            self.actions.push(Action::Event(Event {
                target: Target::Node(n.name.clone()),
                warning: false,
                reason: "Released",
                message: format!("{cr} no longer selects this node; released it"),
            }));
        }
        true
    }
}

#[cfg(test)]
mod tests;
