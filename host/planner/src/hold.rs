//! What holds a CR's new disruptive work this pass: its maintenance windows (the CR's own,
//! else its policy's), its failing health gates, and agent pods the API server refuses.
//!
//! A hold applies to nodes that have not *started*: a node that carries the CR's cordon mark
//! or has one of its Jobs finishes its current stage chain whatever the clock or the gates
//! say, so no node is ever left half-done. A node that has not started gets no new
//! disruptive step (cordon, drain, a stage with an interrupt in scope, an interrupt), and
//! with `applyToAll` outside a window no new step at all.

use jiff::Timestamp;
use nodewright_api::gates::NodeHealthGate;
use nodewright_api::v1alpha1::DeploymentPolicySpec;
use nodewright_api::windows::{MaintenanceWindows, WindowState};

use crate::snapshot::{AgentPods, Cr, GateFinding, ObservedNode, Replica};

/// How much new work a node that has not started may begin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Hold {
    /// Anything.
    #[default]
    Open,
    /// Only non-disruptive steps.
    Disruption,
    /// Nothing.
    All,
}

impl Hold {
    /// Whether a node that has not started may begin a step (`disruptive` or not).
    pub fn allows(self, disruptive: bool) -> bool {
        match self {
            Hold::Open => true,
            Hold::Disruption => !disruptive,
            Hold::All => false,
        }
    }
}

/// Why, and how much, a CR is held this pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holds {
    /// The combined hold.
    pub hold: Hold,
    /// Where the CR stands against its windows (`None`: it has none).
    pub window: Option<WindowState>,
    /// Failing gates.
    pub gates: Vec<GateFinding>,
    /// Why the API server refuses the agent's pods, when it does.
    pub agent_pods_refused: Option<String>,
}

/// The windows that apply to `cr`: its own, else its policy's.
pub fn windows<'a>(
    cr: &'a Cr,
    policy: Option<&'a DeploymentPolicySpec>,
) -> Option<&'a MaintenanceWindows> {
    cr.spec
        .maintenance_windows
        .as_ref()
        .or(policy.and_then(|p| p.maintenance_windows.as_ref()))
}

/// The holds on `cr` at `now` (unix seconds), with the agent pods' admission.
pub fn evaluate(
    cr: &Cr,
    policy: Option<&DeploymentPolicySpec>,
    now: i64,
    agent_pods: &AgentPods,
) -> Holds {
    let mut hold = Hold::Open;
    let window = windows(cr, policy).map(|w| {
        let state = w.at(Timestamp::from_second(now).unwrap_or(Timestamp::UNIX_EPOCH));
        if matches!(state, WindowState::Closed { .. }) {
            hold = hold.max(if w.apply_to_all {
                Hold::All
            } else {
                Hold::Disruption
            });
        }
        state
    });
    if !cr.failing_gates.is_empty() {
        hold = hold.max(Hold::Disruption);
    }
    // Every step but the cordon needs a pod, and a cordon with no pod to follow it would
    // strand the node: nothing new starts.
    let agent_pods_refused = match agent_pods {
        AgentPods::Refused(why) => {
            hold = Hold::All;
            Some(why.clone())
        }
        AgentPods::Admitted | AgentPods::Unknown => None,
    };
    Holds {
        hold,
        window,
        gates: cr.failing_gates.clone(),
        agent_pods_refused,
    }
}

/// The replica a reboot of `node` must wait for, if any: `node` runs a ready operator replica,
/// no other node does, and a replica elsewhere is on its way (not ready yet). Rebooting the
/// node then would leave no replica to lead or to answer the fail-closed webhook until one
/// of them is back. With no replica on its way there is nothing to wait for (every replica
/// runs on this node): the reboot goes ahead.
pub fn operator_waits<'r>(replicas: &'r [Replica], node: &str) -> Option<&'r Replica> {
    let here = replicas.iter().any(|r| r.node == node && r.ready);
    let elsewhere = replicas.iter().any(|r| r.node != node && r.ready);
    if !here || elsewhere {
        return None;
    }
    replicas.iter().find(|r| r.node != node && !r.ready)
}

