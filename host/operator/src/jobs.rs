//! Agent Jobs: built from the planner's requests, and read back into the planner's view.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use nodewright_api::agent::{
    AgentCall, Backend, Common, InterruptAsk, InterruptCall, PrestageCall, Pulling, StageCall,
};
use nodewright_api::keys::job as label;
use nodewright_api::result::{Blame, StageResult};
use nodewright_api::v1alpha1::InterruptType;
use nodewright_planner::{Ask, JobPhase, JobRequest, Work};
use serde_json::{Value, json};

/// Where and how agent pods run.
#[derive(Clone, Debug)]
pub struct JobConfig {
    /// Namespace of the Jobs.
    pub namespace: String,
    /// Agent image.
    pub image: String,
    /// The agent's command in that image.
    pub command: String,
    /// Host-ops backend: `linux` on real nodes, `sim` on simulated ones.
    pub backend: Backend,
    /// `ttlSecondsAfterFinished`.
    pub ttl_seconds: i32,
    /// How the agents reach plugin registries (and the kubelet the agent image).
    pub registry: crate::registries::RegistryAccess,
    /// Service account of the agent pods (none: the namespace default).
    pub service_account: Option<String>,
    /// Free space every plugin write must leave on the node.
    pub min_free_bytes: u64,
    /// Most the node cache may hold (none: no quota).
    pub cache_quota: Option<u64>,
}

/// The container name the agent runs as (exit-code rules name it).
pub const CONTAINER: &str = "agent";

/// Where the agent writes its result (the container's `terminationMessagePath`).
const TERMINATION_LOG: &str = "/dev/termination-log";

/// The time a stage's agent has after its package's `gracefulShutdown`, before the kubelet
/// kills it: to stop the plugin cleanly and write its result.
const GRACE_MARGIN: Duration = Duration::from_secs(10);

/// Builds the Job for a planner request: its labels, its pod, how it retries, its owner.
pub fn build(req: &JobRequest, cfg: &JobConfig) -> Job {
    let labels = labels(req);
    let mut spec = json!({
        "ttlSecondsAfterFinished": cfg.ttl_seconds,
        "backoffLimit": req.backoff_limit,
        "template": {"metadata": {"labels": labels}, "spec": pod_spec(req, cfg)}
    });
    let deadline = req.deadline.map(|d| d.as_secs());
    match Attempts::of(&req.ask) {
        Attempts::InPlace => {
            // Reboots restart the pod in place; the whole stage is bounded by the deadline.
            if let Some(d) = deadline {
                spec["activeDeadlineSeconds"] = json!(d);
            }
        }
        Attempts::PerPod => {
            spec["podReplacementPolicy"] = json!("Failed");
            // Disruptions and the agent's verdicts that are not the package's fault (host,
            // disruption) do not count against backoffLimit.
            let free: Vec<u8> = Blame::ALL
                .into_iter()
                .filter(|b| *b != Blame::None && !b.counts_against_budget())
                .map(Blame::exit_code)
                .collect();
            spec["podFailurePolicy"] = json!({"rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                {"action": "Ignore", "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": free}}
            ]});
            if let Some(d) = deadline {
                spec["template"]["spec"]["activeDeadlineSeconds"] = json!(d);
            }
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": req.name,
            "namespace": cfg.namespace,
            "labels": labels,
            // The garbage collector's backstop: a Job outlives its NodeWright only until the
            // collector sees the owner gone (the operator deletes them itself first).
            "ownerReferences": [{
                "apiVersion": format!("{}/v1alpha1", nodewright_api::keys::GROUP),
                "kind": "NodeWright",
                "name": req.cr,
                "uid": req.cr_uid,
                "controller": true,
                "blockOwnerDeletion": false,
            }],
        },
        "spec": spec
    }))
    .expect("the Job we build is a valid Job")
}

