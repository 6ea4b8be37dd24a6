//! `plan(snapshot, now)`: one level-triggered pass over every NodeWright.
//!
//! [`Pass`] holds what the whole pass shares: the nodes in rollout order, each node's
//! annotations as the pass has left them ([`NodeWork`]), Jobs and pods by node, and which
//! CRs are done where (for sequencing). One CR's pass is in [`crate::crpass`]; the
//! cluster-wide steps (auto-taint, runtime-required, orphaned Jobs) are here.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use k8s_openapi::api::core::v1::Taint;
use nodewright_api::keys::{self, CrKeys, CrMark};
use nodewright_api::v1alpha1::{Sequencing, Status};

use crate::action::Action;
use crate::packages::node_done;
use crate::places::{JobPlaces, NOWHERE, Placed};
use crate::roster::NodeIndex;
use crate::select;
use crate::snapshot::{Cr, ObservedJob, ObservedNode, ObservedPod, Snapshot};
use crate::states::Glance;
use crate::work::{Grouped, PerNode, Works};

/// Decides what to do next. Pure: the same snapshot and clock give the same actions (the
/// snapshot's [`crate::StateCache`] only saves parsing).
pub fn plan(s: &Snapshot, now: i64) -> Vec<Action> {
    let index = s.roster.index(&s.nodes);
    let mut pass = Pass::new(s, &index, now);
    pass.auto_taint();
    let mut order: Vec<&Cr> = s.nodewrights.iter().collect();
    order.sort_by(|a, b| (a.spec.priority(), &a.name).cmp(&(b.spec.priority(), &b.name)));
    for (i, cr) in order.iter().enumerate() {
        pass.cr(cr, &order[..i]);
    }
    pass.runtime_required();
    pass.orphans();
    s.states.end_pass();
    pass.finish()
}

/// A node's parsed state for a CR, shared with the cache until the pass changes it.
pub(crate) type Parsed = Arc<crate::states::Reading>;

/// What the whole pass shares.
pub(crate) struct Pass<'a> {
    pub(crate) s: &'a Snapshot,
    pub(crate) now: i64,
    /// Nodes in rollout order (`NodeFacts::rollout_key`).
    pub(crate) nodes: Vec<&'a ObservedNode>,
    /// The snapshot's nodes by name.
    pub(crate) index: &'a NodeIndex<'a>,
    pub(crate) work: Works<'a>,
    /// Every CR's Jobs on each node, in snapshot order.
    pub(crate) jobs: JobsByNode<'a>,
    pub(crate) pods: Grouped<'a, ObservedPod>,
    /// CR → each node's status this pass (`None`: not selected).
    pub(crate) outcome: HashMap<&'a str, PerNode<'a, Option<Status>>>,
    /// CR → whether it is done on each node in the snapshot.
    done_on: HashMap<&'a str, PerNode<'a, bool>>,
    /// CRs done on every node they select, in the snapshot.
    done_everywhere: HashSet<&'a str>,
    /// CR → a glance at each node's state, as [`Pass::completion`] read it, taken by the
    /// CR's pass.
    pub(crate) glanced: HashMap<&'a str, PerNode<'a, Option<Glance>>>,
    /// CR → its marks on each node it selects, as the snapshot has them (read beside the
    /// state, taken by the CR's pass).
    pub(crate) marks: HashMap<&'a str, crate::work::CrMarks<'a>>,
    /// Nodes whose operator replicas are fenced (`CrMark::FenceOperator`), as this pass has
    /// left them: at most one at a time, so two reboots never take every replica out.
    pub(crate) fencing: crate::work::Fencing<'a>,
    pub(crate) actions: Vec<Action>,
}

impl<'a> Pass<'a> {
    pub(crate) fn new(s: &'a Snapshot, index: &'a NodeIndex<'a>, now: i64) -> Self {
        let nodes: Vec<&ObservedNode> = index.rollout().collect();
        let work = Works::new(index);
        let jobs = JobsByNode::new(index, &s.jobs, &s.job_places);
        let pods = Grouped::new(&s.nodes, &s.pods, s.pod_places.grouping(index, &s.pods));
        let mut pass = Pass {
            s,
            now,
            nodes,
            index,
            work,
            jobs,
            pods,
            outcome: HashMap::default(),
            done_on: HashMap::default(),
            done_everywhere: HashSet::default(),
            glanced: HashMap::default(),
            marks: HashMap::default(),
            fencing: crate::work::Fencing::new(&s.nodes),
            actions: Vec::new(),
        };
        pass.completion();
        pass
    }

    /// A CR's state on `node` (`keys`: the CR's) as this pass has left it (parsed once
    /// per annotation text).
    pub(crate) fn state_of(&self, keys: &CrKeys, node: &ObservedNode) -> Parsed {
        let key = keys.get(CrMark::State);
        self.s.states.get(keys.cr(), self.read(key, node))
    }

