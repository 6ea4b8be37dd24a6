//! NodeWright's rollout semantics, decided without any I/O.
//!
//! This crate grows into `plan(snapshot, now) -> Vec<Action>`. What is here now are the
//! rules that function is built from, each a pure function with its own tests:
//!
//! - [`stages`]: the per-package stage graph (transitions only from `complete`), which check
//!   verifies which stage, and which stage an executor (re)starts at;
//! - [`interrupts`]: whether an interrupt is in scope (package interrupt vs the
//!   `configInterrupts` of changed keys) and how a node's interrupts coalesce into one;
//! - [`cordon`]: shared cordon ownership that never releases a cordon nodewright did not make;
//! - [`batches`]: batch sizes of the rollout strategies, capped by the budget.
//!
//! No tokio, no client, no clock: time, when needed, is an argument.

#![deny(missing_docs)]

pub mod batches;
pub mod cordon;
pub mod interrupts;
pub mod stages;
