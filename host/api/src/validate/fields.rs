//! Checks of fields several kinds share: selectors, budgets, interrupts, durations.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::units::parse_duration;
use crate::v1alpha1::{Budget, Interrupt, InterruptType};

use super::errors::Errors;

pub(super) fn check_selector(errs: &mut Errors, path: &str, sel: &LabelSelector) {
    for (i, expr) in sel.match_expressions.iter().flatten().enumerate() {
        let p = format!("{path}.matchExpressions[{i}]");
        let values = expr.values.as_deref().unwrap_or_default();
        match expr.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => errs.add(
                format!("{p}.values"),
                format!("must be non-empty for {}", expr.operator),
            ),
            "Exists" | "DoesNotExist" if !values.is_empty() => errs.add(
                format!("{p}.values"),
                format!("must be empty for {}", expr.operator),
            ),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errs.add(
                format!("{p}.operator"),
                format!("{other:?} is not In, NotIn, Exists or DoesNotExist"),
            ),
        }
        if expr.key.is_empty() {
            errs.add(format!("{p}.key"), "must not be empty");
        }
    }
    for k in sel.match_labels.iter().flatten().map(|(k, _)| k) {
        if k.is_empty() || k.contains(char::is_whitespace) {
            errs.add(
                format!("{path}.matchLabels"),
                format!("{k:?} is not a label key"),
            );
        }
    }
}

pub(super) fn check_budget(errs: &mut Errors, path: &str, b: &Budget, min: i32) {
    match (b.percent, b.count) {
        (Some(_), Some(_)) => errs.add(path, "set exactly one of percent and count"),
        (None, None) => errs.add(path, "set one of percent and count"),
        (Some(p), None) if !(min..=100).contains(&p) => errs.add(
            format!("{path}.percent"),
            format!("{p} is outside {min}-100"),
        ),
        (None, Some(c)) if c < min => errs.add(
            format!("{path}.count"),
            format!("{c} must be at least {min}"),
        ),
        _ => {}
    }
}

pub(super) fn check_interrupt(errs: &mut Errors, path: &str, i: &Interrupt) {
    match i.kind {
        InterruptType::Service if i.services.is_empty() => errs.add(
            format!("{path}.services"),
            "type service needs at least one unit",
        ),
        InterruptType::Service => {
            for (i, unit) in i.services.iter().enumerate() {
                if let Err(reason) = crate::hostargs::ServiceUnit::parse(unit) {
                    errs.add(format!("{path}.services[{i}]"), reason);
                }
            }
        }
        InterruptType::Noop | InterruptType::RestartAllServices | InterruptType::Reboot
            if !i.services.is_empty() =>
        {
            errs.add(format!("{path}.services"), "only allowed with type service")
        }
        InterruptType::Noop | InterruptType::RestartAllServices | InterruptType::Reboot => {}
    }
}

pub(super) fn check_duration(errs: &mut Errors, path: &str, d: Option<&String>) {
    if let Some(d) = d
        && let Err(e) = parse_duration(d)
    {
        errs.add(path, e);
    }
}