    /// `node`'s state annotation `key` as this pass has left it, for the state cache.
    fn read<'r>(
        &'r self,
        key: &'r str,
        node: &'r ObservedNode,
    ) -> crate::states::Read<'r, impl FnOnce() -> Option<&'r str> + 'r> {
        let work = &self.work[node];
        crate::states::Read {
            node,
            place: self.index.place(node),
            raw: move || work.get(key),
            observed: work.observed(key),
        }
    }

    /// `cr`'s Jobs on `node`, in snapshot order.
    pub(crate) fn jobs_of(&self, cr: &str, node: &ObservedNode) -> Vec<&'a ObservedJob> {
        self.jobs.on(node).filter(|j| j.cr == cr).collect()
    }

    /// Whether `cr` has a Job on `node`.
    pub(crate) fn has_jobs(&self, cr: &str, node: &ObservedNode) -> bool {
        self.jobs.on(node).any(|j| j.cr == cr)
    }

    pub(crate) fn selects(cr: &Cr, node: &ObservedNode) -> bool {
        select::matches(cr.spec.node_selectors.as_ref(), &node.labels)
    }

    /// Which selected nodes each CR is done on, and whether it is done everywhere — from the
    /// snapshot, for sequencing.
    fn completion(&mut self) {
        for cr in &self.s.nodewrights {
            let digests = crate::packages::digests(&cr.spec);
            let key = keys::node_state(&cr.name);
            let judge = self.s.states.judge(&cr.name, &cr.spec, cr.deleting);
            let mut everywhere = true;
            let mut glanced = self.index.per_node();
            let mut done_on = self.index.per_node();
            let mut marks = crate::work::CrMarks::new(&cr.name, self.index);
            for &n in self.nodes.iter().filter(|n| Self::selects(cr, n)) {
                let (glance, done, on) = self.s.states.judged(
                    &cr.name,
                    self.read(&key, n),
                    judge,
                    |st| node_done(&cr.spec, &digests, st, cr.deleting),
                    || marks.read(|k| n.annotations.get(k).map(String::as_str)),
                );
                marks.set(n, on);
                glanced[n] = Some(glance);
                everywhere &= done;
                done_on[n] = done;
            }
            self.glanced.insert(cr.name.as_str(), glanced);
            self.marks.insert(cr.name.as_str(), marks);
            self.done_on.insert(cr.name.as_str(), done_on);
            if everywhere {
                self.done_everywhere.insert(cr.name.as_str());
            }
        }
    }

    /// Whether `cr` is done on `node` in the snapshot.
    pub(crate) fn done_on(&self, cr: &Cr, node: &ObservedNode) -> bool {
        self.done_on.get(cr.name.as_str()).is_some_and(|d| d[node])
    }

    /// A predecessor (lower priority value, or same and earlier name) holds this node.
    pub(crate) fn gated(&self, before: &[&Cr], node: &ObservedNode) -> bool {
        before
            .iter()
            .filter(|p| !p.disabled && Self::selects(p, node))
            .any(|p| {
                p.paused
                    || match p.spec.sequencing.unwrap_or_default() {
                        Sequencing::Node => !self.done_on(p, node),
                        Sequencing::All => !self.done_everywhere.contains(p.name.as_str()),
                    }
            })
    }

    /// Jobs of a NodeWright that no longer exists, or on a node that no longer exists, are
    /// nobody's work: delete them (the garbage collector is the backstop for the first).
    fn orphans(&mut self) {
        let crs: HashSet<&str> = self.s.nodewrights.iter().map(|c| c.name.as_str()).collect();
        let jobs = self.s.jobs.iter().zip(&self.jobs.placed.places);
        for (j, &place) in jobs.filter(|(j, _)| !j.stopping) {
            let cr_gone = !crs.contains(j.cr.as_str());
            let node_gone = place == NOWHERE;
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
                let tainted = self.index.brief(n).runtime_tainted;
                let work = &mut self.work[*n];
                if !touched && !tainted && work.add_taint(runtime_taint()) {
                    work.set(&keys::auto_taint(&cr.name), Some("true".into()));
                }
            }
        }
    }

    /// Removes the runtime-required taint from nodes where every `runtimeRequired` CR that
    /// selects them is complete.
    fn runtime_required(&mut self) {
        for n in &self.nodes {
            if !self.index.brief(n).runtime_tainted {
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
                    self.outcome
                        .get(c.name.as_str())
                        .is_some_and(|o| o[*n] == Some(Status::Complete))
                })
            {
                continue;
            }
            let work = &mut self.work[*n];
            work.remove_taint(keys::RUNTIME_REQUIRED_TAINT_KEY);
            if crs.iter().any(|c| c.spec.runtime_required_cordon_after) {
                work.cordon(true);
                work.set(keys::RUNTIME_REQUIRED_CORDON, Some("true".into()));
            }
        }
    }

    /// Node patches first (sorted by node), then everything else in the order it was decided.
    fn finish(mut self) -> Vec<Action> {
        let mut patches: Vec<_> = self.work.into_patches().collect();
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

/// The snapshot's Jobs by node: each Job's node found by name ([`crate::places::JobPlaces`],
/// kept while the Jobs name the same nodes), the Jobs grouped by place (two flat lists, not
/// a list per node: at 10,000 nodes, 240 KB written and a thousand lists made every pass).
pub(crate) struct JobsByNode<'a> {
    /// Each Job's node place ([`NOWHERE`]: on no node of the snapshot) and the grouping.
    placed: Arc<Placed>,
    grouped: Grouped<'a, ObservedJob>,
    /// Whether each Job was let go of this pass ([`JobsByNode::forget`]): left out from
    /// then on (empty until one is).
    forgotten: Vec<bool>,
}

