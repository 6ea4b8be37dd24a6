//! The executor's write order, against an API server answered in-process: every request
//! the executor sends is recorded in order and answered as kube-apiserver would.

use std::collections::HashSet;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hyper::{Method, Request, Response, StatusCode};
use kube::client::Body;
use nodewright_api::agent::Backend;
use nodewright_api::v1alpha1::{CompartmentStatus, Status};
use nodewright_planner::{Action, JobRequest, NodePatch};
use serde_json::{Value, json};

use super::*;

/// The requests seen, in order, as `METHOD what`.
type Seen = Arc<Mutex<Vec<String>>>;

/// Answers the executor's requests; node patches of the nodes in `conflict` lose.
#[derive(Clone)]
struct FakeApi {
    seen: Seen,
    conflict: Arc<HashSet<&'static str>>,
}

impl tower_service::Service<Request<Body>> for FakeApi {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let api = self.clone();
        Box::pin(async move {
            let method = req.method().clone();
            let path = req.uri().path().to_string();
            let body = req.into_body().collect_bytes().await.unwrap_or_default();
            let sent: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let node = path.strip_prefix("/api/v1/nodes/").map(str::to_string);
            let (what, status, answer) = match (&method, node) {
                (&Method::PATCH, Some(n)) if api.conflict.contains(n.as_str()) => {
                    (format!("patch node {n}"), StatusCode::CONFLICT, status(409))
                }
                (&Method::PATCH, Some(n)) => {
                    (format!("patch node {n}"), StatusCode::OK, node_json(&n))
                }
                (&Method::GET, Some(n)) => {
                    (format!("read node {n}"), StatusCode::OK, node_json(&n))
                }
                (&Method::POST, _) if path.ends_with("/jobs") => {
                    let name = sent["metadata"]["name"].as_str().unwrap_or_default();
                    (
                        format!("create job {name}"),
                        StatusCode::CREATED,
                        sent.clone(),
                    )
                }
                (&Method::POST, _) if path.ends_with("/eviction") => {
                    (format!("evict {path}"), StatusCode::CREATED, status(201))
                }
                (&Method::DELETE, _) => {
                    let name = path.rsplit('/').next().unwrap_or_default();
                    (format!("delete job {name}"), StatusCode::OK, status(200))
                }
                _ => (
                    format!("{method} {path}"),
                    StatusCode::NOT_FOUND,
                    status(404),
                ),
            };
            api.seen.lock().unwrap().push(what);
            let mut resp = Response::new(Body::from(serde_json::to_vec(&answer).unwrap()));
            *resp.status_mut() = status;
            Ok(resp)
        })
    }
}

fn status(code: u16) -> Value {
    let failed = code >= 400;
    json!({
        "apiVersion": "v1", "kind": "Status", "metadata": {},
        "status": if failed { "Failure" } else { "Success" },
        "code": code,
        "reason": if code == 409 { "Conflict" } else { "" },
        "message": if failed { "refused by the test" } else { "" },
    })
}

fn node_json(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "resourceVersion": "9"}})
}

