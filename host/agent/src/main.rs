//! `nodewright-agent`: runs one stage of one package, or a node's merged interrupt, inside
//! a stage Job's pod.
//!
//! It resolves nothing: it pulls only the pinned digest it is given, verifies it through the
//! node cache, checks the grants against the component's imports, runs the stage in the
//! sandbox against the host root, and writes a structured [`nodewright_api::result::StageResult`] to the
//! termination message. Exit codes follow the failure's blame (see [`nodewright_api::result::Blame`]):
//! 0 ok, 1 package, 2 denied, 3 config, 4 host (retryable), 5 disruption.

mod markers;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use nodewright_api::grants::{Capabilities, GrantSet, GrantSource};
use nodewright_api::{hostargs, limits};
use nodewright_engine::{
    Engine, EngineConfig, Interrupt, RunStage, SandboxLimits, StageContext, StepFailure,
};
use nodewright_hostops::{HostNamespaces, HostOps, LinuxHost, NodeIdentity, SimHost};
use nodewright_oci::{NodeCache, Puller, Registry, RegistryConfig};

use markers::{MarkerKey, RebootPending};
use nodewright_api::result::{self, Blame, StageResult};

#[derive(Debug, Parser)]
#[command(name = "nodewright-agent", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one stage of one package.
    Run(RunArgs),
    /// Perform the node's merged interrupt (reboot protocol or service restarts).
    Interrupt(InterruptArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    /// A real node: the host's `/` at --host-root, commands in PID 1's namespaces.
    Linux,
    /// A simulated node (tests): --host-root is the node's scratch root.
    Sim,
}

#[derive(Debug, Args)]
struct Common {
    /// Where the host's `/` is mounted.
    #[arg(long, default_value = "/host")]
    host_root: PathBuf,
    /// Host-ops backend.
    #[arg(long, value_enum, default_value = "linux")]
    backend: Backend,
    /// Node name.
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// NodeWright uid (idempotence markers are keyed by it).
    #[arg(long)]
    cr_uid: String,
    /// NodeWright generation.
    #[arg(long, default_value_t = 0)]
    generation: i64,
    /// The node state entry's run epoch: a re-created entry (node reset, package rerun,
    /// reapply after reboot) has a new one, so its stages run again.
    #[arg(long, default_value_t = 0)]
    run: i64,
    /// Where the result goes.
    #[arg(long, default_value = "/dev/termination-log")]
    termination_log: PathBuf,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    common: Common,
    /// Stage (plan, apply, apply-check, config, ...).
    #[arg(long, value_parser = |s: &str| s.parse::<RunStage>())]
    stage: RunStage,
    /// Package name.
    #[arg(long)]
    package: String,
    /// Package version.
    #[arg(long)]
    version: String,
    /// Previous version (upgrade).
    #[arg(long)]
    previous_version: Option<String>,
    /// The node's place in the rollout order; the plugin sees it as `NODEWRIGHT_NODE_ORDER`.
    #[arg(long)]
    node_order: Option<u32>,
    /// Pinned plugin reference: repo@sha256:...
    #[arg(long)]
    plugin: String,
    /// The package's `capabilities`, as JSON.
    #[arg(long, default_value = "{}")]
    capabilities: String,
    /// The package's interrupt is `reboot` (grants power).
    #[arg(long)]
    reboot_allowed: bool,
    /// Configuration, as a JSON object of strings.
    #[arg(long, default_value = "{}")]
    config: String,
    /// Config keys changed since the last successful config.
    #[arg(long = "changed-key")]
    changed_keys: Vec<String>,
    /// Stage wall-clock limit.
    #[arg(long, default_value = "3600", value_parser = parse_seconds)]
    timeout: Duration,
    /// Sandbox memory limit in bytes (all the plugin's memories together).
    #[arg(long, default_value_t = limits::DEFAULT_MEMORY)]
    memory: u64,
    /// Bytes the stage may write through `files`.
    #[arg(long, default_value_t = limits::DEFAULT_WRITE_BYTES)]
    write_bytes: u64,
    /// Files and directories the stage may write or create.
    #[arg(long, default_value_t = limits::DEFAULT_WRITE_FILES)]
    write_files: u32,
    /// Free bytes every write must leave on its filesystem.
    #[arg(long, default_value_t = limits::DEFAULT_MIN_FREE_BYTES)]
    min_free_bytes: u64,
    /// How long to let a running stage finish after SIGTERM.
    #[arg(long, default_value = "30", value_parser = parse_seconds)]
    graceful_shutdown: Duration,
    /// Plugin cache (default: <host-root>/var/lib/nodewright/plugins).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Registries reachable over plain HTTP.
    #[arg(long = "insecure-registry")]
    insecure: Vec<String>,
    /// Run only the stage, not its check afterwards.
    #[arg(long)]
    no_check: bool,
}