/// A preview's plan Job: the Job the rollout would create for `req` (a `plan` stage, which
/// the agent and engine hold read-only), named `name`, marked as the preview's — so no
/// rollout pass ever reads it (the rollout's caches select `managed=true`) — and owned by
/// the preview, which takes it along when it goes. `None` for anything but a `plan` stage:
/// a preview runs nothing else, whatever asks it.
pub fn build_preview(
    req: &JobRequest,
    cfg: &JobConfig,
    preview: &str,
    preview_uid: &str,
    name: &str,
) -> Option<Job> {
    if req
        .stage()
        .is_none_or(|s| s.stage != nodewright_api::agent::RunStage::Plan)
    {
        return None;
    }
    let mut job = build(req, cfg);
    let mark = |labels: &mut BTreeMap<String, String>| {
        labels.insert(label::MANAGED.into(), label::MANAGED_PREVIEW.into());
        labels.insert(label::PREVIEW.into(), preview.into());
        labels.insert(label::JOB.into(), name.into());
    };
    mark(job.metadata.labels.get_or_insert_default());
    if let Some(t) = job.spec.as_mut().and_then(|s| s.template.metadata.as_mut()) {
        mark(t.labels.get_or_insert_default());
    }
    job.metadata.name = Some(name.into());
    job.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: format!("{}/v1alpha1", nodewright_api::keys::GROUP),
            kind: "NodeWrightPreview".into(),
            name: preview.into(),
            uid: preview_uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(false),
        },
    ]);
    Some(job)
}

/// The labels the planner reads a Job back by (see [`read`]).
fn labels(req: &JobRequest) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = BTreeMap::from([
        (label::MANAGED.into(), "true".into()),
        (label::CR.into(), req.cr.clone()),
        (label::NODE.into(), req.node.clone()),
        (label::GENERATION.into(), req.generation.to_string()),
        (label::RUN.into(), req.run.to_string()),
        (label::JOB.into(), req.name.clone()),
    ]);
    match req.work() {
        Work::Package {
            package,
            version,
            stage,
        } => {
            labels.insert(label::PACKAGE.into(), package);
            labels.insert(label::VERSION.into(), version);
            labels.insert(label::STAGE.into(), stage.as_str().into());
        }
        Work::Interrupt { stage, kind, owner } => {
            labels.insert(label::PACKAGE.into(), owner);
            labels.insert(label::STAGE.into(), stage.as_str().into());
            labels.insert(label::INTERRUPT.into(), kind.as_str().into());
        }
        Work::Prestage { set } => {
            labels.insert(label::PRESTAGE.into(), set);
        }
    }
    labels
}

/// How a Job's attempts run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attempts {
    /// A reboot: the reboot ends the pod, which starts again in place on the new boot and
    /// finishes the interrupt; the Job's deadline bounds it all.
    InPlace,
    /// A stage or a service restart: each attempt a pod of its own, whose exit code says
    /// whether it counts against `backoffLimit`, each under the per-attempt deadline.
    PerPod,
}

impl Attempts {
    fn of(ask: &Ask) -> Self {
        match ask {
            Ask::Interrupt { call, .. } if call.kind == InterruptType::Reboot => Attempts::InPlace,
            Ask::Interrupt { .. } | Ask::Stage { .. } | Ask::Prestage { .. } => Attempts::PerPod,
        }
    }
}

/// The agent's pod: on the node, in its PID and network namespaces, privileged, the host's
/// `/` at `/host`, no API token.
fn pod_spec(req: &JobRequest, cfg: &JobConfig) -> Value {
    let restart = match Attempts::of(&req.ask) {
        Attempts::InPlace => "OnFailure",
        Attempts::PerPod => "Never",
    };
    let mut pod = json!({
        "nodeName": req.node,
        "restartPolicy": restart,
        "hostPID": true,
        // The node's network namespace: `net.*` sysctls are the node's, and the agent can
        // pull its plugin before (or without) the node's CNI.
        "hostNetwork": true,
        "dnsPolicy": "ClusterFirstWithHostNet",
        // The agent never calls the Kubernetes API (its result travels in the termination
        // message): a pod holding a token would only be a gift to whoever breaks out.
        "automountServiceAccountToken": false,
        "tolerations": serde_json::to_value(&req.tolerations).unwrap_or(Value::Null),
        "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
        "containers": [{
            "name": CONTAINER,
            "image": cfg.image,
            "command": [cfg.command],
            "args": call(req, cfg).to_args(),
            "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
            "securityContext": {"privileged": true},
            "volumeMounts": [{"name": "host", "mountPath": "/host"}],
            "terminationMessagePath": TERMINATION_LOG,
            "terminationMessagePolicy": "FallbackToLogsOnError"
        }]
    });
    if let Some(sa) = &cfg.service_account {
        pod["serviceAccountName"] = json!(sa);
    }
    let access = cfg.registry.for_pod(req.image_pull_secret.as_deref());
    if !access.image_pull_secrets.is_empty() {
        pod["imagePullSecrets"] = access
            .image_pull_secrets
            .iter()
            .map(|name| json!({"name": name}))
            .collect();
    }
    if matches!(req.ask, Ask::Stage { .. } | Ask::Prestage { .. }) {
        // Only a stage and a prestage pull: their pods mount the logins and CA bundles
        // they are told.
        extend(&mut pod["volumes"], access.volumes);
        extend(&mut pod["containers"][0]["volumeMounts"], access.mounts);
    }
    if let Ask::Stage { call, .. } = &req.ask {
        // The pod's grace covers the package's: Kubernetes' default (30 s) would cut a
        // longer `gracefulShutdown` short, and leave none for the agent's own stop.
        pod["terminationGracePeriodSeconds"] =
            json!((call.graceful_shutdown + GRACE_MARGIN).as_secs());
    }
    if let Ask::Stage {
        resources: Some(r), ..
    } = &req.ask
    {
        pod["containers"][0]["resources"] = json!({
            "requests": {"cpu": r.cpu_request, "memory": r.memory_request},
            "limits": {"cpu": r.cpu_limit, "memory": r.memory_limit}
        });
    }
    pod
}

