//! nodewright's wasmtime embedding: load a plugin component once, link only the
//! capabilities its grant allows, run each stage in a fresh, bounded sandbox.
//!
//! The lifecycle, from cheapest-to-repeat to most expensive:
//!
//! 1. [`Engine::new`] — one per process. Epoch interruption is on and a ticker thread
//!    advances the epoch every [`EPOCH_TICK`]; runs take their instances from a pool of
//!    slots mapped here and reset between runs ([`EngineConfig::concurrent_runs`]).
//! 2. [`Engine::load`] — bytes → [`LoadedPlugin`]. Checks the bytes are a component within
//!    the [`LoadLimits`] (size and function count, measured before anything compiles), then
//!    loads precompiled native code from the on-disk cache (keyed by the content digest and
//!    the engine's compatibility hash, re-hashed before use) or compiles it on a thread with
//!    a deadline and caches it; then checks it is of our world.
//! 3. [`check_grants`] — compares the component's imports with a [`GrantSet`]: imports
//!    without a grant are errors, grants without an import are reported as excess. Nothing
//!    runs. The webhook, operator, agent and CLI all call it.
//! 4. [`Engine::prepare`] — an `InstancePre` per (component, linked capability set), cached.
//!    Only granted capability interfaces are linked; `log` and `node` always are.
//! 5. [`PreparedPlugin::run`] — one stage: a fresh `Store` with a memory cap, an epoch
//!    deadline *and* an async timeout (covering time spent in host calls), no environment,
//!    no arguments, no preopened directories, no network, stdout/stderr and logs captured
//!    into a bounded buffer. Every capability call is checked against the grant; a refusal
//!    is a typed `denied` error naming the grant to add.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use nodewright_api::grants::{Capabilities, GrantSet, GrantSource};
//! use nodewright_engine::{Engine, EngineConfig, RunStage, StageContext, SandboxLimits};
//! use nodewright_hostops::{NodeIdentity, SimHost};
//!
//! let engine = Engine::new(EngineConfig::default())?;
//! let plugin = engine.load(&std::fs::read("sysctl.wasm")?)?;
//! let caps: Capabilities = serde_json::from_str(r#"{"sysctl": ["net.ipv4.ip_forward"],
//!     "files": [{"path": "/etc/sysctl.d", "access": "readWrite"}]}"#)?;
//! let grants = Arc::new(GrantSet::parse(&caps, false, GrantSource::Flags).map_err(|e| format!("{e:?}"))?);
//! let prepared = engine.prepare(&plugin, &grants)?;
//! let host = Arc::new(SimHost::new("/tmp/node".as_ref(), NodeIdentity::default())?);
//! let ctx = StageContext::new("node-1", "tuning", "1.0.0").with_config("net.ipv4.ip_forward", "1");
//! let report = prepared.run(RunStage::Apply, ctx, host, grants, &SandboxLimits::default()).await?;
//! println!("{:?}", report.result);
//! # Ok(()) }
//! ```
//!
//! The engine never checks *who* may grant what: that is admission's job. It guarantees
//! only that a plugin cannot exceed the grant it was given.

#![deny(missing_docs)]

mod bindings;
mod cache;
mod caps;
mod error;
mod inspect;
mod load;
mod plugin;
mod pool;
mod report;
mod run;
mod sandbox;
mod stage;
mod state;

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub use error::{Error, GrantCheck, Result, RunError, WasmError};
pub use inspect::{EXPECTED_EXPORT, ImportKind, PluginImport, STAGE_FUNCTIONS};
pub use load::LoadLimits;
pub use nodewright_api::grants::{Capability, GrantSet};
pub use plugin::{LoadedPlugin, PreparedPlugin, check_grants};
pub use pool::DEFAULT_CONCURRENT_RUNS;
pub use report::{
    Change, Denial, LogLevel, LogLine, LogSource, MAX_DENIALS_KEPT, RequestedInterrupt, RunReport,
    StageOutcome, StepFailure,
};
pub use sandbox::{EPOCH_TICK, SandboxLimits};
pub use stage::{NODE_ORDER_ENV, RunStage, StageContext};
/// The wasmtime version this engine is built on, re-exported so embedders never mismatch it.
pub use wasmtime;

use state::HostState;

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Directory for precompiled native code. `None` disables the on-disk cache (every
    /// load compiles). Created with mode 0700: its contents are native code.
    pub cache_dir: Option<PathBuf>,
    /// Bounds checked before and during compilation.
    pub load_limits: LoadLimits,
    /// Runs admitted at once: the pool's slots, mapped when the engine is built and reset
    /// between runs. One more run waits for a slot.
    pub concurrent_runs: NonZeroU32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            cache_dir: None,
            load_limits: LoadLimits::default(),
            concurrent_runs: DEFAULT_CONCURRENT_RUNS,
        }
    }
}

