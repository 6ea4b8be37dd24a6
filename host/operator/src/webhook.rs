//! The validating admission webhook for NodeWright, DeploymentPolicy and
//! PluginTrustPolicy.
//!
//! Every replica serves it (not only the leader). It runs the same validation as
//! `nodewright validate` (defaults, then every field rule), plus the rules that need the
//! cluster: a referenced DeploymentPolicy must exist, a policy in use cannot be deleted, an
//! update may not drop or downgrade an uninstallable package nodes still have, the author
//! must be allowed to grant what a NodeWright grants ([`authority`]), and under a trust
//! policy each plugin must be signed by signers who may be granted it (refused under
//! `enforce`, a warning under `warn`). Those are answered from live reads, so a policy
//! created a moment earlier counts. A server-side dry run of an admissible NodeWright is
//! answered with a preview of its rollout, as warnings ([`crate::preview`]). Anything it cannot
//! check — an unreadable request, an API error — is denied: the webhook fails closed, like
//! its `failurePolicy: Fail`.

pub mod authority;
pub mod cert;

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::Client;
use kube::api::{Api, ListParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use nodewright_api::node_state::NodeState;
use nodewright_api::trust::PluginTrustPolicy;
use nodewright_api::v1alpha1::{
    DeploymentPolicy, NodeWright, NodeWrightPreviewSpec, NodeWrightSpec,
};
use nodewright_api::validate::{self, FieldError};
use nodewright_oci::Registry;
use nodewright_planner::Settings;

use crate::metrics::{AdmissionLabels, Metrics};
use crate::registries::RegistryAccess;
use crate::trust::Trust;
use crate::world::World;

/// Answers admission reviews.
#[derive(Clone)]
pub struct Admission {
    client: Client,
    world: World,
    metrics: Arc<Metrics>,
    trust: Trust,
    access: Arc<RegistryAccess>,
    /// The planner's settings, for a dry run's preview.
    settings: Settings,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").finish_non_exhaustive()
    }
}

/// What the rules said about one request.
#[derive(Debug, Default)]
struct Verdict {
    errors: Vec<FieldError>,
    warnings: Vec<String>,
}

