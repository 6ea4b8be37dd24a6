//! Logs captured by the host, bounded, and shown in the stage result and `plugin run`.

use crate::bindings::nodewright::plugin::log::{Level, log};

/// Logs at trace level.
pub fn trace(msg: &str) {
    log(Level::Trace, msg)
}
/// Logs at debug level.
pub fn debug(msg: &str) {
    log(Level::Debug, msg)
}
/// Logs at info level.
pub fn info(msg: &str) {
    log(Level::Info, msg)
}
/// Logs at warn level.
pub fn warn(msg: &str) {
    log(Level::Warn, msg)
}
/// Logs at error level.
pub fn error(msg: &str) {
    log(Level::Error, msg)
}
