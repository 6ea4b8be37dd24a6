//! Bounds on what a component may cost before it runs at all.
//!
//! Compiling is the most expensive thing the host does with untrusted bytes: a small
//! component with hundreds of thousands of tiny functions takes tens of seconds and
//! gigabytes to compile. So the bytes are measured first (size, function count, with
//! `wasmparser` and nothing compiled), and compilation runs on a thread of its own with a
//! deadline. wasmtime cannot cancel a compilation; past the deadline the thread is left to
//! finish on its own and the load fails, which the pre-scan bounds keep cheap.

use std::sync::mpsc;
use std::time::Duration;

use wasmparser::{Parser, Payload};
use wasmtime::component::Component;

use crate::error::{Error, Result};

/// Limits applied to every component before and while it is compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadLimits {
    /// Largest component, in bytes.
    pub max_bytes: usize,
    /// Most function bodies across all of the component's core modules.
    pub max_functions: u32,
    /// Most CPU time one compilation may use (all of the process's threads, while it
    /// runs): the work a component demands, which a loaded machine does not inflate. Wall
    /// time is bounded too, at [`WALL_FACTOR`] times this, for a machine so starved that
    /// even a fair compile cannot finish.
    pub compile_timeout: Duration,
}

impl Default for LoadLimits {
    /// 100 MiB, 60,000 functions, 2 minutes: room for an interpreter-based component
    /// (CPython, SpiderMonkey), far below what makes compilation a denial of service.
    fn default() -> Self {
        LoadLimits {
            max_bytes: 100 << 20,
            max_functions: 60_000,
            compile_timeout: Duration::from_secs(120),
        }
    }
}

/// Refuses a component over the size limit, before anything reads it.
pub(crate) fn check_size(bytes: &[u8], limits: &LoadLimits) -> Result<()> {
    if bytes.len() > limits.max_bytes {
        return Err(Error::TooLarge(format!(
            "the component is {} bytes; the limit is {}",
            bytes.len(),
            limits.max_bytes
        )));
    }
    Ok(())
}

/// Counts functions without compiling, before a compilation: a component whose code is
/// already cached passed this when it was compiled (the cache is keyed by its digest), so
/// loading from the cache skips the walk over every section. Malformed sections are left
/// to wasmtime's validation; only the counts are checked here.
pub(crate) fn check_functions(bytes: &[u8], limits: &LoadLimits) -> Result<()> {
    let mut functions: u64 = 0;
    for payload in Parser::new(0).parse_all(bytes) {
        let Ok(payload) = payload else { break };
        if let Payload::CodeSectionStart { count, .. } = payload {
            functions += u64::from(count);
            if functions > u64::from(limits.max_functions) {
                return Err(Error::TooLarge(format!(
                    "the component has more than {} functions (at least {functions})",
                    limits.max_functions
                )));
            }
        }
    }
    Ok(())
}

/// The wall-time bound of a compilation, as a multiple of its CPU-time bound.
pub const WALL_FACTOR: u32 = 4;

/// How often a compilation's CPU time is read.
const CPU_CHECK: Duration = Duration::from_millis(250);

/// The CPU time this process has used (user + system, all threads), from
/// `/proc/self/stat`; `None` where there is no procfs.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // After the command name's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ: 100 on every Linux architecture's user-space ABI.
    Some(Duration::from_millis(ticks * 10))
}

/// Compiles on a thread of its own, giving up once it has used `timeout` of CPU time (or
/// [`WALL_FACTOR`] times that of wall time).
pub(crate) fn compile(
    engine: &wasmtime::Engine,
    bytes: &[u8],
    timeout: Duration,
) -> Result<Component> {
    let (tx, rx) = mpsc::channel();
    let engine = engine.clone();
    let bytes = bytes.to_vec();
    std::thread::Builder::new()
        .name("nodewright-compile".into())
        .spawn(move || {
            let _ = tx.send(Component::new(&engine, &bytes));
        })
        .map_err(|source| Error::Thread {
            what: "compile",
            source,
        })?;
    let started = std::time::Instant::now();
    let cpu_before = process_cpu();
    let wall = timeout * WALL_FACTOR;
    loop {
        match rx.recv_timeout(CPU_CHECK.min(timeout.max(Duration::from_millis(1)))) {
            Ok(result) => return result.map_err(Error::compile),
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(Error::CompileLost),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let used = match (cpu_before, process_cpu()) {
            (Some(before), Some(now)) => now.saturating_sub(before),
            // No CPU clock: wall time stands in for it.
            _ => started.elapsed(),
        };
        if used > timeout {
            return Err(Error::TooLarge(format!(
                "compiling the component used more than {:.0}s of CPU time",
                timeout.as_secs_f64()
            )));
        }
        if started.elapsed() > wall {
            return Err(Error::TooLarge(format!(
                "compiling the component took longer than {:.0}s (it had used {:.0}s of CPU)",
                wall.as_secs_f64(),
                used.as_secs_f64()
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_clock_counts_this_process_s_work() {
        let before = process_cpu().expect("procfs");
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let used = process_cpu().unwrap() - before;
        // Other tests' threads share the process: at most every core for the whole time.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        assert!(
            used >= Duration::from_millis(10)
                && used <= start.elapsed() * cores + Duration::from_millis(50),
            "300 ms of spinning read as {used:?}"
        );
    }

    #[test]
    fn size_is_checked_first() {
        let limits = LoadLimits {
            max_bytes: 8,
            ..Default::default()
        };
        assert!(matches!(
            check_size(&[0; 9], &limits),
            Err(Error::TooLarge(_))
        ));
    }
}