fn extend(list: &mut Value, more: Vec<Value>) {
    if let Value::Array(items) = list {
        items.extend(more);
    }
}

/// The pod a stage Job of this deployment creates, as admission sees it (the same image,
/// privileges, host namespaces and volumes; a placeholder node and call): what
/// [`crate::admission`] asks the API server about.
pub fn probe_pod(cfg: &JobConfig) -> Pod {
    let req = JobRequest {
        name: "nodewright-admission-probe".into(),
        cr: "nodewright-admission-probe".into(),
        cr_uid: String::new(),
        generation: 0,
        run: 0,
        node: "nodewright-admission-probe".into(),
        deadline: None,
        backoff_limit: 0,
        tolerations: vec![],
        image_pull_secret: None,
        ask: Ask::Interrupt {
            uninstall: false,
            call: InterruptAsk {
                kind: InterruptType::Service,
                package: "probe".into(),
                services: vec![],
            },
        },
    };
    let mut spec = pod_spec(&req, cfg);
    spec["restartPolicy"] = json!("Never");
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "nodewright-admission-probe",
            "namespace": cfg.namespace,
            "labels": labels(&req),
        },
        "spec": spec,
    }))
    .expect("the probe we build is a valid Pod")
}

/// What the Job's agent is asked to do: the planner's ask with this deployment's settings.
pub fn call(req: &JobRequest, cfg: &JobConfig) -> AgentCall {
    let common = Common {
        host_root: "/host".into(),
        backend: cfg.backend,
        node: req.node.clone(),
        cr_uid: req.cr_uid.clone(),
        generation: req.generation,
        run: req.run,
        termination_log: TERMINATION_LOG.into(),
    };
    match &req.ask {
        Ask::Stage { call, .. } => {
            let mut c = StageCall::new(common, call.clone());
            c.min_free_bytes = cfg.min_free_bytes;
            c.pulling = pulling(req, cfg);
            AgentCall::Run(c)
        }
        Ask::Interrupt { call, .. } => {
            AgentCall::Interrupt(InterruptCall::new(common, call.clone()))
        }
        Ask::Prestage { call, .. } => AgentCall::Prestage(PrestageCall {
            common,
            ask: call.clone(),
            pulling: pulling(req, cfg),
        }),
    }
}

/// How the Job's agent reaches registries: the deployment's insecure list, and the logins
/// and CA bundles its pod mounts.
fn pulling(req: &JobRequest, cfg: &JobConfig) -> Pulling {
    let access = cfg.registry.for_pod(req.image_pull_secret.as_deref());
    Pulling {
        insecure_registries: cfg.registry.insecure.clone(),
        registry_configs: access.configs,
        registry_cas: access.cas,
        cache_dir: None,
        cache_quota: cfg.cache_quota,
    }
}