#[derive(Debug, Args)]
struct InterruptArgs {
    #[command(flatten)]
    common: Common,
    /// `reboot`, `service` or `restartAllServices`.
    #[arg(long = "type")]
    kind: String,
    /// The package that owns the merged interrupt (part of its idempotence key).
    #[arg(long, default_value = "node")]
    package: String,
    /// Units to restart (for `service`).
    #[arg(long = "service")]
    services: Vec<String>,
    /// How long to wait for the node to go down after requesting a reboot.
    #[arg(long, default_value = "10", value_parser = parse_seconds)]
    reboot_wait: Duration,
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    s.trim_end_matches('s')
        .parse::<f64>()
        .map(Duration::from_secs_f64)
        .map_err(|_| format!("{s:?} is not a number of seconds"))
}

fn host(common: &Common) -> anyhow::Result<Arc<dyn HostOps>> {
    let identity = NodeIdentity {
        name: common.node.clone(),
        labels: vec![],
    };
    Ok(match common.backend {
        Backend::Linux => {
            // The host's /proc as mounted under the host root: its boot ID is the node's
            // even where the pod's own /proc would say otherwise. (Sysctls are per network
            // namespace either way, and the pod has the node's.)
            let host_proc = common.host_root.join("proc");
            let proc_root = if host_proc.join("sys/kernel").is_dir() {
                host_proc
            } else {
                PathBuf::from("/proc")
            };
            Arc::new(LinuxHost::new(
                &common.host_root,
                &proc_root,
                HostNamespaces::Of(1),
                identity,
            )?)
        }
        Backend::Sim => Arc::new(SimHost::new(&common.host_root, identity)?),
    })
}

fn finish(common: &Common, result: &StageResult) -> ExitCode {
    let message = result.to_termination_message();
    if let Err(e) = std::fs::write(&common.termination_log, &message) {
        eprintln!("cannot write {}: {e}", common.termination_log.display());
    }
    println!("{message}");
    ExitCode::from(result.blame.exit_code())
}

fn interrupt_text(i: &Interrupt) -> String {
    match i {
        Interrupt::None => "none".into(),
        Interrupt::Service(s) => format!("service:{}", s.join(",")),
        Interrupt::RestartAllServices => "restartAllServices".into(),
        Interrupt::Reboot => "reboot".into(),
    }
}

