//! The real node backend.

use std::path::Path;

use nodewright_api::hostargs::UnitPowerProps;

use crate::argv;
use crate::command::HELPER_TIMEOUT;
use crate::command::{
    ExecLimits, ExecOutput, ProcessTree, Program, run_bounded_in, run_program_bounded,
};
use crate::error::{HostError, Result};
use crate::namespaces::Namespaces;
use crate::node::{NodeIdentity, NodeInfo, parse_os_release};
use crate::ops::{HostOps, ServiceVerb, UnitStatus, refuse_power_change};
use crate::ops::{PayloadArg, Runnable, open_payload_args, open_payload_executable};
use crate::procsys::ProcSys;
use crate::rootfs::RootFs;

/// Where host commands (`modprobe`, `systemctl`, granted commands) run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostNamespaces {
    /// Run directly: the agent already runs in the host's namespaces (or `/` is the host).
    Current,
    /// Join the mount, UTS, IPC and network namespaces of this process with `setns(2)`
    /// (PID 1 for an agent in a privileged pod with `hostPID: true`).
    Of(u32),
}
/// A real Linux node.
///
/// - files: under `root` (the host's `/` as mounted in the pod, e.g. `/host`);
/// - sysctl: `proc_root/sys` (the pod needs `hostNetwork` for `net.*` keys to be the host's);
/// - kmod, services, commands: run in the host's namespaces per [`HostNamespaces`];
/// - reboot: `systemctl reboot` in the host's namespaces.
#[derive(Debug)]
pub struct LinuxHost {
    fs: RootFs,
    proc: ProcSys,
    namespaces: HostNamespaces,
    identity: NodeIdentity,
}

impl LinuxHost {
    /// A host whose `/` is at `root`, with `/proc` at `proc_root`.
    pub fn new(
        root: &Path,
        proc_root: &Path,
        namespaces: HostNamespaces,
        identity: NodeIdentity,
    ) -> Result<Self> {
        Ok(LinuxHost {
            fs: RootFs::open(root)?,
            proc: ProcSys::new(proc_root),
            namespaces,
            identity,
        })
    }

    fn command(&self, program: &Path, args: &[String], limits: &ExecLimits) -> Result<ExecOutput> {
        run_bounded_in(program, args, &[], None, limits, self.enter()?)
    }

    /// The namespaces a command joins: PID 1's on a real node, none otherwise.
    fn enter(&self) -> Result<Option<Namespaces>> {
        match self.namespaces {
            HostNamespaces::Current => Ok(None),
            HostNamespaces::Of(pid) => Namespaces::of(pid).map(Some),
        }
    }

    /// Runs a helper argv built by [`argv`] (program first).
    fn helper(&self, argv: Vec<String>) -> Result<ExecOutput> {
        let limits = ExecLimits {
            timeout: HELPER_TIMEOUT,
            max_output: 64 * 1024,
            cancel: None,
            tree: ProcessTree::Group,
        };
        let line = argv.join(" ");
        let (program, args) = argv.split_first().expect("helper argvs name a program");
        self.command(Path::new(program), args, &limits)?
            .check(&line)
    }
}

impl HostOps for LinuxHost {
    fn fs(&self) -> &RootFs {
        &self.fs
    }

    fn sysctl_get(&self, key: &str) -> Result<String> {
        self.proc.get(key)
    }

    fn sysctl_set(&self, key: &str, value: &str) -> Result<()> {
        let path = self.proc.path(key)?;
        if !path.exists() {
            return Err(HostError::NotFound(format!("sysctl {key}")));
        }
        std::fs::write(&path, value).map_err(|e| HostError::io("write", &path, e))
    }

    fn kmod_load(&self, name: &str, params: &[String]) -> Result<()> {
        self.helper(argv::modprobe_load(name, params)?).map(drop)
    }

    fn kmod_unload(&self, name: &str) -> Result<()> {
        self.helper(argv::modprobe_unload(name)?).map(drop)
    }

    fn depmod(&self, release: &str) -> Result<()> {
        self.helper(argv::depmod(release)?).map(drop)
    }

    fn service(&self, verb: ServiceVerb, unit: &str) -> Result<()> {
        let argv = argv::systemctl(verb, unit)?;
        refuse_power_change(verb, unit, || {
            let out = self.helper(argv::systemctl_show_power(unit)?)?;
            Ok(UnitPowerProps::from_show(&String::from_utf8_lossy(
                &out.stdout,
            )))
        })?;
        self.helper(argv).map(drop)
    }

