//! Spec builders the validation tests share: a valid NodeWright spec and JSON patches of it.

use nodewright_api::v1alpha1::NodeWrightSpec;
use nodewright_api::validate::{FieldError, validate_nodewright};
use serde_json::{Value, json};

pub fn base() -> Value {
    json!({
        "packages": {
            "tuning": {
                "version": "1.0.0",
                "plugin": "registry.example.com/plugins/sysctl:1.0.0",
                "capabilities": {"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}], "sysctl": ["net.ipv4.ip_forward"]},
                "configMap": {"net.ipv4.ip_forward": "1"}
            }
        }
    })
}

pub fn with(patch: Value) -> Value {
    let mut v = base();
    merge(&mut v, patch);
    v
}

pub fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                if v.is_null() {
                    a.remove(&k);
                } else {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (a, b) => *a = b,
    }
}

pub fn nw(v: Value) -> Vec<FieldError> {
    let spec: NodeWrightSpec = serde_json::from_value(v).expect("spec deserializes");
    validate_nodewright("example", &spec)
}
