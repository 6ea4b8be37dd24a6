//! The simulated node: real files, recorded effects, state kept under the scratch root.
//!
//! Layout under the root (all created on demand):
//!
//! | path | what |
//! |---|---|
//! | `/proc/sys/...` | sysctl values, one file per key (`/proc/sys/kernel/random/boot_id` too) |
//! | `/proc/modules` | loaded modules, `/proc/modules` format |
//! | `/sys/module/<m>/{initstate,refcnt,version}` | what the kernel shows of a loaded module (`initstate` is what says it is loaded) |
//! | `/run/nodewright-sim/services.json` | unit states |
//! | `/run/nodewright-sim/reboot-requested` | present while a reboot is pending (holds the reason) |
//! | `/var/lib/nodewright-sim/journal.jsonl` | every effect, one JSON [`HostAction`] per line |
//! | `/var/lib/nodewright-sim/argv.jsonl` | the exact argv a real node would have run for each helper command (`modprobe`, `systemctl`), one JSON array per line |
//!
//! Commands are run only if they exist as executables *inside* the root (tests drop small
//! scripts there); the simulated node has no other binaries.
//!
//! Units: every unit is taken to exist (tests name units without writing unit files), except
//! a masked one — its unit file a symlink to `/dev/null` in `/etc/systemd/system` (or another
//! unit directory) — whose start, restart, reload and enable fail as systemctl's do.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nodewright_api::hostargs::UnitPowerProps;
use serde::{Deserialize, Serialize};

use crate::argv;
use crate::command::{ExecLimits, ExecOutput, ProcessTree, Program, run_program_bounded};
use crate::error::{HostError, Result};
use crate::linux::node_info;
use crate::node::{NodeIdentity, NodeInfo};
use crate::ops::{HostOps, ServiceVerb, UnitStatus, refuse_power_change};
use crate::ops::{PayloadArg, Runnable, open_payload_args, open_payload_executable};
use crate::procsys::ProcSys;
use crate::rootfs::RootFs;

/// One recorded host effect.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum HostAction {
    /// A sysctl write.
    SysctlSet {
        /// Dotted key.
        key: String,
        /// New value.
        value: String,
    },
    /// A module load.
    KmodLoad {
        /// Module.
        name: String,
        /// Parameters.
        params: Vec<String>,
    },
    /// A module unload.
    KmodUnload {
        /// Module.
        name: String,
    },
    /// A systemctl verb.
    Service {
        /// Verb.
        verb: ServiceVerb,
        /// Unit.
        unit: String,
    },
    /// `systemctl daemon-reload`.
    DaemonReload,
    /// `depmod -a` for a kernel release.
    Depmod {
        /// The release.
        release: String,
    },
    /// A command run.
    Exec {
        /// Host path.
        path: String,
        /// Arguments.
        args: Vec<String>,
        /// Exit code.
        status: Option<i32>,
    },
    /// A reboot request.
    RebootRequested {
        /// Why.
        reason: String,
    },
    /// A simulated reboot happened (new boot ID).
    Rebooted {
        /// The new boot ID.
        boot_id: String,
    },
}

impl std::fmt::Display for HostAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostAction::SysctlSet { key, value } => write!(f, "sysctl {key}={value}"),
            HostAction::KmodLoad { name, params } if params.is_empty() => {
                write!(f, "modprobe {name}")
            }
            HostAction::KmodLoad { name, params } => {
                write!(f, "modprobe {name} {}", params.join(" "))
            }
            HostAction::KmodUnload { name } => write!(f, "modprobe -r {name}"),
            HostAction::Service { verb, unit } => write!(f, "systemctl {verb} {unit}"),
            HostAction::DaemonReload => f.write_str("systemctl daemon-reload"),
            HostAction::Depmod { release } => write!(f, "depmod {release}"),
            HostAction::Exec { path, args, status } => {
                write!(
                    f,
                    "exec {path} {} (exit {})",
                    args.join(" "),
                    status.map_or("-".into(), |s| s.to_string())
                )
            }
            HostAction::RebootRequested { reason } => write!(f, "reboot requested: {reason}"),
            HostAction::Rebooted { boot_id } => write!(f, "rebooted (boot id {boot_id})"),
        }
    }
}