async fn run_stage(args: &RunArgs) -> StageResult {
    let stage = args.stage.as_str();
    let fail = |blame, msg: String| StageResult::failed(stage, &args.package, blame, msg);
    // The first line of the pod's log says what this pod is for.
    eprintln!(
        "nodewright-agent: {stage} of {} {} on {} ({})",
        args.package, args.version, args.common.node, args.plugin
    );
    if !args.plugin.contains("@sha256:") {
        return fail(
            Blame::Config,
            format!(
                "{}: agents pull only pinned references (repo@sha256:...)",
                args.plugin
            ),
        );
    }
    let caps: Capabilities = match serde_json::from_str(&args.capabilities) {
        Ok(c) => c,
        Err(e) => return fail(Blame::Config, format!("--capabilities: {e}")),
    };
    let grants = match GrantSet::parse(
        &caps,
        args.reboot_allowed,
        GrantSource::Spec {
            package: args.package.clone(),
        },
    ) {
        Ok(g) => Arc::new(g),
        Err(errs) => {
            return fail(
                Blame::Config,
                errs.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            );
        }
    };
    let config: BTreeMap<String, String> = match serde_json::from_str(&args.config) {
        Ok(c) => c,
        Err(e) => return fail(Blame::Config, format!("--config: {e}")),
    };
    let host = match host(&args.common) {
        Ok(h) => h,
        Err(e) => return fail(Blame::Host, format!("host: {e:#}")),
    };
    let cache_dir = args
        .cache_dir
        .clone()
        .unwrap_or_else(|| markers::state_dir(&args.common.host_root).join("plugins"));
    let cache = match NodeCache::open(&cache_dir) {
        Ok(c) => c,
        Err(e) => return fail(Blame::Host, e.to_string()),
    };
    let registry = Registry::new(RegistryConfig {
        insecure: args.insecure.clone(),
        ..Default::default()
    });
    let puller = Puller::new(registry, cache);
    let pulled = match puller
        .pull_pinned(&args.plugin, &|p| eprintln!("{p:?}"))
        .await
    {
        Ok(p) => p,
        Err(e) if e.is_retryable() => return fail(Blame::Host, e.to_string()),
        Err(e) => return fail(Blame::Config, e.to_string()),
    };
    let engine = match Engine::new(EngineConfig {
        cache_dir: Some(puller.cache().code_dir()),
        ..Default::default()
    }) {
        Ok(e) => e,
        Err(e) => return fail(Blame::Host, e.to_string()),
    };
    let plugin = match engine.load(&pulled.bytes) {
        Ok(p) => p,
        Err(e) => return fail(Blame::Config, format!("{}: {e}", args.plugin)),
    };
    let prepared = match engine.prepare(&plugin, &grants) {
        Ok(p) => p,
        Err(e @ nodewright_engine::Error::MissingGrants { .. }) => {
            return fail(Blame::Denied, e.to_string());
        }
        Err(e) => return fail(Blame::Host, e.to_string()),
    };
    let ctx = StageContext {
        node: args.common.node.clone(),
        package: args.package.clone(),
        version: args.version.clone(),
        previous_version: args.previous_version.clone(),
        config,
        changed_keys: args.changed_keys.clone(),
        node_order: args.node_order,
    };
    let limits = SandboxLimits {
        timeout: args.timeout,
        memory: args.memory,
        write_bytes: args.write_bytes,
        write_files: args.write_files,
        min_free_bytes: args.min_free_bytes,
        ..Default::default()
    };
    // SIGTERM: let the running stage finish within the graceful-shutdown period, else abort.
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => return fail(Blame::Host, format!("signal handler: {e}")),
    };
    let mut result = execute(
        args,
        &prepared,
        args.stage,
        ctx.clone(),
        host.clone(),
        grants.clone(),
        &limits,
        &mut term,
    )
    .await;
    // Work, then its check: a stage counts as done only when its check passes.
    if result.blame == Blame::None
        && !args.no_check
        && let Some(check) = args.stage.check()
    {
        let verdict = execute(
            args, &prepared, check, ctx, host, grants, &limits, &mut term,
        )
        .await;
        if verdict.blame != Blame::None {
            let mut failed = fail(
                verdict.blame,
                format!(
                    "{check} failed after {stage} succeeded: {}",
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
    }
    result.plugin = pulled.reference;
    result
}

/// Runs one stage in the sandbox and turns its report into a result.
#[expect(
    clippy::too_many_arguments,
    reason = "one stage's inputs, shared by the stage and its check"
)]
async fn execute(
    args: &RunArgs,
    prepared: &nodewright_engine::PreparedPlugin,
    stage: RunStage,
    ctx: StageContext,
    host: Arc<dyn HostOps>,
    grants: Arc<GrantSet>,
    limits: &SandboxLimits,
    term: &mut tokio::signal::unix::Signal,
) -> StageResult {
    let name = stage.as_str();
    let fail = |blame, msg: String| StageResult::failed(name, &args.package, blame, msg);
    let run = prepared.run(stage, ctx, host, grants, limits);
    tokio::pin!(run);
    let outcome = tokio::select! {
        r = &mut run => r,
        _ = term.recv() => match tokio::time::timeout(args.graceful_shutdown, &mut run).await {
            Ok(r) => r,
            Err(_) => return fail(Blame::Disruption, format!("stopped by SIGTERM; {name} did not finish within {:?}", args.graceful_shutdown)),
        },
    };
    let report = match outcome {
        Ok(r) => r,
        Err(e) => {
            let blame = if e.is_package_fault() {
                Blame::Package
            } else {
                Blame::Host
            };
            let mut r = fail(blame, e.to_string());
            r.logs = e
                .logs()
                .iter()
                .rev()
                .take(20)
                .rev()
                .map(|l| l.message.clone())
                .collect();
            return r.bounded();
        }
    };
    let logs: Vec<String> = report
        .logs
        .iter()
        .rev()
        .take(20)
        .rev()
        .map(|l| l.message.clone())
        .collect();
    let mut result = match &report.result {
        Ok(o) => StageResult {
            outcome: "ok".into(),
            stage: name.into(),
            package: args.package.clone(),
            blame: Blame::None,
            message: o
                .message
                .clone()
                .unwrap_or_else(|| format!("{} change(s)", o.changes.len())),
            interrupt: Some(interrupt_text(&o.interrupt)),
            change_count: o.changes.len() as u32,
            changes: o
                .changes
                .iter()
                .take(result::MAX_CHANGES)
                .map(|c| format!("{} {}: {}", c.kind, c.target, c.detail))
                .collect(),
            plugin: String::new(),
            logs: Vec::new(),
        },
        Err(f) => {
            let blame = match f {
                StepFailure::Denied(_) => Blame::Denied,
                StepFailure::InvalidConfig(_) => Blame::Config,
                StepFailure::HostFailed(_) => Blame::Host,
                StepFailure::WrongStage(_) | StepFailure::NotFound(_) | StepFailure::Failed(_) => {
                    Blame::Package
                }
            };
            fail(blame, f.to_string())
        }
    };
    result.logs = logs;
    result.bounded()
}

