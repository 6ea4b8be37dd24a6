//! Running host processes with a deadline and bounded output.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{HostError, Result};
use crate::namespaces::Namespaces;

/// How long host helper commands (`modprobe`, `systemctl`) may take.
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(120);

/// Bounds for one command.
#[derive(Clone, Debug)]
pub struct ExecLimits {
    /// Killed (SIGKILL) when still running after this long.
    pub timeout: Duration,
    /// Bytes kept from each of stdout and stderr; the rest is read and dropped so the
    /// child never blocks on a full pipe.
    pub max_output: usize,
    /// Killed as soon as this is set: the stage that ran it ended (its deadline passed).
    pub cancel: Option<Arc<AtomicBool>>,
    /// How what the command starts is bounded.
    pub tree: ProcessTree,
}

/// How a command's descendants are bounded: what is left of them is killed when the
/// command exits, times out or is cancelled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProcessTree {
    /// Its own process group: descendants that stay in it are killed with it; one that
    /// leaves it (`setsid`, a daemon's double fork) survives. For nodewright's own helpers
    /// (`systemctl`, `modprobe`), which start nothing that outlives them.
    #[default]
    Group,
    /// The first process of its own PID namespace as well: when it exits or is killed, the
    /// kernel kills every process in the namespace, however it detached. For granted
    /// commands. Needs `CAP_SYS_ADMIN`, which the agent has.
    Namespace,
}

impl Default for ExecLimits {
    /// 5 minutes, 64 KiB per stream, no cancellation.
    fn default() -> Self {
        ExecLimits {
            timeout: Duration::from_secs(300),
            max_output: 64 * 1024,
            cancel: None,
            tree: ProcessTree::Group,
        }
    }
}

/// What a finished command produced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutput {
    /// Exit code; `None` when killed by a signal or by the timeout.
    pub status: Option<i32>,
    /// Captured stdout (truncated to the limit).
    pub stdout: Vec<u8>,
    /// Captured stderr (truncated to the limit).
    pub stderr: Vec<u8>,
    /// Whether the timeout killed it.
    pub timed_out: bool,
}

impl ExecOutput {
    /// Turns a non-zero exit into [`HostError::Command`].
    pub fn check(self, command: &str) -> Result<ExecOutput> {
        if self.status == Some(0) {
            return Ok(self);
        }
        let status = match (self.status, self.timed_out) {
            (_, true) => "a timeout".to_string(),
            (Some(code), _) => format!("status {code}"),
            (None, _) => "a signal".to_string(),
        };
        let stderr = String::from_utf8_lossy(&self.stderr);
        let tail: String = stderr
            .trim()
            .chars()
            .rev()
            .take(400)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        Err(HostError::Command {
            command: command.to_string(),
            status,
            stderr: tail,
        })
    }
}

/// Reads a pipe to the end on its own thread, keeping at most `max` bytes.
fn drain(mut pipe: impl Read + Send + 'static, max: usize) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = max.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
        let _ = tx.send(kept);
    });
    rx
}

/// After the child exits, a grandchild may still hold its pipes open; wait briefly, then
/// give up on the rest of the output rather than hang.
fn collect(rx: &mpsc::Receiver<Vec<u8>>) -> Vec<u8> {
    rx.recv_timeout(Duration::from_secs(2)).unwrap_or_default()
}

/// Runs `program args` with a cleared environment (only `PATH`, plus `env`), in `cwd`,
/// with stdin closed, killing it at the deadline.
pub fn run_bounded(
    program: &Path,
    args: &[String],
    env: &[(&str, &str)],
    cwd: Option<&Path>,
    limits: &ExecLimits,
) -> Result<ExecOutput> {
    run_bounded_in(program, args, env, cwd, limits, None)
}

/// [`run_bounded`], in `enter`'s namespaces when given (the program path then resolves in
/// the entered mount namespace).
pub fn run_bounded_in(
    program: &Path,
    args: &[String],
    env: &[(&str, &str)],
    cwd: Option<&Path>,
    limits: &ExecLimits,
    enter: Option<Namespaces>,
) -> Result<ExecOutput> {
    let shown = program.display().to_string();
    run_program_bounded(
        Program::Path(program, &shown),
        args,
        &[],
        env,
        cwd,
        limits,
        enter,
    )
}