/// One wasmtime engine, its code cache and its linkers.
pub struct Engine {
    inner: wasmtime::Engine,
    cache: Option<cache::CodeCache>,
    load_limits: LoadLimits,
    slots: pool::RunSlots,
    linkers: Mutex<HashMap<u8, Arc<wasmtime::component::Linker<HostState>>>>,
    pres: Mutex<HashMap<(String, u8), plugin::Linked>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

fn capability_mask(grants: &GrantSet) -> u8 {
    Capability::ALL
        .iter()
        .enumerate()
        .filter(|(_, c)| grants.grants(**c))
        .fold(0, |m, (i, _)| m | (1 << i))
}

impl Engine {
    /// Builds the engine and starts its epoch ticker.
    pub fn new(config: EngineConfig) -> Result<Self> {
        let mut wasm = wasmtime::Config::new();
        wasm.wasm_component_model(true)
            .epoch_interruption(true)
            .parallel_compilation(true);
        pool::configure(&mut wasm, config.concurrent_runs);
        let inner = wasmtime::Engine::new(&wasm).map_err(Error::engine)?;
        let weak = inner.weak();
        std::thread::Builder::new()
            .name("nodewright-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })
            .map_err(|source| Error::Thread {
                what: "epoch",
                source,
            })?;
        let cache = match config.cache_dir.clone() {
            Some(dir) => Some(cache::CodeCache::open(dir, &inner)?),
            None => None,
        };
        Ok(Engine {
            inner,
            cache,
            load_limits: config.load_limits,
            slots: pool::RunSlots::new(config.concurrent_runs),
            linkers: Mutex::default(),
            pres: Mutex::default(),
        })
    }

    /// The wasmtime engine.
    pub fn wasmtime(&self) -> &wasmtime::Engine {
        &self.inner
    }

    /// Checks `bytes` are a nodewright plugin component and loads its native code, from the
    /// cache when possible.
    ///
    /// Blocks for as long as a compilation takes (bounded by
    /// [`LoadLimits::compile_timeout`]); async callers run it on a blocking thread.
    pub fn load(&self, bytes: &[u8]) -> Result<LoadedPlugin> {
        inspect::check_is_component(bytes)?;
        load::check_size(bytes, &self.load_limits)?;
        let digest = cache::digest(bytes);
        let compile = || {
            load::check_functions(bytes, &self.load_limits)?;
            load::compile(&self.inner, bytes, self.load_limits.compile_timeout)
        };
        let (component, from_cache) = match &self.cache {
            Some(cache) => cache.load_or_compile(&self.inner, &digest, compile)?,
            None => (compile()?, false),
        };
        let (imports, exports) = inspect::describe(&self.inner, &component)?;
        Ok(LoadedPlugin {
            digest,
            size: bytes.len(),
            from_cache,
            imports,
            exports,
            component,
        })
    }

    /// Links `plugin` for `grants` after [`check_grants`] passes. Cached per
    /// (digest, linked capability set).
    pub fn prepare(&self, plugin: &LoadedPlugin, grants: &GrantSet) -> Result<PreparedPlugin> {
        let check = check_grants(plugin, grants);
        if !check.missing.is_empty() {
            return Err(Error::MissingGrants {
                digest: plugin.digest.clone(),
                check,
            });
        }
        let mask = capability_mask(grants);
        let key = (plugin.digest.clone(), mask);
        if let Some(linked) = self.pres.lock().expect("pre cache lock").get(&key) {
            return Ok(PreparedPlugin {
                linked: linked.clone(),
                engine: self.inner.clone(),
                slots: self.slots.clone(),
                digest: plugin.digest.clone(),
            });
        }
        let linker = self.linker(mask)?;
        let instance_pre = linker
            .instantiate_pre(&plugin.component)
            .map_err(Error::link)?;
        let linked = plugin::Linked::new(instance_pre).map_err(Error::link)?;
        self.pres
            .lock()
            .expect("pre cache lock")
            .insert(key, linked.clone());
        Ok(PreparedPlugin {
            linked,
            engine: self.inner.clone(),
            slots: self.slots.clone(),
            digest: plugin.digest.clone(),
        })
    }

    fn linker(&self, mask: u8) -> Result<Arc<wasmtime::component::Linker<HostState>>> {
        let mut linkers = self.linkers.lock().expect("linker cache lock");
        if let Some(l) = linkers.get(&mask) {
            return Ok(l.clone());
        }
        let caps: Vec<Capability> = Capability::ALL
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, c)| *c)
            .collect();
        let linker = Arc::new(caps::linker(&self.inner, &caps)?);
        linkers.insert(mask, linker.clone());
        Ok(linker)
    }
}
