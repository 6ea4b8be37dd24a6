//! `DeploymentPolicy` specs: compartments, strategies and budgets.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::names::{DEFAULT_COMPARTMENT, is_dns_label};
use crate::v1alpha1::{BatchParams, DeploymentPolicySpec, Strategy};

use super::errors::{Errors, FieldError};
use super::fields::{check_budget, check_selector};

pub(super) fn check_strategy(errs: &mut Errors, path: &str, s: &Strategy) {
    let set: Vec<(&str, &BatchParams)> = [
        ("fixed", &s.fixed),
        ("linear", &s.linear),
        ("exponential", &s.exponential),
    ]
    .into_iter()
    .filter_map(|(n, p)| p.as_ref().map(|p| (n, p)))
    .collect();
    let [(kind, p)] = set.as_slice() else {
        errs.add(path, "set exactly one of fixed, linear and exponential");
        return;
    };
    let path = format!("{path}.{kind}");
    let mut range = |field: &str, v: Option<i32>, lo: i32, hi: i32| {
        if let Some(v) = v
            && !(lo..=hi).contains(&v)
        {
            errs.add(
                format!("{path}.{field}"),
                if hi == i32::MAX {
                    format!("{v} must be at least {lo}")
                } else {
                    format!("{v} is outside {lo}-{hi}")
                },
            );
        }
    };
    range("initialBatch", p.initial_batch, 1, i32::MAX);
    range("batchThreshold", p.batch_threshold, 1, 100);
    range("failureThreshold", p.failure_threshold, 1, i32::MAX);
    range("safetyLimit", p.safety_limit, 1, 100);
    range("delta", p.delta, 1, i32::MAX);
    range("growthFactor", p.growth_factor, 2, i32::MAX);
    if *kind != "linear" && p.delta.is_some() {
        errs.add(format!("{path}.delta"), "only for linear");
    }
    if *kind != "exponential" && p.growth_factor.is_some() {
        errs.add(format!("{path}.growthFactor"), "only for exponential");
    }
}

/// Validates a DeploymentPolicy named `name`. Empty means valid.
pub fn validate_deployment_policy(name: &str, spec: &DeploymentPolicySpec) -> Vec<FieldError> {
    let mut errs = Errors(Vec::new());
    if !is_dns_label(name, 253) {
        errs.add("metadata.name", "must be a DNS label");
    }
    check_budget(&mut errs, "spec.default.budget", &spec.default.budget, 1);
    if let Some(w) = &spec.maintenance_windows {
        for (field, message) in w.validate() {
            errs.add(format!("spec.maintenanceWindows.{field}"), message);
        }
    }
    match &spec.default.strategy {
        Some(s) => check_strategy(&mut errs, "spec.default.strategy", s),
        None => errs.add("spec.default.strategy", "required"),
    }
    let mut names = BTreeSet::new();
    for (i, c) in spec.compartments.iter().enumerate() {
        let path = format!("spec.compartments[{i}]");
        if c.name == DEFAULT_COMPARTMENT {
            errs.add(
                format!("{path}.name"),
                format!("{DEFAULT_COMPARTMENT} is reserved"),
            );
        } else if !is_dns_label(&c.name, 63) {
            errs.add(
                format!("{path}.name"),
                format!("{:?} must be a DNS label", c.name),
            );
        }
        if !names.insert(c.name.as_str()) {
            errs.add(
                format!("{path}.name"),
                format!("duplicate compartment {:?}", c.name),
            );
        }
        check_selector(&mut errs, &format!("{path}.selector"), &c.selector);
        if c.selector == LabelSelector::default() {
            errs.add(
                format!("{path}.selector"),
                "an empty selector would match every node; use spec.default for that",
            );
        }
        if let Some(j) = spec.compartments[..i]
            .iter()
            .position(|o| o.selector == c.selector)
        {
            errs.add(
                format!("{path}.selector"),
                format!("same selector as spec.compartments[{j}]"),
            );
        }
        check_budget(&mut errs, &format!("{path}.budget"), &c.budget, 1);
        if let Some(s) = &c.strategy {
            check_strategy(&mut errs, &format!("{path}.strategy"), s);
        }
    }
    errs.0
}
