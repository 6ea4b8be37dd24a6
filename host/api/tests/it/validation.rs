//! Table tests of the NodeWright rules: each with a failing and a passing case, plus a
//! property test feeding random specs to validation.

use crate::common;

use common::{base, nw, with};
use nodewright_api::v1alpha1::NodeWrightSpec;
use nodewright_api::validate::validate_nodewright;
use serde_json::{Value, json};

/// (rule, patch that breaks it, expected path, expected message part)
fn nodewright_cases() -> Vec<(&'static str, Value, &'static str, &'static str)> {
    let pkg = |p: Value| json!({"packages": {"tuning": p}});
    vec![
        (
            "budget xor policy",
            json!({"interruptionBudget": {"count": 1}, "deploymentPolicy": "canary"}),
            "spec.deploymentPolicy",
            "not both",
        ),
        (
            "budget exclusive",
            json!({"interruptionBudget": {"count": 1, "percent": 10}}),
            "spec.interruptionBudget",
            "exactly one",
        ),
        (
            "budget range",
            json!({"interruptionBudget": {"percent": 101}}),
            "spec.interruptionBudget.percent",
            "outside 0-100",
        ),
        (
            "pull secret name",
            json!({"imagePullSecret": "Reg_Cred"}),
            "spec.imagePullSecret",
            "not a valid Secret name",
        ),
        (
            "priority",
            json!({"priority": 0}),
            "spec.priority",
            "at least 1",
        ),
        (
            "selector operator",
            json!({"nodeSelectors": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}),
            "spec.nodeSelectors.matchExpressions[0].operator",
            "not In",
        ),
        (
            "selector values",
            json!({"podNonInterruptLabels": {"matchExpressions": [{"key": "a", "operator": "In"}]}}),
            "spec.podNonInterruptLabels.matchExpressions[0].values",
            "non-empty",
        ),
        (
            "drain timeout",
            json!({"drainConfig": {"timeout": "soon"}}),
            "spec.drainConfig.timeout",
            "not a duration",
        ),
        (
            "cordon-after needs runtimeRequired",
            json!({"runtimeRequiredCordonAfter": true}),
            "spec.runtimeRequiredCordonAfter",
            "runtimeRequired",
        ),
        (
            "package version semver",
            pkg(json!({"version": "1.0"})),
            "spec.packages.tuning.version",
            "semantic version",
        ),
        (
            "plugin reference",
            pkg(json!({"plugin": "sysctl"})),
            "spec.packages.tuning.plugin",
            "registry",
        ),
        (
            "plugin pinned",
            pkg(json!({"plugin": "registry.example.com/plugins/sysctl"})),
            "spec.packages.tuning.plugin",
            "tag or a digest",
        ),
        (
            "plugin digest",
            pkg(json!({"plugin": "registry.example.com/p/s@sha256:abc"})),
            "spec.packages.tuning.plugin",
            "64 lowercase hex",
        ),
        (
            "payload name",
            pkg(json!({"payloads": [{"name": ".hidden", "image": "r.example/nvidia/driver:560"}]})),
            "spec.packages.tuning.payloads[0].name",
            "payload name",
        ),
        (
            "payload named twice",
            pkg(json!({"payloads": [
                {"name": "driver", "image": "r.example/nvidia/driver:560"},
                {"name": "driver", "image": "r.example/nvidia/fw:1"}
            ]})),
            "spec.packages.tuning.payloads[1].name",
            "named twice",
        ),
        (
            "payload image",
            pkg(json!({"payloads": [{"name": "driver", "image": "nvidia-driver"}]})),
            "spec.packages.tuning.payloads[0].image",
            "registry",
        ),
        (
            "payload path",
            pkg(
                json!({"payloads": [{"name": "driver", "image": "r.example/nvidia/driver:560", "path": "/opt/../etc"}]}),
            ),
            "spec.packages.tuning.payloads[0].path",
            "inside the image",
        ),
        (
            "grant glob",
            pkg(json!({"capabilities": {"kernelModules": ["ok", "nv[idia"]}})),
            "spec.packages.tuning.capabilities.kernelModules[1]",
            "not a valid glob",
        ),
        (
            "grant path absolute",
            pkg(json!({"capabilities": {"files": [{"path": "etc"}]}})),
            "spec.packages.tuning.capabilities.files[0].path",
            "not an absolute path",
        ),
        (
            "grant path escape",
            pkg(json!({"capabilities": {"files": [{"path": "/etc/../root"}]}})),
            "spec.packages.tuning.capabilities.files[0].path",
            "..",
        ),
        (
            "service interrupt needs units",
            pkg(json!({"interrupt": {"type": "service"}})),
            "spec.packages.tuning.interrupt.services",
            "at least one",
        ),
        (
            "interrupt units are unit names",
            pkg(json!({"interrupt": {"type": "service", "services": ["--root=/x"]}})),
            "spec.packages.tuning.interrupt.services[0]",
            "starts with",
        ),
        (
            "interrupts never restart power targets",
            pkg(
                json!({"interrupt": {"type": "service", "services": ["a.service", "poweroff.target"]}}),
            ),
            "spec.packages.tuning.interrupt.services[1]",
            ".service units only",
        ),
        (
            "interrupts never restart systemd's power services",
            pkg(json!({"interrupt": {"type": "service", "services": ["systemd-reboot.service"]}})),
            "spec.packages.tuning.interrupt.services[0]",
            "power grant",
        ),
        (
            "config interrupts follow the same rule",
            pkg(
                json!({"configInterrupts": {"k": {"type": "service", "services": ["emergency.target"]}}}),
            ),
            "spec.packages.tuning.configInterrupts.k.services[0]",
            ".service units only",
        ),
        (
            "services only for service",
            pkg(json!({"interrupt": {"type": "reboot", "services": ["a.service"]}})),
            "spec.packages.tuning.interrupt.services",
            "only allowed",
        ),
        (
            "configMap key",
            pkg(json!({"configMap": {"a/b": "x"}})),
            "spec.packages.tuning.configMap",
            "must be letters",
        ),
        (
            "configInterrupt matches a key",
            pkg(json!({"configInterrupts": {"vm.*": {"type": "reboot"}}})),
            "spec.packages.tuning.configInterrupts.vm.*",
            "matches no configMap key",
        ),
        (
            "resources positive",
            pkg(
                json!({"resources": {"cpuRequest": "0", "cpuLimit": "1", "memoryRequest": "1Mi", "memoryLimit": "2Mi"}}),
            ),
            "spec.packages.tuning.resources.cpuRequest",
            "positive",
        ),
        (
            "resources limit >= request",
            pkg(
                json!({"resources": {"cpuRequest": "2", "cpuLimit": "1", "memoryRequest": "1Mi", "memoryLimit": "2Mi"}}),
            ),
            "spec.packages.tuning.resources.cpuLimit",
            "at least cpuRequest",
        ),
        (
            "memory limit leaves agent headroom",
            pkg(
                json!({"resources": {"cpuRequest": "1", "cpuLimit": "1", "memoryRequest": "64Mi", "memoryLimit": "128Mi"}}),
            ),
            "spec.packages.tuning.resources.memoryLimit",
            "at least 192Mi",
        ),
        (
            "headroom follows sandbox.memory",
            pkg(
                json!({"sandbox": {"memory": "512Mi"}, "resources": {"cpuRequest": "1", "cpuLimit": "1", "memoryRequest": "64Mi", "memoryLimit": "512Mi"}}),
            ),
            "spec.packages.tuning.resources.memoryLimit",
            "at least 576Mi",
        ),
        (
            "sandbox memory quantity",
            pkg(json!({"sandbox": {"memory": "lots"}})),
            "spec.packages.tuning.sandbox.memory",
            "not a quantity",
        ),
        (
            "sandbox write bytes whole",
            pkg(json!({"sandbox": {"writeBytes": "0.5"}})),
            "spec.packages.tuning.sandbox.writeBytes",
            "whole, positive",
        ),
        (
            "special modes need readWrite",
            pkg(json!({"capabilities": {"files": [{"path": "/opt/bin", "specialModes": true}]}})),
            "spec.packages.tuning.capabilities.files[0].specialModes",
            "readWrite",
        ),
        (
            "module grant is never an option",
            pkg(json!({"capabilities": {"kernelModules": ["-C"]}})),
            "spec.packages.tuning.capabilities.kernelModules[0]",
            "starts with '-'",
        ),
        (
            "stage timeout",
            pkg(json!({"stageTimeout": "-1h"})),
            "spec.packages.tuning.stageTimeout",
            "not a duration",
        ),
        (
            "uninstall apply needs enabled",
            pkg(json!({"uninstall": {"apply": true}})),
            "spec.packages.tuning.uninstall.apply",
            "requires uninstall.enabled",
        ),
        (
            "dependency exists",
            pkg(json!({"dependsOn": {"ghost": "1.0.0"}})),
            "spec.packages.tuning.dependsOn.ghost",
            "no package",
        ),
        (
            "dependency on itself",
            pkg(json!({"dependsOn": {"tuning": "1.0.0"}})),
            "spec.packages.tuning.dependsOn.tuning",
            "itself",
        ),
    ]
}

