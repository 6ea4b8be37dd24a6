//! nodewright-planner's integration tests, one binary (each file here was once its own binary,
//! each linking the whole dependency tree). Test names read `<file>::<test>`.

mod fleet;
mod forecast;
mod world;

mod changes;
mod cordons;
mod holds;
mod lifecycle;
mod packages;
mod prestage;
mod properties;
mod rollout;
mod scenarios;
