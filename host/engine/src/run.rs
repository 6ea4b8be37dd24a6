//! Running one stage in a fresh store: instantiate with the limits, call the export, judge
//! what came back.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nodewright_api::grants::GrantSet;
use nodewright_hostops::HostOps;
use wasmtime::Store;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use crate::bindings::types as wit;
use crate::error::RunError;
use crate::plugin::PreparedPlugin;
use crate::report::{LogLine, LogSource, RunReport, StepFailure, check_outcome};
use crate::sandbox::{
    CapturedStream, EPOCH_TICK, Limiter, LogBuffer, MemoryLimitExceeded, SandboxLimits,
};
use crate::stage::{NODE_ORDER_ENV, RunStage, StageContext};
use crate::state::{CapState, HostState, fingerprint};

/// Every stage export's parameters and results (`func(ctx: context) -> result<outcome,
/// step-error>`).
type StageParams<'a> = (&'a wit::Context,);
type StageResults = (Result<wit::Outcome, wit::StepError>,);

/// The plugin's error as the host will judge it. A capability error counts as the
/// grant's (`denied`) or the host's (`failed`) only if the host raised exactly that error
/// in this run; an invented one is the package's failure.
fn step_failure(e: wit::StepError, issued: &HashSet<u64>) -> StepFailure {
    let cap = match e {
        wit::StepError::InvalidConfig(m) => return StepFailure::InvalidConfig(m),
        wit::StepError::Failed(m) => return StepFailure::Failed(m),
        wit::StepError::Capability(cap) => cap,
    };
    if !issued.contains(&fingerprint(&cap)) {
        let (kind, text) = match &cap {
            wit::CapError::Denied(d) => ("denied", d.message.as_str()),
            wit::CapError::WrongStage(m) => ("wrong-stage", m.as_str()),
            wit::CapError::NotFound(m) => ("not-found", m.as_str()),
            wit::CapError::Failed(m) => ("failed", m.as_str()),
        };
        return StepFailure::Failed(format!(
            "the plugin reported a {kind} capability error the host never raised: {}",
            crate::caps::clip(text, 512)
        ));
    }
    match cap {
        wit::CapError::Denied(d) => StepFailure::Denied(d.into()),
        wit::CapError::WrongStage(m) => StepFailure::WrongStage(m),
        wit::CapError::NotFound(m) => StepFailure::NotFound(m),
        wit::CapError::Failed(m) => StepFailure::HostFailed(m),
    }
}

impl PreparedPlugin {
    /// Runs one stage in a fresh store against `host`, with `grants` checked on every call.
    ///
    /// Waits for a free slot first ([`EngineConfig::concurrent_runs`](crate::EngineConfig));
    /// the stage's deadline starts once it has one.
    ///
    /// Returns `Ok` when the plugin returned (successfully or with its own error) and
    /// [`RunError`] when the sandbox stopped it (deadline, memory, trap).
    pub async fn run(
        &self,
        stage: RunStage,
        mut ctx: StageContext,
        host: Arc<dyn HostOps>,
        grants: Arc<GrantSet>,
        limits: &SandboxLimits,
    ) -> Result<RunReport, RunError> {
        // Declared before the store, so dropped after it: the slot is free again only
        // once the store has given back its instances.
        let _slot = self.slots.acquire().await;
        let log = Arc::new(Mutex::new(LogBuffer::new(limits)));
        let stdout = CapturedStream::new(log.clone(), LogSource::Stdout);
        let stderr = CapturedStream::new(log.clone(), LogSource::Stderr);
        let caps = CapState::new(
            grants,
            host,
            stage,
            log.clone(),
            limits,
            // The capabilities keep the payloads (install's sources); the store's
            // directories are opened from them.
            std::mem::take(&mut ctx.payloads),
        );
        let streams = (stdout.clone(), stderr.clone());
        let mut store = self.store(caps, streams, ctx.node_order, stage, limits)?;

        let started = Instant::now();
        let timeout = |logs: Vec<LogLine>| RunError::Timeout {
            stage: stage.to_string(),
            seconds: limits.timeout.as_secs_f64(),
            logs,
        };
        let pre = &self.linked.pre;
        let instance = tokio::time::timeout(limits.timeout, pre.instantiate_async(&mut store))
            .await
            .map_err(|_| timeout(Vec::new()))?
            .map_err(|e| {
                // Linking was done when the plugin was prepared: what fails here is the
                // component's own (a trap or memory in its start code, or the store's
                // instance, table and memory counts), so every case is the package's.
                if e.downcast_ref::<wasmtime::Trap>().is_some()
                    || e.downcast_ref::<MemoryLimitExceeded>().is_some()
                {
                    classify_trap(stage, e, limits, &log)
                } else {
                    RunError::Instantiate {
                        stage: stage.to_string(),
                        error: crate::error::WasmError(e),
                    }
                }
            })?;
        let wit_ctx = ctx.to_wit(stage);
        let remaining = limits.timeout.saturating_sub(started.elapsed());
        let call = async {
            // Checked against its type once here; where it lies was found when prepared.
            let func = instance.get_typed_func::<StageParams, StageResults>(
                &mut store,
                self.linked.export(stage),
            )?;
            func.call_async(&mut store, (&wit_ctx,))
                .await
                .map(|(result,)| result)
        };
        let called = tokio::time::timeout(remaining, call).await;
        stdout.finish();
        stderr.finish();
        let duration = started.elapsed();
        let raw = match called {
            Err(_) => return Err(timeout(log.lock().expect("log lock").take().0)),
            Ok(Err(trap)) => return Err(classify_trap(stage, trap, limits, &log)),
            Ok(Ok(result)) => result,
        };
        let memory_peak = store.data().limiter.memory_used();
        let caps = &mut store.data_mut().caps;
        let result = match raw {
            Ok(o) => check_outcome(o),
            Err(e) => Err(step_failure(e, &caps.issued)),
        };
        let (logs, logs_dropped) = log.lock().expect("log lock").take();
        let (denials, denials_total) = caps.denials.take();
        Ok(RunReport {
            stage,
            result,
            logs,
            logs_dropped,
            denials,
            denials_total,
            duration,
            memory_peak,
        })
    }
}

