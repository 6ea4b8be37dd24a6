//! The host a stage touches: the real node through its root and PID 1's namespaces, or a
//! simulated node's scratch root.

use std::path::PathBuf;
use std::sync::Arc;

use nodewright_api::agent::{Backend, Common};
use nodewright_hostops::{HostNamespaces, HostOps, LinuxHost, NodeIdentity, SimHost};

/// The host-ops backend `common` names.
pub fn host(common: &Common) -> anyhow::Result<Arc<dyn HostOps>> {
    let identity = NodeIdentity {
        name: common.node.clone(),
        labels: vec![],
    };
    Ok(match common.backend {
        Backend::Linux => {
            // The host's /proc as mounted under the host root: its boot ID is the node's
            // even where the pod's own /proc would say otherwise. (Sysctls are per network
            // namespace either way, and the pod has the node's.)
            let host_proc = common.host_root.join("proc");
            let proc_root = if host_proc.join("sys/kernel").is_dir() {
                host_proc
            } else {
                PathBuf::from("/proc")
            };
            Arc::new(LinuxHost::new(
                &common.host_root,
                &proc_root,
                HostNamespaces::Of(1),
                identity,
            )?)
        }
        Backend::Sim => Arc::new(SimHost::new(&common.host_root, identity)?),
    })
}
