//! Per-run bounds: memory, wall clock, captured output.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use nodewright_api::limits;

use crate::report::{LogLevel, LogLine, LogSource};

/// How often the epoch advances. Wall-clock deadlines are rounded up to this.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Limits applied to every stage run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Wall-clock budget for the whole stage, guest code and host calls together.
    pub timeout: Duration,
    /// Cap on the guest's linear memory, in bytes: all its memories together. Reads
    /// through `files` are capped at half of it.
    pub memory: u64,
    /// Log lines kept (the most recent ones; older lines are counted as dropped).
    pub max_log_lines: usize,
    /// Log bytes kept.
    pub max_log_bytes: usize,
    /// Timeout for each granted host command.
    pub exec_timeout: Duration,
    /// Bytes kept from each stream of a granted host command.
    pub exec_max_output: usize,
    /// Bytes one stage may write through `files`.
    pub write_bytes: u64,
    /// Files and directories one stage may write or create.
    pub write_files: u32,
    /// Free bytes a write must leave on its filesystem.
    pub min_free_bytes: u64,
}

impl SandboxLimits {
    /// The largest single `files.read`: half the memory limit.
    pub fn max_read_bytes(&self) -> u64 {
        limits::max_read_bytes(self.memory)
    }
}

impl Default for SandboxLimits {
    /// 5 minutes, 128 MiB, the last 2000 log lines up to 256 KiB, 2-minute commands with
    /// 64 KiB of output each, 256 MiB and 4096 files written per stage, 256 MiB left free.
    fn default() -> Self {
        SandboxLimits {
            timeout: Duration::from_secs(300),
            memory: limits::DEFAULT_MEMORY,
            max_log_lines: 2000,
            max_log_bytes: 256 << 10,
            exec_timeout: Duration::from_secs(120),
            exec_max_output: 64 << 10,
            write_bytes: limits::DEFAULT_WRITE_BYTES,
            write_files: limits::DEFAULT_WRITE_FILES,
            min_free_bytes: limits::DEFAULT_MIN_FREE_BYTES,
        }
    }
}

/// A single line longer than this is cut: one huge line must not evict all others.
const MAX_LINE: usize = 4096;

/// Raised through the limiter when the guest asks for more memory than allowed, so the
/// run can report a memory-limit error rather than a generic trap.
#[derive(Debug, thiserror::Error)]
#[error("memory limit of {limit} bytes exceeded (asked for {desired})")]
pub(crate) struct MemoryLimitExceeded {
    pub(crate) limit: u64,
    pub(crate) desired: u64,
}

/// Table elements one store may hold across all its tables.
pub(crate) const MAX_TABLE_ELEMENTS: u64 = 200_000;
/// Core instances one store may hold (a component's modules, adapters and shims).
pub(crate) const STORE_INSTANCES: u32 = 32;
/// Tables one store may hold.
pub(crate) const STORE_TABLES: u32 = 32;
/// Linear memories one store may hold (their bytes together are capped by the limit).
pub(crate) const STORE_MEMORIES: u32 = 16;

/// Caps the *total* linear memory and table elements of one store (a component may have
/// several core instances, each with its own memories), and instance counts.
#[derive(Debug)]
pub(crate) struct Limiter {
    memory: u64,
    memory_used: u64,
    table_elements: u64,
}

impl Limiter {
    pub(crate) fn new(memory: u64) -> Self {
        Limiter {
            memory,
            memory_used: 0,
            table_elements: 0,
        }
    }

    /// Bytes of linear memory granted so far (the peak: memories only grow).
    pub(crate) fn memory_used(&self) -> u64 {
        self.memory_used
    }
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Called for every memory, with current = 0 when it is created.
        let total = self.memory_used - current as u64 + desired as u64;
        if total > self.memory {
            return Err(wasmtime::Error::new(MemoryLimitExceeded {
                limit: self.memory,
                desired: total,
            }));
        }
        self.memory_used = total;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        // The growth did not happen after all; the accounting stays high, which only errs
        // on the safe side for the rest of this run.
        Ok(())
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self.table_elements - current as u64 + desired as u64;
        if total > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        self.table_elements = total;
        Ok(true)
    }

    fn instances(&self) -> usize {
        STORE_INSTANCES as usize
    }
    fn tables(&self) -> usize {
        STORE_TABLES as usize
    }
    fn memories(&self) -> usize {
        STORE_MEMORIES as usize
    }
}

/// The bounded log of one run, shared by the `log` interface and guest stdout/stderr.
#[derive(Debug)]
pub(crate) struct LogBuffer {
    lines: VecDeque<LogLine>,
    bytes: usize,
    max_lines: usize,
    max_bytes: usize,
    pub(crate) dropped: u64,
}