/// Whether a reboot of `node` may start now, as far as the operator's replicas go: it
/// starts once no replica here is ready, or when every replica runs here.
#[derive(Debug, PartialEq, Eq)]
pub enum Fence<'r> {
    /// Yes: no ready replica runs here, or every replica runs here (there is no one to
    /// hand over to).
    Go,
    /// Not yet: these ready replicas run here while one is ready elsewhere. They are fenced
    /// first — they report not ready, so the webhook Service stops sending them requests,
    /// and the leader among them hands over — before the node goes down under them.
    Fence(Vec<&'r Replica>),
    /// Not yet: another node's replicas are being fenced; one node at a time, so two
    /// reboots never take every replica out together.
    Queued(String),
    /// Not yet: the replicas elsewhere are not ready (this one, say, is on its way back
    /// from its own node's reboot); the ones here keep serving until it is.
    Starting(String),
}

/// Whether a reboot of `node` may start, given the replicas and the nodes already fencing
/// theirs.
pub fn fence<'r>(
    replicas: &'r [Replica],
    node: &str,
    fencing: &std::collections::BTreeSet<String>,
) -> Fence<'r> {
    let here: Vec<&Replica> = replicas
        .iter()
        .filter(|r| r.node == node && r.ready)
        .collect();
    if here.is_empty() {
        return Fence::Go;
    }
    // Checked before looking for a ready replica elsewhere: the one elsewhere may be out
    // only because its own node is fencing it.
    if let Some(other) = fencing.iter().find(|n| *n != node) {
        return Fence::Queued(other.clone());
    }
    if replicas.iter().any(|r| r.node != node && r.ready) {
        return Fence::Fence(here);
    }
    match replicas.iter().find(|r| r.node != node) {
        Some(other) => Fence::Starting(other.pod.clone()),
        None => Fence::Go,
    }
}

