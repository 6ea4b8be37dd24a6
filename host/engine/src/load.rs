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
    /// Longest compilation.
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

/// Compiles on a thread of its own, giving up after `timeout`.
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
    match rx.recv_timeout(timeout) {
        Ok(result) => result.map_err(Error::compile),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(Error::TooLarge(format!(
            "compiling the component took longer than {:.0}s",
            timeout.as_secs_f64()
        ))),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(Error::CompileLost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