impl LogBuffer {
    pub(crate) fn new(limits: &SandboxLimits) -> Self {
        LogBuffer {
            lines: VecDeque::new(),
            bytes: 0,
            max_lines: limits.max_log_lines,
            max_bytes: limits.max_log_bytes,
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, source: LogSource, level: LogLevel, mut message: String) {
        if message.len() > MAX_LINE {
            let mut cut = MAX_LINE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str(" [truncated]");
        }
        self.bytes += message.len();
        self.lines.push_back(LogLine {
            source,
            level,
            message,
        });
        while self.lines.len() > self.max_lines || self.bytes > self.max_bytes {
            let Some(old) = self.lines.pop_front() else {
                break;
            };
            self.bytes -= old.message.len();
            self.dropped += 1;
        }
    }

    pub(crate) fn take(&mut self) -> (Vec<LogLine>, u64) {
        (std::mem::take(&mut self.lines).into(), self.dropped)
    }
}

/// Guest stdout or stderr: split into lines and appended to the run's log. Never errors
/// (an error would make Rust's `println!` panic inside the guest); the buffer bounds it.
#[derive(Clone, Debug)]
pub(crate) struct CapturedStream {
    pub(crate) log: Arc<Mutex<LogBuffer>>,
    pub(crate) source: LogSource,
    partial: Arc<Mutex<Vec<u8>>>,
}

impl CapturedStream {
    pub(crate) fn new(log: Arc<Mutex<LogBuffer>>, source: LogSource) -> Self {
        CapturedStream {
            log,
            source,
            partial: Arc::default(),
        }
    }

    fn accept(&self, buf: &[u8]) {
        let mut partial = self.partial.lock().expect("stream lock");
        partial.extend_from_slice(buf);
        let level = if self.source == LogSource::Stderr {
            LogLevel::Warn
        } else {
            LogLevel::Info
        };
        while let Some(pos) = partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = partial.drain(..=pos).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            self.log
                .lock()
                .expect("log lock")
                .push(self.source, level, text);
        }
        if partial.len() > MAX_LINE {
            let text = String::from_utf8_lossy(&partial).into_owned();
            partial.clear();
            self.log
                .lock()
                .expect("log lock")
                .push(self.source, level, text);
        }
    }

    /// Flushes a final line without a newline.
    pub(crate) fn finish(&self) {
        let mut partial = self.partial.lock().expect("stream lock");
        if !partial.is_empty() {
            let text = String::from_utf8_lossy(&partial).into_owned();
            partial.clear();
            let level = if self.source == LogSource::Stderr {
                LogLevel::Warn
            } else {
                LogLevel::Info
            };
            self.log
                .lock()
                .expect("log lock")
                .push(self.source, level, text);
        }
    }
}

impl tokio::io::AsyncWrite for CapturedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.accept(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl wasmtime_wasi::cli::IsTerminal for CapturedStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl wasmtime_wasi::cli::StdoutStream for CapturedStream {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keeps_the_most_recent_lines_within_bounds() {
        let limits = SandboxLimits {
            max_log_lines: 3,
            max_log_bytes: 1000,
            ..Default::default()
        };
        let mut log = LogBuffer::new(&limits);
        for i in 0..10 {
            log.push(LogSource::Plugin, LogLevel::Info, format!("line {i}"));
        }
        let (lines, dropped) = log.take();
        assert_eq!(dropped, 7);
        assert_eq!(
            lines.iter().map(|l| l.message.as_str()).collect::<Vec<_>>(),
            ["line 7", "line 8", "line 9"]
        );
    }

    #[test]
    fn long_lines_are_cut() {
        let mut log = LogBuffer::new(&SandboxLimits::default());
        log.push(LogSource::Plugin, LogLevel::Info, "é".repeat(5000));
        let (lines, _) = log.take();
        assert!(lines[0].message.len() <= MAX_LINE + 12);
        assert!(lines[0].message.ends_with("[truncated]"));
    }

    #[test]
    fn streams_split_lines() {
        let log = Arc::new(Mutex::new(LogBuffer::new(&SandboxLimits::default())));
        let s = CapturedStream::new(log.clone(), LogSource::Stdout);
        s.accept(b"a\nb");
        s.accept(b"c\n");
        s.accept(b"tail");
        s.finish();
        let (lines, _) = log.lock().unwrap().take();
        assert_eq!(
            lines.iter().map(|l| l.message.as_str()).collect::<Vec<_>>(),
            ["a", "bc", "tail"]
        );
    }

    #[test]
    fn memory_is_capped_across_memories() {
        use wasmtime::ResourceLimiter;
        let mut l = Limiter::new(100);
        assert!(l.memory_growing(0, 40, None).unwrap());
        assert!(l.memory_growing(0, 40, None).unwrap());
        // A third memory of 40 would be 120 in all.
        assert!(l.memory_growing(0, 40, None).is_err());
        // Growing the first from 40 to 60 fits exactly.
        assert!(l.memory_growing(40, 60, None).unwrap());
        assert!(l.memory_growing(60, 61, None).is_err());
    }
}
