//! nodewright-cli's integration tests, one binary (each file here was once its own binary,
//! each linking the whole dependency tree). Test names read `<file>::<test>`.

mod cluster_verbs;
mod plugin_support;

mod author_cli;
mod cluster_cli;
mod plugin_cli;