/// What a bounded command runs, with the name its errors show.
#[derive(Clone, Copy, Debug)]
pub enum Program<'a> {
    /// A path (resolved in the mount namespace the command enters).
    Path(&'a Path, &'a str),
    /// A file already open: what runs is that file, never a path looked up again after it
    /// was checked, in whatever mount namespace the command enters. It runs as
    /// `/proc/self/fd/N`, with the descriptor kept open across the exec so that an
    /// interpreter (`#!`) reads the same file — which needs a `/proc` that shows the
    /// command, as the host's does for an agent in the host's PID namespace. A file that
    /// cannot be run is the caller's fault ([`HostError::Refused`]).
    File(&'a std::fs::File, &'a str),
}

/// How a command reaches a file this process opened: `/proc/self/fd/N`, valid in the command
/// when `file` is among those passed to [`run_program_bounded`].
pub fn fd_path(file: &std::fs::File) -> String {
    format!("/proc/self/fd/{}", file.as_raw_fd())
}

/// [`run_bounded_in`] for any [`Program`], with `files` kept open across the exec (so
/// arguments may name them by [`fd_path`]).
// Long on purpose: spawn, feed, read both pipes and kill on a bound are one sequence of
// owned handles.
pub fn run_program_bounded(
    program: Program<'_>,
    args: &[String],
    files: &[&std::fs::File],
    env: &[(&str, &str)],
    cwd: Option<&Path>,
    limits: &ExecLimits,
    enter: Option<Namespaces>,
) -> Result<ExecOutput> {
    let mut keep: Vec<std::os::fd::RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
    let (path, shown, by_file) = match program {
        Program::Path(path, shown) => (path.to_path_buf(), shown, false),
        Program::File(file, shown) => {
            keep.push(file.as_raw_fd());
            (fd_path(file).into(), shown, true)
        }
    };
    let display = std::iter::once(shown.to_string())
        .chain(args.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    let mut cmd = Command::new(&path);
    cmd.args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Own process group, so the timeout kills everything the command started.
        .process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    if enter.is_some() || !keep.is_empty() {
        // SAFETY: the closure runs in the forked child before exec and only makes system
        // calls on descriptors opened before the fork (see `Namespaces::enter`).
        #[allow(unsafe_code, reason = "setns(2) and fcntl(2) between fork and exec")]
        unsafe {
            cmd.pre_exec(move || {
                if let Some(ns) = &enter {
                    ns.enter()?;
                }
                for fd in &keep {
                    // SAFETY: `fd` is one of the caller's open files, inherited by this
                    // child; only its close-on-exec flag changes, in this child.
                    let fd = rustix::fd::BorrowedFd::borrow_raw(*fd);
                    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
                }
                Ok(())
            });
        }
    }
    let mut child = spawn_when_not_busy(&mut cmd, limits.tree).map_err(|source| {
        let refused = by_file
            && [rustix::io::Errno::ACCESS, rustix::io::Errno::NOEXEC]
                .iter()
                .any(|e| source.raw_os_error() == Some(e.raw_os_error()));
        match source.kind() {
            std::io::ErrorKind::NotFound => HostError::NotFound(shown.to_string()),
            _ if refused => HostError::Refused {
                op: "exec",
                path: shown.to_string(),
                source,
            },
            _ => HostError::Spawn {
                command: display.clone(),
                source,
            },
        }
    })?;
    let out = drain(
        child.stdout.take().expect("stdout is piped"),
        limits.max_output,
    );
    let err = drain(
        child.stderr.take().expect("stderr is piped"),
        limits.max_output,
    );
    let started = Instant::now();
    let mut timed_out = false;
    let pid = rustix::process::Pid::from_child(&child);
    // The whole group, with the syscall: a minimal image has no `kill` binary.
    let kill_group = || {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    };
    let exited = rustix::process::WaitIdOptions::EXITED
        | rustix::process::WaitIdOptions::NOHANG
        | rustix::process::WaitIdOptions::NOWAIT;
    loop {
        // Seen exited but not yet reaped, so its PID (the group's ID) is not reused while
        // what it left in its group is killed.
        match rustix::process::waitid(rustix::process::WaitId::Pid(pid), exited) {
            Ok(Some(_)) => break,
            Ok(None)
                if started.elapsed() >= limits.timeout
                    || limits
                        .cancel
                        .as_ref()
                        .is_some_and(|c| c.load(Ordering::Relaxed)) =>
            {
                timed_out = true;
                break;
            }
            Ok(None) => thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                return Err(HostError::Spawn {
                    command: display,
                    source: e.into(),
                });
            }
        }
    }
    // What it left running in its group goes with it; in its own PID namespace the kernel
    // kills the rest when it ends.
    kill_group();
    if timed_out {
        // Also when it moved itself to another group (it is not reaped yet: the PID is its).
        let _ = child.kill();
    }
    let status = child.wait().ok();
    Ok(ExecOutput {
        status: if timed_out {
            None
        } else {
            status.and_then(|s| s.code())
        },
        stdout: collect(&out),
        stderr: collect(&err),
        timed_out,
    })
}

