//! nodewright's Kubernetes-facing types, with no I/O.
//!
//! This crate is shared by the operator, the agent, the engine and the CLI. It holds the
//! capability grants a NodeWright gives each package ([`grants`]) and the rules that
//! validate them, the `NodeWright` and `DeploymentPolicy` CRD types ([`v1alpha1`]), the
//! per-node record each NodeWright keeps in node annotations ([`node_state`]), the
//! annotation, label and condition names ([`keys`]), the agent's structured stage result
//! that the operator reads back ([`result`]), validation and defaulting as pure
//! functions ([`validate`]), the grammar of host names a plugin may pass ([`hostargs`]),
//! the sandbox bounds of a stage ([`limits`]), the pinned plugin reference ([`pinned`]), plugin trust policies ([`trust`]),
//! maintenance windows ([`windows`]), health gates ([`gates`]), the one grammar of
//! durations and sizes ([`units`]) and the operator → agent call ([`agent`]).
//! It depends on serde, schemars, globset, regex, url and jiff (time zones) only (and, with
//! the `cli` feature, clap's derive for the agent's arguments): never on a client, a
//! runtime or tokio.
//!
//! ```
//! use nodewright_api::grants::{Capabilities, GrantSet, GrantSource};
//! let caps: Capabilities = serde_json::from_str(r#"{"kernelModules": ["br_netfilter"]}"#).unwrap();
//! let set = GrantSet::parse(&caps, false, GrantSource::Spec { package: "net".into() }).unwrap();
//! assert!(set.allows_module("br_netfilter"));
//! assert!(!set.allows_module("nvidia"));
//! ```
#![deny(missing_docs)]

pub mod agent;
pub mod atomic;
pub mod crdgen;
pub mod gates;
pub mod grants;
pub mod hostargs;
pub mod keys;
pub mod limits;
pub mod names;
pub mod node_state;
pub mod payload;
pub mod pinned;
pub mod result;
pub mod trust;
pub mod units;
pub mod v1alpha1;
pub mod validate;
pub mod windows;
