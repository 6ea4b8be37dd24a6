//! Entering the host's namespaces without an `nsenter` binary.
//!
//! The agent runs in a privileged pod with `hostPID`; the host's mount, UTS, IPC and
//! network namespaces are those of the host's init (PID 1 as the pod sees it). A command
//! that must run "on the host" (`modprobe`, `systemctl`, a granted command) is started in
//! them: the namespace files are opened first, and the forked child joins them with
//! `setns(2)` before it execs — so a minimal image needs no util-linux. The PID namespace
//! is already the host's (`hostPID`), and nothing here forks again.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::PathBuf;

use rustix::thread::LinkNameSpaceType;

use crate::error::{HostError, Result};

/// The namespaces joined, in the order they are joined (the mount namespace last: after
/// it, paths resolve in the host's filesystem).
const JOINED: [(&str, LinkNameSpaceType); 4] = [
    ("ipc", LinkNameSpaceType::InterProcessCommunication),
    ("uts", LinkNameSpaceType::HostNameAndNISDomainName),
    ("net", LinkNameSpaceType::Network),
    ("mnt", LinkNameSpaceType::Mount),
];

/// Another process's namespaces, opened to be entered.
#[derive(Debug)]
pub struct Namespaces {
    files: Vec<(File, LinkNameSpaceType)>,
}

impl Namespaces {
    /// Opens the namespaces of process `pid` (from `/proc`).
    pub fn of(pid: u32) -> Result<Self> {
        let mut files = Vec::new();
        for (name, kind) in JOINED {
            let path = PathBuf::from(format!("/proc/{pid}/ns/{name}"));
            let file = File::open(&path).map_err(|e| HostError::io("open", &path, e))?;
            files.push((file, kind));
        }
        Ok(Namespaces { files })
    }

    /// Joins them and moves to the new root. Runs in the forked child before exec, so it
    /// only makes system calls (no allocation, no locks).
    pub(crate) fn enter(&self) -> std::io::Result<()> {
        for (file, kind) in &self.files {
            rustix::thread::move_into_link_name_space(file.as_fd(), Some(*kind))?;
        }
        rustix::process::chdir(c"/")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{ExecLimits, run_bounded_in};
    use std::path::Path;
    use std::time::Duration;

    /// A process in a network namespace of its own; the test runs a command in it.
    #[test]
    fn a_command_runs_in_another_process_s_namespaces() {
        let Ok(mut holder) = std::process::Command::new("unshare")
            .args(["--net", "--uts", "sleep", "30"])
            .spawn()
        else {
            panic!("unshare(1) is needed (util-linux)");
        };
        // Wait until `unshare` has become `sleep` in its new namespaces.
        let pid = holder.id();
        let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/net")).unwrap();
        let ours = ns("self");
        let mut theirs = ns(&pid.to_string());
        for _ in 0..100 {
            if theirs != ours {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            theirs = ns(&pid.to_string());
        }
        assert_ne!(theirs, ours, "unshare did not create a network namespace");
        let enter = Namespaces::of(pid).unwrap();
        let limits = ExecLimits {
            timeout: Duration::from_secs(10),
            max_output: 4096,
            cancel: None,
            tree: crate::command::ProcessTree::Group,
        };
        let out = run_bounded_in(
            Path::new("/usr/bin/readlink"),
            &["/proc/self/ns/net".into()],
            &[],
            None,
            &limits,
            Some(enter),
        )
        .unwrap();
        let _ = holder.kill();
        let _ = holder.wait();
        assert_eq!(
            out.status,
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            theirs.display().to_string()
        );
    }
}