async fn interrupt(args: &InterruptArgs) -> StageResult {
    let fail = |blame, msg: String| StageResult::failed("interrupt", "node", blame, msg);
    let host = match host(&args.common) {
        Ok(h) => h,
        Err(e) => return fail(Blame::Host, format!("host: {e:#}")),
    };
    let state = markers::state_dir(&args.common.host_root);
    let ok = |message: String| StageResult {
        outcome: "ok".into(),
        blame: Blame::None,
        message,
        interrupt: Some(args.kind.clone()),
        ..fail(Blame::None, String::new())
    };
    match args.kind.as_str() {
        "reboot" => {
            let boot = host.node_info().boot_id;
            if let Some(pending) = markers::read_pending(&state) {
                let _ = std::fs::remove_file(markers::reboot_marker(&state));
                if pending.boot_id != boot {
                    return ok(format!("rebooted: boot ID {} -> {boot}", pending.boot_id));
                }
                eprintln!("stale reboot marker (boot ID unchanged): requesting the reboot again");
            }
            if let Err(e) = markers::write_pending(
                &state,
                &RebootPending {
                    boot_id: boot.clone(),
                    cr_uid: args.common.cr_uid.clone(),
                },
            ) {
                return fail(
                    Blame::Host,
                    format!("cannot record the pending reboot: {e}"),
                );
            }
            if let Err(e) =
                host.request_reboot(&format!("nodewright interrupt for {}", args.common.cr_uid))
            {
                return fail(Blame::Host, format!("reboot request failed: {e}"));
            }
            eprintln!(
                "reboot requested (boot ID {boot}); waiting up to {:?} for shutdown",
                args.reboot_wait
            );
            tokio::time::sleep(args.reboot_wait).await;
            fail(
                Blame::Host,
                format!(
                    "the node did not go down within {:?} of the reboot request",
                    args.reboot_wait
                ),
            )
        }
        "service" | "restartAllServices" => {
            // For restartAllServices the operator passes its configured list.
            let units = args.services.clone();
            if units.is_empty() {
                return fail(
                    Blame::Config,
                    format!("{} interrupt without units", args.kind),
                );
            }
            if let Some(reason) = units.iter().find_map(|u| hostargs::unit_name(u).err()) {
                return fail(Blame::Config, format!("--service: {reason}"));
            }
            for unit in &units {
                if let Err(e) = host.service(nodewright_hostops::ServiceVerb::Restart, unit) {
                    return fail(Blame::Host, format!("restart {unit}: {e}"));
                }
            }
            ok(format!("restarted {}", units.join(", ")))
        }
        other => fail(Blame::Config, format!("unknown interrupt type {other:?}")),
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let cli = Cli::parse();
    // Before any thread: an image without CA certificates still reaches plain-HTTP
    // registries, and HTTPS ones fail saying what is missing (instead of a panic).
    let common = match &cli.command {
        Command::Run(a) => &a.common,
        Command::Interrupt(a) => &a.common,
    };
    if let Err(e) =
        nodewright_oci::prepare_roots(&markers::state_dir(&common.host_root).join("tls"))
    {
        eprintln!("cannot prepare the TLS roots: {e}");
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::from(Blame::Host.exit_code());
        }
    };
    match &cli.command {
        Command::Run(args) => {
            let key = MarkerKey {
                cr_uid: args.common.cr_uid.clone(),
                generation: args.common.generation,
                run: args.common.run,
                package: args.package.clone(),
                version: args.version.clone(),
                stage: args.stage.as_str().into(),
            };
            let state = markers::state_dir(&args.common.host_root);
            if !args.stage.read_only()
                && let Some(done) = key.done(&state)
            {
                eprintln!(
                    "{} of {} {} already succeeded for this generation; not running it again",
                    args.stage, args.package, args.version
                );
                return finish(&args.common, &done);
            }
            let result = rt.block_on(run_stage(args));
            // A host call still blocked past the stage deadline must not keep the pod
            // alive: give blocking threads a moment, then leave them.
            rt.shutdown_timeout(Duration::from_secs(1));
            if result.blame == Blame::None
                && !args.stage.read_only()
                && let Err(e) = key.record(&state, &result)
            {
                eprintln!("cannot record the idempotence marker: {e}");
            }
            finish(&args.common, &result)
        }
        Command::Interrupt(args) => {
            let key = MarkerKey {
                cr_uid: args.common.cr_uid.clone(),
                generation: args.common.generation,
                run: args.common.run,
                package: args.package.clone(),
                version: String::new(),
                stage: format!("interrupt-{}", args.kind),
            };
            let state = markers::state_dir(&args.common.host_root);
            if let Some(done) = key.done(&state) {
                eprintln!("the interrupt already completed for this generation");
                return finish(&args.common, &done);
            }
            let result = rt.block_on(interrupt(args));
            rt.shutdown_timeout(Duration::from_secs(1));
            if result.blame == Blame::None
                && let Err(e) = key.record(&state, &result)
            {
                eprintln!("cannot record the idempotence marker: {e}");
            }
            finish(&args.common, &result)
        }
    }
}
