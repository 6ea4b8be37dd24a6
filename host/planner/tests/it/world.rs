//! A tiny in-memory cluster that applies the planner's actions, so tests can drive a
//! rollout pass by pass and decide each Job's outcome.

use nodewright_api::agent::RunStage;
use nodewright_api::keys::{self, CrMark};
use nodewright_api::node_state::NodeState;
use nodewright_api::pinned::PinnedRef;
use nodewright_api::result::{Blame, StageResult};
use nodewright_api::v1alpha1::{DeploymentPolicySpec, NodeWrightSpec, Status};
use nodewright_planner::{
    Action, Cr, JobPhase, NodeFacts, ObservedJob, ObservedNode, ObservedPod, PluginCheck, PodFacts,
    Snapshot, Work, forecast, plan,
};

pub struct World {
    pub snap: Snapshot,
    pub now: i64,
    /// Every action ever taken, with the pass number.
    pub history: Vec<(usize, Action)>,
    pub passes: usize,
    /// Pods whose eviction a PDB refuses.
    pub pdb_protected: std::collections::BTreeSet<String>,
    /// Operator replicas do what the operator does when their node is fenced
    /// (`CrMark::FenceOperator`): report not ready until the mark goes (default on).
    pub replicas_fence_themselves: bool,
    /// Replicas not ready because their node is fenced.
    fenced: Vec<String>,
    /// The last pass changed a replica's readiness.
    replicas_moved: bool,
    boot: u64,
}

pub fn spec(json: serde_json::Value) -> NodeWrightSpec {
    serde_json::from_value(json).expect("valid spec")
}

pub fn policy(json: serde_json::Value) -> DeploymentPolicySpec {
    serde_json::from_value(json).expect("valid policy")
}

