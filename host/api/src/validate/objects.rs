//! Whole objects: a manifest of either kind, and the rules that need another object (a
//! policy a NodeWright names, the NodeWrights a policy deletion strands, an update).

use std::collections::BTreeMap;

use crate::v1alpha1::{DeploymentPolicySpec, NodeWrightSpec};

use super::errors::{Errors, FieldError};

use super::defaults::{default_deployment_policy, default_nodewright};
use super::nodewright::validate_nodewright;
use super::policy::validate_deployment_policy;

/// Validates one manifest (as JSON): a `NodeWright` or a `DeploymentPolicy` of
/// `nodewright.io/v1alpha1`. Returns `(kind, name)` when valid.
pub fn validate_manifest(doc: &serde_json::Value) -> Result<(String, String), Vec<FieldError>> {
    let err = |path: &str, message: String| {
        vec![FieldError {
            path: path.into(),
            message,
        }]
    };
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default().to_string();
    let name = doc["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if api_version != "nodewright.io/v1alpha1" {
        return Err(err(
            "apiVersion",
            format!("{api_version:?} is not nodewright.io/v1alpha1"),
        ));
    }
    let spec = doc.get("spec").cloned().unwrap_or(serde_json::Value::Null);
    let errors = match kind.as_str() {
        "NodeWright" => match serde_json::from_value::<NodeWrightSpec>(spec) {
            Ok(mut s) => {
                default_nodewright(&mut s);
                validate_nodewright(&name, &s)
            }
            Err(e) => err("spec", e.to_string()),
        },
        "DeploymentPolicy" => match serde_json::from_value::<DeploymentPolicySpec>(spec) {
            Ok(mut s) => {
                default_deployment_policy(&mut s);
                validate_deployment_policy(&name, &s)
            }
            Err(e) => err("spec", e.to_string()),
        },
        "PluginTrustPolicy" => {
            match serde_json::from_value::<crate::trust::PluginTrustPolicySpec>(spec) {
                Ok(s) => crate::trust::validate(&s)
                    .into_iter()
                    .map(|(path, message)| FieldError { path, message })
                    .collect(),
                Err(e) => err("spec", e.to_string()),
            }
        }
        other => err(
            "kind",
            format!("{other:?} is not NodeWright, DeploymentPolicy or PluginTrustPolicy"),
        ),
    };
    if errors.is_empty() {
        Ok((kind, name))
    } else {
        Err(errors)
    }
}

/// The cross-object rule on a NodeWright: `spec.deploymentPolicy` must name a policy that
/// exists (`exists` answers for a name).
pub fn validate_policy_reference(
    spec: &NodeWrightSpec,
    exists: impl Fn(&str) -> bool,
) -> Option<FieldError> {
    let name = spec.deployment_policy.as_deref()?;
    (!exists(name)).then(|| FieldError {
        path: "spec.deploymentPolicy".into(),
        message: format!("DeploymentPolicy {name:?} does not exist; create it first"),
    })
}

/// The rule on deleting a DeploymentPolicy: refused while NodeWrights (`users`) reference it.
pub fn validate_policy_delete(policy: &str, users: &[String]) -> Option<FieldError> {
    (!users.is_empty()).then(|| FieldError {
        path: "metadata.name".into(),
        message: format!(
            "DeploymentPolicy {policy:?} is in use by NodeWright {}; point their spec.deploymentPolicy elsewhere first",
            users.join(", ")
        ),
    })
}

/// What an update may not do, given the package states recorded on nodes
/// (`node name → NodeState`, from the `nodewright.io/state.<cr>` annotations).
///
/// Rules (NodeWright's update-only checks):
/// - removing a package with `uninstall.enabled` is rejected while any node still records
///   it (uninstall it first with `uninstall.apply: true`);
/// - downgrading a package with `uninstall.enabled` is rejected unless the old spec already
///   had `uninstall.apply: true` and no node records it any more;
/// - turning `uninstall.apply` from true to false is allowed with a warning.
///
/// Returns `(errors, warnings)`.
pub fn validate_nodewright_update(
    old: &NodeWrightSpec,
    new: &NodeWrightSpec,
    node_states: &BTreeMap<String, crate::node_state::NodeState>,
) -> (Vec<FieldError>, Vec<String>) {
    let mut errs = Errors(Vec::new());
    let mut warnings = Vec::new();
    let nodes_with = |pkg: &str| -> Vec<&str> {
        node_states
            .iter()
            .filter(|(_, s)| s.values().any(|p| p.name == pkg))
            .map(|(n, _)| n.as_str())
            .collect()
    };
    for (name, before) in &old.packages {
        let enabled = before.uninstall.as_ref().is_some_and(|u| u.enabled);
        let applied = before.uninstall.as_ref().is_some_and(|u| u.apply);
        let path = format!("spec.packages.{name}");
        match new.packages.get(name) {
            None if enabled => {
                let nodes = nodes_with(name);
                if !nodes.is_empty() {
                    errs.add(&path, format!("cannot remove a package with uninstall.enabled while nodes still have it ({}); set uninstall.apply: true first", nodes.join(", ")));
                }
            }
            None => {}
            Some(after) => {
                if let (Ok(a), Ok(b)) = (
                    semver::Version::parse(&before.version),
                    semver::Version::parse(&after.version),
                ) && b < a
                    && enabled
                    && !(applied && nodes_with(name).is_empty())
                {
                    errs.add(format!("{path}.version"), format!("downgrade {a} -> {b} of a package with uninstall.enabled needs it uninstalled everywhere first"));
                }
                if applied && !after.uninstall.as_ref().is_some_and(|u| u.apply) {
                    warnings.push(format!("{path}.uninstall.apply turned off: nodes already uninstalled will install the package again"));
                }
            }
        }
    }
    (errs.0, warnings)
}