const SIM_RUN: &str = "run/nodewright-sim";
const SIM_LIB: &str = "var/lib/nodewright-sim";

/// A simulated node rooted at a scratch directory.
#[derive(Debug)]
pub struct SimHost {
    root: PathBuf,
    fs: RootFs,
    proc: ProcSys,
    identity: NodeIdentity,
    recorded: Mutex<Vec<HostAction>>,
    argvs: Mutex<Vec<Vec<String>>>,
}

impl SimHost {
    /// Opens (creating if needed) a simulated node at `root`. A boot ID is written if the
    /// root has none yet.
    pub fn new(root: &Path, identity: NodeIdentity) -> Result<Self> {
        // What every systemd distribution ships, so grants written for a real node (a
        // `/etc/sysctl.d` grant without the trailing `/`) mean the same here.
        const DISTRO_DIRS: [&str; 4] = [
            "etc/sysctl.d",
            "etc/modules-load.d",
            "etc/modprobe.d",
            "etc/systemd/system",
        ];
        for dir in ["proc/sys/kernel/random", SIM_RUN, SIM_LIB]
            .iter()
            .chain(&DISTRO_DIRS)
        {
            let d = root.join(dir);
            std::fs::create_dir_all(&d).map_err(|e| HostError::io("create", &d, e))?;
        }
        let host = SimHost {
            root: root.to_path_buf(),
            fs: RootFs::open(root)?,
            proc: ProcSys::new(&root.join("proc")),
            identity,
            recorded: Mutex::new(Vec::new()),
            argvs: Mutex::new(Vec::new()),
        };
        if host
            .proc
            .read_opt("kernel/random/boot_id")
            .is_none_or(|b| b.is_empty())
        {
            host.write_local("proc/sys/kernel/random/boot_id", &new_boot_id())?;
        }
        if host.proc.read_opt("kernel/osrelease").is_none() {
            host.write_local("proc/sys/kernel/osrelease", "6.1.0-nodewright-sim")?;
        }
        Ok(host)
    }

    /// Effects recorded by this instance, in order.
    pub fn recorded(&self) -> Vec<HostAction> {
        self.recorded.lock().expect("journal lock").clone()
    }

