//! nodewright-api's integration tests, one binary (each file here was once its own binary,
//! each linking the whole dependency tree). Test names read `<file>::<test>`.

mod common;

mod crds;
mod examples;
mod policy_validation;
mod validation;
