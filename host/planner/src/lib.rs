//! NodeWright's rollout semantics, decided without any I/O.
//!
//! [`plan`] takes what the operator observed ([`Snapshot`]: NodeWrights, policies, nodes
//! with their annotations, taints and boot IDs, the agent Jobs and their outcomes, pods,
//! refused evictions) and a clock, and returns the [`Action`]s to take next: Jobs to create
//! or delete, one patch per node (state annotation, cordon, Karpenter annotations, taints),
//! evictions, status writes, events, finalizers. It is level-triggered: running it again on
//! the world those actions produce moves the rollout one step further, and running it on an
//! unchanged world asks for nothing new. The rules it is built from are separate modules with
//! their own tests: the stage graph ([`stages`]), interrupt scope and coalescing
//! ([`interrupts`]), shared cordon ownership ([`cordon`]), drains ([`drain`]), batch
//! arithmetic ([`batches`]), compartments ([`rollout`]) and what holds new disruption
//! (maintenance windows and health gates, [`hold`]). [`forecast`] runs it forward on a copy
//! of the world: what a rollout will do, node by node, before it does anything.
//!
//! No tokio, no client, no clock: time is an argument.

#![deny(missing_docs)]

pub mod action;
pub mod batches;
pub mod cordon;
mod crpass;
pub mod drain;
pub mod forecast;
pub mod hold;
pub mod interrupts;
pub mod jobs;
pub mod node;
pub mod packages;
pub mod places;
mod plan;
pub mod prestage;
pub mod rollout;
pub mod roster;
pub mod select;
pub mod snapshot;
pub mod stages;
pub mod states;
mod status;
mod tally;
pub mod work;

pub use action::{Action, Ask, Event, JobRequest, NodePatch, Target};
pub use places::{JobPlaces, PodPlaces};
pub use plan::plan;
pub use roster::Roster;
pub use snapshot::{
    AgentPods, Cr, GateFinding, JobPhase, NodeFacts, Observed, ObservedJob, ObservedNode,
    ObservedPod, PluginCheck, PodFacts, Refusal, Replica, Resolved, Settings, Snapshot, Work,
};
pub use states::StateCache;
