//! Table tests of the DeploymentPolicy rules, defaulting, and the rules that span objects
//! (updates that would strand an uninstall, policy references and deletions).

use crate::common;

use common::{base, merge, with};
use nodewright_api::v1alpha1::{DeploymentPolicySpec, NodeWrightSpec};
use nodewright_api::validate::{FieldError, validate_deployment_policy};
use serde_json::{Value, json};

fn policy(v: Value) -> Vec<FieldError> {
    let spec: DeploymentPolicySpec = serde_json::from_value(v).expect("policy deserializes");
    validate_deployment_policy("rollout", &spec)
}

#[test]
fn every_deployment_policy_rule() {
    let good = json!({
        "default": {"budget": {"percent": 25}, "strategy": {"fixed": {"initialBatch": 1}}},
        "compartments": [
            {"name": "canary", "selector": {"matchLabels": {"tier": "canary"}}, "budget": {"count": 1}, "strategy": {"linear": {"delta": 2}}},
            {"name": "production", "selector": {"matchLabels": {"tier": "prod"}}, "budget": {"percent": 10}, "strategy": {"exponential": {"growthFactor": 2, "failureThreshold": 1}}}
        ]
    });
    assert_eq!(policy(good.clone()), vec![]);
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "budget exclusive",
            json!({"default": {"budget": {"percent": 5, "count": 1}}}),
            "spec.default.budget",
            "exactly one",
        ),
        (
            "budget range",
            json!({"default": {"budget": {"percent": 0}}}),
            "spec.default.budget.percent",
            "outside 1-100",
        ),
        (
            "strategy exclusive",
            json!({"default": {"strategy": {"fixed": {}, "linear": {}}}}),
            "spec.default.strategy",
            "exactly one",
        ),
        (
            "initialBatch",
            json!({"default": {"strategy": {"fixed": {"initialBatch": 0}}}}),
            "spec.default.strategy.fixed.initialBatch",
            "at least 1",
        ),
        (
            "batchThreshold",
            json!({"default": {"strategy": {"fixed": {"batchThreshold": 101}}}}),
            "spec.default.strategy.fixed.batchThreshold",
            "outside 1-100",
        ),
        (
            "safetyLimit",
            json!({"default": {"strategy": {"fixed": {"safetyLimit": 0}}}}),
            "spec.default.strategy.fixed.safetyLimit",
            "outside 1-100",
        ),
        (
            "failureThreshold",
            json!({"default": {"strategy": {"fixed": {"failureThreshold": 0}}}}),
            "spec.default.strategy.fixed.failureThreshold",
            "at least 1",
        ),
        (
            "growthFactor",
            json!({"default": {"strategy": {"fixed": null, "exponential": {"growthFactor": 1}}}}),
            "spec.default.strategy.exponential.growthFactor",
            "at least 2",
        ),
        (
            "delta only linear",
            json!({"default": {"strategy": {"fixed": {"delta": 2}}}}),
            "spec.default.strategy.fixed.delta",
            "only for linear",
        ),
        (
            "reserved name",
            json!({"compartments": [{"name": "__default__", "selector": {"matchLabels": {"a": "b"}}, "budget": {"count": 1}}]}),
            "spec.compartments[0].name",
            "reserved",
        ),
        (
            "duplicate name",
            json!({"compartments": [
            {"name": "a", "selector": {"matchLabels": {"a": "1"}}, "budget": {"count": 1}},
            {"name": "a", "selector": {"matchLabels": {"a": "2"}}, "budget": {"count": 1}}]}),
            "spec.compartments[1].name",
            "duplicate",
        ),
        (
            "duplicate selector",
            json!({"compartments": [
            {"name": "a", "selector": {"matchLabels": {"a": "1"}}, "budget": {"count": 1}},
            {"name": "b", "selector": {"matchLabels": {"a": "1"}}, "budget": {"count": 1}}]}),
            "spec.compartments[1].selector",
            "same selector",
        ),
    ];
    for (rule, patch, path, needle) in cases {
        let mut v = good.clone();
        merge(&mut v, patch);
        let errs = policy(v);
        assert!(
            errs.iter()
                .any(|e| e.path == path && e.message.contains(needle)),
            "{rule}: expected {path}: …{needle}…, got {errs:?}"
        );
    }
}

