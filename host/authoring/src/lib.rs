//! Builds nodewright plugins from source and writes the templates authors start from.
//!
//! One contract (`wit/plugin.wit`), three languages: Rust builds with cargo for
//! `wasm32-wasip2` against the Rust SDK; Python with `componentize-py` and JavaScript (or
//! TypeScript) with esbuild and `componentize-js`, each against the world narrowed to the
//! capabilities its manifest declares ([`world`]) and with the copy of the SDK embedded
//! here, so a build always pairs the contract with the SDK written for it. [`build`] finds
//! or installs the language's tools ([`tools`]) and returns the component; checking that
//! the component really is a plugin is the engine's job, done by the caller.
//! [`new_project`] writes a template that builds as is. Every failure is a [`BuildError`]
//! that says what to install or which manifest field to fix.

#![deny(missing_docs)]

mod build;
mod error;
mod io;
mod js;
mod language;
mod manifest;
mod options;
mod python;
mod rust;
#[cfg(test)]
mod sdk_coverage;
mod templates;
pub mod tools;
mod versions;
pub mod world;

pub use build::build;
pub use error::BuildError;
pub use language::Language;
pub use options::{BuildOptions, Built, Toolchain};
pub use templates::{new_project, valid_name};