#[test]
fn every_nodewright_rule_fails_with_its_field_path_and_the_base_passes() {
    assert_eq!(nw(base()), vec![], "the base spec is valid");
    for (rule, patch, path, needle) in nodewright_cases() {
        let errs = nw(with(patch));
        assert!(
            errs.iter()
                .any(|e| e.path == path && e.message.contains(needle)),
            "{rule}: expected {path}: …{needle}…, got {errs:?}"
        );
    }
}

#[test]
fn package_names_and_unknown_fields() {
    let errs = nw(json!({"packages": {"Bad_Name": base()["packages"]["tuning"].clone()}}));
    assert!(
        errs.iter().any(|e| e.path == "spec.packages.Bad_Name"),
        "{errs:?}"
    );
    // `name` in the body (NodeWright rejects it) and other unknown fields fail to parse.
    let bad = with(json!({"packages": {"tuning": {"name": "tuning"}}}));
    assert!(
        serde_json::from_value::<NodeWrightSpec>(bad)
            .unwrap_err()
            .to_string()
            .contains("unknown field `name`")
    );
    let spec: NodeWrightSpec = serde_json::from_value(base()).unwrap();
    assert!(!validate_nodewright("Not A Name", &spec).is_empty());
    assert!(
        validate_nodewright(&"a".repeat(49), &spec)
            .iter()
            .any(|e| e.path == "metadata.name")
    );
}

