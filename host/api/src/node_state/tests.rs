use super::*;

#[test]
fn stages_parse_what_they_print() {
    for st in Stage::ALL {
        assert_eq!(st.as_str().parse::<Stage>(), Ok(st));
        assert_eq!(st.to_string(), st.as_str());
    }
    assert!("apply-check".parse::<Stage>().is_err());
}

fn done_entry() -> PackageStatus {
    let mut e = PackageStatus::new("driver", "1.0.0", Stage::PostInterrupt, 3);
    e.state = State::Complete;
    e.attempts = 2;
    e.message = "earlier failure".into();
    e.run = 1_700_000_000;
    e.boot_id = "boot-2".into();
    e.changed_keys = vec!["a.conf".into()];
    e.planned = Some(Planned {
        changes: 0,
        interrupt: None,
    });
    e
}

#[test]
fn names_are_the_serialized_ones() {
    let all = [
        Stage::Plan,
        Stage::Apply,
        Stage::Config,
        Stage::Interrupt,
        Stage::PostInterrupt,
        Stage::Upgrade,
        Stage::Uninstall,
        Stage::UninstallInterrupt,
    ];
    for st in all {
        assert_eq!(serde_json::to_value(st).unwrap(), st.as_str());
    }
    for st in [
        State::Complete,
        State::InProgress,
        State::Skipped,
        State::Erroring,
        State::Unknown,
    ] {
        assert_eq!(serde_json::to_value(st).unwrap(), st.as_str());
    }
}

#[test]
fn a_restart_is_a_new_run_of_the_stage() {
    let mut e = done_entry();
    // The clock may be behind the entry's epoch (another machine's clock): still later.
    e.restart_at(Stage::Config, 1_600_000_000);
    assert_eq!(
        (e.stage, e.state, e.attempts, e.message.as_str()),
        (Stage::Config, State::InProgress, 0, "")
    );
    assert_eq!(e.run, 1_700_000_001);
    assert_eq!(
        (e.boot_id.as_str(), e.changed_keys.len()),
        ("boot-2", 1),
        "a config rerun keeps its cycle"
    );
    assert!(e.planned.is_some());
}

#[test]
fn a_restart_clears_what_the_new_cycle_decides_again() {
    let mut e = done_entry();
    e.restart_at(Stage::Apply, 1_800_000_000);
    assert_eq!(e.run, 1_800_000_000);
    assert!(
        e.planned.is_none() && e.changed_keys.is_empty(),
        "a whole install cycle: the spec's interrupt is in scope"
    );
    let mut e = done_entry();
    e.restart_at(Stage::Interrupt, 0);
    assert!(
        e.boot_id.is_empty() && e.planned.is_none(),
        "the interrupt records the boot it starts from"
    );
    assert_eq!(
        e.changed_keys,
        ["a.conf"],
        "a config cycle's interrupt stays the config cycle's"
    );
}

#[test]
fn a_state_reads_and_writes_itself_through_its_annotation() {
    let mut st = NodeState::new();
    st.insert(state_key("driver", "1.0.0"), done_entry());
    let mut patch = BTreeMap::new();
    st.write("gpu", &mut patch);
    let raw = patch[&keys::node_state("gpu")].clone().expect("a value");
    let annotations = BTreeMap::from([(keys::node_state("gpu"), raw)]);
    assert_eq!(NodeState::read("n1", &annotations, "gpu"), Ok(st));
    assert_eq!(
        NodeState::read("n1", &annotations, "other"),
        Ok(NodeState::new())
    );
    // An empty state is no annotation at all.
    NodeState::new().write("gpu", &mut patch);
    assert_eq!(patch[&keys::node_state("gpu")], None);
}

#[test]
fn a_malformed_state_names_the_node_and_the_annotation() {
    let annotations = BTreeMap::from([(keys::node_state("gpu"), "{not json".to_string())]);
    let err = NodeState::read("n1", &annotations, "gpu").unwrap_err();
    assert_eq!(
        (err.node.as_str(), err.key.as_str()),
        ("n1", "nodewright.io/state.gpu")
    );
    assert!(
        err.to_string().starts_with("n1: nodewright.io/state.gpu: "),
        "{err}"
    );
}

#[test]
fn a_reset_clears_state_status_and_drain_marks_but_not_the_cordon() {
    let cleared = reset("gpu");
    assert!(cleared.values().all(Option::is_none));
    let all = keys("gpu");
    assert!(cleared.keys().all(|k| all.contains(k)));
    assert!(!cleared.contains_key(&keys::cordon("gpu")));
    assert_eq!(cleared.len(), all.len() - 1);
}

#[test]
fn a_staged_mark_parses_what_it_prints_and_refuses_anything_else() {
    let staged = Staged {
        set: "0a1b2c3d4e5f6a7b".into(),
        bytes: 210 << 20,
    };
    assert_eq!(staged.to_string(), "0a1b2c3d4e5f6a7b 220200960");
    assert_eq!(staged.to_string().parse::<Staged>(), Ok(staged));
    for bad in [
        "",
        "0a1b",
        "0a1b x",
        " 12",
        "0a-1 12",
        "0a1b -1",
        "0a1b 12 13",
    ] {
        let err = bad.parse::<Staged>().unwrap_err();
        assert!(err.contains("<set> <bytes>"), "{bad:?}: {err}");
    }
}
