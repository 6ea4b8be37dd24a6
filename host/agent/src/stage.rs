//! One stage of one package: pull the pinned plugin, check its grants, run the stage and
//! then its check in the sandbox, and judge the outcome into a [`StageResult`] with its
//! blame. [`run_checked`] and [`judge`] are what `nodewright plugin run` shares with the
//! agent, so a local run reports the blame a node would.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nodewright_api::agent::{Common, Pulling, RunStage, StageCall};
use nodewright_api::grants::{GrantSet, GrantSource};
use nodewright_api::payload::PayloadName;
use nodewright_api::result::{self, Blame, Needs, StageResult};
use nodewright_engine::{
    Engine, EngineConfig, PreparedPlugin, RunError, RunReport, SandboxLimits, StageContext,
    StepFailure,
};
use nodewright_hostops::HostOps;
use nodewright_oci::{Credentials, NodeCache, Puller, Registry, RegistryConfig};

use crate::host::host;
use crate::markers;

/// Log lines a result carries (the most recent).
const RESULT_LOG_LINES: usize = 20;

/// What stops a running stage early: SIGTERM (the pod is being deleted), after which the
/// stage has `grace` to finish.
#[derive(Debug)]
pub struct Shutdown {
    signal: Option<tokio::signal::unix::Signal>,
    grace: Duration,
}

impl Shutdown {
    /// Stops on SIGTERM, `grace` after it.
    pub fn on_sigterm(grace: Duration) -> std::io::Result<Self> {
        let signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        Ok(Shutdown {
            signal: Some(signal),
            grace,
        })
    }

    /// Never stops a stage (a local run: Ctrl-C ends the process).
    pub fn never() -> Self {
        Shutdown {
            signal: None,
            grace: Duration::ZERO,
        }
    }

    async fn requested(&mut self) {
        match &mut self.signal {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending().await,
        }
    }
}

/// One sandbox run of a stage or its check, as the engine returned it.
#[derive(Debug)]
pub struct Ran {
    /// What ran.
    pub stage: RunStage,
    /// The report, or why the sandbox stopped the plugin.
    pub outcome: Result<RunReport, RunError>,
}

/// A stage and (when it succeeded) its check.
#[derive(Debug)]
pub struct StageRun {
    /// What the agent reports: the verdict, its blame, changes and the last log lines.
    pub result: StageResult,
    /// Each sandbox run (none stopped midway by SIGTERM is listed).
    pub runs: Vec<Ran>,
}

/// Which party a plugin's reported failure blames.
pub fn blame_of(failure: &StepFailure) -> Blame {
    match failure {
        StepFailure::Denied(_) => Blame::Denied,
        StepFailure::InvalidConfig(_) => Blame::Config,
        StepFailure::HostFailed(_) => Blame::Host,
        StepFailure::WrongStage(_) | StepFailure::NotFound(_) | StepFailure::Failed(_) => {
            Blame::Package
        }
    }
}

/// The result the agent reports for one sandbox run of `stage` of `package`.
pub fn judge(stage: RunStage, package: &str, outcome: &Result<RunReport, RunError>) -> StageResult {
    let last_lines = |lines: &[nodewright_engine::LogLine]| -> Vec<String> {
        let skip = lines.len().saturating_sub(RESULT_LOG_LINES);
        lines[skip..].iter().map(|l| l.message.clone()).collect()
    };
    let report = match outcome {
        Ok(r) => r,
        Err(e) => {
            // The sandbox stopped it: a trap, its memory limit or its deadline is the
            // package's; anything else (instantiation) the host's.
            let blame = if e.is_package_fault() {
                Blame::Package
            } else {
                Blame::Host
            };
            let mut r = StageResult::failed(stage, package, blame, e.to_string());
            r.logs = last_lines(e.logs());
            return r.bounded();
        }
    };
    let mut result = match &report.result {
        Ok(o) => {
            let message = o
                .message
                .clone()
                .unwrap_or_else(|| format!("{} change(s)", o.changes.len()));
            StageResult {
                change_count: o.changes.len() as u32,
                changes: o
                    .changes
                    .iter()
                    .take(result::MAX_CHANGES)
                    .map(|c| format!("{} {}: {}", c.kind, c.target, c.detail))
                    .collect(),
                interrupt: Some(Needs::of(o.interrupt.to_api().as_ref())),
                ..StageResult::passed(stage, package, message)
            }
        }
        Err(f) => StageResult::failed(stage, package, blame_of(f), f.to_string()),
    };
    result.logs = last_lines(&report.logs);
    result.bounded()
}

/// What a stage and the check that verifies it both run with.
#[derive(Debug)]
pub struct StageInputs<'a> {
    /// The plugin, linked against its grants.
    pub prepared: &'a PreparedPlugin,
    /// What the plugin is told.
    pub ctx: StageContext,
    /// The node.
    pub host: Arc<dyn HostOps>,
    /// What the package may touch.
    pub grants: Arc<GrantSet>,
    /// The sandbox's bounds.
    pub limits: &'a SandboxLimits,
}