/// [`spawn`], again while the program is busy (`ETXTBSY`, for up to a second): another
/// thread of this process that forks while a file is open for writing — a script or
/// payload just written — hands its child that descriptor until the child execs, and an
/// exec of the file fails meanwhile. It passes on its own.
fn spawn_when_not_busy(
    cmd: &mut Command,
    tree: ProcessTree,
) -> std::io::Result<std::process::Child> {
    let mut tries = 0;
    loop {
        match spawn(cmd, tree) {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// Spawns `cmd`; with [`ProcessTree::Namespace`], as the first process of a new PID
/// namespace. `unshare(CLONE_NEWPID)` changes the namespace of the calling thread's future
/// children only, so it is made on a thread of its own that spawns this one child and ends.
fn spawn(cmd: &mut Command, tree: ProcessTree) -> std::io::Result<std::process::Child> {
    match tree {
        ProcessTree::Group => cmd.spawn(),
        ProcessTree::Namespace => thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: `CLONE_NEWPID` touches no state other threads share (unlike
                    // `CLONE_FILES` or `CLONE_FS`); it applies to this thread's children.
                    #[allow(unsafe_code, reason = "unshare(2) of the PID namespace only")]
                    unsafe {
                        rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWPID)?;
                    }
                    cmd.spawn()
                })
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the spawning thread panicked")))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_and_bounds_output() {
        let limits = ExecLimits {
            timeout: Duration::from_secs(10),
            max_output: 10,
            cancel: None,
            tree: ProcessTree::Group,
        };
        let out = run_bounded(
            Path::new("/bin/sh"),
            &[
                "-c".into(),
                "yes | head -c 100000; echo err >&2; exit 3".into(),
            ],
            &[],
            None,
            &limits,
        )
        .unwrap();
        assert_eq!(out.status, Some(3));
        assert_eq!(out.stdout.len(), 10);
        assert_eq!(out.stderr, b"err\n");
        assert!(out.check("x").is_err());
    }

    #[test]
    fn kills_at_the_deadline() {
        let limits = ExecLimits {
            timeout: Duration::from_millis(100),
            max_output: 10,
            cancel: None,
            tree: ProcessTree::Group,
        };
        let out = run_bounded(Path::new("/bin/sleep"), &["30".into()], &[], None, &limits).unwrap();
        assert!(out.timed_out);
        assert_eq!(out.status, None);
    }

    #[test]
    fn the_deadline_kills_the_whole_command_tree() {
        let limits = ExecLimits {
            timeout: Duration::from_millis(300),
            max_output: 1024,
            cancel: None,
            tree: ProcessTree::Group,
        };
        let tmp = std::env::temp_dir().join(format!("nodewright-tree-{}", std::process::id()));
        let script = format!("sleep 30 & echo $! > {}; wait", tmp.display());
        let out = run_bounded(
            Path::new("/bin/sh"),
            &["-c".into(), script],
            &[],
            None,
            &limits,
        )
        .unwrap();
        assert!(out.timed_out);
        let pid: i32 = std::fs::read_to_string(&tmp)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let _ = std::fs::remove_file(&tmp);
        // The grandchild is gone (or a zombie about to be reaped by init).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if !is_running(pid) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the backgrounded sleep {pid} survived the deadline"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether process `pid` exists and is not a zombie about to be reaped.
    fn is_running(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    /// Processes whose command line has `marker` as an argument.
    fn alive_with(marker: &str) -> Vec<i32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                is_running(pid) && cmdline.split(|b| *b == 0).any(|a| a == marker.as_bytes())
            })
            .collect()
    }

    /// Runs a command that detaches a child from its process group (`setsid`) and exits
    /// at once; returns the marker that child carries.
    fn detach_a_child(tree: ProcessTree) -> String {
        let marker = format!("{}.{}", 3000 + std::process::id() % 1000, tree as u8);
        let limits = ExecLimits {
            tree,
            ..ExecLimits::default()
        };
        // The command waits until its child has left the group, so the race is not whether
        // `setsid` ran before the command exited.
        let ready = std::env::temp_dir().join(format!("nodewright-detached-{marker}"));
        let _ = std::fs::remove_file(&ready);
        let script = format!(
            "setsid sh -c 'touch {r}; exec sleep {marker}' </dev/null >/dev/null 2>&1 &\n\
             while [ ! -e {r} ]; do sleep 0.01; done; exit 0",
            r = ready.display()
        );
        let out = run_bounded(
            Path::new("/bin/sh"),
            &["-c".into(), script],
            &[],
            None,
            &limits,
        )
        .unwrap();
        assert_eq!(out.status, Some(0));
        let _ = std::fs::remove_file(&ready);
        marker
    }

    #[test]
    fn a_command_in_its_own_pid_namespace_ends_with_everything_it_started() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: a PID namespace needs CAP_SYS_ADMIN");
            return;
        }
        let marker = detach_a_child(ProcessTree::Namespace);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !alive_with(&marker).is_empty() {
            assert!(
                Instant::now() < deadline,
                "the detached sleep {marker} outlived its command"
            );
            thread::sleep(Duration::from_millis(20));
        }
        // The contrast that makes the namespace necessary: a process group alone does not
        // hold a child that left it.
        let marker = detach_a_child(ProcessTree::Group);
        thread::sleep(Duration::from_millis(200));
        let survivors = alive_with(&marker);
        for pid in &survivors {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(*pid).unwrap(),
                rustix::process::Signal::KILL,
            );
        }
        assert!(
            !survivors.is_empty(),
            "setsid left the group and survived it"
        );
    }

    #[test]
    fn cancelling_kills_the_command() {
        let cancel = Arc::new(AtomicBool::new(false));
        let limits = ExecLimits {
            timeout: Duration::from_secs(60),
            max_output: 10,
            cancel: Some(cancel.clone()),
            tree: ProcessTree::Group,
        };
        let stop = thread::spawn(move || {
            thread::sleep(Duration::from_millis(200));
            cancel.store(true, Ordering::Relaxed);
        });
        let out = run_bounded(Path::new("/bin/sleep"), &["30".into()], &[], None, &limits).unwrap();
        stop.join().unwrap();
        assert!(
            out.timed_out,
            "a cancelled command is reported like a timed-out one"
        );
    }

    #[test]
    fn environment_is_cleared() {
        let out = run_bounded(
            Path::new("/usr/bin/env"),
            &[],
            &[("A", "b")],
            None,
            &ExecLimits::default(),
        )
        .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut keys: Vec<_> = text.lines().map(|l| l.split('=').next().unwrap()).collect();
        keys.sort();
        assert_eq!(keys, ["A", "PATH"]);
    }

    #[test]
    fn missing_program_is_not_found() {
        let err = run_bounded(
            Path::new("/nonexistent/x"),
            &[],
            &[],
            None,
            &ExecLimits::default(),
        )
        .unwrap_err();
        assert!(matches!(err, HostError::NotFound(_)), "{err:?}");
    }

    /// What runs is the file that was opened: a script (its interpreter reads the open
    /// file too) keeps running as opened after its path is replaced; a missing interpreter
    /// is named by the file's name.
    #[test]
    fn an_open_file_runs_as_opened() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tool");
        let write = |body: &str, mode: u32| {
            let tmp = dir.path().join("next");
            std::fs::write(&tmp, body).unwrap();
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
        };
        write("#!/bin/sh\necho opened \"$@\"\n", 0o555);
        let file = std::fs::File::open(&path).unwrap();
        write("#!/bin/sh\necho swapped\n", 0o555);
        let out = run_program_bounded(
            Program::File(&file, "payload:fw/tool"),
            &["a".into()],
            &[],
            &[],
            None,
            &ExecLimits::default(),
            None,
        )
        .unwrap();
        assert_eq!((out.status, out.stdout), (Some(0), b"opened a\n".to_vec()));

        let run = |file| {
            let program = Program::File(file, "payload:fw/tool");
            run_program_bounded(program, &[], &[], &[], None, &ExecLimits::default(), None)
        };
        write("#!/nonexistent/interpreter\n", 0o555);
        let file = std::fs::File::open(&path).unwrap();
        match run(&file) {
            Err(HostError::NotFound(what)) => assert_eq!(what, "payload:fw/tool"),
            other => panic!("a missing interpreter: {other:?}"),
        }
    }
}
