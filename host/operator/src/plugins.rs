//! Before any node is touched: every package's plugin reference is resolved to a digest,
//! its signatures checked against the trust policies in force, pulled and verified, and its
//! imports checked against the package's grants. Done once per CR generation (and again
//! when the trust policies change), in the background; the planner sees `Pending` until it
//! is.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nodewright_api::limits::{Ceilings, StageLimits};
use nodewright_api::v1alpha1::NodeWrightSpec;
use nodewright_engine::{Engine, EngineConfig};
use nodewright_oci::{NodeCache, Puller, Registry, RegistryConfig, pin};
use nodewright_planner::{PluginCheck as Verdict, Resolved};
use tokio::sync::Notify;

use crate::trust::Trust;

/// How long a retryable failure (registry unreachable) is kept before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(20);

/// The resolve/pull/grant-check cache.
#[derive(Clone)]
pub struct Plugins {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Plugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugins").finish_non_exhaustive()
    }
}

struct Inner {
    puller: Puller,
    engine: Arc<Engine>,
    ceilings: Ceilings,
    trust: Trust,
    entries: Mutex<HashMap<String, Entry>>,
    notify: Arc<Notify>,
}

struct Entry {
    uid: String,
    generation: i64,
    /// The trust policies the verdict was reached under.
    trust: u64,
    verdict: Option<Verdict>,
    retryable: bool,
    at: Instant,
}

impl Plugins {
    /// A checker pulling into `cache_dir`, reaching `insecure` registries over HTTP, holding
    /// packages to the sandbox `ceilings` and plugins to the `trust` policies.
    pub fn new(
        cache_dir: PathBuf,
        insecure: Vec<String>,
        ceilings: Ceilings,
        trust: Trust,
        notify: Arc<Notify>,
    ) -> anyhow::Result<Self> {
        let cache = NodeCache::open(&cache_dir)?;
        let engine = Arc::new(Engine::new(EngineConfig {
            cache_dir: Some(cache.code_dir()),
            ..Default::default()
        })?);
        let registry = Registry::new(RegistryConfig {
            insecure,
            ..Default::default()
        });
        let inner = Inner {
            puller: Puller::new(registry, cache),
            engine,
            ceilings,
            trust,
            entries: Mutex::default(),
            notify,
        };
        Ok(Plugins {
            inner: Arc::new(inner),
        })
    }

    /// The verdict for this CR generation under the trust policies in force; starts the
    /// check if there is none yet.
    pub fn get(&self, name: &str, uid: &str, generation: i64, spec: &NodeWrightSpec) -> Verdict {
        let trust = self.inner.trust.fingerprint();
        let mut entries = self.inner.entries.lock().expect("plugins lock");
        if let Some(e) = entries.get(name)
            && e.uid == uid
            && e.generation == generation
            && e.trust == trust
        {
            match &e.verdict {
                None => return Verdict::Pending,
                Some(v) if !(e.retryable && e.at.elapsed() > RETRY_AFTER) => return v.clone(),
                Some(_) => {}
            }
        }
        entries.insert(
            name.into(),
            Entry {
                uid: uid.into(),
                generation,
                trust,
                verdict: None,
                retryable: false,
                at: Instant::now(),
            },
        );
        drop(entries);
        let this = self.clone();
        let (name, uid, spec) = (name.to_string(), uid.to_string(), spec.clone());
        tokio::spawn(async move {
            let (verdict, retryable) = this.check(&spec).await;
            tracing::info!(cr = %name, generation, ?verdict, "plugins checked");
            let mut entries = this.inner.entries.lock().expect("plugins lock");
            if let Some(e) = entries.get_mut(&name)
                && e.uid == uid
                && e.generation == generation
                && e.trust == trust
            {
                e.verdict = Some(verdict);
                e.retryable = retryable;
                e.at = Instant::now();
            }
            drop(entries);
            this.inner.notify.notify_one();
        });
        Verdict::Pending
    }