/// Nodes `w0`, `w1`, … labelled `tier=<tier>` (none for an empty tier), and the DeploymentPolicy
/// `staged`: a `canary` compartment (one at a time, fixed, stops at the first failure), a
/// `production` one (linear from one) and a default budget of two for the rest.
pub fn staged(w: &mut World, tiers: &[&str]) {
    for (i, tier) in tiers.iter().enumerate() {
        let labels: Vec<(&str, &str)> = if tier.is_empty() {
            vec![]
        } else {
            vec![("tier", tier)]
        };
        w.add_node(&format!("w{i}"), &labels);
    }
    w.snap.policies.insert(
        "staged".into(),
        policy(serde_json::json!({
            "default": {"budget": {"count": 2}},
            "compartments": [
                {"name": "canary", "selector": {"matchLabels": {"tier": "canary"}}, "budget": {"count": 1},
                 "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1, "safetyLimit": 100}}},
                {"name": "production", "selector": {"matchLabels": {"tier": "production"}}, "budget": {"percent": 100},
                 "strategy": {"linear": {"initialBatch": 1, "delta": 1, "failureThreshold": 2, "safetyLimit": 100}}}
            ]
        })),
    );
}

/// A package whose changes need a reboot.
pub fn reboot_pkg() -> serde_json::Value {
    serde_json::json!({"version": "1.0.0", "plugin": "r.example/driver:1", "interrupt": {"type": "reboot"}})
}

/// A package with no interrupt.
pub fn plain_pkg() -> serde_json::Value {
    serde_json::json!({"version": "1.0.0", "plugin": "r.example/tuning:1", "configMap": {"swappiness": "10"}})
}

/// The stages started on `node`, in order: `package:stage`, `interrupt:kind:owner`.
pub fn stages_on(w: &World, node: &str) -> Vec<String> {
    w.created()
        .into_iter()
        .filter(|(_, _, n)| *n == node)
        .map(|(_, work, _)| match work {
            Work::Package { package, stage, .. } => format!("{package}:{}", stage.as_str()),
            Work::Interrupt { kind, owner, .. } => format!("interrupt:{}:{owner}", kind.as_str()),
            Work::Prestage { .. } => "prestage".into(),
        })
        .collect()
}

/// A condition of a CR: (status, reason, message).
pub fn condition(w: &World, cr: &str, kind: &str) -> (String, String, String) {
    let c = w
        .cr(cr)
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == kind)
        .unwrap_or_else(|| panic!("no {kind} condition"));
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

pub fn ok(interrupt: &str, changes: u32) -> StageResult {
    StageResult {
        interrupt: Some(interrupt.parse().unwrap()),
        change_count: changes,
        ..StageResult::passed(RunStage::Plan, "p", "")
    }
}

impl World {
    pub fn new(nodes: usize) -> Self {
        let mut w = World {
            snap: Snapshot::default(),
            now: 1_000_000,
            history: vec![],
            passes: 0,
            pdb_protected: Default::default(),
            replicas_fence_themselves: true,
            fenced: vec![],
            replicas_moved: false,
            boot: 0,
        };
        for i in 0..nodes {
            w.add_node(&format!("node-{i}"), &[]);
        }
        w
    }

    pub fn add_node(&mut self, name: &str, labels: &[(&str, &str)]) {
        self.boot += 1;
        let created = self.snap.nodes.len() as i64;
        self.snap.nodes.push(ObservedNode::new(NodeFacts {
            name: name.into(),
            created,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            boot_id: format!("boot-{}", self.boot),
            resource_version: "1".into(),
            ..Default::default()
        }));
    }

    /// The node is deleted from the cluster, with its pods.
    pub fn remove_node(&mut self, name: &str) {
        self.snap.nodes.retain(|n| n.name != name);
        self.snap.pods.retain(|p| p.node != name);
    }

    pub fn add_cr(&mut self, name: &str, spec: NodeWrightSpec) {
        let pinned: std::collections::BTreeMap<String, PinnedRef> = spec
            .packages
            .iter()
            .map(|(n, p)| {
                (
                    n.clone(),
                    format!(
                        "{}@sha256:{}",
                        p.plugin.split(':').next().unwrap_or_default(),
                        "0".repeat(64)
                    )
                    .parse()
                    .unwrap(),
                )
            })
            .collect();
        self.snap.nodewrights.push(Cr {
            name: name.into(),
            uid: format!("uid-{name}"),
            generation: 1,
            spec,
            plugins: PluginCheck::Ready(pinned.into()),
            ..Default::default()
        });
    }

    /// The CR's plugins carry payloads: package → bytes, as the operator's plugin check
    /// reads them from the manifests.
    pub fn with_payloads(&mut self, cr: &str, payloads: &[(&str, u64)]) {
        let PluginCheck::Ready(resolved) = &mut self.cr_mut(cr).plugins else {
            panic!("{cr}'s plugins are not ready");
        };
        resolved.payloads = payloads.iter().map(|(p, b)| (p.to_string(), *b)).collect();
    }

    pub fn cr(&self, name: &str) -> &Cr {
        self.snap
            .nodewrights
            .iter()
            .find(|c| c.name == name)
            .expect("cr exists")
    }

    pub fn cr_mut(&mut self, name: &str) -> &mut Cr {
        self.snap
            .nodewrights
            .iter_mut()
            .find(|c| c.name == name)
            .expect("cr exists")
    }

    /// Changes the spec like an admin: the generation goes up.
    pub fn edit(&mut self, name: &str, f: impl FnOnce(&mut NodeWrightSpec)) {
        let cr = self.cr_mut(name);
        f(&mut cr.spec);
        cr.generation += 1;
    }

    pub fn node(&self, name: &str) -> &ObservedNode {
        self.snap
            .nodes
            .iter()
            .find(|n| n.name == name)
            .expect("node exists")
    }

    pub fn node_mut(&mut self, name: &str) -> &mut ObservedNode {
        self.snap
            .nodes
            .iter_mut()
            .find(|n| n.name == name)
            .expect("node exists")
    }

    pub fn state(&self, cr: &str, node: &str) -> NodeState {
        self.node(node)
            .annotations
            .get(&keys::node_state(cr))
            .map(|s| serde_json::from_str(s).unwrap())
            .unwrap_or_default()
    }

    pub fn node_status(&self, cr: &str, node: &str) -> Option<Status> {
        self.cr(cr).status.node_status.get(node).copied()
    }

    pub fn add_pod(
        &mut self,
        node: &str,
        name: &str,
        labels: &[(&str, &str)],
        controller: Option<&str>,
    ) {
        self.snap.pods.push(ObservedPod::new(PodFacts {
            namespace: "default".into(),
            name: name.into(),
            node: node.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            active: true,
            controller: controller.map(String::from),
            ..Default::default()
        }));
    }

    /// One planner pass, its actions applied. Returns the actions.
    pub fn step(&mut self) -> Vec<Action> {
        self.step_keeping(|_| true)
    }

    /// One planner pass of which only the actions `keep` accepts take effect (the others are
    /// lost, as a write the API refused).
    pub fn step_keeping(&mut self, keep: impl Fn(&Action) -> bool) -> Vec<Action> {
        let actions = plan(&self.snap, self.now);
        // The state cache is a memo: the same snapshot with an empty one plans the same.
        let cold = Snapshot {
            states: Default::default(),
            pod_places: Default::default(),
            job_places: Default::default(),
            roster: Default::default(),
            ..self.snap.clone()
        };
        assert_eq!(
            plan(&cold, self.now),
            actions,
            "a warm state cache or pod places memo changed the plan at pass {}",
            self.passes
        );
        self.passes += 1;
        for a in actions.iter().filter(|a| keep(a)) {
            self.history.push((self.passes, a.clone()));
            self.apply(a);
        }
        self.now += 2;
        self.replicas_moved = self.fence_replicas();
        actions
    }

    /// A replica on a fenced node reports not ready; back once its node is not fenced.
    /// True when one changed (the operator's watch of its pods would wake it).
    fn fence_replicas(&mut self) -> bool {
        if !self.replicas_fence_themselves {
            return false;
        }
        let mut moved = false;
        let nodes = &self.snap.nodes;
        for r in &mut self.snap.replicas {
            let fenced = nodes
                .iter()
                .find(|n| n.name == r.node)
                .is_some_and(|n| keys::fences_operator(n.annotations.keys()));
            if fenced && r.ready {
                r.ready = false;
                self.fenced.push(r.pod.clone());
                moved = true;
            } else if !fenced && let Some(i) = self.fenced.iter().position(|p| *p == r.pod) {
                self.fenced.remove(i);
                r.ready = true;
                moved = true;
            }
        }
        moved
    }

    /// Applies `a` as the planner's own forecast does, checking on the way what every
    /// rollout must hold (per-CR marks, a finalizer that goes last).
    fn apply(&mut self, a: &Action) {
        match a {
            Action::PatchNode(p) => self.per_cr_keys_are_marks(p),
            Action::RemoveFinalizer { cr } => self.let_go_of_every_node(cr),
            _ => {}
        }
        forecast::apply(&mut self.snap, self.now, &self.pdb_protected, a);
    }

    /// Every annotation the planner writes that names a CR of this world is one of the
    /// listed marks ([`CrMark`]) — the list a release clears — so a new per-CR annotation
    /// cannot be left out of it.
    fn per_cr_keys_are_marks(&self, p: &nodewright_planner::NodePatch) {
        for key in p.annotations.keys() {
            for cr in &self.snap.nodewrights {
                if key.ends_with(&format!(".{}", cr.name)) && key.starts_with("nodewright.io/") {
                    assert!(
                        CrMark::parse(key).is_some_and(|(_, of)| of == cr.name),
                        "pass {}: the planner writes {key} on {}, which is not a CrMark: \
                         a release would leave it behind",
                        self.passes,
                        p.node
                    );
                }
            }
        }
    }

    /// A CR's finalizer goes only once it has let go of every node: no mark of it is left
    /// but the record of what stays installed (and no cordon it took).
    fn let_go_of_every_node(&self, cr: &str) {
        for n in &self.snap.nodes {
            let left: Vec<&String> = n
                .annotations
                .keys()
                .filter(|k| CrMark::parse(k).is_some_and(|(m, of)| of == cr && m != CrMark::State))
                .collect();
            assert!(
                left.is_empty(),
                "pass {}: {cr}'s finalizer goes while {} keeps {left:?}",
                self.passes,
                n.name
            );
        }
    }

    /// Finishes every active Job with `outcome(job)`; a finished reboot changes the boot ID.
    pub fn finish_jobs(&mut self, mut outcome: impl FnMut(&ObservedJob) -> Option<JobPhase>) {
        forecast::finish_jobs(&mut self.snap, &mut outcome);
    }

    /// Every Job succeeds; plans report `plan` (interrupt text, changes).
    pub fn succeed_all(&mut self, plan_says: (&str, u32)) {
        self.finish_jobs(|j| {
            Some(JobPhase::Succeeded(Some(Box::new(match &j.work {
                Work::Package {
                    stage: nodewright_api::node_state::Stage::Plan,
                    ..
                } => ok(plan_says.0, plan_says.1),
                _ => ok("none", 1),
            }))))
        });
    }

    /// Passes until nothing changes (or `max` passes), finishing Jobs as `plan_says`.
    pub fn run(&mut self, plan_says: (&str, u32), max: usize) -> usize {
        for i in 0..max {
            let acted = self.step();
            self.succeed_all(plan_says);
            let quiet = acted.iter().all(|a| matches!(a, Action::Event(_)))
                && self.at_rest()
                && !self.replicas_moved;
            if quiet {
                return i;
            }
        }
        panic!(
            "no convergence in {max} passes; jobs: {:?}",
            self.snap.jobs.iter().map(|j| &j.name).collect::<Vec<_>>()
        );
    }

    /// No Job runs, stops or waits to be recorded: the only ones left are genuinely failed
    /// ones kept (for their logs) beside the parked entry they recorded.
    pub fn at_rest(&self) -> bool {
        self.kept_failures().len() == self.snap.jobs.len()
    }

    /// The Jobs kept as the record of a parked failure: genuinely failed, not stopping, and
    /// their CR's entry on their node erroring at their stage.
    pub fn kept_failures(&self) -> Vec<&ObservedJob> {
        self.snap
            .jobs
            .iter()
            .filter(|j| !j.stopping && matches!(j.phase, JobPhase::Failed { genuine: true, .. }))
            .filter(|j| match &j.work {
                Work::Package {
                    package,
                    version,
                    stage,
                } => {
                    self.snap.nodewrights.iter().any(|c| c.name == j.cr)
                        && self.snap.nodes.iter().any(|n| n.name == j.node)
                        && self
                            .state(&j.cr, &j.node)
                            .find(package, version)
                            .is_some_and(|e| {
                                e.stage == *stage
                                    && e.state == nodewright_api::node_state::State::Erroring
                            })
                }
                Work::Interrupt { .. } => false,
                // The node reads erroring beside it until its TTL ends it.
                Work::Prestage { .. } => true,
            })
            .collect()
    }

    pub fn created(&self) -> Vec<(usize, Work, &str)> {
        self.history
            .iter()
            .filter_map(|(i, a)| {
                if let Action::CreateJob(r) = a {
                    Some((*i, r.work(), r.node.as_str()))
                } else {
                    None
                }
            })
            .collect()
    }

    pub fn events(&self, reason: &str) -> Vec<String> {
        self.history
            .iter()
            .filter_map(|(_, a)| {
                if let Action::Event(e) = a {
                    (e.reason == reason).then(|| e.message.clone())
                } else {
                    None
                }
            })
            .collect()
    }
}

pub fn cordoned_passes(w: &World, node: &str) -> Vec<usize> {
    w.history
        .iter()
        .filter_map(|(i, a)| {
            if let Action::PatchNode(p) = a {
                (p.node == node && p.unschedulable == Some(true)).then_some(*i)
            } else {
                None
            }
        })
        .collect()
}

pub fn evicted(w: &World) -> Vec<(usize, String)> {
    w.history
        .iter()
        .filter_map(|(i, a)| {
            if let Action::Evict { pod, .. } = a {
                Some((*i, pod.clone()))
            } else {
                None
            }
        })
        .collect()
}

pub fn failed(blame: Blame, msg: &str, genuine: bool) -> JobPhase {
    JobPhase::Failed {
        genuine,
        attempts: 4,
        reason: "BackoffLimitExceeded".into(),
        last: Some(Box::new(StageResult::failed(
            RunStage::Apply,
            "tuning",
            blame,
            msg,
        ))),
    }
}