/// The planner's view of one of our Jobs, from its labels, status and pods.
pub fn read(job: &Job, pods: &[&Pod]) -> Option<nodewright_planner::ObservedJob> {
    let labels = job.metadata.labels.as_ref()?;
    let get = |k: &str| labels.get(k).cloned();
    let stage = || {
        get(label::STAGE)?
            .parse::<nodewright_api::node_state::Stage>()
            .ok()
    };
    let work = match (get(label::PRESTAGE), get(label::INTERRUPT)) {
        (Some(set), _) => Work::Prestage { set },
        (None, Some(kind)) => Work::Interrupt {
            stage: stage()?,
            kind: kind.parse().ok()?,
            owner: get(label::PACKAGE)?,
        },
        (None, None) => Work::Package {
            package: get(label::PACKAGE)?,
            version: get(label::VERSION)?,
            stage: stage()?,
        },
    };
    let status = job.status.clone().unwrap_or_default();
    let condition = |t: &str| {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == t && c.status == "True")
    };
    let mut failed_pods: Vec<&&Pod> = pods
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed"))
        .collect();
    failed_pods.sort_by_key(|p| p.metadata.creation_timestamp.clone());
    let last = failed_pods
        .iter()
        .rev()
        .find_map(|p| result_of(p))
        .map(Box::new);
    let phase = if condition("Complete").is_some() {
        let ok = pods
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
            .find_map(|p| result_of(p));
        JobPhase::Succeeded(ok.map(Box::new))
    } else if let Some(c) = condition("Failed") {
        let reason = c.reason.clone().unwrap_or_default();
        let genuine =
            reason == "DeadlineExceeded" || failed_pods.iter().any(|p| genuine_failure(p));
        JobPhase::Failed {
            genuine,
            attempts: status.failed.unwrap_or(0).max(0) as u32,
            reason,
            last,
        }
    } else {
        JobPhase::Active {
            failed: status.failed.unwrap_or(0).max(0) as u32,
            last,
        }
    };
    let generation = get(label::GENERATION)
        .and_then(|g| g.parse().ok())
        .unwrap_or(0);
    let run = get(label::RUN).and_then(|r| r.parse().ok()).unwrap_or(0);
    let stopping = job.metadata.deletion_timestamp.is_some();
    Some(nodewright_planner::ObservedJob {
        name: job.metadata.name.clone()?,
        cr: get(label::CR)?,
        node: get(label::NODE)?,
        generation,
        run,
        work,
        phase,
        stopping,
        stuck: pods.iter().find_map(|p| cannot_start(p)),
    })
}

/// Why the agent's container cannot start, when the kubelet says it cannot: the image
/// cannot be pulled or the container created. Other waits (creating, a pull under way) are
/// progress.
fn cannot_start(p: &Pod) -> Option<String> {
    const STUCK: [&str; 5] = [
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    ];
    let c = p
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == CONTAINER)?;
    let waiting = c.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref().filter(|r| STUCK.contains(r))?;
    Some(format!(
        "the agent pod {} cannot start: {reason}: {} (image {})",
        p.metadata.name.as_deref().unwrap_or_default(),
        waiting.message.as_deref().unwrap_or("no message"),
        c.image
    ))
}

/// The agent's result in a pod's termination message, if it wrote one.
fn result_of(p: &Pod) -> Option<StageResult> {
    let statuses = p.status.as_ref()?.container_statuses.as_ref()?;
    let c = statuses.iter().find(|c| c.name == CONTAINER)?;
    let t = c
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .or(c.last_state.as_ref()?.terminated.as_ref())?;
    serde_json::from_str(t.message.as_deref()?).ok()
}

/// A failed attempt that counts: a verdict from the agent (exit 1–3) or the per-attempt
/// deadline — not a disruption, an admission rejection or a host failure.
fn genuine_failure(p: &Pod) -> bool {
    let Some(status) = p.status.as_ref() else {
        return false;
    };
    if status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        || p.metadata.deletion_timestamp.is_some()
    {
        return false;
    }
    if status.reason.as_deref() == Some("DeadlineExceeded") {
        return true;
    }
    status
        .container_statuses
        .iter()
        .flatten()
        .filter(|c| c.name == CONTAINER)
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .any(|t| Blame::from_exit_code(t.exit_code).is_some_and(Blame::counts_against_budget))
}

#[cfg(test)]
pub(crate) mod tests {

    use super::*;
    use nodewright_api::agent::{RunStage, StageAsk};
    use nodewright_api::limits::StageLimits;
    use nodewright_api::v1alpha1::{Package, SandboxSpec};

