//! sysctls as files under a `proc` directory.

use std::path::{Path, PathBuf};

use crate::error::{HostError, Result};

/// sysctl access through a `proc/sys` directory: the host's `/proc/sys` on a real node, a
/// plain directory under the scratch root on a simulated one.
#[derive(Clone, Debug)]
pub(crate) struct ProcSys {
    base: PathBuf,
}

impl ProcSys {
    pub(crate) fn new(proc_root: &Path) -> Self {
        ProcSys {
            base: proc_root.join("sys"),
        }
    }

    /// `net.ipv4.ip_forward` → `<proc>/sys/net/ipv4/ip_forward`. The engine checks keys
    /// before they reach here; checked again because this is a raw path join.
    pub(crate) fn path(&self, key: &str) -> Result<PathBuf> {
        nodewright_api::hostargs::sysctl_key(key)
            .map_err(|r| HostError::InvalidName(format!("sysctl key: {r}")))?;
        Ok(self.base.join(key.replace('.', "/")))
    }

    pub(crate) fn get(&self, key: &str) -> Result<String> {
        let path = self.path(key)?;
        let raw = read_small(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => HostError::NotFound(format!("sysctl {key}")),
            _ => HostError::io("read", &path, e),
        })?;
        Ok(raw.trim_end().to_string())
    }

    pub(crate) fn read_opt(&self, rel: &str) -> Option<String> {
        read_small(&self.base.join(rel))
            .ok()
            .map(|s| s.trim().to_string())
    }
}

/// Reads a `proc` file whole: open, read to the end, close. (`std::fs::read_to_string` adds
/// an `fstat` for a size `proc` does not report, and musl's `open` an `fcntl` to set a
/// close-on-exec flag the kernel has set already: a third of the syscalls of a sysctl read,
/// and each stage reads every key it manages.)
fn read_small(path: &Path) -> std::io::Result<String> {
    use rustix::fs::{Mode, OFlags};
    use std::io::Read;
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )?;
    let mut text = String::new();
    // Through `Take`, which gives no size hint, so nothing asks the file its size.
    std::fs::File::from(fd)
        .take(u64::MAX)
        .read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_reads_its_file_trimmed_and_a_missing_one_is_not_found() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sys/net/ipv4");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tcp_rmem"), "4096\t131072\t6291456\n").unwrap();
        let long = "x".repeat(10_000);
        std::fs::write(dir.join("long"), &long).unwrap();
        let p = ProcSys::new(tmp.path());
        assert_eq!(p.get("net.ipv4.tcp_rmem").unwrap(), "4096\t131072\t6291456");
        assert_eq!(p.get("net.ipv4.long").unwrap(), long, "read to the end");
        match p.get("net.ipv4.missing") {
            Err(HostError::NotFound(what)) => assert_eq!(what, "sysctl net.ipv4.missing"),
            other => panic!("{other:?}"),
        }
        let dir = p.get("net.ipv4");
        assert!(
            matches!(&dir, Err(HostError::Refused { op: "read", .. })),
            "a directory is not a value: {dir:?}"
        );
        assert_eq!(
            p.read_opt("net/ipv4/tcp_rmem").as_deref(),
            Some("4096\t131072\t6291456")
        );
        assert_eq!(p.read_opt("net/ipv4/missing"), None);
    }

    #[test]
    fn sysctl_keys_cannot_escape() {
        let p = ProcSys::new(Path::new("/proc"));
        assert_eq!(
            p.path("net.ipv4.ip_forward").unwrap(),
            Path::new("/proc/sys/net/ipv4/ip_forward")
        );
        assert!(p.path("net/../../etc").is_err());
        assert!(p.path("a..b").is_err());
        assert!(p.path("").is_err());
    }
}