#[test]
fn dependencies_must_match_versions_and_cycles_are_rejected() {
    let two = |a_dep: Value, b_dep: Value| {
        json!({"packages": {
            "alpha": {"version": "1.0.0", "plugin": "r.example/p/a:1", "dependsOn": a_dep},
            "beta": {"version": "2.0.0", "plugin": "r.example/p/b:1", "dependsOn": b_dep},
        }})
    };
    assert_eq!(nw(two(json!({"beta": "2.0.0"}), json!({}))), vec![]);
    let errs = nw(two(json!({"beta": "1.0.0"}), json!({})));
    assert!(
        errs.iter()
            .any(|e| e.path == "spec.packages.alpha.dependsOn.beta"
                && e.message.contains("does not match")),
        "{errs:?}"
    );
    let errs = nw(two(json!({"beta": "2.0.0"}), json!({"alpha": "1.0.0"})));
    assert!(
        errs.iter().any(|e| e
            .message
            .contains("dependency cycle: alpha -> beta -> alpha")),
        "{errs:?}"
    );
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn scalar() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<i32>().prop_map(|n| json!(n)),
            "[ -~]{0,12}".prop_map(|s| json!(s)),
            any::<bool>().prop_map(|b| json!(b)),
            Just(json!("1.0.0")),
            Just(json!("r.example/p/x:1")),
            Just(json!("*")),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Random specs never make validation panic; specs that parse get a verdict.
        #[test]
        fn validation_never_panics(
            names in prop::collection::vec("[a-z][a-z0-9-]{0,6}[a-z]", 1..4),
            versions in prop::collection::vec(scalar(), 1..4),
            globs in prop::collection::vec("[a-z.*\\[\\]/]{0,8}", 0..4),
            deps in prop::collection::vec(0usize..4, 0..4),
            budget in prop::option::of(scalar()),
            timeout in scalar(),
        ) {
            let mut packages = serde_json::Map::new();
            for (i, n) in names.iter().enumerate() {
                let dep = deps.get(i).and_then(|d| names.get(*d)).cloned().unwrap_or_default();
                packages.insert(n.clone(), json!({
                    "version": versions[i % versions.len()],
                    "plugin": "r.example/p/x:1",
                    "capabilities": {"kernelModules": globs, "sysctl": globs, "files": globs.iter().map(|g| json!({"path": g})).collect::<Vec<_>>()},
                    "configMap": {"a.b": "1"},
                    "configInterrupts": globs.iter().map(|g| (g.clone(), json!({"type": "reboot"}))).collect::<serde_json::Map<_, _>>(),
                    "dependsOn": if dep.is_empty() { json!({}) } else { json!({dep: versions[0]}) },
                    "stageTimeout": timeout,
                }));
            }
            let spec = json!({"packages": packages, "interruptionBudget": {"percent": budget}});
            if let Ok(spec) = serde_json::from_value::<NodeWrightSpec>(spec) {
                let _ = validate_nodewright("fuzz", &spec);
            }
        }
    }
}