    async fn check(&self, spec: &NodeWrightSpec) -> (Verdict, bool) {
        let mut resolved = Resolved::default();
        for (name, p) in &spec.packages {
            let not_ready = |reason: &str, message: String, retryable: bool| {
                (
                    Verdict::NotReady {
                        reason: reason.into(),
                        message,
                    },
                    retryable,
                )
            };
            let reference = match self
                .inner
                .puller
                .registry()
                .resolve(&p.plugin)
                .await
                .and_then(|d| pin(&p.plugin, &d))
            {
                Ok(r) => r,
                Err(e) => {
                    return not_ready(
                        "ResolveFailed",
                        format!("spec.packages.{name}.plugin: {e}"),
                        e.is_retryable(),
                    );
                }
            };
            // Trust first: an untrusted plugin is not even pulled.
            let judgement = match self
                .inner
                .trust
                .judge(self.inner.puller.registry(), name, &reference, p)
                .await
            {
                Ok(j) => j,
                Err(e) => {
                    let retryable =
                        matches!(&e, nodewright_trust::Error::Registry(r) if r.is_retryable());
                    return not_ready(
                        "SignatureUnverifiable",
                        format!("spec.packages.{name}.plugin {reference}: {e}"),
                        retryable,
                    );
                }
            };
            if let Some(first) = judgement.refusals.first() {
                return not_ready(
                    first.reason(),
                    judgement
                        .refusals
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; "),
                    false,
                );
            }
            if !judgement.signers.is_empty() {
                resolved.signers.insert(name.clone(), judgement.signers);
            }
            resolved.warnings.extend(judgement.warnings);
            let pulled = match self.inner.puller.pull_pinned(&reference, &|_| {}).await {
                Ok(p) => p,
                Err(e) => {
                    return not_ready(
                        "PullFailed",
                        format!("spec.packages.{name}.plugin: {e}"),
                        e.is_retryable(),
                    );
                }
            };
            // Compiling blocks (bounded by the engine's load limits): off the async workers.
            let engine = self.inner.engine.clone();
            let loaded = match tokio::task::spawn_blocking(move || engine.load(&pulled.bytes)).await
            {
                Ok(Ok(l)) => l,
                Ok(Err(e)) => {
                    return not_ready(
                        "InvalidPlugin",
                        format!("spec.packages.{name}.plugin {reference}: {e}"),
                        false,
                    );
                }
                Err(e) => {
                    return not_ready(
                        "InvalidPlugin",
                        format!("spec.packages.{name}.plugin {reference}: loading panicked: {e}"),
                        false,
                    );
                }
            };
            let limits = match StageLimits::of(p) {
                Ok(l) => l,
                Err(errs) => {
                    let text = errs
                        .iter()
                        .map(|(f, m)| format!("spec.packages.{name}.{f}: {m}"))
                        .collect::<Vec<_>>()
                        .join("; ");
                    return not_ready("InvalidSandbox", text, false);
                }
            };
            if let Err((field, message)) = limits.check(&self.inner.ceilings) {
                return not_ready(
                    "SandboxAboveCeiling",
                    format!("spec.packages.{name}.{field}: {message}"),
                    false,
                );
            }
            let grants = match p.grant_set(name) {
                Ok(g) => g,
                Err(errs) => {
                    return not_ready(
                        "InvalidGrant",
                        errs.iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join("; "),
                        false,
                    );
                }
            };
            let check = nodewright_engine::check_grants(&loaded, &grants);
            if !check.missing.is_empty() {
                return not_ready(
                    "GrantMissing",
                    format!(
                        "package {name} ({reference}) imports capabilities its grants do not cover: {}",
                        check.missing_summary()
                    ),
                    false,
                );
            }
            resolved.pinned.insert(name.clone(), reference);
        }
        (Verdict::Ready(resolved), false)
    }
}
