//! The Grafana dashboard in deploy/grafana only queries metrics the operator documents (and
//! therefore exports: the rollout test checks docs against the exposition).

use crate::common;

#[test]
fn the_dashboard_queries_only_documented_metrics() {
    let root = nodewright_testregistry::workspace();
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/nodewright-dashboard.json")).unwrap(),
    )
    .unwrap();
    let documented = common::documented_metrics();
    let panels = dash["panels"].as_array().unwrap();
    assert!(panels.len() >= 10);
    let mut used = std::collections::BTreeSet::new();
    for p in panels {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            for word in expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("nodewright_"))
            {
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .fold(word, |w, s| w.strip_suffix(s).unwrap_or(w));
                assert!(
                    documented.iter().any(|d| d == base),
                    "panel {:?} queries {word}, which docs/operator.md does not document",
                    p["title"]
                );
                used.insert(base.to_string());
            }
        }
    }
    for must in [
        "nodewright_status",
        "nodewright_packages",
        "nodewright_stage_failures_total",
        "nodewright_compartment_nodes_completed",
        "nodewright_reconcile_duration_seconds",
    ] {
        assert!(used.contains(must), "the dashboard shows {must}");
    }
}