    /// Every effect ever recorded at this root (all processes), from the journal file.
    pub fn journal(root: &Path) -> Vec<HostAction> {
        std::fs::read_to_string(root.join(SIM_LIB).join("journal.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The helper argvs this instance would have run on a real node, in order.
    pub fn recorded_argv(&self) -> Vec<Vec<String>> {
        self.argvs.lock().expect("argv lock").clone()
    }

    /// Every helper argv recorded at this root (all processes).
    pub fn argv_log(root: &Path) -> Vec<Vec<String>> {
        std::fs::read_to_string(root.join(SIM_LIB).join("argv.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The pending reboot request's reason, if any.
    pub fn reboot_requested(root: &Path) -> Option<String> {
        std::fs::read_to_string(root.join(SIM_RUN).join("reboot-requested")).ok()
    }

    /// Performs a pending (or forced) reboot: new boot ID, runtime state under `/run`
    /// cleared, modules unloaded and sysctls kept only if persisted... as a real boot would
    /// (modules from `/etc/modules-load.d` are loaded again). Returns the new boot ID.
    pub fn reboot(&self) -> Result<String> {
        let boot_id = new_boot_id();
        let run = self.root.join(SIM_RUN);
        let _ = std::fs::remove_dir_all(&run);
        std::fs::create_dir_all(&run).map_err(|e| HostError::io("create", &run, e))?;
        // Modules do not survive a reboot; the ones configured to load at boot come back.
        let sys = self.root.join("sys/module");
        if sys.exists() {
            std::fs::remove_dir_all(&sys).map_err(|e| HostError::io("remove", &sys, e))?;
        }
        let mut boot_loaded = Vec::new();
        let mut modules = String::new();
        if let Ok(entries) = std::fs::read_dir(self.root.join("etc/modules-load.d")) {
            for entry in entries.flatten() {
                for line in std::fs::read_to_string(entry.path())
                    .unwrap_or_default()
                    .lines()
                {
                    let name = line.trim();
                    if !name.is_empty()
                        && !name.starts_with('#')
                        && !modules_contains(&modules, name)
                    {
                        modules.push_str(&format!("{} 0 0 - Live 0x0\n", name.replace('-', "_")));
                        boot_loaded.push(name.to_string());
                    }
                }
            }
        }
        self.write_local("proc/modules", &modules)?;
        for name in &boot_loaded {
            self.sys_module_loaded(name)?;
        }
        self.write_local("proc/sys/kernel/random/boot_id", &boot_id)?;
        self.record(HostAction::Rebooted {
            boot_id: boot_id.clone(),
        })?;
        Ok(boot_id)
    }

    /// What the kernel shows of a module it loaded: `/sys/module/<name>/initstate` (`live`,
    /// what [`HostOps::kmod_is_loaded`] reads), `refcnt` (0), and `version` when the module
    /// file modprobe would take (`/lib/modules/<release>/updates/<name>.ko`, where installed
    /// modules go) declares one in its modinfo, as a real module's `.modinfo` section does
    /// (`version=…`, NUL-terminated).
    fn sys_module_loaded(&self, name: &str) -> Result<()> {
        let want = name.replace('-', "_");
        let release = self.proc.read_opt("kernel/osrelease").unwrap_or_default();
        let file = self
            .root
            .join("lib/modules")
            .join(release.trim())
            .join("updates")
            .join(format!("{name}.ko"));
        self.write_local(&format!("sys/module/{want}/initstate"), "live\n")?;
        self.write_local(&format!("sys/module/{want}/refcnt"), "0\n")?;
        if let Ok(bytes) = std::fs::read(&file)
            && let Some(version) = modinfo_version(&bytes)
        {
            self.write_local(
                &format!("sys/module/{want}/version"),
                &format!("{version}\n"),
            )?;
        }
        Ok(())
    }

    fn write_local(&self, rel: &str, contents: &str) -> Result<()> {
        let path = self.root.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| HostError::io("create", parent, e))?;
        }
        std::fs::write(&path, contents).map_err(|e| HostError::io("write", &path, e))
    }

    fn append(&self, file: &str, mut line: String) -> Result<()> {
        let path = self.root.join(SIM_LIB).join(file);
        line.push('\n');
        // One write(2) per line with O_APPEND: concurrent processes do not interleave.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(|e| HostError::io("write", &path, e))
    }

    fn record(&self, action: HostAction) -> Result<()> {
        self.append(
            "journal.jsonl",
            serde_json::to_string(&action).expect("host actions serialize"),
        )?;
        self.recorded.lock().expect("journal lock").push(action);
        Ok(())
    }

    /// Records the argv a real node would run: the simulated node builds it with the same
    /// code (and the same checks) as the Linux backend.
    fn run_helper(&self, argv: Vec<String>) -> Result<()> {
        self.append(
            "argv.jsonl",
            serde_json::to_string(&argv).expect("argvs serialize"),
        )?;
        self.argvs.lock().expect("argv lock").push(argv);
        Ok(())
    }

    /// A unit's power-relevant properties as systemd would load them from this root: the
    /// unit file from the first of systemd's unit directories that has it, then its drop-ins
    /// (`Key=value` lines read as `systemctl show` prints them; sections and comments
    /// skipped). A unit without a file has none, like systemd's not-found unit.
    fn unit_power_props(&self, unit: &str) -> UnitPowerProps {
        let mut text = String::new();
        if let Some(file) = UNIT_DIRS
            .iter()
            .find_map(|d| std::fs::read_to_string(self.root.join(d).join(unit)).ok())
        {
            text.push_str(&file);
        }
        for d in UNIT_DIRS {
            let Ok(entries) = std::fs::read_dir(self.root.join(d).join(format!("{unit}.d"))) else {
                continue;
            };
            let mut confs: Vec<PathBuf> = entries
                .filter_map(|e| Some(e.ok()?.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "conf"))
                .collect();
            confs.sort();
            for conf in confs {
                text.push('\n');
                text.push_str(&std::fs::read_to_string(conf).unwrap_or_default());
            }
        }
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with(['#', ';', '[']))
            .collect();
        UnitPowerProps::from_show(&lines.join("\n"))
    }

    /// The unit is masked (its unit file a symlink to `/dev/null` in a unit directory):
    /// systemd refuses to start, restart, reload or enable it.
    fn masked(&self, unit: &str) -> bool {
        UNIT_DIRS.iter().any(|d| {
            std::fs::read_link(self.root.join(d).join(unit))
                .is_ok_and(|target| target == Path::new("/dev/null"))
        })
    }

    fn services(&self) -> BTreeMap<String, UnitStatus> {
        std::fs::read_to_string(self.root.join(SIM_RUN).join("services.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default()
    }
}

/// systemd's unit directories, most important first, relative to the root.
const UNIT_DIRS: [&str; 4] = [
    "etc/systemd/system",
    "run/systemd/system",
    "usr/lib/systemd/system",
    "lib/systemd/system",
];

fn new_boot_id() -> String {
    // Not a security token: unique enough for a simulated boot. Mix time and pid.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let x = nanos ^ (u128::from(std::process::id()) << 64);
    let h = format!("{x:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

impl HostOps for SimHost {
    fn fs(&self) -> &RootFs {
        &self.fs
    }

    fn sysctl_get(&self, key: &str) -> Result<String> {
        self.proc.get(key)
    }

    /// The simulated kernel accepts any key.
    fn sysctl_set(&self, key: &str, value: &str) -> Result<()> {
        let path = self.proc.path(key)?;
        let rel = path
            .strip_prefix(&self.root)
            .map_err(|_| HostError::NotFound(key.to_string()))?;
        self.write_local(&rel.to_string_lossy(), value)?;
        self.record(HostAction::SysctlSet {
            key: key.to_string(),
            value: value.to_string(),
        })
    }

    fn kmod_load(&self, name: &str, params: &[String]) -> Result<()> {
        self.run_helper(argv::modprobe_load(name, params)?)?;
        // Loaded is what `kmod_is_loaded` says (`initstate`), the one rule; `/proc/modules`
        // is kept beside it, a line per module.
        if !self.kmod_is_loaded(name)? {
            let modules = self
                .fs
                .read_host_file(Path::new("/proc/modules"))
                .unwrap_or_default();
            if !modules_contains(&modules, name) {
                self.write_local(
                    "proc/modules",
                    &format!("{modules}{} 0 0 - Live 0x0\n", name.replace('-', "_")),
                )?;
            }
            self.sys_module_loaded(name)?;
        }
        self.record(HostAction::KmodLoad {
            name: name.to_string(),
            params: params.to_vec(),
        })
    }

    fn kmod_unload(&self, name: &str) -> Result<()> {
        self.run_helper(argv::modprobe_unload(name)?)?;
        let modules = self
            .fs
            .read_host_file(Path::new("/proc/modules"))
            .unwrap_or_default();
        let want = name.replace('-', "_");
        let kept: String = modules
            .lines()
            .filter(|l| l.split_whitespace().next() != Some(want.as_str()))
            .map(|l| format!("{l}\n"))
            .collect();
        self.write_local("proc/modules", &kept)?;
        let sys = self.root.join("sys/module").join(&want);
        if sys.exists() {
            std::fs::remove_dir_all(&sys).map_err(|e| HostError::io("remove", &sys, e))?;
        }
        self.record(HostAction::KmodUnload {
            name: name.to_string(),
        })
    }

    fn depmod(&self, release: &str) -> Result<()> {
        self.run_helper(argv::depmod(release)?)?;
        self.record(HostAction::Depmod {
            release: release.to_string(),
        })
    }

    fn service(&self, verb: ServiceVerb, unit: &str) -> Result<()> {
        let argv = argv::systemctl(verb, unit)?;
        refuse_power_change(verb, unit, || Ok(self.unit_power_props(unit)))?;
        let command = argv.join(" ");
        self.run_helper(argv)?;
        let refused = !matches!(verb, ServiceVerb::Stop | ServiceVerb::Disable);
        if refused && self.masked(unit) {
            // What systemctl prints and exits with for a masked unit.
            return Err(HostError::Command {
                command,
                status: "exit status: 1".into(),
                stderr: format!("Failed to {verb} {unit}: Unit {unit} is masked."),
            });
        }
        let mut all = self.services();
        let state = all.entry(unit.to_string()).or_insert_with(|| UnitStatus {
            active_state: "inactive".into(),
            enabled: false,
        });
        match verb {
            ServiceVerb::Start | ServiceVerb::Restart | ServiceVerb::Reload => {
                state.active_state = "active".into()
            }
            ServiceVerb::Stop => state.active_state = "inactive".into(),
            ServiceVerb::Enable => state.enabled = true,
            ServiceVerb::Disable => state.enabled = false,
        }
        let json = serde_json::to_string_pretty(&all).expect("unit states serialize");
        self.write_local(&format!("{SIM_RUN}/services.json"), &json)?;
        self.record(HostAction::Service {
            verb,
            unit: unit.to_string(),
        })
    }

    fn service_status(&self, unit: &str) -> Result<UnitStatus> {
        self.run_helper(argv::systemctl_show(unit)?)?;
        Ok(self.services().remove(unit).unwrap_or_else(|| UnitStatus {
            active_state: "inactive".into(),
            enabled: false,
        }))
    }

    fn daemon_reload(&self) -> Result<()> {
        self.run_helper(argv::daemon_reload())?;
        self.record(HostAction::DaemonReload)
    }

    fn exec(
        &self,
        runnable: &Runnable<'_>,
        args: &[String],
        files: &[PayloadArg],
        limits: &ExecLimits,
    ) -> Result<ExecOutput> {
        let (open, passed) = open_payload_args(args, files)?;
        let open: Vec<&std::fs::File> = open.iter().collect();
        let root = self.root.to_string_lossy().into_owned();
        let env = [("NODEWRIGHT_SIM_ROOT", root.as_str())];
        // As on a real node, when this process may make a PID namespace (root): a granted
        // command ends with everything it started. Without root (`plugin run` on an
        // author's machine) only its process group is bounded.
        let tree = if rustix::process::geteuid().is_root() {
            ProcessTree::Namespace
        } else {
            ProcessTree::Group
        };
        let limits = ExecLimits {
            tree,
            ..limits.clone()
        };
        // The program, found: a command placed under the simulated root, or the payload's
        // file opened below its tree.
        let (local, payload_file, host_shown);
        let program = match *runnable {
            Runnable::Host(path) => {
                local = self.fs.host_to_local(path);
                if !local.is_file() {
                    return Err(HostError::NotFound(format!(
                        "{} (the simulated node only has commands placed under its root)",
                        path.display()
                    )));
                }
                host_shown = path.display().to_string();
                Program::Path(&local, &host_shown)
            }
            Runnable::Payload { tree, rel, shown } => {
                payload_file = open_payload_executable(tree, rel)?;
                Program::File(&payload_file, shown)
            }
        };
        let root = Some(self.root.as_path());
        let out = run_program_bounded(program, &passed, &open, &env, root, &limits, None)?;
        // Recorded as the plugin named them: payload arguments as `payload:<name>/<path>`.
        self.record(HostAction::Exec {
            path: runnable.shown(),
            args: args.to_vec(),
            status: out.status,
        })?;
        Ok(out)
    }

    fn request_reboot(&self, reason: &str) -> Result<()> {
        self.run_helper(argv::reboot())?;
        // Recorded before it is requested: the simulated kubelet reboots the node (killing
        // this agent) as soon as it sees the request, which could otherwise beat the record.
        self.record(HostAction::RebootRequested {
            reason: reason.to_string(),
        })?;
        self.write_local(&format!("{SIM_RUN}/reboot-requested"), reason)
    }

    fn node_info(&self) -> NodeInfo {
        node_info(&self.fs, &self.proc, &self.identity, std::env::consts::ARCH)
    }
}

/// The `version=` entry of a module's modinfo strings, if it has one.
pub fn modinfo_version(module: &[u8]) -> Option<String> {
    const KEY: &[u8] = b"\0version=";
    let at = module.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let end = module[at..].iter().position(|&b| b == 0)? + at;
    String::from_utf8(module[at..end].to_vec()).ok()
}

/// Whether `/proc/modules` text lists `name` (`-` and `_` are the same to the kernel).
fn modules_contains(modules: &str, name: &str) -> bool {
    let want = name.replace('-', "_");
    modules
        .lines()
        .any(|l| l.split_whitespace().next() == Some(want.as_str()))
}

#[cfg(test)]
mod tests;