/// Runs `stage`, then (when it succeeded and `check` is set) the check that verifies it: a
/// stage counts as done only when its check passes.
pub async fn run_checked(
    inputs: &StageInputs<'_>,
    stage: RunStage,
    check: bool,
    shutdown: &mut Shutdown,
) -> StageRun {
    let ctx = &inputs.ctx;
    let mut runs = Vec::new();
    let mut result = match sandboxed(inputs, stage, shutdown).await {
        Ok(ran) => {
            let r = judge(stage, &ctx.package, &ran.outcome);
            runs.push(ran);
            r
        }
        Err(stopped) => {
            return StageRun {
                result: stopped,
                runs,
            };
        }
    };
    let Some(verifier) = stage
        .check()
        .filter(|_| check && result.blame == Blame::None)
    else {
        return StageRun { result, runs };
    };
    let verdict = match sandboxed(inputs, verifier, shutdown).await {
        Ok(ran) => {
            let v = judge(verifier, &ctx.package, &ran.outcome);
            runs.push(ran);
            v
        }
        Err(stopped) => stopped,
    };
    if verdict.blame != Blame::None {
        let mut failed = StageResult::failed(
            stage,
            &ctx.package,
            verdict.blame,
            format!(
                "{verifier} failed after {stage} succeeded: {}",
                verdict.message
            ),
        );
        failed.logs = result.logs.iter().chain(&verdict.logs).cloned().collect();
        failed.changes = std::mem::take(&mut result.changes);
        failed.change_count = result.change_count;
        result = failed;
    } else {
        result.logs.extend(verdict.logs);
    }
    StageRun { result, runs }
}

/// One sandbox run; `Err` is the result when SIGTERM stopped it past its grace period.
async fn sandboxed(
    inputs: &StageInputs<'_>,
    stage: RunStage,
    shutdown: &mut Shutdown,
) -> Result<Ran, StageResult> {
    let StageInputs {
        prepared,
        ctx,
        host,
        grants,
        limits,
    } = inputs;
    let run = prepared.run(stage, ctx.clone(), host.clone(), grants.clone(), limits);
    tokio::pin!(run);
    let outcome = tokio::select! {
        r = &mut run => r,
        () = shutdown.requested() => match tokio::time::timeout(shutdown.grace, &mut run).await {
            Ok(r) => r,
            Err(_) => {
                return Err(StageResult::failed(
                    stage,
                    &ctx.package,
                    Blame::Disruption,
                    format!(
                        "stopped by SIGTERM; {stage} did not finish within {:?}",
                        shutdown.grace
                    ),
                ));
            }
        },
    };
    Ok(Ran { stage, outcome })
}

/// The whole `run` call: the grants parsed, the pinned plugin pulled through the node cache
/// and linked against them, then the stage (and its check) run against the host. A failure
/// before the plugin runs carries the blame of the step that failed.
pub(crate) async fn run_stage(call: &StageCall) -> StageResult {
    // The first line of the pod's log says what this pod is for.
    eprintln!(
        "nodewright-agent: {} of {} {} on {} ({})",
        call.ask.stage, call.ask.package, call.ask.version, call.common.node, call.ask.plugin
    );
    match run_prepared(call).await {
        Ok(result) => result,
        Err((blame, message)) => {
            StageResult::failed(call.ask.stage, &call.ask.package, blame, message)
        }
    }
}

/// A step before the plugin ran failed: whose fault, and what happened.
pub(crate) type Refused = (Blame, String);

async fn run_prepared(call: &StageCall) -> Result<StageResult, Refused> {
    let grants = GrantSet::parse(
        &call.ask.capabilities,
        call.ask.reboot_allowed,
        GrantSource::Spec {
            package: call.ask.package.clone(),
        },
    )
    .map(Arc::new)
    .map_err(|errs| {
        let text = errs.iter().map(ToString::to_string).collect::<Vec<_>>();
        (Blame::Config, text.join("; "))
    })?;
    let host = host(&call.common).map_err(|e| (Blame::Host, format!("host: {e:#}")))?;
    let (prepared, payloads) = pull_and_prepare(call, &grants).await?;
    let ctx = StageContext {
        node: call.common.node.clone(),
        package: call.ask.package.clone(),
        version: call.ask.version.clone(),
        previous_version: call.ask.previous_version.clone(),
        config: call.ask.config.clone(),
        changed_keys: call.ask.changed_keys.clone(),
        node_order: call.ask.node_order,
        payloads,
    };
    let limits = SandboxLimits {
        timeout: call.ask.timeout,
        memory: call.ask.limits.memory,
        write_bytes: call.ask.limits.write_bytes,
        write_files: call.ask.limits.write_files,
        min_free_bytes: call.min_free_bytes,
        ..Default::default()
    };
    // SIGTERM: let the running stage finish within the graceful-shutdown period, else abort.
    let mut shutdown = Shutdown::on_sigterm(call.ask.graceful_shutdown)
        .map_err(|e| (Blame::Host, format!("signal handler: {e}")))?;
    let inputs = StageInputs {
        prepared: &prepared,
        ctx,
        host,
        grants,
        limits: &limits,
    };
    let mut run = run_checked(&inputs, call.ask.stage, !call.no_check, &mut shutdown).await;
    run.result.plugin = call.ask.plugin.to_string();
    Ok(run.result)
}