impl PreparedPlugin {
    /// A fresh store for one run: nothing inherited — no environment but the node order,
    /// no arguments or sockets (wasmtime-wasi denies TCP, UDP and name lookup unless
    /// allowed), no directory but the package's payloads, each read-only at
    /// `/payload/<name>` — stdout and stderr into the bounded log, the memory limiter, and
    /// the epoch deadline of `limits.timeout`.
    fn store(
        &self,
        caps: CapState,
        (stdout, stderr): (CapturedStream, CapturedStream),
        node_order: Option<u32>,
        stage: RunStage,
        limits: &SandboxLimits,
    ) -> Result<Store<HostState>, RunError> {
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(stdout).stderr(stderr);
        if let Some(order) = node_order {
            wasi.env(NODE_ORDER_ENV, order.to_string());
        }
        for (name, tree) in &caps.payloads {
            wasi.preopened_dir(tree, name.guest_path(), FsPerms::ReadOnly)
                .map_err(|e| RunError::Payload {
                    stage: stage.to_string(),
                    payload: name.to_string(),
                    path: tree.display().to_string(),
                    reason: format!("{e:#}"),
                })?;
        }
        let state = HostState {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limiter: Limiter::new(limits.memory),
            caps,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        let ticks = (limits.timeout.as_millis() / EPOCH_TICK.as_millis()) as u64 + 1;
        store.set_epoch_deadline(ticks);
        store.epoch_deadline_trap();
        Ok(store)
    }
}

fn classify_trap(
    stage: RunStage,
    err: wasmtime::Error,
    limits: &SandboxLimits,
    log: &Mutex<LogBuffer>,
) -> RunError {
    let (lines, _) = log.lock().expect("log lock").take();
    if err.downcast_ref::<MemoryLimitExceeded>().is_some() {
        return RunError::MemoryLimit {
            stage: stage.to_string(),
            limit_mib: limits.memory >> 20,
            logs: lines,
        };
    }
    if err.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::Interrupt) {
        return RunError::Timeout {
            stage: stage.to_string(),
            seconds: limits.timeout.as_secs_f64(),
            logs: lines,
        };
    }
    // A Rust guest prints its panic message to stderr before aborting; surface it.
    let panic = lines
        .iter()
        .rev()
        .find(|l| l.source == LogSource::Stderr && l.message.contains("panicked"));
    let trap = err
        .downcast_ref::<wasmtime::Trap>()
        .map(|t| t.to_string())
        .unwrap_or_else(|| format!("{err:#}"));
    let message = match panic {
        Some(line) => format!("{trap} ({})", line.message),
        None => trap,
    };
    RunError::Trap {
        stage: stage.to_string(),
        message,
        logs: lines,
    }
}
