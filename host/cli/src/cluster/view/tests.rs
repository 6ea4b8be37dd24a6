use nodewright_api::node_state::{Stage, Staged, State};
use serde_json::json;

use super::*;

fn node(name: &str, cordoned: bool, state: Option<&NodeState>) -> Node {
    let mut ann = serde_json::Map::new();
    if let Some(s) = state {
        ann.insert(
            keys::node_state("gpu"),
            json!(serde_json::to_string(s).unwrap()),
        );
    }
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": ann}, "spec": {"unschedulable": cordoned}})).unwrap()
}

fn cr() -> NodeWright {
    serde_json::from_value(json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": "gpu", "annotations": {"nodewright.io/pause": "true"}},
        "spec": {"packages": {"driver": {"version": "1.0.0", "plugin": "r.example/p:1"}}},
        "status": {"status": "in_progress", "completeNodes": "1/2", "nodeStatus": {"a": "complete", "b": "erroring"},
                   "conditions": [{"type": "Ready", "status": "False", "reason": "Erroring", "message": "driver: exited with 1", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    }))
    .unwrap()
}

fn state(stage: Stage, st: State) -> NodeState {
    let mut p = PackageStatus::new("driver", "1.0.0", stage, 1);
    p.state = st;
    if st == State::Erroring {
        p.message = "exited with 1".into();
    }
    [("driver|1.0.0".to_string(), p)].into()
}

#[test]
fn the_overview_shows_flags_and_what_is_wrong() {
    let s = summaries(&[cr()]);
    assert!(s[0].paused && !s[0].disabled);
    assert_eq!(
        s[0].problems,
        vec!["Ready=False: driver: exited with 1".to_string()]
    );
    let t = summaries_table(&s, false);
    assert!(
        t.lines()
            .nth(1)
            .unwrap()
            .starts_with("gpu         in_progress  1/2       paused"),
        "{t}"
    );
    let w = summaries_table(&s, true);
    assert!(
        w.lines().next().unwrap().contains("OBSERVED/GEN  PACKAGES"),
        "{w}"
    );
    assert!(
        w.lines()
            .nth(1)
            .unwrap()
            .contains("-/0           driver:1.0.0"),
        "{w}"
    );

    // Outside its windows: when the next opens, and why it waits.
    let mut held = cr();
    let st = held.status.as_mut().unwrap();
    st.next_window = Some("2026-12-01T21:00:00Z".into());
    st.conditions[0].reason = "OutsideMaintenanceWindow".into();
    st.conditions[0].message = "0/2 node(s) complete; every maintenance window is closed, the next opens at 2026-12-01T21:00:00Z".into();
    let t = summaries_table(&summaries(&[held]), false);
    assert!(
        t.contains("paused,next-window=2026-12-01T21:00:00Z")
            && t.contains("every maintenance window is closed"),
        "{t}"
    );
}

#[test]
fn node_rows_have_a_column_per_package() {
    let nodes = [
        node("b", true, Some(&state(Stage::Apply, State::Erroring))),
        node("a", false, Some(&state(Stage::Config, State::Complete))),
        node("c", false, None),
    ];
    let rows = node_rows(&cr(), &nodes);
    assert_eq!(
        rows.iter().map(|r| r.node.as_str()).collect::<Vec<_>>(),
        ["a", "b"],
        "sorted; the unrelated node left out"
    );
    let t = node_rows_table(&cr(), &rows, false);
    assert!(
        t.contains("b     erroring  yes       apply/erroring"),
        "{t}"
    );
    assert!(!t.contains("MESSAGES"));
    let w = node_rows_table(&cr(), &rows, true);
    assert!(w.contains("apply/erroring   driver: exited with 1"), "{w}");
    let p = package_rows("gpu", Some("driver"), &nodes);
    assert_eq!(p.len(), 2);
    assert_eq!(
        (p[1].node.as_str(), p[1].stage.as_str(), p[1].state.as_str()),
        ("b", "apply", "erroring")
    );
    assert!(package_rows("gpu", Some("other"), &nodes).is_empty());
}

#[test]
fn a_node_that_staged_payloads_shows_how_much() {
    let mut staged = node("a", false, Some(&state(Stage::Plan, State::InProgress)));
    staged.metadata.annotations.as_mut().unwrap().insert(
        keys::staged("gpu"),
        Staged {
            set: "0a1b2c3d4e5f6a7b".into(),
            bytes: 300 << 20,
        }
        .to_string(),
    );
    let nodes = [
        staged,
        node("b", true, Some(&state(Stage::Apply, State::Erroring))),
    ];
    let rows = node_rows(&cr(), &nodes);
    assert_eq!(
        rows.iter().map(|r| r.staged).collect::<Vec<_>>(),
        [Some(300 << 20), None]
    );
    let t = node_rows_table(&cr(), &rows, false);
    assert!(
        t.lines().next().unwrap().contains("CORDONED  STAGED"),
        "{t}"
    );
    assert!(t.contains("300.0 MiB"), "{t}");
    // Without any staged payload the column is left out.
    let t = node_rows_table(&cr(), &node_rows(&cr(), &nodes[1..]), false);
    assert!(!t.contains("STAGED"), "{t}");
}

#[test]
fn long_messages_are_cut_unless_wide() {
    let long = format!("{}\nsecond line", "x".repeat(80));
    assert_eq!(short(&long), format!("{}…", "x".repeat(60)));
    assert_eq!(short("one line\nmore"), "one line…");
    assert_eq!(short("fits"), "fits");
    let mut rows = package_rows(
        "gpu",
        None,
        &[node(
            "a",
            false,
            Some(&state(Stage::Apply, State::Erroring)),
        )],
    );
    rows[0].message = long.clone();
    rows[0].digest = "r.example/p@sha256:abc".into();
    assert!(!package_table(&rows, false).contains("second line"));
    let w = package_table(&rows, true);
    assert!(
        w.contains("r.example/p@sha256:abc") && w.contains(&"x".repeat(80)),
        "{w}"
    );
}

#[test]
fn node_list_has_a_column_per_nodewright() {
    let mut a = node("a", true, None);
    a.metadata.labels = Some([(keys::IGNORE.to_string(), "true".to_string())].into());
    a.status = serde_json::from_value(json!({"nodeInfo": {"bootID": "boot-1", "machineID": "", "systemUUID": "", "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "", "kubeProxyVersion": "", "operatingSystem": "", "architecture": ""}, "conditions": [{"type": "Ready", "status": "True"}]})).unwrap();
    let rows = node_list(&[cr()], &[node("b", false, None), a]);
    assert_eq!(
        rows.iter()
            .map(|r| (r.node.as_str(), r.nodewrights["gpu"].as_str()))
            .collect::<Vec<_>>(),
        [("a", "complete"), ("b", "erroring")]
    );
    let t = node_list_table(&rows, false);
    assert_eq!(
        t.lines().nth(1).unwrap(),
        "a     yes      yes       complete",
        "{t}"
    );
    let w = node_list_table(&rows, true);
    assert_eq!(
        w.lines().nth(1).unwrap(),
        "a     yes      yes       True     boot-1   complete",
        "{w}"
    );
    assert_eq!(
        w.lines().nth(2).unwrap(),
        "b     -        -         Unknown           erroring",
        "{w}"
    );
}
