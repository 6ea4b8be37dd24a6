//! Where a run's instances, memories, tables and fiber stack come from.
//!
//! On demand, every run maps a fresh linear memory, faults its pages in, maps a fresh
//! fiber stack and unmaps all of it when the store drops: about half of a warm Rust `plan`
//! was the kernel doing that. A pool maps slots once, when the engine is built, and resets
//! a slot when its run ends — the pages the run dirtied (found with `PAGEMAP_SCAN` where
//! the kernel has it) are restored from the module's image, the fiber stack is zeroed — so
//! the next run starts from the same pristine state without a system call per page.
//!
//! A pool has a fixed number of slots, so the engine admits at most that many runs at
//! once; one more waits for a slot ([`RunSlots`]) rather than failing. Every slot is sized
//! to hold whatever the store's limiter admits (the `STORE_*` bounds), and wasmtime checks
//! a component against the slot sizes when it is loaded: a component with more core
//! instances, memories or tables than one store may hold is refused at load, by every
//! engine (the operator's included), before any node runs it.

use std::num::NonZeroU32;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::sandbox::{MAX_TABLE_ELEMENTS, STORE_INSTANCES, STORE_MEMORIES, STORE_TABLES};

/// Bytes of each linear memory kept mapped between runs and reset in place: a Rust
/// plugin's whole memory (stack and heap) fits; beyond it, pages go back to the kernel.
const MEMORY_KEEP_RESIDENT: usize = 2 << 20;
/// The same for each table and fiber stack.
const TABLE_KEEP_RESIDENT: usize = 256 << 10;
const STACK_KEEP_RESIDENT: usize = 64 << 10;

/// Runs an engine admits at once unless told otherwise, for tools and tests that run a few
/// side by side. The agent and the CLI's plugin commands run one stage at a time and ask
/// for one slot (a quarter of the mappings to make at start).
pub const DEFAULT_CONCURRENT_RUNS: NonZeroU32 = NonZeroU32::new(4).expect("nonzero");

/// Sets `config` up to pool slots for `runs` runs at once.
pub(crate) fn configure(config: &mut wasmtime::Config, runs: NonZeroU32) {
    let runs = runs.get();
    let mut pool = wasmtime::PoolingAllocationConfig::new();
    pool.total_component_instances(runs)
        .total_core_instances(STORE_INSTANCES * runs)
        .total_memories(STORE_MEMORIES * runs)
        .total_tables(STORE_TABLES * runs)
        .total_stacks(runs)
        .max_core_instances_per_component(STORE_INSTANCES)
        .max_memories_per_component(STORE_MEMORIES)
        .max_tables_per_component(STORE_TABLES)
        .max_memories_per_module(STORE_MEMORIES)
        .max_tables_per_module(STORE_TABLES)
        .table_elements(MAX_TABLE_ELEMENTS as usize)
        .linear_memory_keep_resident(MEMORY_KEEP_RESIDENT)
        .table_keep_resident(TABLE_KEEP_RESIDENT)
        .async_stack_keep_resident(STACK_KEEP_RESIDENT)
        // Reset only the pages a run dirtied (Linux 6.7+; otherwise the whole resident
        // part is reset, which is correct and slower).
        .pagemap_scan(wasmtime::Enabled::Auto);
    config
        .allocation_strategy(pool)
        // A slot's fiber stack is zeroed before the next run: one plugin's frames are
        // never there for the next to find through a bug.
        .async_stack_zeroing(true);
}

/// Admits at most as many runs as the pool has slots; one more waits.
#[derive(Clone, Debug)]
pub(crate) struct RunSlots(Arc<Semaphore>);

impl RunSlots {
    pub(crate) fn new(runs: NonZeroU32) -> Self {
        RunSlots(Arc::new(Semaphore::new(runs.get() as usize)))
    }

    /// Waits for a free slot, held until the permit drops.
    pub(crate) async fn acquire(&self) -> OwnedSemaphorePermit {
        self.0
            .clone()
            .acquire_owned()
            .await
            .expect("the engine never closes its slots")
    }
}
