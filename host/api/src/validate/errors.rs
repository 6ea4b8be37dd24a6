//! A rejected field, and the collector the checks add to.

use std::fmt;

/// A rejected field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path, e.g. `spec.packages.driver.version`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

pub(super) struct Errors(pub(super) Vec<FieldError>);

impl Errors {
    pub(super) fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }
}
