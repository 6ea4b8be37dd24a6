//! Label selectors and taint tolerations, evaluated as Kubernetes does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Whether `labels` match `selector` (`None` or an empty selector matches everything).
pub fn matches(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    let Some(s) = selector else { return true };
    let by_label = s
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    by_label
        && s.match_expressions.iter().flatten().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
                "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
                "Exists" => labels.contains_key(&e.key),
                "DoesNotExist" => !labels.contains_key(&e.key),
                _ => false,
            }
        })
}

/// Whether a selector selects nothing at all (used for `podNonInterruptLabels`, where an
/// empty selector means "no pod").
pub fn is_empty(selector: Option<&LabelSelector>) -> bool {
    selector.is_none_or(|s| {
        s.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
            && s.match_expressions.as_ref().is_none_or(Vec::is_empty)
    })
}

/// Whether `toleration` tolerates `taint`.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect_ok = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key_ok = match toleration.key.as_deref() {
        None | Some("") => toleration.operator.as_deref() == Some("Exists"),
        Some(k) => k == taint.key,
    };
    let value_ok = match toleration.operator.as_deref() {
        Some("Exists") => true,
        _ => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
    };
    effect_ok && key_ok && value_ok
}

/// Taints of a node (`NoSchedule`/`NoExecute`) none of `tolerations` tolerates.
pub fn untolerated<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Vec<&'a Taint> {
    taints
        .iter()
        .filter(|t| t.effect != "PreferNoSchedule" && t.key != "node.kubernetes.io/unschedulable")
        .filter(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_match_like_kubernetes() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("pool", "gpu")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "zone".into(),
                operator: "In".into(),
                values: Some(vec!["a".into(), "b".into()]),
            }]),
        };
        assert!(matches(
            Some(&sel),
            &labels(&[("pool", "gpu"), ("zone", "a")])
        ));
        assert!(!matches(
            Some(&sel),
            &labels(&[("pool", "gpu"), ("zone", "c")])
        ));
        assert!(!matches(Some(&sel), &labels(&[("zone", "a")])));
        assert!(matches(None, &labels(&[])));
        assert!(is_empty(Some(&LabelSelector::default())) && !is_empty(Some(&sel)));
    }

    #[test]
    fn tolerations_follow_operator_key_value_and_effect() {
        let taint = Taint {
            key: "dedicated".into(),
            value: Some("gpu".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        let equal = Toleration {
            key: Some("dedicated".into()),
            operator: Some("Equal".into()),
            value: Some("gpu".into()),
            ..Default::default()
        };
        let wrong = Toleration {
            value: Some("cpu".into()),
            ..equal.clone()
        };
        let exists_all = Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        };
        assert!(
            tolerates(&equal, &taint)
                && !tolerates(&wrong, &taint)
                && tolerates(&exists_all, &taint)
        );
        assert_eq!(untolerated(std::slice::from_ref(&taint), &[wrong]).len(), 1);
        assert!(untolerated(std::slice::from_ref(&taint), &[equal]).is_empty());
    }
}
