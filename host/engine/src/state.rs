//! The store's data for one run: the WASI context, the memory limiter, and what the
//! capability implementations see (grants, host, budgets, denials, the errors the host
//! raised).

use std::collections::{BTreeMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use nodewright_api::grants::GrantSet;
use nodewright_api::payload::PayloadName;
use nodewright_hostops::{ExecLimits, HostOps};
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::bindings::types as wit;
use crate::report::{Denial, MAX_DENIALS_KEPT};
use crate::sandbox::{Limiter, LogBuffer, SandboxLimits};
use crate::stage::RunStage;

/// Store data for one run.
pub(crate) struct HostState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limiter: Limiter,
    pub(crate) caps: CapState,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Errors the host remembers having raised in one run, to tell them from forgeries.
const MAX_ISSUED: usize = 4096;

/// What one stage may still read and write.
#[derive(Clone, Debug)]
pub(crate) struct IoBudget {
    pub(crate) max_read: u64,
    pub(crate) bytes: u64,
    pub(crate) bytes_left: u64,
    pub(crate) files: u32,
    pub(crate) files_left: u32,
    pub(crate) min_free: u64,
}

impl IoBudget {
    pub(crate) fn new(limits: &SandboxLimits) -> Self {
        IoBudget {
            max_read: limits.max_read_bytes(),
            bytes: limits.write_bytes,
            bytes_left: limits.write_bytes,
            files: limits.write_files,
            files_left: limits.write_files,
            min_free: limits.min_free_bytes,
        }
    }
}

/// What capability implementations see.
pub(crate) struct CapState {
    pub(crate) grants: Arc<GrantSet>,
    pub(crate) host: Arc<dyn HostOps>,
    pub(crate) stage: RunStage,
    pub(crate) log: Arc<Mutex<LogBuffer>>,
    pub(crate) denials: DenialLedger,
    /// Fingerprints of the capability errors this run raised: a plugin may pass one on,
    /// but not invent one (which would shift the blame to the grant or the host).
    pub(crate) issued: HashSet<u64>,
    pub(crate) exec_limits: ExecLimits,
    pub(crate) budget: IoBudget,
    pub(crate) reboot_requested: bool,
    /// The package's payload trees, by name (`files.install` takes its sources there).
    pub(crate) payloads: BTreeMap<PayloadName, PathBuf>,
    /// Set when the run's store is dropped: a granted command still running then (the
    /// stage's deadline passed while it ran) is killed.
    #[expect(dead_code, reason = "held for its Drop")]
    pub(crate) ended: EndOfRun,
}

/// Raises its flag when dropped.
pub(crate) struct EndOfRun(pub(crate) Arc<std::sync::atomic::AtomicBool>);

impl Drop for EndOfRun {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The denials of one run: every one counted, the first [`MAX_DENIALS_KEPT`] kept whole
/// (a plugin looping on a refused call must not grow the report without bound).
#[derive(Debug, Default)]
pub(crate) struct DenialLedger {
    kept: Vec<Denial>,
    total: u64,
}

impl DenialLedger {
    fn record(&mut self, denial: Denial) {
        self.total += 1;
        if self.kept.len() < MAX_DENIALS_KEPT {
            self.kept.push(denial);
        }
    }

    /// The denials kept and how many there were in all, leaving the ledger empty.
    pub(crate) fn take(&mut self) -> (Vec<Denial>, u64) {
        (
            std::mem::take(&mut self.kept),
            std::mem::take(&mut self.total),
        )
    }
}

impl CapState {
    /// What the capability implementations of one run of `stage` see: `grants` over
    /// `host`, the budgets of `limits`, the run's `log`, the package's `payloads`. A
    /// granted command still running when the run's store is dropped is killed.
    pub(crate) fn new(
        grants: Arc<GrantSet>,
        host: Arc<dyn HostOps>,
        stage: RunStage,
        log: Arc<Mutex<LogBuffer>>,
        limits: &SandboxLimits,
        payloads: BTreeMap<PayloadName, PathBuf>,
    ) -> Self {
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        CapState {
            grants,
            host,
            stage,
            log,
            denials: DenialLedger::default(),
            issued: HashSet::new(),
            exec_limits: ExecLimits {
                timeout: limits.exec_timeout,
                max_output: limits.exec_max_output,
                cancel: Some(ended.clone()),
                tree: nodewright_hostops::ProcessTree::Group,
            },
            budget: IoBudget::new(limits),
            reboot_requested: false,
            payloads,
            ended: EndOfRun(ended),
        }
    }

    /// Remembers `e` as raised by the host and returns it.
    pub(crate) fn issue(&mut self, e: wit::CapError) -> wit::CapError {
        if self.issued.len() < MAX_ISSUED {
            self.issued.insert(fingerprint(&e));
        }
        e
    }

    pub(crate) fn record_denial(&mut self, denial: Denial) {
        self.denials.record(denial);
    }
}

pub(crate) fn fingerprint(e: &wit::CapError) -> u64 {
    let mut h = DefaultHasher::new();
    match e {
        wit::CapError::Denied(d) => {
            ("denied", &d.capability, &d.operation, &d.target, &d.message).hash(&mut h)
        }
        wit::CapError::WrongStage(m) => ("wrong-stage", m).hash(&mut h),
        wit::CapError::NotFound(m) => ("not-found", m).hash(&mut h),
        wit::CapError::Failed(m) => ("failed", m).hash(&mut h),
    }
    h.finish()
}