impl<'a> JobsByNode<'a> {
    fn new(index: &NodeIndex<'a>, jobs: &'a [ObservedJob], memo: &JobPlaces) -> Self {
        let placed = memo.placed(index, jobs);
        JobsByNode {
            grouped: Grouped::new(index.nodes(), jobs, placed.grouping.clone()),
            placed,
            forgotten: Vec::new(),
        }
    }

    /// The Jobs on `node`, in snapshot order.
    pub(crate) fn on(&self, node: &ObservedNode) -> impl Iterator<Item = &'a ObservedJob> + '_ {
        let forgotten = |i: usize| self.forgotten.get(i).is_some_and(|&f| f);
        let jobs = self.grouped.indexed(node);
        jobs.filter(move |&(i, _)| !forgotten(i)).map(|(_, j)| j)
    }

    /// Leaves out `cr`'s Jobs on `node` for the rest of the pass.
    pub(crate) fn forget(&mut self, cr: &str, node: &ObservedNode) {
        self.forgotten.resize(self.placed.places.len(), false);
        for (i, _) in self.grouped.indexed(node).filter(|(_, j)| j.cr == cr) {
            self.forgotten[i] = true;
        }
    }
}

/// The empty pin map of a CR whose plugins are not ready.
pub(crate) static NO_PINS: BTreeMap<String, nodewright_api::pinned::PinnedRef> = BTreeMap::new();

/// The empty image payloads of a CR whose plugins are not ready.
pub(crate) static NO_IMAGES: BTreeMap<String, Vec<nodewright_api::payload::ImagePayload>> =
    BTreeMap::new();

fn runtime_taint() -> Taint {
    Taint {
        key: keys::RUNTIME_REQUIRED_TAINT_KEY.into(),
        value: Some(keys::RUNTIME_REQUIRED_TAINT_VALUE.into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{JobPhase, Work};

    fn job(name: &str, cr: &str, node: &str) -> ObservedJob {
        ObservedJob {
            name: name.into(),
            cr: cr.into(),
            node: node.into(),
            generation: 1,
            run: 0,
            work: Work::Prestage { set: "s".into() },
            phase: JobPhase::Active {
                failed: 0,
                last: None,
            },
            stopping: false,
            stuck: None,
        }
    }

    #[test]
    fn jobs_are_found_by_node_in_snapshot_order_and_a_forgotten_crs_are_left_out() {
        let nodes: Vec<ObservedNode> = ["a", "b"].map(ObservedNode::named).into();
        let jobs = [
            job("1", "x", "b"),
            job("2", "x", "a"),
            job("3", "gone", "nowhere"),
            job("4", "y", "b"),
            job("5", "x", "b"),
        ];
        let index = NodeIndex::new(&nodes);
        let mut by_node = JobsByNode::new(&index, &jobs, &JobPlaces::default());
        let names = |by: &JobsByNode<'_>, n: &ObservedNode| -> Vec<String> {
            by.on(n).map(|j| j.name.clone()).collect()
        };
        assert_eq!(names(&by_node, &nodes[0]), ["2"]);
        assert_eq!(names(&by_node, &nodes[1]), ["1", "4", "5"]);
        assert_eq!(
            by_node.placed.places,
            [1, 0, NOWHERE, 1, 1],
            "the stray is on no node"
        );
        by_node.forget("x", &nodes[1]);
        assert_eq!(names(&by_node, &nodes[1]), ["4"], "only x's, only on b");
        assert_eq!(names(&by_node, &nodes[0]), ["2"]);
    }
}
