//! Plugin trust as the operator and its webhook apply it: every `PluginTrustPolicy` not
//! `off` — read from the operator's cache for rollouts, listed live for admission — judged against a package's pinned plugin with one
//! shared, bounded cache of verified signatures (a rollout verifies a digest once, however
//! many nodes and admission requests ask).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use kube::runtime::reflector::Store;
use nodewright_api::pinned::PinnedRef;
use nodewright_api::trust::{PluginTrustPolicy, PluginTrustPolicySpec, TrustMode};
use nodewright_api::v1alpha1::Package;
use nodewright_oci::Registry;
use nodewright_trust::Verifier;
use nodewright_trust::keys::PublicKey;
use nodewright_trust::policy::{self, Finding};

/// How many (reference, key set) answers the verifier remembers.
const VERIFIED_CAPACITY: usize = 1024;

/// Where the policies come from: the operator's cache, or a list just read from the API
/// (admission must not judge under a policy older than the request).
#[derive(Clone)]
enum Policies {
    Cached(Store<PluginTrustPolicy>),
    Listed(Arc<Vec<PluginTrustPolicy>>),
}

/// The trust policies in force and a verifier.
#[derive(Clone)]
pub struct Trust {
    policies: Policies,
    verifier: Arc<Verifier>,
}

impl std::fmt::Debug for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trust")
            .field("verifier", &self.verifier)
            .finish_non_exhaustive()
    }
}

/// What the policies say about one package.
#[derive(Debug, Default)]
pub struct Judgement {
    /// Trusted signers whose signatures verified, across the policies.
    pub signers: Vec<String>,
    /// Findings of `enforce` policies: the package may not be used.
    pub refusals: Vec<Finding>,
    /// Findings of `warn` policies, prefixed with the policy's name.
    pub warnings: Vec<String>,
}

impl Trust {
    /// Trust over the cached `policies`.
    pub fn new(policies: Store<PluginTrustPolicy>) -> Self {
        Trust {
            policies: Policies::Cached(policies),
            verifier: Arc::new(Verifier::new(VERIFIED_CAPACITY)),
        }
    }

    /// The same trust (and verifier) over `policies` as just listed from the API: what the
    /// webhook judges with, so a policy created a moment before a NodeWright applies to it.
    pub fn over(&self, policies: Vec<PluginTrustPolicy>) -> Self {
        Trust {
            policies: Policies::Listed(Arc::new(policies)),
            verifier: self.verifier.clone(),
        }
    }

    /// The policies not `off`, by name.
    fn active(&self) -> Vec<(String, PluginTrustPolicySpec)> {
        let all: Vec<PluginTrustPolicy> = match &self.policies {
            Policies::Cached(store) => store.state().iter().map(|p| (**p).clone()).collect(),
            Policies::Listed(list) => list.as_ref().clone(),
        };
        let mut out: Vec<_> = all
            .iter()
            .filter(|p| p.spec.mode != TrustMode::Off)
            .map(|p| (p.metadata.name.clone().unwrap_or_default(), p.spec.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Whether any policy is in force (with none, plugins are not verified).
    pub fn in_force(&self) -> bool {
        !self.active().is_empty()
    }

    /// Changes whenever the policies in force do: a verdict reached under other policies is
    /// stale.
    pub fn fingerprint(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for (name, spec) in self.active() {
            name.hash(&mut h);
            serde_json::to_string(&spec)
                .unwrap_or_default()
                .hash(&mut h);
        }
        h.finish()
    }

    /// Judges package `name` (plugin `pinned`) against every policy in force, verifying
    /// signatures through `registry`. A policy key that does not parse verifies nothing (the
    /// webhook refuses such a policy; one written around it fails closed).
    pub async fn judge(
        &self,
        registry: &Registry,
        name: &str,
        pinned: &PinnedRef,
        package: &Package,
    ) -> Result<Judgement, nodewright_trust::Error> {
        let mut out = Judgement::default();
        for (policy_name, spec) in self.active() {
            let keys: Vec<(String, PublicKey)> = spec
                .signers
                .iter()
                .filter_map(|s| match PublicKey::from_pem(s.public_key.as_deref()?) {
                    Ok(k) => Some((s.name.clone(), k)),
                    Err(e) => {
                        tracing::warn!(policy = %policy_name, signer = %s.name, "trust policy key unusable: {e}");
                        None
                    }
                })
                .collect();
            let verified = self.verifier.signers(registry, pinned, &keys).await?;
            for s in &verified {
                if !out.signers.contains(s) {
                    out.signers.push(s.clone());
                }
            }
            let findings = policy::check(&spec, name, pinned, package, &verified);
            match spec.mode {
                TrustMode::Enforce => out.refusals.extend(findings),
                TrustMode::Warn => out.warnings.extend(
                    findings
                        .iter()
                        .map(|f| format!("PluginTrustPolicy {policy_name}: {f}")),
                ),
                TrustMode::Off => {}
            }
        }
        Ok(out)
    }

    /// Judges every package of a spec, resolving tags through `registry`: `package → pinned`
    /// with the judgements, or the first failure to reach the registry.
    pub async fn judge_all(
        &self,
        registry: &Registry,
        packages: &BTreeMap<String, Package>,
    ) -> Result<Vec<(String, PinnedRef, Judgement)>, String> {
        let mut out = Vec::new();
        for (name, p) in packages {
            let pinned = registry
                .resolve(&p.plugin)
                .await
                .and_then(|d| nodewright_oci::pin(&p.plugin, &d))
                .map_err(|e| {
                    format!(
                        "spec.packages.{name}.plugin: resolving {} to verify its signature: {e}",
                        p.plugin
                    )
                })?;
            let judgement = self.judge(registry, name, &pinned, p).await.map_err(|e| {
                format!("spec.packages.{name}.plugin {pinned}: verifying its signature: {e}")
            })?;
            out.push((name.clone(), pinned, judgement));
        }
        Ok(out)
    }
}
