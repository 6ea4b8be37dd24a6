//! Before any node is touched: every package's plugin reference is resolved to a digest,
//! its signatures checked against the trust policies in force, pulled and verified, and its
//! imports checked against the package's grants. Done once per CR generation (and again
//! when the trust policies change), in the background; the planner sees `Pending` until it
//! is.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nodewright_api::limits::{Ceilings, StageLimits};
use nodewright_api::payload::{ImagePayload, PayloadName};
use nodewright_api::pinned::PinnedRef;
use nodewright_api::v1alpha1::{NodeWrightSpec, Package, PayloadSource};
use nodewright_engine::{Engine, EngineConfig, LoadedPlugin};
use nodewright_oci::artifact::Descriptor;
use nodewright_oci::payload::Payload;
use nodewright_oci::{NodeCache, Puller, Registry, pin};
use nodewright_planner::{PluginCheck as Verdict, Resolved};
use tokio::sync::Notify;

use crate::registries::RegistryAccess;
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
    client: kube::Client,
    access: RegistryAccess,
    cache: NodeCache,
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
    /// A checker pulling into `cache_dir`, reaching registries as `access` says (its
    /// Secrets and ConfigMaps read through `client`), holding packages to the sandbox
    /// `ceilings` and plugins to the `trust` policies.
    pub fn new(
        client: kube::Client,
        cache_dir: PathBuf,
        access: RegistryAccess,
        ceilings: Ceilings,
        trust: Trust,
        notify: Arc<Notify>,
    ) -> anyhow::Result<Self> {
        let cache = NodeCache::open(&cache_dir)?;
        // It compiles and inspects plugins, never runs one: one slot, so the pool checks a
        // component as the agent's does (a component no store can hold is refused here).
        let engine = Arc::new(Engine::new(EngineConfig {
            cache_dir: Some(cache.code_dir()),
            concurrent_runs: NonZeroU32::MIN,
            ..Default::default()
        })?);
        let inner = Inner {
            client,
            access,
            cache,
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

    /// Forgets the verdict kept for `name` (a preview that finished: nothing asks again).
    pub fn forget(&self, name: &str) {
        self.inner
            .entries
            .lock()
            .expect("plugins lock")
            .remove(name);
    }

    async fn check(&self, spec: &NodeWrightSpec) -> (Verdict, bool) {
        let inner = &self.inner;
        // The logins and CA bundles as they are now: a Secret created or rotated after a
        // refusal is used at the next try.
        let config = match inner
            .access
            .config(&inner.client, spec.image_pull_secret.as_deref())
            .await
        {
            Ok(c) => c,
            Err(e) => {
                let verdict = Verdict::NotReady {
                    reason: "RegistryAccess".into(),
                    message: e.to_string(),
                };
                return (verdict, true);
            }
        };
        let puller = Puller::new(Registry::new(config), inner.cache.clone());
        let mut resolved = Resolved::default();
        for (name, p) in &spec.packages {
            if let Err(n) = self.check_package(&puller, name, p, &mut resolved).await {
                let verdict = Verdict::NotReady {
                    reason: n.reason,
                    message: n.message,
                };
                return (verdict, n.retryable);
            }
        }
        (Verdict::Ready(resolved), false)
    }

    /// One package: its tag resolved, its signatures judged (an untrusted plugin is not
    /// even pulled), pulled and compiled, then its sandbox bounds and grants checked
    /// against what the component imports.
    async fn check_package(
        &self,
        puller: &Puller,
        name: &str,
        p: &Package,
        resolved: &mut Resolved,
    ) -> Result<(), NotReady> {
        let registry = puller.registry();
        let reference = registry
            .resolve(&p.plugin)
            .await
            .and_then(|d| pin(&p.plugin, &d))
            .map_err(|e| {
                let message = format!("spec.packages.{name}.plugin: {e}{}", login_hint(&e));
                not_ready("ResolveFailed", message, retry(&e))
            })?;
        let judgement = self
            .judged(
                registry,
                name,
                &format!("spec.packages.{name}.plugin"),
                &reference,
                p,
            )
            .await?;
        if !judgement.signers.is_empty() {
            resolved.signers.insert(name.into(), judgement.signers);
        }
        resolved.warnings.extend(judgement.warnings);
        let (loaded, payloads) = self.load(puller, name, &reference).await?;
        self.admits(name, &reference, p, &loaded)?;
        let mut bytes = Descriptor::total(payloads.iter().map(|p| &p.layer));
        let mut images = Vec::new();
        for (i, source) in p.payloads.iter().enumerate() {
            let field = format!("spec.packages.{name}.payloads[{i}]");
            if payloads.iter().any(|a| a.name.as_str() == source.name) {
                return Err(not_ready(
                    "InvalidPayload",
                    format!(
                        "{field}.name: the plugin {reference} already carries a payload named {:?}",
                        source.name
                    ),
                    false,
                ));
            }
            let (image, size) = self
                .check_image(puller, name, &field, source, p, resolved)
                .await?;
            bytes = bytes.saturating_add(size);
            images.push(image);
        }
        if bytes > 0 || !images.is_empty() {
            resolved.payloads.insert(name.into(), bytes);
        }
        if !images.is_empty() {
            resolved.images.insert(name.into(), images);
        }
        resolved.pinned.insert(name.into(), reference);
        Ok(())
    }

    /// The plugin pulled by digest and compiled (off the async workers: compiling blocks,
    /// bounded by the engine's load limits), with the payloads its manifest lists (listed,
    /// never fetched here: the nodes stage them).
    async fn load(
        &self,
        puller: &Puller,
        name: &str,
        reference: &PinnedRef,
    ) -> Result<(LoadedPlugin, Vec<Payload>), NotReady> {
        let pulled = puller.pull_pinned(reference, &|_| {}).await.map_err(|e| {
            let message = format!("spec.packages.{name}.plugin: {e}{}", login_hint(&e));
            not_ready("PullFailed", message, retry(&e))
        })?;
        let payloads = pulled.payloads;
        let engine = self.inner.engine.clone();
        let bytes = pulled.bytes;
        match tokio::task::spawn_blocking(move || engine.load(&bytes)).await {
            Ok(Ok(l)) => Ok((l, payloads)),
            Ok(Err(e)) => Err(not_ready(
                "InvalidPlugin",
                format!("spec.packages.{name}.plugin {reference}: {e}"),
                false,
            )),
            Err(e) => Err(not_ready(
                "InvalidPlugin",
                format!("spec.packages.{name}.plugin {reference}: loading panicked: {e}"),
                false,
            )),
        }
    }

    /// `pinned` (the package's plugin, or an image it takes a payload from; `field` names
    /// it in the spec) judged by the trust policies in force: its signers and warnings, or
    /// the first refusal's reason with them all.
    async fn judged(
        &self,
        registry: &Registry,
        name: &str,
        field: &str,
        pinned: &PinnedRef,
        p: &Package,
    ) -> Result<crate::trust::Judgement, NotReady> {
        let judgement = self
            .inner
            .trust
            .judge(registry, name, pinned, p)
            .await
            .map_err(|e| {
                let retryable =
                    matches!(&e, nodewright_trust::Error::Registry(r) if r.is_retryable());
                not_ready(
                    "SignatureUnverifiable",
                    format!("{field} {pinned}: {e}"),
                    retryable,
                )
            })?;
        match judgement.refusals.first() {
            Some(first) => Err(not_ready(
                first.reason(),
                joined(&judgement.refusals),
                false,
            )),
            None => Ok(judgement),
        }
    }

    /// One payload taken from a container image: its tag resolved and pinned, its
    /// signatures judged by the trust policies as the plugin's are, its layers checked as a
    /// node can apply them; with their size (for this operator's platform).
    async fn check_image(
        &self,
        puller: &Puller,
        name: &str,
        field: &str,
        source: &PayloadSource,
        p: &Package,
        resolved: &mut Resolved,
    ) -> Result<(ImagePayload, u64), NotReady> {
        let registry = puller.registry();
        let image = registry
            .resolve(&source.image)
            .await
            .and_then(|d| pin(&source.image, &d))
            .map_err(|e| {
                let message = format!("{field}.image: {e}{}", login_hint(&e));
                not_ready("ResolveFailed", message, retry(&e))
            })?;
        let judgement = self
            .judged(registry, name, &format!("{field}.image"), &image, p)
            .await?;
        resolved.warnings.extend(judgement.warnings);
        let (_, layers) = puller.image_layers(&image).await.map_err(|e| {
            let message = format!("{field}.image: {e}{}", login_hint(&e));
            not_ready("PullFailed", message, retry(&e))
        })?;
        let size = Descriptor::total(&layers);
        let bad = |reason: String| not_ready("InvalidPayload", reason, false);
        let payload = ImagePayload {
            name: PayloadName::parse(&source.name)
                .map_err(|e| bad(format!("{field}.name: {e}")))?,
            image,
            path: match &source.path {
                None => Default::default(),
                Some(path) => ImagePayload::image_path(path).ok_or_else(|| {
                    bad(format!(
                        "{field}.path: {path:?} is not an absolute path inside the image"
                    ))
                })?,
            },
        };
        Ok((payload, size))
    }

    /// The package's sandbox bounds within the operator's ceilings, and grants that cover
    /// every capability the component imports.
    fn admits(
        &self,
        name: &str,
        reference: &PinnedRef,
        p: &Package,
        loaded: &LoadedPlugin,
    ) -> Result<(), NotReady> {
        let limits = StageLimits::of(p).map_err(|errs| {
            let text = errs
                .iter()
                .map(|(f, m)| format!("spec.packages.{name}.{f}: {m}"))
                .collect::<Vec<_>>()
                .join("; ");
            not_ready("InvalidSandbox", text, false)
        })?;
        limits
            .check(&self.inner.ceilings)
            .map_err(|(field, message)| {
                let message = format!("spec.packages.{name}.{field}: {message}");
                not_ready("SandboxAboveCeiling", message, false)
            })?;
        let grants = p
            .grant_set(name)
            .map_err(|errs| not_ready("InvalidGrant", joined(&errs), false))?;
        let check = nodewright_engine::check_grants(loaded, &grants);
        if !check.missing.is_empty() {
            return Err(not_ready(
                "GrantMissing",
                format!(
                    "package {name} ({reference}) imports capabilities its grants do not cover: {}",
                    check.missing_summary()
                ),
                false,
            ));
        }
        Ok(())
    }
}

/// Why a package's plugin is not ready: the condition's reason and message, and whether
/// trying again later may help.
struct NotReady {
    reason: String,
    message: String,
    retryable: bool,
}

/// Whether to try again later without a new generation: a registry that was unavailable,
/// or one that refused the login (a Secret may be created or rotated meanwhile).
fn retry(e: &nodewright_oci::Error) -> bool {
    e.is_retryable() || matches!(e, nodewright_oci::Error::Unauthorized { .. })
}

/// What to do about a registry that wants a login.
fn login_hint(e: &nodewright_oci::Error) -> &'static str {
    match e {
        nodewright_oci::Error::Unauthorized { .. } => {
            " (a registry login: spec.imagePullSecret naming a kubernetes.io/dockerconfigjson Secret the chart lists in pluginRegistries.packageSecrets, or pluginRegistries.secrets for every NodeWright)"
        }
        _ => "",
    }
}

fn not_ready(reason: &str, message: String, retryable: bool) -> NotReady {
    NotReady {
        reason: reason.into(),
        message,
        retryable,
    }
}

fn joined<T: ToString>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
