//! The shipped alert rules (`deploy/chart/nodewright/files/alerts.yaml`): valid for the real
//! `promtool`, each alert with a runbook that exists in docs/operations.md, each metric one
//! the operator documents; and one of them firing in a real Prometheus that scrapes the real
//! operator while a node fails for good.

use crate::common;
use crate::prometheus::Prometheus;
use crate::specs::{LIMIT, commands, cr};

use std::process::Command;

use common::E2e;
use nodewright_api::v1alpha1::Status;
use serde_json::{Value, json};

fn rules_path() -> std::path::PathBuf {
    nodewright_testregistry::workspace().join("deploy/chart/nodewright/files/alerts.yaml")
}

fn rules() -> Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(rules_path()).unwrap()).unwrap()
}

fn alerts(rules: &Value) -> Vec<&Value> {
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect()
}

#[test]
fn the_alert_rules_are_valid_documented_and_each_has_its_runbook() {
    let out = Command::new("/usr/bin/promtool")
        .arg("check")
        .arg("rules")
        .arg(rules_path())
        .output()
        .expect("/usr/bin/promtool (Debian's prometheus package; cargo xtask setup installs it)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let ops =
        std::fs::read_to_string(nodewright_testregistry::workspace().join("docs/operations.md"))
            .unwrap();
    let documented = common::documented_metrics();
    let rules = rules();
    let alerts = alerts(&rules);
    assert!(alerts.len() >= 6, "{alerts:?}");
    for a in alerts {
        let name = a["alert"].as_str().unwrap();
        let runbook = a["annotations"]["runbook_url"].as_str().unwrap_or_default();
        assert_eq!(
            runbook,
            format!("docs/operations.md#runbook-{}", name.to_lowercase()),
            "{name}'s runbook link"
        );
        assert!(
            ops.contains(&format!("### Runbook: {name}\n")),
            "docs/operations.md has no runbook for {name}"
        );
        assert!(
            ops.contains(&format!("| `{name}` |")),
            "docs/operations.md's alert table lacks {name}"
        );
        assert!(
            matches!(
                a["labels"]["severity"].as_str(),
                Some("warning" | "critical")
            ),
            "{name}: severity"
        );
        let expr = a["expr"].as_str().unwrap();
        for metric in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("nodewright_"))
        {
            assert!(
                documented.iter().any(|d| d == metric),
                "{name} uses {metric}, which docs/operator.md does not document"
            );
        }
    }
}

/// The firing alerts Prometheus reports: `(alertname, labels)`.
async fn firing(prom: &Prometheus) -> Vec<(String, Value)> {
    let Ok(resp) = reqwest::get(format!("{}/api/v1/alerts", prom.url())).await else {
        return Vec::new();
    };
    let body: Value =
        serde_json::from_str(&resp.text().await.unwrap_or_default()).unwrap_or_default();
    body["data"]["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["state"] == "firing")
        .map(|a| {
            (
                a["labels"]["alertname"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                a["labels"].clone(),
            )
        })
        .collect()
}

/// A real Prometheus scrapes the real operator and evaluates the shipped rules, their `for`
/// durations cut to zero (the only change: nobody waits 15 minutes in a test). A node whose
/// package fails for good fires `NodewrightNodeErroring` naming the node and NodeWright; the
/// leader alert stays quiet while the operator leads.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_that_fails_for_good_fires_its_alert_in_a_real_prometheus() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("a1", &[])]).await;
    e.script(
        "/usr/local/bin/broken",
        "echo 'no driver for this card' >&2; exit 1",
    );
    let metrics = nodewright_testregistry::free_port();
    e.start_operator(&[
        "--job-backoff-limit=0",
        "--leader-elect",
        &format!("--metrics-addr=127.0.0.1:{metrics}"),
    ]);
    let shipped = std::fs::read_to_string(rules_path()).unwrap();
    let quick: String = shipped
        .lines()
        .map(|l| match l.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 0s", &l[..l.len() - l.trim_start().len()]),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert_ne!(quick, shipped, "the rules have `for` durations to cut");
    let work = tempfile::tempdir().unwrap();
    let prom = Prometheus::start(&work.path().join("prometheus"), &quick, Some(metrics));

    e.apply(cr(
        "drivers",
        json!({"packages": {"broken": {
            "version": "1.0.0", "plugin": e.plugin("shell"),
            "capabilities": commands(&["/usr/local/bin/broken"]),
            "configMap": {"apply": "/usr/local/bin/broken"}
        }}}),
    ))
    .await;
    e.wait("a1 erroring", LIMIT, || async {
        (e.node_status("drivers", "a1").await == Some(Status::Erroring)).then_some(())
    })
    .await;
    let labels = e
        .wait("NodewrightNodeErroring firing", LIMIT, || async {
            firing(&prom)
                .await
                .into_iter()
                .find(|(name, _)| name == "NodewrightNodeErroring")
                .map(|(_, labels)| labels)
        })
        .await;
    assert_eq!(
        (labels["node"].as_str(), labels["nodewright"].as_str()),
        (Some("a1"), Some("drivers")),
        "{labels}\n{}",
        prom.log()
    );
    assert_eq!(labels["severity"], "warning");
    let all = firing(&prom).await;
    assert!(
        !all.iter().any(|(name, _)| name == "NodewrightNoLeader"),
        "the operator leads: {all:?}"
    );
}