/// The `nodeHealth` conditions a node that finished an interrupt cycle for `cr` does not
/// show (empty when it has no such gate, or the CR is being deleted: a deletion never
/// waits on a node's health).
pub fn unhealthy(cr: &Cr, node: &ObservedNode) -> Vec<String> {
    if cr.deleting {
        return Vec::new();
    }
    let gate: Option<&NodeHealthGate> = cr
        .spec
        .health_gates
        .as_ref()
        .and_then(|g| g.node_health.as_ref());
    gate.map(|g| g.unmet(&node.conditions)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use nodewright_api::windows::Window;

    use super::*;

    fn at(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_second()
    }

    fn nightly(apply_to_all: bool) -> MaintenanceWindows {
        MaintenanceWindows {
            windows: vec![Window {
                start: "22:00".into(),
                end: Some("04:00".into()),
                ..Default::default()
            }],
            apply_to_all,
            ..Default::default()
        }
    }

    #[test]
    fn the_crs_windows_replace_the_policys() {
        let policy = DeploymentPolicySpec {
            maintenance_windows: Some(nightly(false)),
            ..Default::default()
        };
        let mut cr = Cr::default();
        assert_eq!(
            evaluate(
                &cr,
                Some(&policy),
                at("2026-12-01T12:00:00Z"),
                &AgentPods::Unknown
            )
            .hold,
            Hold::Disruption,
            "the policy's window is closed at noon"
        );
        assert_eq!(
            evaluate(
                &cr,
                Some(&policy),
                at("2026-12-01T23:00:00Z"),
                &AgentPods::Unknown
            )
            .hold,
            Hold::Open
        );
        cr.spec.maintenance_windows = Some(MaintenanceWindows {
            windows: vec![Window {
                start: "11:00".into(),
                duration: Some("2h".into()),
                ..Default::default()
            }],
            ..Default::default()
        });
        let h = evaluate(
            &cr,
            Some(&policy),
            at("2026-12-01T12:00:00Z"),
            &AgentPods::Unknown,
        );
        assert_eq!(h.hold, Hold::Open, "the CR's own window is open at noon");
        assert!(matches!(h.window, Some(WindowState::Open { .. })));
        assert_eq!(
            evaluate(&Cr::default(), None, 0, &AgentPods::Unknown),
            Holds::default(),
            "no windows, no gates: open"
        );
    }

    fn replica(pod: &str, node: &str, ready: bool) -> Replica {
        Replica {
            pod: pod.into(),
            node: node.into(),
            ready,
        }
    }

    #[test]
    fn a_reboot_waits_only_for_a_replica_on_its_way_elsewhere() {
        let starting = [replica("op-a", "a", true), replica("op-b", "b", false)];
        assert_eq!(
            operator_waits(&starting, "a").map(|r| r.pod.as_str()),
            Some("op-b"),
            "a hosts the last ready replica; b's is starting"
        );
        assert_eq!(operator_waits(&starting, "b"), None, "b hosts no ready one");
        assert_eq!(operator_waits(&starting, "c"), None);
        let spread = [replica("op-a", "a", true), replica("op-b", "b", true)];
        assert_eq!(
            operator_waits(&spread, "a"),
            None,
            "another is ready elsewhere"
        );
        let together = [replica("op-1", "a", true), replica("op-2", "a", false)];
        assert_eq!(
            operator_waits(&together, "a"),
            None,
            "nothing elsewhere to wait for"
        );
        assert_eq!(operator_waits(&[], "a"), None, "replicas unknown");
    }

    #[test]
    fn a_reboot_fences_the_ready_replicas_on_its_node_one_node_at_a_time() {
        let none = std::collections::BTreeSet::new();
        let pods = |f: Fence<'_>| match f {
            Fence::Fence(r) => r.iter().map(|r| r.pod.clone()).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        let spread = [
            replica("op-a", "a", true),
            replica("op-a2", "a", true),
            replica("op-b", "b", true),
        ];
        assert_eq!(pods(fence(&spread, "a", &none)), ["op-a", "op-a2"]);
        assert_eq!(pods(fence(&spread, "b", &none)), ["op-b"]);
        assert_eq!(fence(&spread, "c", &none), Fence::Go, "no replica there");
        let a_fencing: std::collections::BTreeSet<String> = ["a".to_string()].into();
        assert_eq!(
            fence(&spread, "b", &a_fencing),
            Fence::Queued("a".into()),
            "a's replicas are leaving: b's stay until a is through"
        );
        assert_eq!(pods(fence(&spread, "a", &a_fencing)), ["op-a", "op-a2"]);
        let fenced = [replica("op-a", "a", false), replica("op-b", "b", true)];
        assert_eq!(
            fence(&fenced, "a", &a_fencing),
            Fence::Go,
            "left the Service already"
        );
        assert_eq!(
            fence(&fenced, "b", &a_fencing),
            Fence::Queued("a".into()),
            "op-a is out only while a is fenced: b must not take op-b out too"
        );
        let alone = [replica("op-a", "a", true), replica("op-b", "b", false)];
        assert_eq!(
            fence(&alone, "a", &none),
            Fence::Starting("op-b".into()),
            "the one elsewhere is on its way: the ones here serve until it is ready"
        );
        let together = [replica("op-1", "a", true), replica("op-2", "a", true)];
        assert_eq!(
            fence(&together, "a", &none),
            Fence::Go,
            "every replica here"
        );
        assert_eq!(fence(&[], "a", &none), Fence::Go, "replicas unknown");
    }

    #[test]
    fn apply_to_all_and_gates_combine() {
        let mut cr = Cr::default();
        cr.spec.maintenance_windows = Some(nightly(true));
        assert_eq!(
            evaluate(&cr, None, at("2026-12-01T12:00:00Z"), &AgentPods::Unknown).hold,
            Hold::All
        );
        cr.failing_gates = vec![GateFinding {
            gate: "prometheus".into(),
            reason: "AlertsFiring".into(),
            message: "NodeDown".into(),
        }];
        assert_eq!(
            evaluate(&cr, None, at("2026-12-01T12:00:00Z"), &AgentPods::Unknown).hold,
            Hold::All,
            "the stricter hold wins"
        );
        assert_eq!(
            evaluate(&cr, None, at("2026-12-01T23:00:00Z"), &AgentPods::Unknown).hold,
            Hold::Disruption,
            "inside the window the gate still holds disruption"
        );
        assert!(
            Hold::Disruption.allows(false)
                && !Hold::Disruption.allows(true)
                && !Hold::All.allows(false)
                && Hold::Open.allows(true)
        );
    }
}
