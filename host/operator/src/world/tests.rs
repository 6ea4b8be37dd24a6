//! The world's snapshot rules, and the benchmark of its snapshot at 10,000 nodes.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::Event;
use nodewright_planner::Observed;

fn node(name: &str, rv: u64, mark: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            resource_version: Some(rv.to_string()),
            annotations: Some([("mark".to_string(), mark.to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn pod(name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("apps".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some("a".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// NodeWright `nw`, its status naming `nodes` complete.
fn nodewright(rv: u64, nodes: &[&str]) -> NodeWright {
    let mut nw: NodeWright = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodewright.io/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": "nw", "resourceVersion": rv.to_string()},
        "spec": {"packages": {}},
    }))
    .expect("a NodeWright");
    let mut status = nodewright_api::v1alpha1::NodeWrightStatus::default();
    for n in nodes {
        status
            .node_status
            .insert(n.to_string(), nodewright_api::v1alpha1::Status::Complete);
    }
    nw.status = Some(status);
    nw
}

/// The operator loop's part of a NodeWright, as the test sees it: paused.
fn finish(mut cr: nodewright_planner::Cr) -> nodewright_planner::Cr {
    cr.paused = true;
    cr
}

#[test]
fn nodes_come_in_rollout_order_whatever_order_the_cache_has() {
    let node = |name: &str, created: i64| {
        ObservedNode::new(nodewright_planner::NodeFacts {
            name: name.into(),
            created,
            ..Default::default()
        })
    };
    let sorted = crate::convert::in_rollout_order(vec![
        node("b", 2),
        node("c", 1),
        node("a", 2),
        node("d", 0),
    ]);
    let names: Vec<&str> = sorted.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["d", "c", "a", "b"]);
}

#[test]
fn only_our_pods_are_grouped_under_a_job() {
    let labelled = |name: &str, labels: &[(&str, &str)]| {
        let mut p = pod(name);
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p
    };
    let pods = [
        labelled("agent", &[(keys::job::MANAGED, "true"), ("job-name", "j")]),
        labelled(
            "preview",
            &[
                (keys::job::MANAGED, keys::job::MANAGED_PREVIEW),
                ("job-name", "k"),
            ],
        ),
        // Someone else's Job of the same name, and one of ours that no Job made.
        labelled("theirs", &[("job-name", "j")]),
        labelled("stray", &[(keys::job::MANAGED, "true")]),
    ];
    let by_job = pods_by_job(&pods);
    let names = |job: &str| -> Vec<&str> {
        by_job[job]
            .iter()
            .map(|p| p.metadata.name.as_deref().unwrap_or_default())
            .collect()
    };
    assert_eq!(names("j"), ["agent"]);
    assert_eq!(names("k"), ["preview"]);
    assert_eq!(by_job.len(), 2);
}

#[test]
fn a_snapshot_shows_our_newer_writes_over_the_cache_and_the_refusals_of_cached_pods() {
    let (nodes, mut node_writer) = reflector::store::<Node>();
    let (pods, mut pod_writer) = reflector::store::<Pod>();
    let (nodewrights, mut nodewright_writer) = reflector::store::<NodeWright>();
    nodewright_writer.apply_watcher_event(&Event::Apply(nodewright(1, &["a"])));
    node_writer.apply_watcher_event(&Event::Apply(node("a", 5, "cached")));
    node_writer.apply_watcher_event(&Event::Apply(node("b", 9, "cached")));
    pod_writer.apply_watcher_event(&Event::Apply(pod("here")));
    let world = World {
        nodes,
        pods,
        nodewrights,
        ..World::empty()
    };
    // Our patch of `a` is newer than the cache; the cache has caught up with `b`.
    world.patched(node("a", 7, "ours"));
    world.patched(node("b", 3, "ours"));
    let refusal = Refusal {
        at: 1,
        message: "budget".into(),
    };
    world.eviction_refused("apps/here".into(), refusal.clone());
    world.eviction_refused("apps/gone".into(), refusal.clone());
    world.eviction_refused("malformed".into(), refusal.clone());

    let snapshot = world.snapshot_with(&Settings::default(), AgentPods::default(), finish);
    let mut marks: Vec<(&str, &str)> = snapshot
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.annotations["mark"].as_str()))
        .collect();
    marks.sort();
    assert_eq!(marks, [("a", "ours"), ("b", "cached")]);
    assert!(
        !world.overlay().nodes.contains_key("b"),
        "a seen write is forgotten"
    );
    assert!(
        world.overlay().nodes.contains_key("a"),
        "an unseen one is kept"
    );
    assert_eq!(
        snapshot.refusals,
        BTreeMap::from([("apps/here".to_string(), refusal)]),
        "a refusal goes with its pod"
    );
    assert_eq!(snapshot.pods.len(), 1);
    let cr = &snapshot.nodewrights[0];
    assert!(cr.paused, "finished by the caller");
    assert_eq!(cr.status.node_status.len(), 1);

    // The next pass shares what it converted; a node the cache replaced is read anew,
    // and the conversion of its old version is forgotten.
    let again = world.snapshot_with(&Settings::default(), AgentPods::default(), finish);
    let find = |s: &Snapshot, name: &str| {
        s.nodes
            .iter()
            .find(|n| n.name == name)
            .cloned()
            .expect("node in the snapshot")
    };
    assert!(ObservedNode::ptr_eq(
        &find(&snapshot, "b"),
        &find(&again, "b")
    ));
    assert!(ObservedPod::ptr_eq(&snapshot.pods[0], &again.pods[0]));
    assert!(
        Observed::ptr_eq(
            &snapshot.nodewrights[0].status,
            &again.nodewrights[0].status
        ),
        "a NodeWright's status is shared while the object is the same"
    );
    assert!(
        !ObservedNode::ptr_eq(&find(&snapshot, "a"), &find(&again, "a")),
        "an overlay's node is converted for its pass"
    );
    node_writer.apply_watcher_event(&Event::Apply(node("b", 10, "changed")));
    nodewright_writer.apply_watcher_event(&Event::Apply(nodewright(2, &["a", "b"])));
    let changed = world.snapshot_with(&Settings::default(), AgentPods::default(), finish);
    assert_eq!(find(&changed, "b").annotations["mark"], "changed");
    assert_eq!(changed.nodewrights[0].status.node_status.len(), 2);
    assert!(changed.nodewrights[0].paused);
    let converted = world.converted.lock().expect("conversions lock");
    assert_eq!(
        (
            converted.crs.len(),
            converted.nodes.len(),
            converted.pods.len()
        ),
        (1, 1, 1),
        "one version of the NodeWright and of the cached node, one pod"
    );
}

/// Whether both list the very same objects.
fn shared<T>(a: &[Observed<T>], b: &[Observed<T>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| Observed::ptr_eq(a, b))
}

/// `cargo xtask bench`'s figure for the operator's part of a pass: snapshots of a world
/// of 10,000 nodes (15 labels, 8 annotations of which one a 1.3 KB state, a taint, 5
/// conditions), 50,000 pods (5 labels, an owner, 3 tolerations) and 5 NodeWrights whose
/// status names every node. Ignored by the test suite (it takes a few seconds to build);
/// it checks what makes it fast — a second snapshot shares every node, pod and status
/// with the first — and reports the first snapshot and the median of the next ones.
#[test]
#[ignore = "a benchmark: `cargo xtask bench` runs it"]
fn bench_snapshot_of_ten_thousand_nodes() {
    use k8s_openapi::api::core::v1::{Taint, Toleration};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use nodewright_figures::Figure;

    const NODES: usize = 10_000;
    let (nodes, mut node_writer) = reflector::store::<Node>();
    let (pods, mut pod_writer) = reflector::store::<Pod>();
    let (nodewrights, mut nodewright_writer) = reflector::store::<NodeWright>();
    let state = format!("{{\"p-1.0.0\": \"{}\"}}", "x".repeat(1300));
    let names: Vec<String> = (0..NODES).map(|i| format!("node-{i:05}")).collect();
    for (i, name) in names.iter().enumerate() {
        let text = |k: &str, l: usize| (format!("example.com/{k}-{l}"), format!("{k}-{l}-{i}"));
        let mut annotations: BTreeMap<String, String> = (0..7).map(|l| text("a", l)).collect();
        annotations.insert(keys::node_state("cr0"), state.clone());
        let mut n = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                resource_version: Some(i.to_string()),
                labels: Some((0..15).map(|l| text("l", l)).collect()),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![Taint {
                    key: "dedicated".into(),
                    value: Some("gpu".into()),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(
                    (0..5)
                        .map(|c| NodeCondition {
                            type_: format!("Condition{c}"),
                            status: "False".into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                node_info: Some(NodeSystemInfo {
                    boot_id: format!("boot-{i}"),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        slim_node(&mut n);
        node_writer.apply_watcher_event(&Event::Apply(n));
        for p in 0..5 {
            let mut pod = pod(&format!("{name}-{p}"));
            pod.metadata.labels = Some((0..5).map(|l| text("app", l)).collect());
            pod.metadata.owner_references = Some(vec![OwnerReference {
                kind: "ReplicaSet".into(),
                name: "rs".into(),
                controller: Some(true),
                ..Default::default()
            }]);
            let spec = pod.spec.as_mut().expect("a spec");
            spec.node_name = Some(name.clone());
            spec.tolerations = Some(
                (0..3)
                    .map(|t| Toleration {
                        key: Some(format!("t{t}")),
                        operator: Some("Exists".into()),
                        ..Default::default()
                    })
                    .collect(),
            );
            slim_pod(&mut pod);
            pod_writer.apply_watcher_event(&Event::Apply(pod));
        }
    }
    let every_node: Vec<&str> = names.iter().map(String::as_str).collect();
    for c in 0..5 {
        let mut nw = nodewright(1, &every_node);
        nw.metadata.name = Some(format!("cr{c}"));
        nodewright_writer.apply_watcher_event(&Event::Apply(nw));
    }
    let world = World {
        nodes,
        pods,
        nodewrights,
        ..World::empty()
    };
    let snapshot = || {
        let start = std::time::Instant::now();
        let s = world.snapshot_with(&Settings::default(), AgentPods::default(), |cr| cr);
        (s, start.elapsed())
    };
    let (first, first_took) = snapshot();
    let mut samples = Vec::new();
    for _ in 0..15 {
        let (next, took) = snapshot();
        samples.push(took);
        assert_eq!((next.nodes.len(), next.pods.len()), (NODES, 5 * NODES));
        assert!(shared(&first.nodes, &next.nodes));
        assert!(shared(&first.pods, &next.pods));
        assert!(
            first
                .nodewrights
                .iter()
                .zip(&next.nodewrights)
                .all(|(a, b)| {
                    a.status.node_status.len() == NODES && Observed::ptr_eq(&a.status, &b.status)
                })
        );
    }
    let what = "10000 nodes, 50000 pods, 5 NodeWrights";
    Figure::value(
        "snapshot",
        format!("first, {what}"),
        "ms",
        first_took.as_secs_f64() * 1e3,
    )
    .report();
    Figure::timed("snapshot", format!("next, {what}"), samples).report();
}