fn op_name(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

fn spec_of(obj: &DynamicObject) -> Result<NodeWrightSpec, String> {
    let mut spec: NodeWrightSpec =
        serde_json::from_value(obj.data.get("spec").cloned().unwrap_or_default())
            .map_err(|e| format!("spec: {e}"))?;
    validate::default_nodewright(&mut spec);
    Ok(spec)
}

impl Admission {
    /// An admission handler reading through `client` and the operator's caches, verifying
    /// plugins' signatures in registries reached as `access` says.
    pub fn new(
        client: Client,
        world: World,
        metrics: Arc<Metrics>,
        trust: Trust,
        access: RegistryAccess,
        settings: Settings,
    ) -> Self {
        Admission {
            client,
            world,
            metrics,
            trust,
            access: Arc::new(access),
            settings,
        }
    }

    /// Answers one `AdmissionReview` body with the review to send back.
    pub async fn review(&self, body: &[u8]) -> AdmissionReview<DynamicObject> {
        let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => {
                return AdmissionResponse::invalid(format!("not an AdmissionReview: {e}"))
                    .into_review();
            }
        };
        let req: AdmissionRequest<DynamicObject> = match review.try_into() {
            Ok(r) => r,
            Err(e) => {
                return AdmissionResponse::invalid(format!("not an AdmissionReview request: {e}"))
                    .into_review();
            }
        };
        let mut resp = AdmissionResponse::from(&req);
        let (verdict, resp) = match self.decide(&req).await {
            Ok(v) if v.errors.is_empty() => {
                if !v.warnings.is_empty() {
                    resp.warnings = Some(v.warnings);
                }
                ("allowed", resp)
            }
            Ok(v) => {
                resp.warnings = (!v.warnings.is_empty()).then_some(v.warnings);
                let msg = v
                    .errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                tracing::info!(kind = %req.kind.kind, name = %req.name, "admission denied: {msg}");
                ("denied", resp.deny(msg))
            }
            Err(why) => {
                tracing::warn!(kind = %req.kind.kind, name = %req.name, "admission could not be checked (denied): {why}");
                (
                    "error",
                    resp.deny(format!(
                        "nodewright could not check this request, so it is refused: {why}"
                    )),
                )
            }
        };
        self.metrics
            .admissions
            .get_or_create(&AdmissionLabels {
                kind: req.kind.kind.clone(),
                operation: op_name(&req.operation).into(),
                verdict,
            })
            .inc();
        resp.into_review()
    }

    async fn decide(&self, req: &AdmissionRequest<DynamicObject>) -> Result<Verdict, String> {
        let mut v = Verdict::default();
        match (req.kind.kind.as_str(), &req.operation) {
            ("DeploymentPolicy", Operation::Delete) => {
                let users = self.policy_users(&req.name).await?;
                v.errors
                    .extend(validate::validate_policy_delete(&req.name, &users));
            }
            (_, Operation::Delete) => {}
            (
                kind @ ("NodeWright" | "DeploymentPolicy" | "PluginTrustPolicy"),
                Operation::Create | Operation::Update,
            ) => {
                let obj = req.object.as_ref().ok_or("the request carries no object")?;
                let doc = serde_json::to_value(obj).map_err(|e| e.to_string())?;
                if let Err(errors) = validate::validate_manifest(&doc) {
                    v.errors = errors;
                    return Ok(v);
                }
                if kind == "PluginTrustPolicy" {
                    let spec = serde_json::from_value(doc["spec"].clone())
                        .map_err(|e| format!("spec: {e}"))?;
                    v.errors.extend(
                        nodewright_trust::policy::key_errors(&spec)
                            .into_iter()
                            .map(|(path, message)| FieldError { path, message }),
                    );
                }
                if kind == "NodeWright" {
                    let spec = spec_of(obj)?;
                    let old = match (&req.operation, &req.old_object) {
                        (Operation::Update, Some(old)) => Some(spec_of(old)?),
                        _ => None,
                    };
                    self.check_nodewright(req, &req.name, &spec, old.as_ref(), &mut v)
                        .await?;
                    if req.dry_run && v.errors.is_empty() {
                        v.warnings.extend(self.preview(&req.name, spec).await?);
                    }
                }
            }
            ("NodeWrightPreview", Operation::Create | Operation::Update) => {
                // Refused as applying its NodeWright would be, for this requester: a grant
                // they may not give, a signer the trust policies refuse, an invalid spec.
                let obj = req.object.as_ref().ok_or("the request carries no object")?;
                let preview: NodeWrightPreviewSpec =
                    serde_json::from_value(obj.data.get("spec").cloned().unwrap_or_default())
                        .map_err(|e| format!("spec: {e}"))?;
                let name = preview.nodewright.clone();
                let doc = serde_json::json!({
                    "apiVersion": format!("{}/v1alpha1", nodewright_api::keys::GROUP),
                    "kind": "NodeWright",
                    "metadata": {"name": name},
                    "spec": preview.spec,
                });
                if let Err(errors) = validate::validate_manifest(&doc) {
                    v.errors = errors;
                    return Ok(v);
                }
                let mut spec = preview.spec;
                validate::default_nodewright(&mut spec);
                let running = Api::<NodeWright>::all(self.client.clone())
                    .get_opt(&name)
                    .await
                    .map_err(|e| format!("reading NodeWright {name:?}: {e}"))?
                    .map(|n| {
                        let mut old = n.spec;
                        validate::default_nodewright(&mut old);
                        old
                    });
                self.check_nodewright(req, &name, &spec, running.as_ref(), &mut v)
                    .await?;
            }
            (other, _) => return Err(format!("this webhook does not handle kind {other:?}")),
        }
        Ok(v)
    }

    /// The checks a NodeWright `name` with `spec` passes before it is applied, `old` its
    /// spec now (`None`: new): its policy reference, the update rules, its pull Secret, the
    /// requester's authority for every grant it adds, the trust policies.
    async fn check_nodewright(
        &self,
        req: &AdmissionRequest<DynamicObject>,
        name: &str,
        spec: &NodeWrightSpec,
        old: Option<&NodeWrightSpec>,
        v: &mut Verdict,
    ) -> Result<(), String> {
        if let Some(policy) = spec.deployment_policy.as_deref() {
            let exists = self.policy_exists(policy).await?;
            v.errors
                .extend(validate::validate_policy_reference(spec, |_| exists));
        }
        if let Some(old) = old {
            let (errors, warnings) =
                validate::validate_nodewright_update(old, spec, &self.node_states(name));
            v.errors.extend(errors);
            v.warnings.extend(warnings);
        }
        if let Some(secret) = spec.image_pull_secret.as_deref()
            && old.and_then(|o| o.image_pull_secret.as_deref()) != Some(secret)
            && let Err(e) = self.access.config(&self.client, Some(secret)).await
        {
            // A warning, not a refusal: applying a directory may create the
            // NodeWright before its Secret; the rollout waits for it and says so.
            v.warnings.push(e.to_string());
        }
        let needed = authority::to_authorize(old, spec);
        if !needed.is_empty() {
            v.errors
                .extend(authority::check(&self.client, &req.user_info, &needed).await?);
        }
        if v.errors.is_empty() {
            // The policies as they are now, not as the cache last saw them.
            let listed = Api::<PluginTrustPolicy>::all(self.client.clone())
                .list(&ListParams::default())
                .await
                .map_err(|e| format!("listing PluginTrustPolicies: {e}"))?;
            let trust = self.trust.over(listed.items);
            if trust.in_force() {
                self.judge(&trust, spec, v).await?;
            }
        }
        Ok(())
    }

    /// Trust findings: `enforce` ones refuse (at the package's plugin field), `warn` ones
    /// warn. A registry that cannot be reached refuses (fail closed).
    async fn judge(
        &self,
        trust: &Trust,
        spec: &NodeWrightSpec,
        v: &mut Verdict,
    ) -> Result<(), String> {
        let config = self
            .access
            .config(&self.client, spec.image_pull_secret.as_deref())
            .await
            .map_err(|e| e.to_string())?;
        let registry = Registry::new(config);
        for (name, _pinned, judgement) in trust.judge_all(&registry, &spec.packages).await? {
            let path = format!("spec.packages.{name}.plugin");
            v.errors
                .extend(judgement.refusals.iter().map(|f| FieldError {
                    path: path.clone(),
                    message: f.to_string(),
                }));
            v.warnings.extend(judgement.warnings);
        }
        Ok(())
    }

    /// A dry run's preview ([`crate::preview`]), off the async threads.
    async fn preview(&self, name: &str, spec: NodeWrightSpec) -> Result<Vec<String>, String> {
        let (world, settings, name) = (self.world.clone(), self.settings.clone(), name.to_string());
        tokio::task::spawn_blocking(move || {
            crate::preview::warnings(&world, &settings, &name, &spec)
        })
        .await
        .map_err(|e| format!("the preview failed: {e}"))
    }

    async fn policy_exists(&self, name: &str) -> Result<bool, String> {
        let api: Api<DeploymentPolicy> = Api::all(self.client.clone());
        api.get_opt(name)
            .await
            .map(|p| p.is_some())
            .map_err(|e| format!("reading DeploymentPolicy {name:?}: {e}"))
    }

    async fn policy_users(&self, policy: &str) -> Result<Vec<String>, String> {
        let api: Api<NodeWright> = Api::all(self.client.clone());
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing NodeWrights: {e}"))?;
        Ok(list
            .items
            .into_iter()
            .filter(|n| n.spec.deployment_policy.as_deref() == Some(policy))
            .filter_map(|n| n.metadata.name)
            .collect())
    }

    /// `node → state` of NodeWright `cr`, from the node cache (unparseable entries skipped:
    /// the planner reports those).
    fn node_states(&self, cr: &str) -> BTreeMap<String, NodeState> {
        self.world
            .node_annotations(&nodewright_api::keys::node_state(cr))
            .into_iter()
            .filter_map(|(n, v)| Some((n, NodeState::parse(&v).ok()?)))
            .collect()
    }
}