fn executor(conflict: &[&'static str]) -> (Executor, Seen) {
    let seen = Seen::default();
    let api = FakeApi {
        seen: seen.clone(),
        conflict: Arc::new(conflict.iter().copied().collect()),
    };
    let client = Client::new(api, "default");
    let jobs = JobConfig {
        namespace: "nodewright".into(),
        image: "registry.example/agent@sha256:0".into(),
        command: "/agent".into(),
        backend: Backend::Sim,
        ttl_seconds: 60,
        registry: Default::default(),
        service_account: None,
        min_free_bytes: 0,
        cache_quota: None,
    };
    let limits = WriteLimits {
        qps: 1000,
        burst: 1000,
    };
    let counter = prometheus_client::metrics::counter::Counter::default();
    let executor = Executor::new(client, jobs, World::empty(), "test", limits, counter);
    (executor, seen)
}

fn job(node: &str) -> Action {
    Action::CreateJob(Box::new(JobRequest {
        name: format!("apply-{node}"),
        node: node.into(),
        ..jobs::tests::request()
    }))
}

fn patch(node: &str) -> Action {
    Action::PatchNode(NodePatch {
        node: node.into(),
        resource_version: "1".into(),
        unschedulable: Some(true),
        ..Default::default()
    })
}

fn evict(node: &str, pod: &str) -> Action {
    Action::Evict {
        node: node.into(),
        namespace: "apps".into(),
        pod: pod.into(),
        delete: false,
        grace_seconds: None,
    }
}

fn finished(node: &str) -> Action {
    Action::DeleteJob {
        name: format!("done-{node}"),
        node: node.into(),
        running: false,
    }
}

/// Where `what` was sent, if it was.
fn at(seen: &[String], what: &str) -> Option<usize> {
    seen.iter().position(|s| s == what)
}

#[tokio::test]
async fn a_node_patch_goes_first_and_a_lost_one_stops_the_nodes_other_writes() {
    let (executor, seen) = executor(&["n2"]);
    // The planner's order is not the write order: creates and evictions listed before the
    // patch that cordons their node.
    let actions = vec![
        job("n1"),
        evict("n1", "web-1"),
        finished("n1"),
        patch("n1"),
        job("n2"),
        evict("n2", "web-2"),
        finished("n2"),
        patch("n2"),
    ];
    let out = executor.run(actions, &[]).await;
    let seen = seen.lock().unwrap().clone();

    let cordon = at(&seen, "patch node n1").expect("n1 patched");
    for then in [
        "create job apply-n1",
        "evict /api/v1/namespaces/apps/pods/web-1/eviction",
        "delete job done-n1",
    ] {
        let i = at(&seen, then).unwrap_or_else(|| panic!("{then} never sent: {seen:?}"));
        assert!(cordon < i, "{then} before its node's patch: {seen:?}");
    }
    // n2's patch lost to a newer node (read again, not the one planned from): nothing else
    // of n2's is written, and its finished Job — whose result the lost patch was recording
    // — stays.
    assert!(at(&seen, "patch node n2").is_some() && at(&seen, "read node n2").is_some());
    for never in [
        "create job apply-n2",
        "evict /api/v1/namespaces/apps/pods/web-2/eviction",
        "delete job done-n2",
    ] {
        assert_eq!(at(&seen, never), None, "{never} sent: {seen:?}");
    }
    assert_eq!(
        out.failures, 1,
        "the lost patch, and only it, failed: {seen:?}"
    );
}

#[tokio::test]
async fn the_job_a_pass_makes_again_is_stopped_before_it_is_created() {
    let (executor, seen) = executor(&[]);
    // A finished Job this pass makes again under the same name: deleted first, in its
    // node's order, never in the background batch after the create.
    let again = Action::DeleteJob {
        name: "apply-n1".into(),
        node: "n1".into(),
        running: false,
    };
    let out = executor.run(vec![job("n1"), again, patch("n1")], &[]).await;
    let seen = seen.lock().unwrap().clone();
    let patched = at(&seen, "patch node n1").unwrap();
    let deleted = at(&seen, "delete job apply-n1").unwrap();
    let created = at(&seen, "create job apply-n1").unwrap();
    assert!(patched < deleted && deleted < created, "{seen:?}");
    assert_eq!(out.failures, 0, "{seen:?}");
}

#[test]
fn only_counts_may_wait_for_the_next_status_write() {
    let before = NodeWrightStatus {
        status: Some(Status::InProgress),
        complete_nodes: Some("10/100".into()),
        nodes_in_progress: Some(10),
        node_status: [("n1".to_string(), Status::InProgress)].into(),
        compartment_statuses: [("__default__".to_string(), CompartmentStatus::default())].into(),
        ..Default::default()
    };
    let mut counts = before.clone();
    counts.complete_nodes = Some("11/100".into());
    counts.nodes_in_progress = Some(9);
    counts.node_status.insert("n1".into(), Status::Complete);
    let c = counts.compartment_statuses.get_mut("__default__").unwrap();
    c.completed = 11;
    c.progress_percent = 11;
    assert_eq!(significant(&before), significant(&counts));
    let mut rolled = counts.clone();
    rolled.status = Some(Status::Complete);
    assert_ne!(
        significant(&before),
        significant(&rolled),
        "a roll-up is written at once"
    );
    let mut batch = counts;
    batch
        .compartment_statuses
        .get_mut("__default__")
        .unwrap()
        .batch_nodes
        .push("n2".into());
    assert_ne!(
        significant(&before),
        significant(&batch),
        "so is batch state"
    );
}
