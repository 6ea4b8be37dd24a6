//! Helpers the scenarios and recovery tests share.

use std::time::Duration;

use crate::common::E2e;
use nodewright_hostops::{HostAction, ServiceVerb};
use serde_json::{Value, json};

pub const LIMIT: Duration = Duration::from_secs(240);

pub fn cr(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": name}, "spec": spec})
}

pub fn commands(paths: &[&str]) -> Value {
    json!({"commands": paths.iter().map(|p| json!({"path": p})).collect::<Vec<_>>()})
}

/// A shell package that needs a reboot and whose plan says "not yet installed".
pub fn reboot_package(e: &E2e) -> Value {
    e.script(
        "/usr/local/bin/install-driver",
        "mkdir -p etc && echo installed > etc/driver",
    );
    e.script("/usr/local/bin/driver-ok", "test -f etc/driver");
    json!({
        "version": "1.0.0", "plugin": e.plugin("shell"), "interrupt": {"type": "reboot"},
        "capabilities": {"commands": [{"path": "/usr/local/bin/install-driver"}, {"path": "/usr/local/bin/driver-ok", "readOnly": true}]},
        "configMap": {"apply": "/usr/local/bin/install-driver", "plan": "/usr/local/bin/driver-ok", "interrupt": "reboot"}
    })
}

/// How many times `unit` was restarted on `node`.
pub fn restarts(e: &E2e, node: &str, unit: &str) -> usize {
    e.journal(node)
        .iter()
        .filter(|a| matches!(a, HostAction::Service { verb: ServiceVerb::Restart, unit: u } if u == unit))
        .count()
}
