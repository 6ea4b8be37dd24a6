//! nodewright-operator's integration tests, one binary (each file here was once its own binary,
//! each linking the whole dependency tree). Test names read `<file>::<test>`.

mod common;
mod prometheus;
mod specs;

mod alerts;
mod chart;
mod dashboard;
mod holds;
mod interrupts;
mod lifecycle;
mod ordering;
mod payloads;
mod preview;
mod recovery;
mod registries;
mod rollout;
mod scenarios;
mod sharing;
mod trust;
mod uninstall;
mod webhook;
