//! nodewright-oci's integration tests, one binary (each file here was once its own binary,
//! each linking the whole dependency tree). Test names read `<file>::<test>`.

mod support;

mod images;
mod payloads;
mod registry;
mod resume;
mod transport;