    pub(crate) fn cfg() -> JobConfig {
        JobConfig {
            namespace: "nodewright".into(),
            image: "registry.example/nodewright/agent@sha256:0".into(),
            command: "/usr/local/bin/nodewright-agent".into(),
            backend: Backend::Linux,
            ttl_seconds: 60,
            registry: Default::default(),
            service_account: None,
            min_free_bytes: 1 << 28,
            cache_quota: None,
        }
    }

    /// An apply of package `tuning` on node `n1`, for the executor's tests too.
    pub(crate) fn request() -> JobRequest {
        let package = Package {
            version: "1.0.0".into(),
            plugin: "r.example/p:1".into(),
            sandbox: Some(SandboxSpec {
                memory: Some("256Mi".into()),
                write_bytes: None,
                write_files: Some(10),
            }),
            ..Default::default()
        };
        let plugin = format!("r.example/p@sha256:{}", "1".repeat(64));
        let mut call = StageAsk::new(RunStage::Apply, "tuning", "1.0.0", plugin.parse().unwrap());
        call.limits = StageLimits::of(&package).unwrap();
        JobRequest {
            name: "nw-tune-tuning-apply-n1-0".into(),
            cr: "tune".into(),
            cr_uid: "uid-1".into(),
            generation: 2,
            run: 7,
            node: "n1".into(),
            deadline: Some(Duration::from_secs(60)),
            backoff_limit: 3,
            tolerations: vec![],
            image_pull_secret: None,
            ask: Ask::Stage {
                call,
                resources: None,
            },
        }
    }

    /// `operator-agent/sigterm_grace`: a pod deleted mid-stage gets the package's
    /// `gracefulShutdown` and the agent's margin before the kubelet kills it.
    /// A reboot interrupt's request.
    fn reboot() -> JobRequest {
        JobRequest {
            ask: Ask::Interrupt {
                uninstall: false,
                call: InterruptAsk {
                    kind: InterruptType::Reboot,
                    package: "tuning".into(),
                    services: vec![],
                },
            },
            ..request()
        }
    }

