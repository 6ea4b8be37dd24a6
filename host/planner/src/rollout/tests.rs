use super::*;
use crate::NodeFacts;

fn node(name: &str, tier: &str) -> ObservedNode {
    ObservedNode::new(NodeFacts {
        name: name.into(),
        labels: [("tier".to_string(), tier.to_string())].into(),
        ..Default::default()
    })
}

fn policy(json: serde_json::Value) -> DeploymentPolicySpec {
    serde_json::from_value(json).unwrap()
}

#[test]
fn overlapping_compartments_resolve_by_safety_then_ceiling_then_name() {
    let p = policy(serde_json::json!({
        "default": {"budget": {"count": 1}},
        "compartments": [
            {"name": "fast", "selector": {"matchLabels": {"tier": "a"}}, "budget": {"count": 5}, "strategy": {"exponential": {"initialBatch": 1}}},
            {"name": "safe", "selector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, "budget": {"count": 5}, "strategy": {"fixed": {"initialBatch": 1}}},
            {"name": "b-small", "selector": {"matchLabels": {"tier": "b"}}, "budget": {"count": 1}},
            {"name": "a-big", "selector": {"matchLabels": {"tier": "b"}}, "budget": {"count": 3}}
        ]
    }));
    // Drop "safe" for the tie-break checks: b-small and a-big (no strategy) differ by ceiling.
    let nodes = [node("n1", "a"), node("n2", "b"), node("n3", "c")];
    let refs: Vec<&ObservedNode> = nodes.iter().collect();
    let got = assign(Some(&p), &refs);
    let names = |c: &str| {
        got.get(c)
            .map(|v| v.iter().map(|n| n.name.clone()).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert_eq!(
        names("safe"),
        ["n1", "n2", "n3"],
        "fixed beats exponential and no strategy"
    );
    let mut p2 = p.clone();
    p2.compartments.retain(|c| c.name != "safe");
    let got = assign(Some(&p2), &refs);
    let names = |c: &str| {
        got.get(c)
            .map(|v| v.iter().map(|n| n.name.clone()).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert_eq!(names("fast"), ["n1"]);
    assert_eq!(
        names("b-small"),
        ["n2"],
        "same safety: the smaller ceiling wins over the name"
    );
    assert_eq!(names(DEFAULT), ["n3"], "no match: the default compartment");
}

#[test]
fn batches_are_sticky_until_each_member_is_done_or_failed() {
    let rules = Rules {
        budget: Budget {
            count: Some(2),
            percent: None,
        },
        strategy: None,
    };
    let first = batch(
        &rules,
        None,
        &[
            ("a", Standing::Eligible),
            ("b", Standing::Eligible),
            ("c", Standing::Eligible),
        ],
        &era(1, "p:1"),
    );
    assert_eq!(first.members(), ["a", "b"]);
    // a is done, b still working: the batch holds; c does not start.
    let held = batch(
        &rules,
        Some(&first.status),
        &[
            ("a", Standing::Done),
            ("b", Standing::Eligible),
            ("c", Standing::Eligible),
        ],
        &era(1, "p:1"),
    );
    assert_eq!(held.members(), ["a", "b"]);
    // b failed: the batch is evaluated and the next one picks c (failed nodes are not re-picked).
    let next = batch(
        &rules,
        Some(&held.status),
        &[
            ("a", Standing::Done),
            ("b", Standing::Failed),
            ("c", Standing::Eligible),
        ],
        &era(1, "p:1"),
    );
    assert_eq!(next.members(), ["c"]);
    let state = next.status.batch_state.unwrap();
    assert_eq!(
        (
            state.current_batch,
            state.completed_nodes,
            state.failed_nodes
        ),
        (2, 1, 1)
    );
}

fn era(generation: i64, versions: &str) -> Era {
    Era {
        generation,
        versions: versions.into(),
        reset_on_version_change: true,
    }
}

#[test]
fn a_version_change_restarts_the_counters_and_keeps_the_members_at_work() {
    let rules = Rules {
        budget: Budget {
            count: Some(2),
            percent: None,
        },
        strategy: Some(Strategy {
            fixed: Some(BatchParams {
                initial_batch: Some(2),
                ..Default::default()
            }),
            ..Default::default()
        }),
    };
    let all = |s: Standing| [("a", s), ("b", s), ("c", s), ("d", s)];
    let first = batch(&rules, None, &all(Standing::Eligible), &era(1, "p:1"));
    let done = batch(
        &rules,
        Some(&first.status),
        &[
            ("a", Standing::Done),
            ("b", Standing::Done),
            ("c", Standing::Eligible),
            ("d", Standing::Eligible),
        ],
        &era(1, "p:1"),
    );
    assert_eq!(done.members(), ["c", "d"]);
    // Version 2 while c and d work: a and b need it too.
    let bumped = batch(
        &rules,
        Some(&done.status),
        &all(Standing::Eligible),
        &era(2, "p:2"),
    );
    assert_eq!(bumped.members(), ["c", "d"], "the batch at work is kept");
    let state = bumped.status.batch_state.clone().unwrap();
    assert_eq!(
        (state.generation, state.completed_nodes, state.current_batch),
        (2, 0, 1)
    );
    let after = batch(
        &rules,
        Some(&bumped.status),
        &[
            ("a", Standing::Eligible),
            ("b", Standing::Eligible),
            ("c", Standing::Done),
            ("d", Standing::Done),
        ],
        &era(2, "p:2"),
    );
    assert_eq!(
        after.members(),
        ["a", "b"],
        "the untouched nodes get the next batch"
    );
    assert_eq!(after.status.batch_state.unwrap().completed_nodes, 2);
}

#[test]
fn a_config_edit_keeps_a_stop_and_the_batch_position_but_not_the_progress() {
    let stopped = BatchState {
        current_batch: 3,
        completed_nodes: 4,
        failed_nodes: 2,
        should_stop: true,
        consecutive_failures: 2,
        generation: 1,
        versions: "p:1".into(),
        ..Default::default()
    };
    let carried = era(2, "p:1").carry(Some(&stopped));
    assert!(carried.should_stop);
    assert_eq!(
        (
            carried.current_batch,
            carried.completed_nodes,
            carried.failed_nodes,
            carried.generation
        ),
        (3, 0, 0, 2)
    );
    let versioned = era(2, "p:2").carry(Some(&stopped));
    assert!(!versioned.should_stop);
    assert_eq!(versioned.current_batch, 1);
    let kept = Era {
        reset_on_version_change: false,
        ..era(2, "p:2")
    }
    .carry(Some(&stopped));
    assert!(
        kept.should_stop,
        "resetBatchStateOnCompletion: false keeps the stop"
    );
    assert_eq!(kept.completed_nodes, 0, "but never the old spec's progress");
    assert_eq!(era(1, "p:1").carry(Some(&stopped)), stopped);
}

/// `batch_of` over handles answers as `batch` over the same nodes' names, including a last
/// batch whose members left the compartment or are listed twice, and counters that cover
/// them; its handles are its members'.
#[test]
fn a_batch_of_handles_is_the_batch_of_their_names() {
    let rules = Rules {
        budget: Budget {
            count: Some(3),
            percent: None,
        },
        strategy: None,
    };
    let previous = CompartmentStatus {
        batch_nodes: ["a", "gone", "b", "a", "c"].map(String::from).into(),
        batch_state: Some(BatchState {
            current_batch: 2,
            completed_nodes: 9,
            failed_nodes: 9,
            generation: 1,
            versions: "p:1".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let s = [Standing::Done, Standing::Failed, Standing::Eligible];
    for (x, y, z) in s
        .iter()
        .flat_map(|x| s.iter().flat_map(move |y| s.map(|z| (*x, *y, z))))
    {
        let nodes = [
            ("a", x),
            ("b", y),
            ("c", z),
            ("d", Standing::Done),
            ("e", Standing::Eligible),
        ];
        let by_map = batch(&rules, Some(&previous), &nodes, &era(1, "p:1"));
        // By handle: each node's position, the last members found by a scan.
        let handles: Vec<(usize, Standing)> = (0..nodes.len()).map(|i| (i, nodes[i].1)).collect();
        let last: Vec<Option<(usize, Standing)>> = (previous.batch_nodes.iter())
            .map(|m| {
                nodes
                    .iter()
                    .position(|(n, _)| n == m)
                    .map(|i| (i, nodes[i].1))
            })
            .collect();
        let name = |i: usize| nodes[i].0;
        let (by_lookup, members) = batch_of(
            &rules,
            Some(&previous),
            &handles,
            &last,
            name,
            &era(1, "p:1"),
        );
        assert_eq!(by_map, by_lookup, "{nodes:?}");
        let named: Vec<&str> = members.iter().map(|&i| nodes[i].0).collect();
        assert_eq!(
            named,
            by_lookup.members(),
            "one handle per member, in order"
        );
        if [x, y, z].contains(&Standing::Eligible) {
            // The batch stays open: the counters cover the done and failed nodes outside
            // it — d alone ("a" listed twice is one member, "gone" none).
            let state = by_lookup.status.batch_state.expect("a state");
            assert_eq!(
                (state.completed_nodes, state.failed_nodes),
                (1, 0),
                "{nodes:?}"
            );
        }
    }
}
