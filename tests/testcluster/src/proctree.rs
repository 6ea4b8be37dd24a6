//! Killing a simulated container the way a container runtime does: every process it
//! started, including commands that moved to a process group of their own (the agent runs
//! each host command in one, so its timeout can kill what the command started) and ones
//! started, or orphaned, after the stop began. A runtime kills the container's cgroup; the
//! simulated kubelet starts each container in a session of its own and kills the session
//! (with every descendant, for one that made a session of its own), until none is left.

use std::collections::{BTreeSet, HashMap};

/// A live process as `/proc/<pid>/stat` has it.
struct Proc {
    pid: u32,
    ppid: u32,
    /// Its process group: the tests tell a command that made a group of its own by it.
    #[cfg_attr(not(test), expect(dead_code, reason = "read by the tests only"))]
    group: u32,
    session: u32,
}

/// Every process, from `/proc`.
fn processes() -> Vec<Proc> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // `pid (comm) state ppid pgrp session ...`: comm may hold spaces and parentheses.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            continue; // a zombie is dead; only its parent's wait is left
        }
        let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u32>().ok());
        if let (Some(ppid), Some(group), Some(session)) = (field(1), field(2), field(3)) {
            out.push(Proc {
                pid,
                ppid,
                group,
                session,
            });
        }
    }
    out
}

/// The processes descending from `root` (not `root` itself), from `/proc`.
pub fn descendants(root: u32) -> BTreeSet<u32> {
    descendants_in(&children(&processes()), root)
}

/// Each parent's children among `procs`.
fn children(procs: &[Proc]) -> HashMap<u32, Vec<u32>> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    children
}

/// The processes descending from `root` in `children` (not `root` itself).
fn descendants_in(children: &HashMap<u32, Vec<u32>>, root: u32) -> BTreeSet<u32> {
    let mut found = BTreeSet::new();
    let mut queue = vec![root];
    while let Some(p) = queue.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            if found.insert(c) {
                queue.push(c);
            }
        }
    }
    found
}

/// Sends `signal` (e.g. `-TERM`) to the process group `pgid`.
pub fn kill_group(pgid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .args([signal, "--", &format!("-{pgid}")])
        .stderr(std::process::Stdio::null())
        .status();
}

/// SIGKILLs the process group `pgid` and every process in `tree` with the process group
/// each leads (a command in a group of its own takes its children with it).
pub fn kill_all(pgid: u32, tree: &BTreeSet<u32>) {
    kill_group(pgid, "-KILL");
    for pid in tree {
        kill_group(*pid, "-KILL");
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// SIGKILLs what a container started as session `sid` left, as a runtime kills its cgroup:
/// the session, the descendants of `sid` and of every process in `earlier` (a process that
/// made a session of its own), again until none is alive (a fork may race a pass).
pub fn kill_session(sid: u32, earlier: &BTreeSet<u32>) {
    for _ in 0..50 {
        // One scan of `/proc` a pass (zombies are left out: they are dead).
        let procs = processes();
        let children = children(&procs);
        let mut live: BTreeSet<u32> = procs
            .iter()
            .filter(|p| p.session == sid || earlier.contains(&p.pid))
            .map(|p| p.pid)
            .collect();
        live.extend(descendants_in(&children, sid));
        for pid in earlier {
            live.extend(descendants_in(&children, *pid));
        }
        if live.is_empty() {
            return;
        }
        kill_all(sid, &live);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_command_in_its_own_group_is_found_and_killed() {
        // A shell in group A starts a sleeper in a group of its own (as the agent does).
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "setsid sleep 300 & wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let root = sh.id();
        // Wait for the sleeper to lead a group of its own: the shell's forked child is a
        // descendant before `setsid` has run, and a group kill in that moment takes it.
        let deadline = Instant::now() + Duration::from_secs(5);
        let tree = loop {
            let t = descendants(root);
            let moved = processes()
                .iter()
                .any(|p| t.contains(&p.pid) && p.group == p.pid);
            if moved || Instant::now() > deadline {
                break t;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(!tree.is_empty(), "the sleeper is a descendant of the shell");
        kill_group(root, "-KILL");
        let _ = sh.wait();
        let alive = |p: &u32| {
            std::path::Path::new(&format!("/proc/{p}")).exists()
                && !std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .unwrap_or_default()
                    .contains(") Z ")
        };
        assert!(
            tree.iter().any(alive),
            "a group kill alone leaves the sleeper running"
        );
        kill_all(root, &tree);
        let deadline = Instant::now() + Duration::from_secs(5);
        while tree.iter().any(alive) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!tree.iter().any(alive), "kill_all got it");
    }

    /// A command in a process group of its own, started after the stop began and orphaned
    /// (so no longer anyone's descendant), keeps the container's session: what the stop
    /// recorded and the group kill miss it, the session kill gets it.
    #[test]
    fn an_orphan_started_late_in_its_own_group_is_killed_with_the_session() {
        let late = "sleep 0.3; (perl -e 'setpgrp(0, 0); exec @ARGV' sleep 300 &); sleep 300";
        let mut sh = std::process::Command::new("setsid")
            .args(["sh", "-c", late])
            .spawn()
            .unwrap();
        let sid = sh.id();
        let at_stop = descendants(sid);
        let deadline = Instant::now() + Duration::from_secs(5);
        let orphans = loop {
            // Reparented (its parent is not in the session any more), leading its group.
            let members: Vec<Proc> = processes()
                .into_iter()
                .filter(|p| p.session == sid)
                .collect();
            let o: BTreeSet<u32> = members
                .iter()
                .filter(|p| p.pid != sid && !members.iter().any(|q| q.pid == p.ppid))
                .filter(|p| p.group == p.pid)
                .map(|p| p.pid)
                .collect();
            if !o.is_empty() || Instant::now() > deadline {
                break o;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(!orphans.is_empty(), "the late command was orphaned");
        let alive = |p: &u32| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| !s.contains(") Z "))
        };
        kill_all(sid, &at_stop);
        let _ = sh.wait();
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            orphans.iter().all(alive),
            "the recorded tree and the group kill leave it running"
        );
        kill_session(sid, &at_stop);
        let deadline = Instant::now() + Duration::from_secs(5);
        while orphans.iter().any(alive) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!orphans.iter().any(alive), "the session kill got it");
    }
}