    fn service_status(&self, unit: &str) -> Result<UnitStatus> {
        let out = self.helper(argv::systemctl_show(unit)?)?;
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                .unwrap_or("")
                .to_string()
        };
        if field("LoadState") == "not-found" {
            return Err(HostError::NotFound(format!("unit {unit}")));
        }
        Ok(UnitStatus {
            active_state: field("ActiveState"),
            enabled: field("UnitFileState") == "enabled",
        })
    }

    fn daemon_reload(&self) -> Result<()> {
        self.helper(argv::daemon_reload()).map(drop)
    }

    fn exec(
        &self,
        program: &Runnable<'_>,
        args: &[String],
        files: &[PayloadArg],
        limits: &ExecLimits,
    ) -> Result<ExecOutput> {
        // A granted command ends with everything it started, daemons included.
        let limits = ExecLimits {
            tree: ProcessTree::Namespace,
            ..limits.clone()
        };
        let (open, args) = open_payload_args(args, files)?;
        let open: Vec<&std::fs::File> = open.iter().collect();
        let enter = self.enter()?;
        let (payload_file, host_shown);
        let program = match *program {
            Runnable::Host(path) => {
                host_shown = path.display().to_string();
                Program::Path(path, &host_shown)
            }
            Runnable::Payload { tree, rel, shown } => {
                payload_file = open_payload_executable(tree, rel)?;
                Program::File(&payload_file, shown)
            }
        };
        run_program_bounded(program, &args, &open, &[], None, &limits, enter)
    }

    fn request_reboot(&self, reason: &str) -> Result<()> {
        tracing::warn!(reason, "requesting host reboot");
        self.helper(argv::reboot()).map(drop)
    }

    fn node_info(&self) -> NodeInfo {
        node_info(&self.fs, &self.proc, &self.identity, std::env::consts::ARCH)
    }
}

/// Node facts read from the root and proc, shared by both backends.
pub(crate) fn node_info(
    fs: &RootFs,
    proc: &ProcSys,
    identity: &NodeIdentity,
    arch: &str,
) -> NodeInfo {
    NodeInfo {
        name: identity.name.clone(),
        labels: identity.labels.clone(),
        kernel_release: proc.read_opt("kernel/osrelease").unwrap_or_default(),
        os_release: fs
            .read_host_file(Path::new("/etc/os-release"))
            .map(|t| parse_os_release(&t))
            .unwrap_or_default(),
        boot_id: proc.read_opt("kernel/random/boot_id").unwrap_or_default(),
        architecture: arch.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_is_loaded_when_its_sysfs_initstate_says_so() {
        let root = tempfile::tempdir().unwrap();
        let state = |module: &str, initstate: Option<&str>| {
            let dir = root.path().join("sys/module").join(module);
            std::fs::create_dir_all(&dir).unwrap();
            if let Some(s) = initstate {
                std::fs::write(dir.join("initstate"), format!("{s}\n")).unwrap();
            }
        };
        state("br_netfilter", Some("live"));
        state("coming_up", Some("coming"));
        state("leaving", Some("going"));
        state("built_in", None);
        // No /proc/modules at all: a kernel without module support has none.
        let host = LinuxHost::new(
            root.path(),
            &root.path().join("proc"),
            HostNamespaces::Current,
            NodeIdentity::default(),
        )
        .unwrap();
        assert!(host.kmod_is_loaded("br_netfilter").unwrap());
        assert!(host.kmod_is_loaded("br-netfilter").unwrap(), "- is _");
        assert!(host.kmod_is_loaded("coming-up").unwrap());
        assert!(!host.kmod_is_loaded("leaving").unwrap());
        assert!(!host.kmod_is_loaded("built_in").unwrap(), "not loadable");
        assert!(!host.kmod_is_loaded("absent").unwrap());
        assert!(matches!(
            host.kmod_is_loaded("../etc"),
            Err(HostError::InvalidName(_))
        ));
    }

    #[test]
    fn reads_this_machines_node_facts() {
        let host = LinuxHost::new(
            Path::new("/"),
            Path::new("/proc"),
            HostNamespaces::Current,
            NodeIdentity::default(),
        )
        .unwrap();
        let info = host.node_info();
        assert_eq!(info.boot_id.len(), 36, "boot id {:?}", info.boot_id);
        assert!(!info.kernel_release.is_empty());
        assert_eq!(
            host.sysctl_get("kernel.random.boot_id").unwrap(),
            info.boot_id
        );
    }
}
