//! The machine's own speed today, beside the project's figures: three fixed workloads that
//! run none of our code, so `cargo xtask bench --compare` can tell a slower path from a
//! slower machine. Machines of the 2-core CI kind differ by more than the ×1.5 at which a
//! comparison marks a path: on 2026-12-07 the same commit read instantiate + `plan` at 50 µs
//! when the first baseline was recorded and at 29 µs on a fresh machine hours later.
//!
//! - compute: a chain of dependent 64-bit multiply-xorshift rounds (the core's clock);
//! - memory: dependent loads along one random cycle through 64 MiB (a cache miss and, most
//!   steps, a TLB miss each: what the planner's 10k-node pass and a store's first touches
//!   pay);
//! - kernel: opening, `fstat`-ing and closing a file (what every host call and every
//!   instantiation pays in system calls on this virtual machine);
//! - the compute chain on every core at once (bench `machine-cores`): not part of the
//!   machine's speed but a check on it — when it slows more than the one-core chain, someone
//!   else is using the other cores, and the paths that run on several (Cranelift's compile,
//!   the payload pull) slow with it.
//!
//! Run: `cargo bench -p nodewright-figures --bench machine`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use nodewright_figures::Figure;

/// Rounds of the compute chain per sample.
const ROUNDS: u64 = 1 << 25;
/// Entries (u32) of the memory cycle: 64 MiB.
const CYCLE: usize = 16 << 20;
/// Dependent loads per sample.
const STEPS: usize = 1 << 20;
/// File opens per sample.
const OPENS: usize = 10_000;

/// The compute chain on every core at once: the wall time until the last one finishes.
fn compute_on_every_core() -> Duration {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..cores {
            s.spawn(compute);
        }
    });
    t.elapsed()
}

fn samples(n: usize, mut one: impl FnMut() -> Duration) -> Vec<Duration> {
    one(); // warm: page the code and data in
    (0..n).map(|_| one()).collect()
}

fn compute() -> Duration {
    let t = Instant::now();
    let mut x = black_box(0x9e37_79b9_7f4a_7c15_u64);
    for _ in 0..ROUNDS {
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 31;
    }
    black_box(x);
    t.elapsed()
}

/// One cycle through every entry in a random order (Sattolo's shuffle of the identity):
/// following it from any entry visits them all before it returns.
fn cycle() -> Vec<u32> {
    let mut next: Vec<u32> = (0..CYCLE as u32).collect();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for i in (1..CYCLE).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let j = (seed % i as u64) as usize;
        next.swap(i, j);
    }
    next
}

fn memory(next: &[u32]) -> Duration {
    let t = Instant::now();
    let mut at = black_box(0_u32);
    for _ in 0..STEPS {
        at = next[at as usize];
    }
    black_box(at);
    t.elapsed()
}

fn kernel(path: &std::path::Path) -> Duration {
    let t = Instant::now();
    for _ in 0..OPENS {
        let f = std::fs::File::open(path).expect("opening the probe file");
        black_box(f.metadata().expect("fstat of the probe file").len());
    }
    t.elapsed()
}

fn main() {
    println!("machine: fixed workloads that run none of nodewright's code");
    Figure::timed(
        "machine",
        "compute, 2^25 mul-xorshift rounds",
        samples(15, compute),
    )
    .report();
    Figure::timed(
        "machine-cores",
        "compute, the same on every core at once",
        samples(15, compute_on_every_core),
    )
    .report();
    let next = cycle();
    Figure::timed(
        "machine",
        "memory, 2^20 random loads in 64 MiB",
        samples(11, || memory(&next)),
    )
    .report();
    drop(next);
    let probe = std::env::temp_dir().join(format!("nodewright-machine-{}", std::process::id()));
    std::fs::write(&probe, b"probe").expect("writing the probe file");
    let opened = samples(15, || kernel(&probe));
    std::fs::remove_file(&probe).expect("removing the probe file");
    Figure::timed("machine", "kernel, 10k open + fstat + close", opened).report();
}
