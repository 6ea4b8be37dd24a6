//! Engine errors.

use nodewright_api::grants::Capability;

use crate::report::LogLine;

/// Loading, checking or linking a plugin failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The wasmtime engine could not be built.
    #[error("cannot build the wasm engine: {0}")]
    Engine(WasmError),
    /// A thread the engine needs could not be started.
    #[error("cannot start the {what} thread: {source}")]
    Thread {
        /// Which (`epoch`, `compile`).
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are a core WebAssembly module, not a component.
    #[error(
        "not a component: this is a core WebAssembly module; build it for wasm32-wasip2 (nodewright plugin build)"
    )]
    CoreModule,
    /// The bytes are not WebAssembly at all.
    #[error("not a component: the file is not WebAssembly (no \\0asm header)")]
    NotWasm,
    /// The component does not export our world.
    #[error("not a nodewright plugin: {0}")]
    WrongWorld(String),
    /// Compilation failed.
    #[error("cannot compile the component: {0}")]
    Compile(WasmError),
    /// The compile thread ended without an answer (it panicked).
    #[error("cannot compile the component: the compile thread ended without a result")]
    CompileLost,
    /// The component is over a [`crate::LoadLimits`] bound; nothing was run.
    #[error("component refused before running: {0}")]
    TooLarge(String),
    /// The precompiled-code cache failed (I/O, not a stale entry: those are recompiled).
    #[error("plugin cache at {path}: {message}")]
    Cache {
        /// Cache path involved.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The component imports capabilities the grant does not cover.
    #[error("plugin {digest} needs capabilities that are not granted: {}", check.missing_summary())]
    MissingGrants {
        /// Component digest.
        digest: String,
        /// The full comparison.
        check: GrantCheck,
    },
    /// The component imports something nodewright does not provide.
    #[error("cannot link the component: {0}")]
    Link(WasmError),
}

impl Error {
    pub(crate) fn engine(e: wasmtime::Error) -> Self {
        Error::Engine(WasmError(e))
    }
    pub(crate) fn compile(e: wasmtime::Error) -> Self {
        Error::Compile(WasmError(e))
    }
    pub(crate) fn link(e: wasmtime::Error) -> Self {
        Error::Link(WasmError(e))
    }
}

/// A wasmtime error, kept whole: shown with its whole chain of causes (what a message
/// needs), and there for a caller that asks what it was ([`WasmError::inner`], then
/// `downcast_ref`, e.g. to a `wasmtime::Trap`).
#[derive(Debug)]
pub struct WasmError(pub(crate) wasmtime::Error);

impl WasmError {
    /// The wasmtime error.
    pub fn inner(&self) -> &wasmtime::Error {
        &self.0
    }
}

impl std::fmt::Display for WasmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

/// Its causes are in its `Display` (a `source` as well would print them twice).
impl std::error::Error for WasmError {}

/// Result alias for engine operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A stage could not run to completion in the sandbox. A plugin's own failure
/// (`Err(step-error)`) is not a `RunError`: it is a normal [`crate::RunReport`].
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The wall-clock deadline passed (guest code or a host call took too long).
    #[error("stage {stage} exceeded its deadline of {seconds:.1}s")]
    Timeout {
        /// Stage.
        stage: String,
        /// Deadline in seconds.
        seconds: f64,
        /// What the plugin logged before it was stopped.
        logs: Vec<LogLine>,
    },
    /// The guest tried to grow memory past the limit.
    #[error("stage {stage} exceeded its memory limit of {limit_mib} MiB")]
    MemoryLimit {
        /// Stage.
        stage: String,
        /// Limit in MiB.
        limit_mib: u64,
        /// What the plugin logged before it was stopped.
        logs: Vec<LogLine>,
    },
    /// The guest trapped (including a Rust panic in the plugin).
    #[error("stage {stage} trapped: {message}")]
    Trap {
        /// Stage.
        stage: String,
        /// Trap description (with the panic message when the guest printed one).
        message: String,
        /// What the plugin logged before it trapped.
        logs: Vec<LogLine>,
    },
    /// The component could not be instantiated in its fresh store. Its imports were linked
    /// and type-checked when it was prepared (and checked against ours when it was loaded),
    /// so what is left is its own doing: more instances, tables or memories than a store
    /// allows, or its start code failing. The package's fault.
    #[error("cannot instantiate plugin for stage {stage}: {error}")]
    Instantiate {
        /// Stage.
        stage: String,
        /// Why.
        error: WasmError,
    },
    /// A payload's tree could not be opened for the guest: the node's fault, not the
    /// package's.
    #[error("stage {stage}: cannot open payload {payload} at {path}: {reason}")]
    Payload {
        /// Stage.
        stage: String,
        /// The payload's name.
        payload: String,
        /// Its tree on the host.
        path: String,
        /// Why.
        reason: String,
    },
}

impl RunError {
    /// The plugin's log up to the failure (empty for instantiation failures).
    pub fn logs(&self) -> &[LogLine] {
        match self {
            RunError::Timeout { logs, .. }
            | RunError::MemoryLimit { logs, .. }
            | RunError::Trap { logs, .. } => logs,
            RunError::Instantiate { .. } | RunError::Payload { .. } => &[],
        }
    }

    /// Whether the failure is the plugin's fault (as opposed to the host's).
    pub fn is_package_fault(&self) -> bool {
        match self {
            RunError::Timeout { .. }
            | RunError::MemoryLimit { .. }
            | RunError::Trap { .. }
            | RunError::Instantiate { .. } => true,
            RunError::Payload { .. } => false,
        }
    }
}

/// The comparison of a component's imports with a grant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrantCheck {
    /// Capabilities imported but not granted: the plugin cannot run.
    pub missing: Vec<Capability>,
    /// Capabilities granted but not imported: harmless, but worth removing from the spec.
    pub excess: Vec<Capability>,
    /// One hint per missing capability, naming where to grant it.
    pub hints: Vec<String>,
}

impl GrantCheck {
    /// One line listing the missing capabilities and how to grant them.
    pub fn missing_summary(&self) -> String {
        self.missing
            .iter()
            .zip(&self.hints)
            .map(|(c, h)| format!("{c} ({h})"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}