    #[test]
    fn the_pods_grace_covers_the_packages() {
        let mut req = request();
        let Ask::Stage { call, .. } = &mut req.ask else {
            unreachable!("a stage request")
        };
        call.graceful_shutdown = Duration::from_secs(120);
        let job = serde_json::to_value(build(&req, &cfg())).unwrap();
        assert_eq!(
            job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
            130
        );
        let default = serde_json::to_value(build(&request(), &cfg())).unwrap();
        assert_eq!(
            default["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], 40,
            "above Kubernetes' 30 s even at the default gracefulShutdown"
        );
    }

    /// A pod whose agent container waits for `reason` (with the kubelet's `message`).
    fn waiting(reason: &str, message: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "nw-tune-tuning-apply-n1-0-x7k2p"},
            "status": {"phase": "Pending", "containerStatuses": [{
                "name": CONTAINER, "image": "registry.example/nodewright/agent@sha256:0",
                "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}}
            }]}
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_that_cannot_start_says_why_and_names_the_image() {
        let job = build(&request(), &cfg());
        let pull = waiting(
            "ImagePullBackOff",
            "Back-off pulling image \"registry.example/nodewright/agent@sha256:0\": 401 Unauthorized",
        );
        let stuck = read(&job, &[&pull]).unwrap().stuck.unwrap();
        assert!(
            stuck.contains("cannot start: ImagePullBackOff")
                && stuck.contains("401 Unauthorized")
                && stuck.contains("(image registry.example/nodewright/agent@sha256:0)")
                && stuck.contains("x7k2p"),
            "{stuck}"
        );
        let creating = waiting("ContainerCreating", "");
        assert_eq!(read(&job, &[&creating]).unwrap().stuck, None, "progress");
        assert_eq!(read(&job, &[]).unwrap().stuck, None);
    }

    #[test]
    fn a_stage_is_retried_per_pod_and_an_interrupt_restarts_in_place() {
        let stage = serde_json::to_value(build(&request(), &cfg())).unwrap();
        assert_eq!(stage["spec"]["template"]["spec"]["restartPolicy"], "Never");
        assert_eq!(
            stage["spec"]["template"]["spec"]["activeDeadlineSeconds"], 60,
            "a stage's deadline is per attempt"
        );
        assert_eq!(stage["spec"]["backoffLimit"], 3);
        assert!(stage["spec"]["podFailurePolicy"]["rules"].is_array());

        let interrupt = JobRequest {
            backoff_limit: 6,
            ..reboot()
        };
        let job = serde_json::to_value(build(&interrupt, &cfg())).unwrap();
        assert_eq!(
            job["spec"]["template"]["spec"]["restartPolicy"], "OnFailure",
            "the pod comes back after the reboot and finishes the interrupt"
        );
        assert_eq!(
            (
                &job["spec"]["activeDeadlineSeconds"],
                &job["spec"]["backoffLimit"]
            ),
            (&serde_json::json!(60), &serde_json::json!(6)),
            "the whole interrupt is bounded"
        );
        assert!(job["spec"]["podFailurePolicy"].is_null());
        assert!(job["spec"]["template"]["spec"]["activeDeadlineSeconds"].is_null());
        assert_eq!(
            job["metadata"]["labels"]["nodewright.io/interrupt"],
            "reboot"
        );
        let args = job["spec"]["template"]["spec"]["containers"][0]["args"].clone();
        assert_eq!(args[0], "interrupt", "{args}");

        // A service restart involves no reboot: its attempts are pods, as a stage's are.
        let restart = JobRequest {
            backoff_limit: 3,
            ask: Ask::Interrupt {
                uninstall: false,
                call: InterruptAsk {
                    kind: InterruptType::Service,
                    package: "tuning".into(),
                    services: vec!["app.service".into()],
                },
            },
            ..request()
        };
        let job = serde_json::to_value(build(&restart, &cfg())).unwrap();
        assert_eq!(job["spec"]["template"]["spec"]["restartPolicy"], "Never");
        assert_eq!(job["spec"]["template"]["spec"]["activeDeadlineSeconds"], 60);
        assert!(job["spec"]["podFailurePolicy"]["rules"].is_array());
        assert!(job["spec"]["activeDeadlineSeconds"].is_null());
    }

    #[test]
    fn a_stage_pod_mounts_its_registry_logins_and_every_pod_pulls_with_its_secrets() {
        let mut cfg = cfg();
        cfg.registry = crate::registries::RegistryAccess {
            namespace: "nodewright".into(),
            secrets: vec!["fleet".into()],
            cas: vec!["reg.example:5000=corp-ca".parse().unwrap()],
            image_pull_secrets: vec!["agent-pull".into()],
            ..Default::default()
        };
        let stage = JobRequest {
            image_pull_secret: Some("team".into()),
            ..request()
        };
        let pod =
            serde_json::to_value(build(&stage, &cfg)).unwrap()["spec"]["template"]["spec"].clone();
        assert_eq!(
            pod["imagePullSecrets"],
            json!([{"name": "team"}, {"name": "agent-pull"}])
        );
        let volumes: Vec<&Value> = pod["volumes"].as_array().unwrap().iter().collect();
        let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
        for v in volumes.iter().skip(1) {
            let name = &v["name"];
            assert!(
                mounts
                    .iter()
                    .any(|m| &m["name"] == name && m["readOnly"] == true),
                "{name} is mounted read-only"
            );
        }
        assert_eq!(volumes[1]["secret"]["secretName"], "team");
        assert_eq!(volumes[2]["secret"]["secretName"], "fleet");
        assert_eq!(volumes[3]["configMap"]["name"], "corp-ca");
        let args: Vec<String> =
            serde_json::from_value(pod["containers"][0]["args"].clone()).unwrap();
        for arg in [
            "--registry-config=/etc/nodewright/registry/logins/0/.dockerconfigjson",
            "--registry-config=/etc/nodewright/registry/logins/1/.dockerconfigjson",
            "--registry-ca=reg.example:5000=/etc/nodewright/registry/ca/0/ca.pem",
        ] {
            assert!(args.iter().any(|a| a == arg), "{arg} in {args:?}");
        }

        // An interrupt pulls no plugin: no logins mounted, but the kubelet still needs the
        // agent image's secrets.
        let interrupt = JobRequest {
            image_pull_secret: Some("team".into()),
            ..reboot()
        };
        let pod =
            serde_json::to_value(build(&interrupt, &cfg)).unwrap()["spec"]["template"]["spec"]
                .clone();
        assert_eq!(pod["volumes"].as_array().unwrap().len(), 1, "{pod}");
        assert_eq!(
            pod["imagePullSecrets"],
            json!([{"name": "team"}, {"name": "agent-pull"}])
        );
    }

    /// A request to stage the payloads of two plugins on `n1`.
    fn prestage() -> JobRequest {
        let pin = |n: &str| {
            format!("r.example/{n}@sha256:{}", "2".repeat(64))
                .parse()
                .unwrap()
        };
        JobRequest {
            ask: Ask::Prestage {
                set: "0a1b2c3d4e5f6a7b".into(),
                call: nodewright_api::agent::PrestageAsk {
                    plugins: vec![pin("driver"), pin("firmware")],
                    images: vec![],
                    keep: vec![pin("kmod")],
                    keep_images: vec![],
                },
            },
            ..request()
        }
    }

    #[test]
    fn a_prestage_job_pulls_with_the_stages_logins_and_reads_back_as_the_set_it_stages() {
        let mut cfg = cfg();
        cfg.registry = crate::registries::RegistryAccess {
            namespace: "nodewright".into(),
            secrets: vec!["fleet".into()],
            insecure: vec!["reg.example:5000".into()],
            ..Default::default()
        };
        let req = JobRequest {
            image_pull_secret: Some("team".into()),
            ..prestage()
        };
        let job = build(&req, &cfg);
        let pod = serde_json::to_value(&job).unwrap()["spec"]["template"]["spec"].clone();
        assert_eq!(pod["volumes"][1]["secret"]["secretName"], "team");
        assert_eq!(pod["volumes"][2]["secret"]["secretName"], "fleet");
        let args: Vec<String> =
            serde_json::from_value(pod["containers"][0]["args"].clone()).unwrap();
        let Ask::Prestage { call: asked, .. } = &req.ask else {
            unreachable!()
        };
        match call(&req, &cfg) {
            AgentCall::Prestage(c) => {
                assert_eq!(&c.ask, asked);
                assert_eq!(c.pulling.insecure_registries, ["reg.example:5000"]);
                assert_eq!(c.pulling.registry_configs.len(), 2, "{:?}", c.pulling);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(args[0], "prestage");
        let observed = read(&job, &[]).expect("one of ours");
        assert_eq!(
            observed.work,
            Work::Prestage {
                set: "0a1b2c3d4e5f6a7b".into()
            }
        );
        assert_eq!(observed.work, req.work());
    }

    #[test]
    fn stage_jobs_run_in_the_nodes_network_namespace() {
        let job = serde_json::to_value(build(&request(), &cfg())).unwrap();
        let pod = &job["spec"]["template"]["spec"];
        assert_eq!(
            pod["hostNetwork"], true,
            "net.* sysctls must land in the node's namespace"
        );
        assert_eq!(
            pod["automountServiceAccountToken"], false,
            "the agent holds no API credentials"
        );
        assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
        assert_eq!(pod["hostPID"], true);
    }

    #[test]
    fn jobs_are_owned_by_their_nodewright_and_carry_the_sandbox_bounds() {
        let job = serde_json::to_value(build(&request(), &cfg())).unwrap();
        let owner = &job["metadata"]["ownerReferences"][0];
        assert_eq!(
            (
                owner["kind"].as_str(),
                owner["name"].as_str(),
                owner["uid"].as_str()
            ),
            (Some("NodeWright"), Some("tune"), Some("uid-1"))
        );
        assert_eq!(owner["apiVersion"], "nodewright.io/v1alpha1");
        let args: Vec<&str> = job["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        for want in [
            "--memory=268435456",
            "--write-bytes=268435456",
            "--write-files=10",
            "--min-free-bytes=268435456",
        ] {
            assert!(args.contains(&want), "{want} missing from {args:?}");
        }
        assert!(
            !args.iter().any(|a| a.starts_with("--node-order")),
            "no order outside a batch: {args:?}"
        );
        let mut ordered = request();
        if let Ask::Stage { call, .. } = &mut ordered.ask {
            call.node_order = Some(3);
        }
        let ordered = serde_json::to_value(build(&ordered, &cfg())).unwrap();
        assert!(
            ordered["spec"]["template"]["spec"]["containers"][0]["args"]
                .as_array()
                .unwrap()
                .contains(&"--node-order=3".into())
        );
    }
}
