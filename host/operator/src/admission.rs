//! Whether the API server admits the agent's pods: asked with a server-side dry run of the
//! pod a stage Job creates, in the Jobs' namespace. Pod Security admission (a namespace
//! enforcing `baseline` refuses privileged, host-namespace, hostPath pods) or a policy
//! engine's webhook answers exactly as it would for the Job controller — which otherwise
//! fails to create the pod, quietly, long after the node was cordoned. The planner holds all
//! new work while the answer is a refusal.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use nodewright_planner::AgentPods;

use crate::jobs::{self, JobConfig};

/// How long an admission is trusted before it is asked again.
const ADMITTED_FOR: Duration = Duration::from_secs(60);
/// How soon a refusal (or a failed question) is asked again: fixing it is one label.
const REFUSED_FOR: Duration = Duration::from_secs(10);

/// Asks, and remembers the answer for a while.
pub struct Admission {
    pods: Api<Pod>,
    probe: Pod,
    namespace: String,
    last: Mutex<Option<(Instant, AgentPods)>>,
}

impl Admission {
    /// For the Jobs `cfg` describes.
    pub fn new(client: kube::Client, cfg: &JobConfig) -> Self {
        Admission {
            pods: Api::namespaced(client, &cfg.namespace),
            probe: jobs::probe_pod(cfg),
            namespace: cfg.namespace.clone(),
            last: Mutex::new(None),
        }
    }

    /// The answer: the remembered one while it is fresh, else the API server's now.
    pub async fn check(&self) -> AgentPods {
        if let Some((at, answer)) = self.last.lock().expect("admission lock").as_ref() {
            let fresh = match answer {
                AgentPods::Admitted => ADMITTED_FOR,
                AgentPods::Refused(_) | AgentPods::Unknown => REFUSED_FOR,
            };
            if at.elapsed() < fresh {
                return answer.clone();
            }
        }
        let answer = self.ask().await;
        *self.last.lock().expect("admission lock") = Some((Instant::now(), answer.clone()));
        answer
    }

    async fn ask(&self) -> AgentPods {
        let dry_run = PostParams {
            dry_run: true,
            field_manager: Some("nodewright-operator".into()),
        };
        match self.pods.create(&dry_run, &self.probe).await {
            Ok(_) => AgentPods::Admitted,
            Err(kube::Error::Api(status)) => match classify(&status.message, status.code) {
                Some(why) => {
                    let answer = AgentPods::Refused(format!(
                        "the API server refuses the agent's pods in namespace {}: {why}; {}",
                        self.namespace,
                        remedy(&why)
                    ));
                    tracing::warn!(namespace = %self.namespace, %why, "agent pods refused: nothing new starts");
                    answer
                }
                None => {
                    tracing::warn!(
                        namespace = %self.namespace,
                        error = %status.message,
                        "cannot ask whether agent pods are admitted (grant the operator create on pods in its namespace)"
                    );
                    AgentPods::Unknown
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot ask whether agent pods are admitted");
                AgentPods::Unknown
            }
        }
    }
}

/// A refusal of the pod itself (`Some(message)`), or `None` when the question was refused
/// (the operator may not create pods: RBAC says nothing about the pod) or failed.
fn classify(message: &str, code: u16) -> Option<String> {
    let rbac = code == 403 && message.contains("cannot create resource");
    (!rbac && (400..500).contains(&code) && code != 429).then(|| message.to_string())
}

/// What to change, for the refusal `why`.
fn remedy(why: &str) -> &'static str {
    if why.contains("PodSecurity") {
        "label the namespace pod-security.kubernetes.io/enforce=privileged (stage Jobs run \
         the agent privileged, with the host's PID and network namespaces and its root)"
    } else {
        "allow the stage Jobs' pods there (they run the agent privileged, with the host's \
         PID and network namespaces and its root)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_pod_is_told_from_a_refused_question() {
        let pod_security = "pods \"p\" is forbidden: violates PodSecurity \"baseline:latest\": \
                            privileged (container \"agent\" must not set securityContext.privileged=true)";
        assert_eq!(classify(pod_security, 403).as_deref(), Some(pod_security));
        assert!(remedy(pod_security).contains("enforce=privileged"));
        let webhook =
            "admission webhook \"validate.kyverno.svc\" denied the request: host namespaces";
        assert!(classify(webhook, 400).is_some());
        assert!(remedy(webhook).starts_with("allow"));
        let rbac = "pods is forbidden: User \"system:serviceaccount:nw:op\" cannot create \
                    resource \"pods\" in API group \"\" in the namespace \"nw\"";
        assert_eq!(classify(rbac, 403), None, "RBAC says nothing about the pod");
        assert_eq!(classify("etcdserver: request timed out", 500), None);
        assert_eq!(classify("too many requests", 429), None);
    }
}