/// How the agent reaches registries: the operator's insecure list, the mounted docker
/// configs (asked in order) and CA bundles.
fn registry_config(pulling: &Pulling) -> RegistryConfig {
    RegistryConfig {
        insecure: pulling.insecure_registries.clone(),
        ca_bundles: pulling
            .registry_cas
            .iter()
            .map(|c| (c.registry.clone(), c.pem.clone().into()))
            .collect(),
        credentials: Credentials::Chain(
            pulling
                .registry_configs
                .iter()
                .cloned()
                .map(Credentials::DockerConfig)
                .collect(),
        ),
        limits: nodewright_oci::PullLimits {
            cache_quota: pulling.cache_quota,
            ..Default::default()
        },
    }
}

/// A puller into the node cache (`--cache-dir`, else the agent's state directory on the
/// host) reaching registries as `pulling` says.
pub(crate) fn puller(common: &Common, pulling: &Pulling) -> Result<Puller, Refused> {
    let cache_dir = pulling
        .cache_dir
        .clone()
        .unwrap_or_else(|| markers::state_dir(&common.host_root).join("plugins"));
    let cache = NodeCache::open(&cache_dir).map_err(|e| (Blame::Host, e.to_string()))?;
    Ok(Puller::new(Registry::new(registry_config(pulling)), cache))
}

/// Whose fault a failed pull or staging is: a registry or node that may do better later is
/// the host's (retried), content that is not what the spec pins the spec's.
pub(crate) fn pull_fault(e: nodewright_oci::Error) -> Refused {
    let blame = if e.is_retryable() {
        Blame::Host
    } else {
        Blame::Config
    };
    (blame, e.to_string())
}

/// What a stage's plugin reads its payloads from: each name's tree in the node cache.
type PayloadTrees = BTreeMap<PayloadName, PathBuf>;

/// The pinned plugin pulled through the node cache with its payloads (a registry that
/// cannot be reached is the host's fault, content that is not a plugin the spec's),
/// compiled (or loaded from the code cache) and linked against `grants` (imports they do
/// not cover: denied).
async fn pull_and_prepare(
    call: &StageCall,
    grants: &GrantSet,
) -> Result<(PreparedPlugin, PayloadTrees), Refused> {
    let host_fault = |e: &dyn std::fmt::Display| (Blame::Host, e.to_string());
    let puller = puller(&call.common, &call.pulling)?;
    let pulled = puller
        .pull_pinned(&call.ask.plugin, &|p| eprintln!("{p:?}"))
        .await
        .map_err(pull_fault)?;
    let engine = Engine::new(EngineConfig {
        cache_dir: Some(puller.cache().code_dir()),
        // One stage, then its check, one after the other: a pool of one slot.
        concurrent_runs: std::num::NonZeroU32::MIN,
        ..Default::default()
    })
    .map_err(|e| host_fault(&e))?;
    let plugin = engine
        .load(&pulled.bytes)
        .map_err(|e| (Blame::Config, format!("{}: {e}", call.ask.plugin)))?;
    let prepared = engine.prepare(&plugin, grants).map_err(|e| match e {
        nodewright_engine::Error::MissingGrants { .. } => (Blame::Denied, e.to_string()),
        e => host_fault(&e),
    })?;
    let progress = |p| eprintln!("{p:?}");
    let mut staged = puller
        .stage_payloads(&call.ask.plugin, &pulled.payloads, &progress)
        .await
        .map_err(pull_fault)?;
    for image in &call.ask.payload_images {
        staged.push(
            puller
                .stage_image(image, &progress)
                .await
                .map_err(pull_fault)?,
        );
    }
    let mut trees = PayloadTrees::new();
    for p in staged {
        if trees.contains_key(&p.name) {
            return Err((
                Blame::Config,
                format!(
                    "payload {} is named twice: by the plugin {} and by spec.packages.{}.payloads",
                    p.name, call.ask.plugin, call.ask.package
                ),
            ));
        }
        trees.insert(p.name, p.tree);
    }
    Ok((prepared, trees))
}
