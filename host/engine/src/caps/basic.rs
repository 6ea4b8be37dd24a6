//! The always-linked interfaces: `types`, `log` and `node`.

use std::sync::Arc;

use crate::bindings::nodewright::plugin::{log, node, types};
use crate::report::{LogLevel, LogSource};
use crate::state::CapState;

impl types::Host for CapState {}

impl log::Host for CapState {
    async fn log(&mut self, level: log::Level, message: String) {
        let level = match level {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        self.log
            .lock()
            .expect("log lock")
            .push(LogSource::Plugin, level, message);
    }
}

impl node::Host for CapState {
    async fn info(&mut self) -> node::NodeInfo {
        let host = Arc::clone(&self.host);
        let info = tokio::task::spawn_blocking(move || host.node_info())
            .await
            .unwrap_or_default();
        node::NodeInfo {
            name: info.name,
            labels: info.labels,
            kernel_release: info.kernel_release,
            os_release: info.os_release,
            boot_id: info.boot_id,
            architecture: info.architecture,
        }
    }
}
