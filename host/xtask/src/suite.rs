//! The suite runner: every test of every test executable as its own process, several at a
//! time, longest first.
//!
//! Most of the suite's time is spent waiting — for a control plane to start, a rollout to
//! reach a node, a pod to stop — so tests run side by side, up to `jobs` at once and only
//! while the machine has memory to spare. The order comes from the previous run's
//! durations (kept in the target directory; on a first run, the snapshot committed in
//! `host/xtask/test-times.tsv`), longest first, so the suite's wall time approaches its
//! longest test rather than the sum. A test's output goes to its own log,
//! printed when it fails. A test gets the environment `cargo test` would give it: its
//! package's directory as working directory and `CARGO_MANIFEST_DIR`, and `CARGO`.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::budget::clock;
use crate::cargo::TestExe;

/// How the suite runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Tests running at once, at most.
    pub jobs: usize,
    /// A test still running after this is killed and fails.
    pub timeout: Duration,
    /// Start no test while less memory than this is available (unless none runs).
    pub min_available: u64,
    /// Environment for every test.
    pub env: Vec<(String, OsString)>,
    /// One log per test under here.
    pub logs: PathBuf,
    /// Durations of the previous run (`seconds<TAB>test`), read for the order and rewritten.
    pub times: PathBuf,
    /// Durations to order by when `times` does not know a test (a first run): the committed
    /// snapshot `host/xtask/test-times.tsv`.
    pub seed_times: PathBuf,
    /// Only tests whose name contains one of these (all when empty).
    pub filters: Vec<String>,
}

/// One test: an executable and the name libtest knows it by.
#[derive(Debug, Clone)]
struct Test {
    exe: usize,
    name: String,
    /// `package/target::name`.
    id: String,
    expected: Duration,
}

/// What the suite did.
#[derive(Debug, Default)]
pub struct Report {
    pub passed: usize,
    pub failed: Vec<String>,
    /// Every test run, slowest first.
    pub durations: Vec<(String, Duration)>,
    pub executables: usize,
}

impl Report {
    pub fn note(&self) -> String {
        format!(
            "{} tests in {} executables: {} passed, {} failed",
            self.passed + self.failed.len(),
            self.executables,
            self.passed,
            self.failed.len()
        )
    }

    /// The slowest `n`, for the budget.
    pub fn slowest(&self, n: usize) -> Vec<String> {
        self.durations
            .iter()
            .take(n)
            .map(|(id, d)| format!("{:>9}  {id}", clock(*d)))
            .collect()
    }
}

/// A test nobody has timed is assumed this long: it starts early, since it may be long, but
/// after the known long ones.
const UNKNOWN: Duration = Duration::from_secs(30);

/// Lists every test, runs them and reports. Errors only when the suite could not run;
/// failing tests are in the report.
pub fn run(exes: &[TestExe], opts: &Options) -> Result<Report> {
    std::fs::create_dir_all(&opts.logs)?;
    let previous = read_times(&opts.times);
    let seed = read_times(&opts.seed_times);
    let mut tests = Vec::new();
    let mut report = Report {
        executables: exes.len(),
        ..Report::default()
    };
    for (i, exe) in exes.iter().enumerate() {
        let names =
            list(exe, opts).with_context(|| format!("listing the tests of {}", exe.label()))?;
        for name in names {
            let id = format!("{}::{name}", exe.label());
            if !opts.filters.is_empty() && !opts.filters.iter().any(|f| id.contains(f)) {
                continue;
            }
            let expected = previous
                .get(&id)
                .or_else(|| seed.get(&id))
                .copied()
                .unwrap_or(UNKNOWN);
            tests.push(Test {
                exe: i,
                name,
                id,
                expected,
            });
        }
    }
    if tests.is_empty() && !opts.filters.is_empty() {
        bail!(
            "no test's name contains any of {:?} (names read `package/target::test`)",
            opts.filters
        );
    }
    // Longest first; ties in listing order.
    tests.sort_by_key(|t| std::cmp::Reverse(t.expected));
    let total = tests.len();
    eprintln!(
        "running {total} tests from {} executables, up to {} at once (logs in {})",
        exes.len(),
        opts.jobs,
        opts.logs.display()
    );
    let mut waiting: VecDeque<Test> = tests.into();
    let mut running: Vec<Running> = Vec::new();
    let mut times = previous;
    while !waiting.is_empty() || !running.is_empty() {
        while running.len() < opts.jobs
            && !waiting.is_empty()
            && (running.is_empty() || available_memory() >= opts.min_available)
        {
            let test = waiting.pop_front().expect("not empty");
            running.push(start(&exes[test.exe], test, opts)?);
        }
        std::thread::sleep(Duration::from_millis(100));
        let mut i = 0;
        while i < running.len() {
            match running[i].poll(opts.timeout)? {
                None => i += 1,
                Some(verdict) => {
                    let r = running.swap_remove(i);
                    let wall = r.started.elapsed();
                    times.insert(r.test.id.clone(), wall);
                    report.durations.push((r.test.id.clone(), wall));
                    let left = waiting.len() + running.len();
                    match verdict {
                        Verdict::Passed => {
                            report.passed += 1;
                            eprintln!("    ok {:>9}  {}  ({left} left)", clock(wall), r.test.id);
                        }
                        Verdict::Failed(why) => {
                            eprintln!(
                                "FAILED {:>9}  {}: {why} (log: {})  ({left} left)",
                                clock(wall),
                                r.test.id,
                                r.log.display()
                            );
                            report.failed.push(failure(&r.test.id, &why, &r.log));
                        }
                    }
                }
            }
        }
    }
    report.durations.sort_by_key(|d| std::cmp::Reverse(d.1));
    write_times(&opts.times, &times)?;
    Ok(report)
}

