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
        let raw = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => HostError::NotFound(format!("sysctl {key}")),
            _ => HostError::io("read", &path, e),
        })?;
        Ok(raw.trim_end().to_string())
    }

    pub(crate) fn read_opt(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.base.join(rel))
            .ok()
            .map(|s| s.trim().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
