//! End to end: the order of work — a priority chain with paused and disabled NodeWrights,
//! and batch sizes as a DeploymentPolicy grows them, watched on the running cluster. Each
//! test names the NodeWright e2e test it mirrors.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common;
use crate::specs;

use common::E2e;
use nodewright_api::v1alpha1::Status;
use serde_json::{Value, json};
use specs::*;

const MARK: &str = "/usr/local/bin/mark";

/// A package that appends `name` to the node's `etc/order`.
fn marker(e: &E2e, name: &str) -> Value {
    json!({
        "version": "1.0.0", "plugin": e.plugin("shell"),
        "capabilities": commands(&[MARK]),
        "configMap": {"apply": format!("{MARK} {name}")}
    })
}

fn order(e: &E2e, node: &str) -> Vec<String> {
    e.read_host_file(node, "/etc/order")
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Mirrors NodeWright's `strict-order`: a paused NodeWright holds a later one of the same
/// priority (nothing of it runs); disabled instead, it is skipped and the later one runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_nodewright_holds_later_ones_and_a_disabled_one_is_skipped() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let mut e = E2e::start(&[("o1", &[])]).await;
    e.script(MARK, "mkdir -p etc && echo \"$1\" >> etc/order");
    e.start_operator(&[]);
    let mut first = cr(
        "first",
        json!({"priority": 100, "packages": {"a": marker(&e, "first")}}),
    );
    first["metadata"]["annotations"] = json!({"nodewright.io/pause": "true"});
    e.apply(first).await;
    e.apply(cr(
        "second",
        json!({"priority": 100, "packages": {"b": marker(&e, "second")}}),
    ))
    .await;
    e.wait("second waiting", LIMIT, || async {
        (e.node_status("second", "o1").await == Some(Status::Waiting)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(order(&e, "o1").is_empty(), "nothing runs behind the pause");
    assert_eq!(e.node_status("second", "o1").await, Some(Status::Waiting));
    assert_eq!(e.node_status("first", "o1").await, Some(Status::Paused));

    e.patch(
        "first",
        json!({"metadata": {"annotations": {"nodewright.io/pause": null, "nodewright.io/disable": "true"}}}),
    )
    .await;
    e.wait_complete("second", LIMIT).await;
    assert_eq!(order(&e, "o1"), ["second"], "the disabled one never ran");
    assert_eq!(
        e.nodewright("first").await.status.unwrap().status,
        Some(Status::Disabled)
    );
}

/// Each batch's size per compartment, as the status showed them while the rollout ran:
/// batch number → the most members seen in it.
type Sizes = BTreeMap<String, BTreeMap<i32, usize>>;

/// Polls `cr`'s status until it is complete, recording each compartment's batch sizes.
async fn watch_batches(e: &E2e, cr: &str) -> Sizes {
    let sizes = std::sync::Mutex::new(Sizes::new());
    e.wait(
        &format!("{cr} complete, watching batches"),
        LIMIT,
        || async {
            let status = e.nodewright(cr).await.status?;
            let mut sizes = sizes.lock().unwrap();
            for (name, c) in &status.compartment_statuses {
                match c.batch_state.as_ref() {
                    Some(batch) if !c.batch_nodes.is_empty() => {
                        let seen = sizes
                            .entry(name.clone())
                            .or_default()
                            .entry(batch.current_batch)
                            .or_default();
                        *seen = (*seen).max(c.batch_nodes.len());
                    }
                    _ => {}
                }
            }
            (status.status == Some(Status::Complete)).then_some(())
        },
    )
    .await;
    sizes.into_inner().unwrap()
}

/// Mirrors NodeWright's `linear-strategy`, `multi-compartment` and `batch-state-reset`: one
/// policy, two compartments — linear batches of 1, 2, 3 and exponential ones of 1, 2, 4,
/// seen batch by batch on the running cluster. A NodeWright's own
/// `resetBatchStateOnCompletion: false` outweighs the policy's `true`: its batch state is
/// kept after completion, while another NodeWright under the same policy starts over.
#[tokio::test(flavor = "multi_thread")]
async fn batches_grow_by_strategy_per_compartment_and_the_nodewright_option_outweighs_the_policy() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let nodes: Vec<(String, Vec<(&str, &str)>)> = (1..=6)
        .map(|i| {
            let mut labels = vec![("pool", "lin")];
            if i <= 3 {
                labels.push(("small", "yes"));
            }
            (format!("lin-{i}"), labels)
        })
        .chain((1..=7).map(|i| (format!("exp-{i}"), vec![("pool", "exp")])))
        .collect();
    let borrowed: Vec<(&str, &[(&str, &str)])> = nodes
        .iter()
        .map(|(n, l)| (n.as_str(), l.as_slice()))
        .collect();
    let mut e = E2e::start(&borrowed).await;
    e.script(MARK, "mkdir -p etc && echo \"$1\" >> etc/order");
    e.start_operator(&[]);
    e.policy(
        "grow",
        json!({
            "resetBatchStateOnCompletion": true,
            "default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}},
            "compartments": [
                {"name": "lin", "selector": {"matchLabels": {"pool": "lin"}}, "budget": {"percent": 100},
                 "strategy": {"linear": {"initialBatch": 1, "delta": 1}}},
                {"name": "exp", "selector": {"matchLabels": {"pool": "exp"}}, "budget": {"percent": 100},
                 "strategy": {"exponential": {"initialBatch": 1, "growthFactor": 2}}}
            ]
        }),
    )
    .await;
    e.apply(cr(
        "kept",
        json!({"deploymentPolicy": "grow",
               "deploymentPolicyOptions": {"resetBatchStateOnCompletion": false},
               "packages": {"k": marker(&e, "kept")}}),
    ))
    .await;
    let sizes = watch_batches(&e, "kept").await;
    assert_eq!(
        sizes["lin"].values().copied().collect::<Vec<_>>(),
        [1, 2, 3],
        "linear: {sizes:?}"
    );
    assert_eq!(
        sizes["exp"].values().copied().collect::<Vec<_>>(),
        [1, 2, 4],
        "exponential: {sizes:?}"
    );
    let batch_of = |status: &nodewright_api::v1alpha1::NodeWrightStatus, c: &str| {
        status.compartment_statuses[c]
            .batch_state
            .as_ref()
            .map_or(0, |b| b.current_batch)
    };
    let kept = e.nodewright("kept").await.status.unwrap();
    assert!(
        batch_of(&kept, "lin") >= 3,
        "the NodeWright's false outweighs the policy's true: {:?}",
        kept.compartment_statuses["lin"]
    );

    // The same policy, no option of its own: reset on completion.
    e.apply(cr(
        "reset",
        json!({"deploymentPolicy": "grow",
               "nodeSelectors": {"matchLabels": {"small": "yes"}},
               "packages": {"r": marker(&e, "reset")}}),
    ))
    .await;
    let sizes = watch_batches(&e, "reset").await;
    assert_eq!(
        sizes["lin"].values().copied().collect::<Vec<_>>(),
        [1, 2],
        "{sizes:?}"
    );
    let reset = e.nodewright("reset").await.status.unwrap();
    assert_eq!(
        batch_of(&reset, "lin"),
        1,
        "reset on completion: {:?}",
        reset.compartment_statuses["lin"]
    );
    for (n, _) in &nodes {
        let small = n.as_str() <= "lin-3" && n.starts_with("lin");
        let expected: &[&str] = if small { &["kept", "reset"] } else { &["kept"] };
        assert_eq!(order(&e, n), expected, "{n}");
    }
}