/// The names of the tests in `exe` that are not `#[ignore]`d.
fn list(exe: &TestExe, opts: &Options) -> Result<Vec<String>> {
    let names = |ignored: bool| -> Result<Vec<String>> {
        let mut cmd = command(exe, opts);
        cmd.args(["--list", "--format", "terse"]);
        if ignored {
            cmd.arg("--ignored");
        }
        let out = cmd.stderr(Stdio::inherit()).output()?;
        if !out.status.success() {
            bail!("{} --list failed with {}", exe.path.display(), out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_suffix(": test"))
            .map(String::from)
            .collect())
    };
    let ignored = names(true)?;
    Ok(names(false)?
        .into_iter()
        .filter(|n| !ignored.contains(n))
        .collect())
}

/// `exe` with the environment `cargo test` gives a test.
fn command(exe: &TestExe, opts: &Options) -> Command {
    let mut cmd = Command::new(&exe.path);
    cmd.current_dir(&exe.manifest_dir)
        .env("CARGO_MANIFEST_DIR", &exe.manifest_dir)
        .env("CARGO", crate::cargo::cargo_bin())
        .envs(opts.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    cmd
}

struct Running {
    test: Test,
    child: Child,
    log: PathBuf,
    started: Instant,
}

enum Verdict {
    Passed,
    Failed(String),
}

fn start(exe: &TestExe, test: Test, opts: &Options) -> Result<Running> {
    let log = opts.logs.join(format!("{}.log", sanitize(&test.id)));
    let out = std::fs::File::create(&log).with_context(|| log.display().to_string())?;
    let child = command(exe, opts)
        .args(["--exact", &test.name, "--test-threads", "1"])
        .stdout(out.try_clone()?)
        .stderr(out)
        // Its own process group, so a timeout stops whatever it started.
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", exe.path.display()))?;
    Ok(Running {
        test,
        child,
        log,
        started: Instant::now(),
    })
}

impl Running {
    fn poll(&mut self, timeout: Duration) -> Result<Option<Verdict>> {
        let Some(status) = self.child.try_wait()? else {
            if self.started.elapsed() > timeout {
                // The whole group: libtest, and what the test started in its group.
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", self.child.id())])
                    .status();
                let _ = self.child.wait();
                return Ok(Some(Verdict::Failed(format!(
                    "still running after {}, killed",
                    clock(timeout)
                ))));
            }
            return Ok(None);
        };
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        Ok(Some(verdict(status.success(), &status.to_string(), &text)))
    }
}

/// Passed only when libtest says it ran the one test and it passed: exit status 0 with
/// "0 passed" means the name matched nothing, which is a failure of the runner.
fn verdict(success: bool, status: &str, output: &str) -> Verdict {
    let ran = output
        .lines()
        .any(|l| l.starts_with("test result: ok. 1 passed"));
    match (success, ran) {
        (true, true) => Verdict::Passed,
        (true, false) => Verdict::Failed("exited 0 without running the test".into()),
        (false, _) => Verdict::Failed(format!("exited with {status}")),
    }
}

fn failure(id: &str, why: &str, log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(150)..];
    let mut out = format!("---- {id}: {why}\n");
    for l in tail {
        let _ = writeln!(out, "{l}");
    }
    out
}

fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '.'
            }
        })
        .collect()
}

/// `MemAvailable` from /proc/meminfo, in bytes (unbounded when unreadable).
fn available_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(u64::MAX, |kb| kb * 1024)
}

fn read_times(path: &Path) -> BTreeMap<String, Duration> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (secs, id) = l.split_once('\t')?;
            Some((id.to_string(), Duration::from_secs_f64(secs.parse().ok()?)))
        })
        .collect()
}

fn write_times(path: &Path, times: &BTreeMap<String, Duration>) -> Result<()> {
    let mut out = String::new();
    for (id, d) in times {
        let _ = writeln!(out, "{:.1}\t{id}", d.as_secs_f64());
    }
    std::fs::write(path, out).with_context(|| path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_passes_only_when_libtest_ran_it() {
        let ok =
            "running 1 test\ntest a::b ... ok\n\ntest result: ok. 1 passed; 0 failed; 0 ignored";
        assert!(matches!(
            verdict(true, "exit status: 0", ok),
            Verdict::Passed
        ));
        let none = "running 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 3 filtered out";
        assert!(matches!(
            verdict(true, "exit status: 0", none),
            Verdict::Failed(_)
        ));
        assert!(matches!(
            verdict(false, "exit status: 101", ok),
            Verdict::Failed(w) if w.contains("101")
        ));
    }

    #[test]
    fn durations_survive_a_round_trip() {
        let dir = std::env::temp_dir().join(format!("xtask-times-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("times");
        let mut t = BTreeMap::new();
        t.insert("p/it::a b".to_string(), Duration::from_millis(12_300));
        write_times(&path, &t).unwrap();
        assert_eq!(read_times(&path), t);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn test_ids_make_safe_file_names() {
        assert_eq!(
            sanitize("nodewright-operator/it::rollout::a_b"),
            "nodewright-operator.it..rollout..a_b"
        );
    }
}