#[test]
fn defaults_are_applied_as_nodewright_applies_them() {
    let mut spec: DeploymentPolicySpec = serde_json::from_value(
        json!({"default": {"budget": {"count": 1}, "strategy": {"linear": {}}}}),
    )
    .unwrap();
    nodewright_api::validate::default_deployment_policy(&mut spec);
    let p = spec.default.strategy.unwrap().linear.unwrap();
    assert_eq!(
        (
            p.initial_batch,
            p.delta,
            p.batch_threshold,
            p.safety_limit,
            p.failure_threshold
        ),
        (Some(1), Some(1), Some(100), Some(50), None)
    );
    assert_eq!(spec.reset_batch_state_on_completion, Some(true));
    let mut nwspec: NodeWrightSpec = serde_json::from_value(base()).unwrap();
    nodewright_api::validate::default_nodewright(&mut nwspec);
    assert_eq!(nwspec.priority, Some(200));
}

#[test]
fn update_rules_protect_uninstallable_packages() {
    use nodewright_api::node_state::{NodeState, PackageStatus, Stage, State};
    use nodewright_api::validate::validate_nodewright_update;
    use std::collections::BTreeMap;
    let spec = |version: &str, apply: bool| -> NodeWrightSpec {
        serde_json::from_value(json!({"packages": {"driver": {
            "version": version, "plugin": "r.example/p/d:1", "uninstall": {"enabled": true, "apply": apply}
        }}}))
        .unwrap()
    };
    let empty: NodeWrightSpec = serde_json::from_value(json!({"packages": {}})).unwrap();
    let mut on_node: NodeState = NodeState::new();
    on_node.insert(
        "driver|2.0.0".into(),
        PackageStatus {
            state: State::Complete,
            ..PackageStatus::new("driver", "2.0.0", Stage::Apply, 1)
        },
    );
    let tracked: BTreeMap<String, NodeState> = [("node-a".to_string(), on_node)].into();
    let none = BTreeMap::new();

    let (errs, _) = validate_nodewright_update(&spec("2.0.0", false), &empty, &tracked);
    assert!(errs[0].message.contains("node-a"), "{errs:?}");
    assert_eq!(
        validate_nodewright_update(&spec("2.0.0", true), &empty, &none).0,
        vec![],
        "removal after uninstall is fine"
    );

    let (errs, _) = validate_nodewright_update(&spec("2.0.0", false), &spec("1.0.0", false), &none);
    assert_eq!(errs[0].path, "spec.packages.driver.version");
    assert_eq!(
        validate_nodewright_update(&spec("2.0.0", true), &spec("1.0.0", true), &none).0,
        vec![]
    );
    assert!(
        !validate_nodewright_update(&spec("2.0.0", true), &spec("1.0.0", true), &tracked)
            .0
            .is_empty()
    );
    assert_eq!(
        validate_nodewright_update(&spec("1.0.0", false), &spec("2.0.0", false), &tracked).0,
        vec![],
        "upgrades are fine"
    );

    let (errs, warnings) =
        validate_nodewright_update(&spec("2.0.0", true), &spec("2.0.0", false), &tracked);
    assert!(
        errs.is_empty() && warnings[0].contains("uninstall.apply turned off"),
        "{errs:?} {warnings:?}"
    );
}

#[test]
fn a_referenced_policy_must_exist_and_a_used_one_cannot_be_deleted() {
    use nodewright_api::validate::{validate_policy_delete, validate_policy_reference};
    let spec: NodeWrightSpec =
        serde_json::from_value(with(json!({"deploymentPolicy": "canary"}))).unwrap();
    let missing =
        validate_policy_reference(&spec, |n| n == "other").expect("a missing policy is an error");
    assert_eq!(missing.path, "spec.deploymentPolicy");
    assert!(
        missing.message.contains("\"canary\" does not exist"),
        "{missing}"
    );
    assert_eq!(validate_policy_reference(&spec, |n| n == "canary"), None);
    let none: NodeWrightSpec = serde_json::from_value(base()).unwrap();
    assert_eq!(
        validate_policy_reference(&none, |_| false),
        None,
        "no reference, nothing to check"
    );

    let used = validate_policy_delete("canary", &["gpu".into(), "net".into()]).expect("in use");
    assert!(
        used.message.contains("in use by NodeWright gpu, net"),
        "{used}"
    );
    assert_eq!(validate_policy_delete("canary", &[]), None);
}
