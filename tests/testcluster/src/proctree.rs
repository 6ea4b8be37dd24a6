//! Killing a simulated container the way a container runtime does: every process it
//! started, including commands that moved to a process group of their own (the agent runs
//! each host command in one, so its timeout can kill what the command started).

use std::collections::{BTreeSet, HashMap};

/// The processes descending from `root` (not `root` itself), from `/proc`.
pub fn descendants(root: u32) -> BTreeSet<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
        else {
            continue;
        };
        children.entry(ppid).or_default().push(pid);
    }
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
        let deadline = Instant::now() + Duration::from_secs(5);
        let tree = loop {
            let t = descendants(root);
            if !t.is_empty() || Instant::now() > deadline {
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
}
