//! A real node for the e2e tests: the real kubelet (built into `ktest` from the same
//! Kubernetes modules as the control plane), containerd and runc from Debian, a bridge
//! CNI network, and the real images — inside PID, mount, network and UTS namespaces of its
//! own, so that what a privileged `hostPID` pod calls "the host" is the node, never the CI
//! machine (see `realnode/node.sh` for what the node sees of the machine's filesystem).
//!
//! The node's network namespace is linked to the machine by a veth pair: the machine end
//! is `10.222.<n>.1`, the node `10.222.<n>.2`, pods get `10.244.<n>.0/24` (routed from the
//! machine, so the apiserver reaches webhooks on pod IPs). The apiserver and the registry
//! must listen on the machine end ([`crate::Options::extra_addresses`], a registry on all
//! interfaces). A reboot is a restart of the namespaces with a new boot ID: the harness
//! does it when the node's fake `systemctl reboot` asks, as the real node would reboot.
//!
//! Needs root, `unshare`/`nsenter` (util-linux), `ip` (iproute2), `iptables`, `containerd`,
//! `runc` and `/usr/lib/cni` (containernetworking-plugins); what this machine type needs
//! besides (a runc wrapper for `oomScoreAdj`, fake kernel settings for the kubelet) is in
//! `../shared/reference/real-node.md` and done here.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use serde_json::json;

use crate::{ControlPlane, ktest_binary};

const NODE_SCRIPT: &str = include_str!("realnode/node.sh");
const MODPROBE: &str = include_str!("realnode/modprobe.sh");
const DEPMOD: &str = include_str!("realnode/depmod.sh");
/// Where the node's `modprobe` and `depmod` record their calls (the node's /var/log).
const KMOD_LOG: &str = "var-log/nodewright-kmod.log";

/// What the node needs on this machine, by the file that shows it is there.
pub const PREREQUISITES: &[(&str, &str)] = &[
    ("/usr/bin/containerd", "containerd"),
    ("/usr/sbin/runc", "runc"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/sbin/iptables", "iptables"),
    ("/usr/bin/unshare", "util-linux"),
    ("/usr/sbin/ip", "iproute2"),
];

/// Missing prerequisites (Debian package names), empty when the node can run here.
pub fn missing_prerequisites() -> Vec<&'static str> {
    let mut missing: Vec<&str> = PREREQUISITES
        .iter()
        .filter(|(f, _)| !Path::new(f).exists())
        .map(|(_, p)| *p)
        .collect();
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !root {
        missing.push("(root)");
    }
    missing
}

/// Whether this machine can run a real node. When it cannot: with
/// `NODEWRIGHT_REQUIRE_REAL_NODE` set (the CI) that is a failure; otherwise the caller
/// skips, and this says so.
pub fn real_node_available() -> bool {
    let missing = missing_prerequisites();
    if missing.is_empty() {
        return true;
    }
    if std::env::var_os("NODEWRIGHT_REQUIRE_REAL_NODE").is_some() {
        panic!(
            "a real node needs {} (cargo xtask setup installs them)",
            missing.join(", ")
        );
    }
    eprintln!(
        "skipped: a real node needs {} (run `cargo xtask setup`)",
        missing.join(", ")
    );
    false
}

/// A real node's settings.
#[derive(Clone, Debug)]
pub struct RealNodeConfig {
    /// Node name.
    pub name: String,
    /// Picks the addresses: `10.222.<index>.0/30` and `10.244.<index>.0/24`.
    pub index: u8,
    /// The registry as the node reaches it (`10.222.<index>.1:<port>`), plain HTTP.
    pub registry: String,
    /// The pause image, pinned, in that registry.
    pub pause_image: String,
}

impl RealNodeConfig {
    /// The machine's end of the link: where the node reaches the apiserver and registry.
    pub fn host_ip(index: u8) -> String {
        format!("10.222.{index}.1")
    }

    fn node_ip(&self) -> String {
        format!("10.222.{}.2", self.index)
    }

    fn pod_cidr(&self) -> String {
        format!("10.244.{}.0/24", self.index)
    }

    fn host_link(&self) -> String {
        format!("nwh{}", self.index)
    }

    /// The cgroup the node's kubelet keeps its pods under (its `cgroupRoot`): one per node,
    /// so that nodes side by side on one machine (tests running at once) leave each other's
    /// pods alone — a kubelet removes the pod cgroups under its root that it does not know.
    fn cgroup_root(&self) -> String {
        format!("nodewright-node-{}", self.index)
    }
}

struct Running {
    unshare: Child,
    pid1: u32,
}

struct Inner {
    config: RealNodeConfig,
    dir: PathBuf,
    api_port: u16,
    running: Mutex<Option<Running>>,
    boots: Mutex<u32>,
}

/// A running real node. Dropping it ends its namespaces and removes what it left behind.
pub struct RealNode {
    inner: Arc<Inner>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("name", &self.inner.config.name)
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

fn sh(cmd: &str) -> Result<()> {
    let out = Command::new("sh")
        .args(["-c", cmd])
        .output()
        .with_context(|| format!("run {cmd}"))?;
    if !out.status.success() {
        bail!("`{cmd}` failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn write_exec(path: &Path, body: &str) -> Result<()> {
    std::fs::write(path, body)?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(())
}

/// The running kernel's release: the node's too (it shares the machine's kernel).
fn kernel_release() -> Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .context("reading the kernel release")?
        .trim()
        .to_string())
}

fn new_boot_id() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap_or_default();
    raw.trim().to_string()
}

impl Inner {
    /// Writes everything the node reads: configs, fakes, its directories (once).
    fn prepare(&self, cp: &ControlPlane) -> Result<()> {
        let n = &self.dir;
        let c = &self.config;
        for d in [
            "var-lib",
            "var-log",
            "bin",
            "fake",
            "state",
            "containerd/root",
            "kubelet/root",
            "kubelet/pki",
            "cni",
            "cni-ipam",
            "pod-logs",
            "lib-modules",
        ] {
            std::fs::create_dir_all(n.join(d))?;
        }
        if !n.join("etc").exists() {
            // The node's /etc starts as a copy of the machine's and lives on by itself.
            sh(&format!("cp -a /etc {}", n.join("etc").display()))?;
        }
        for (f, v) in [
            ("overcommit_memory", "1"),
            ("panic", "10"),
            ("panic_on_oops", "1"),
        ] {
            std::fs::write(n.join("fake").join(f), format!("{v}\n"))?;
        }
        let state = n.join("state");
        write_exec(
            &n.join("bin/systemctl"),
            &format!(
                "#!/bin/sh\n# The node's systemctl: records each call; a reboot is the harness's cue to restart the node.\necho \"$*\" >> {state}/systemctl.log\ncase \"$1\" in\n  reboot|poweroff|halt|kexec) echo \"$*\" > {state}/reboot-requested ;;\n  show) printf 'ActiveState=active\\nUnitFileState=enabled\\nLoadState=loaded\\n' ;;\nesac\nexit 0\n",
                state = state.display()
            ),
        )?;
        write_exec(&n.join("bin/modprobe"), MODPROBE)?;
        write_exec(&n.join("bin/depmod"), DEPMOD)?;
        std::fs::create_dir_all(n.join("lib-modules").join(kernel_release()?))?;
        // This VM's root cannot lower oom_score_adj (no CAP_SYS_RESOURCE): runc would fail
        // every pod sandbox. The wrapper drops a negative oomScoreAdj from the bundle.
        write_exec(
            &n.join("bin/runc-wrap"),
            "#!/bin/sh\nprev=\nfor a in \"$@\"; do\n  case \"$prev\" in --bundle|-b) b=\"$a\" ;; esac\n  prev=\"$a\"\ndone\nif [ -n \"${b:-}\" ] && [ -f \"$b/config.json\" ]; then\n  sed -i 's/\"oomScoreAdj\":-[0-9]*/\"oomScoreAdj\":0/' \"$b/config.json\"\nfi\nexec /usr/sbin/runc \"$@\"\n",
        )?;
        let containerd = format!(
            r#"version = 2
root = "{root}"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."{reg}"]
    endpoint = ["http://{reg}"]
"#,
            root = n.join("containerd/root").display(),
            pause = c.pause_image,
            runc = n.join("bin/runc-wrap").display(),
            cni = n.join("cni").display(),
            reg = c.registry,
        );
        std::fs::write(n.join("containerd/config.toml"), containerd)?;
        let cni = json!({
            "cniVersion": "0.4.0",
            "name": "nodewright-localcluster",
            "plugins": [
                {"type": "bridge", "bridge": "nwbr0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": c.pod_cidr()}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": n.join("cni-ipam")}},
                {"type": "loopback"}
            ]
        });
        std::fs::write(
            n.join("cni/10-nodewright-localcluster.conflist"),
            serde_json::to_vec_pretty(&cni)?,
        )?;
        let pki = cp.dir().join("pki");
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: https://{}:{}\n    certificate-authority: {}\nusers:\n- name: node\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: node}}\ncurrent-context: e2e\n",
            RealNodeConfig::host_ip(c.index),
            self.api_port,
            pki.join("ca.crt").display(),
            pki.join("admin.crt").display(),
            pki.join("admin.key").display()
        );
        std::fs::write(n.join("kubelet/kubeconfig"), kubeconfig)?;
        let kubelet = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\ncgroupDriver: cgroupfs\ncgroupRoot: /{cgroup_root}\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\nprotectKernelDefaults: true\nmakeIPTablesUtilChains: false\nfailSwapOn: false\npodLogsDir: {logs}\nstaticPodPath: {root}/manifests\naddress: 0.0.0.0\nport: {port}\nreadOnlyPort: 0\nserializeImagePulls: false\nevictionHard: {{}}\nimageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\nsyncFrequency: 5s\nnodeStatusUpdateFrequency: 5s\nauthentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}\nauthorization: {{mode: AlwaysAllow}}\n",
            logs = n.join("pod-logs").display(),
            root = n.join("kubelet").display(),
            port = nodewright_testregistry::free_port(),
            cgroup_root = c.cgroup_root(),
        );
        make_cgroup_root(&c.cgroup_root())?;
        std::fs::create_dir_all(n.join("kubelet/manifests"))?;
        std::fs::write(n.join("kubelet/config.yaml"), kubelet)?;
        Ok(())
    }

    /// Starts the node's namespaces (a boot).
    fn boot(&self) -> Result<String> {
        let n = &self.dir;
        let c = &self.config;
        let boot_id = new_boot_id();
        std::fs::write(n.join("boot_id"), format!("{boot_id}\n"))?;
        for f in ["reboot-requested", "started", "pid1-inside"] {
            let _ = std::fs::remove_file(n.join("state").join(f));
        }
        std::fs::write(n.join("node.sh"), NODE_SCRIPT)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(n.join("node.log"))?;
        use std::os::unix::process::CommandExt;
        let unshare = Command::new("unshare")
            .args([
                "--pid",
                "--fork",
                "--mount-proc",
                "--mount",
                "--net",
                "--uts",
                "--propagation",
                "private",
                "bash",
            ])
            .arg(n.join("node.sh"))
            .env("NODE", n)
            .env("NAME", &c.name)
            .env("NODE_IP", c.node_ip())
            .env("HOST_IP", RealNodeConfig::host_ip(c.index))
            .env("API_PORT", self.api_port.to_string())
            .env("KTEST", ktest_binary()?)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("starting the node's namespaces (unshare)")?;
        // The node's init is unshare's child.
        let started = Instant::now();
        let pid1 = loop {
            let children = std::fs::read_to_string(format!(
                "/proc/{}/task/{}/children",
                unshare.id(),
                unshare.id()
            ))
            .unwrap_or_default();
            if let Some(p) = children
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
            {
                break p;
            }
            if started.elapsed() > Duration::from_secs(10) {
                bail!(
                    "the node's init did not start: {}",
                    std::fs::read_to_string(n.join("node.log")).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let link = c.host_link();
        let _ = Command::new("ip")
            .args(["link", "del", &link])
            .stderr(Stdio::null())
            .status();
        sh(&format!(
            "ip link add {link} type veth peer name nwn0 netns {pid1}"
        ))?;
        sh(&format!(
            "ip addr add {}/30 dev {link} && ip link set {link} up",
            RealNodeConfig::host_ip(c.index)
        ))?;
        sh(&format!(
            "ip route replace {} via {} dev {link} onlink",
            c.pod_cidr(),
            c.node_ip()
        ))?;
        *self.running.lock().expect("node lock") = Some(Running { unshare, pid1 });
        *self.boots.lock().expect("node lock") += 1;
        Ok(boot_id)
    }

    /// Ends the node's namespaces: its init dies, and with it every process inside.
    fn halt(&self) {
        if let Some(mut r) = self.running.lock().expect("node lock").take() {
            let _ = kill_now(r.pid1);
            let _ = r.unshare.kill();
            let _ = r.unshare.wait();
            // Processes of the namespace are gone when its init is; wait for the kernel.
            let deadline = Instant::now() + Duration::from_secs(10);
            while Path::new(&format!("/proc/{}", r.pid1)).exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.config.host_link()])
            .stderr(Stdio::null())
            .status();
    }
}

fn kill_now(pid: u32) -> std::io::Result<()> {
    let status = Command::new("/bin/kill")
        .args(["-KILL", &pid.to_string()])
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other("kill failed"))
    }
}

/// The machine's cgroup hierarchies: the unified one (cgroup v2), or one per controller
/// (v1; the aliases such as `cpu` → `cpu,cpuacct` skipped).
fn cgroup_hierarchies() -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_path_buf()];
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect()
}

/// Creates the node's cgroup root in every hierarchy (the kubelet refuses a root that is
/// missing). A new v1 cpuset has no CPUs or memory nodes, so it gets its parent's.
fn make_cgroup_root(name: &str) -> Result<()> {
    for hierarchy in cgroup_hierarchies() {
        let dir = hierarchy.join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let own = dir.join(file);
            if own.exists() && std::fs::read_to_string(&own)?.trim().is_empty() {
                let parent = std::fs::read_to_string(hierarchy.join(file))?;
                std::fs::write(&own, parent.trim())
                    .with_context(|| format!("writing {}", own.display()))?;
            }
        }
    }
    Ok(())
}

/// Removes the node's cgroups (its root and what the kubelet and containerd made below it),
/// deepest first; only empty ones can go, which is all of them once the node's processes
/// are gone.
fn remove_cgroups(name: &str) {
    for hierarchy in cgroup_hierarchies() {
        let root = hierarchy.join(name);
        if root.exists() {
            let _ = Command::new("sh")
                .args([
                    "-c",
                    &format!(
                        "find {} -depth -type d -exec rmdir {{}} + 2>/dev/null",
                        root.display()
                    ),
                ])
                .status();
        }
    }
}

impl RealNode {
    /// Boots the node `config` in `dir` against `cp` (which must serve on
    /// [`RealNodeConfig::host_ip`]), and waits until it is Ready. A Deployment's pods reach
    /// it through the control plane's kube-scheduler ([`crate::Options::workloads`]).
    pub async fn start(
        cp: &ControlPlane,
        client: Client,
        config: RealNodeConfig,
        dir: &Path,
    ) -> Result<RealNode> {
        let missing = missing_prerequisites();
        if !missing.is_empty() {
            bail!(
                "a real node needs {} (cargo xtask setup installs them)",
                missing.join(", ")
            );
        }
        let api_port: u16 = cp
            .server
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .context("the apiserver's port")?;
        let inner = Arc::new(Inner {
            config,
            dir: dir.to_path_buf(),
            api_port,
            running: Mutex::new(None),
            boots: Mutex::new(0),
        });
        inner.prepare(cp)?;
        let boot_inner = inner.clone();
        tokio::task::spawn_blocking(move || boot_inner.boot()).await??;
        let node = RealNode {
            tasks: vec![tokio::spawn(reboots(inner.clone(), client.clone()))],
            inner,
        };
        node.wait_ready(&client, Duration::from_secs(120)).await?;
        Ok(node)
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.inner.config.name
    }

    /// The node's directory (its /etc, /var/lib, logs, state).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// How many times it has booted.
    pub fn boots(&self) -> u32 {
        *self.inner.boots.lock().expect("node lock")
    }

    /// The node's init as the machine sees it (to enter its namespaces).
    pub fn pid1(&self) -> Option<u32> {
        self.inner
            .running
            .lock()
            .expect("node lock")
            .as_ref()
            .map(|r| r.pid1)
    }

    /// A path of the node's filesystem as the machine sees it (/etc, /var/lib, /var/log,
    /// /lib/modules and /sys/module are the node's own).
    pub fn host_path(&self, path: &str) -> PathBuf {
        let rel = path.trim_start_matches('/');
        for (prefix, dir) in [
            ("etc", "etc"),
            ("var/lib", "var-lib"),
            ("var/log", "var-log"),
            ("lib/modules", "lib-modules"),
            ("usr/lib/modules", "lib-modules"),
            ("sys/module", "kmod/sys-module"),
        ] {
            let under = rel
                .strip_prefix(prefix)
                .filter(|rest| rest.is_empty() || rest.starts_with('/'));
            if let Some(rest) = under {
                return self.inner.dir.join(dir).join(rest.trim_start_matches('/'));
            }
        }
        PathBuf::from(path)
    }

    /// Runs `argv` inside the node's network namespace (to read its sysctls).
    pub fn in_netns(&self, argv: &[&str]) -> Result<String> {
        self.nsenter(&["net"], argv)
    }

    /// Runs `argv` in the node's mount, UTS and network namespaces, as a host command of
    /// the node would run.
    pub fn in_node(&self, argv: &[&str]) -> Result<String> {
        self.nsenter(&["mount", "uts", "net"], argv)
    }

    fn nsenter(&self, namespaces: &[&str], argv: &[&str]) -> Result<String> {
        let pid = self.pid1().context("the node is not running")?;
        let out = Command::new("nsenter")
            .args(namespaces.iter().map(|ns| {
                let file = if *ns == "mount" { "mnt" } else { ns };
                format!("--{ns}=/proc/{pid}/ns/{file}")
            }))
            .arg("--")
            .args(argv)
            .output()?;
        if !out.status.success() {
            bail!(
                "{argv:?} in the node's {} namespaces: {}",
                namespaces.join(", "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// What the node's `systemctl` was asked, one call per line.
    pub fn systemctl_calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.inner.dir.join("state/systemctl.log"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    /// What the node's `modprobe` and `depmod` were asked, one call per line.
    pub fn kmod_calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.inner.dir.join(KMOD_LOG))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    /// Makes the node's kernel show module `name` loaded at `version`, held by `refcnt`
    /// users, as if loaded before this test (gone at the next boot, like any module).
    pub fn load_module(&self, name: &str, version: &str, refcnt: u32) -> Result<()> {
        let sys = self.host_path(&format!("/sys/module/{name}"));
        std::fs::create_dir_all(&sys)?;
        std::fs::write(sys.join("version"), format!("{version}\n"))?;
        std::fs::write(sys.join("refcnt"), format!("{refcnt}\n"))?;
        std::fs::write(sys.join("initstate"), "live\n")?;
        Ok(())
    }

    /// The tails of the node's own logs (node script, containerd, kubelet).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["node.log", "containerd.log", "kubelet.log"] {
            let text = std::fs::read_to_string(self.inner.dir.join(name)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(25).collect();
            out.push_str(&format!(
                "--- real node {name} (last {} lines)\n",
                tail.len()
            ));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    async fn wait_ready(&self, client: &Client, timeout: Duration) -> Result<()> {
        wait_ready(client, &self.inner, timeout).await
    }
}

/// Waits until the node reports Ready with this boot's ID, then lifts the not-ready taint
/// the apiserver put on it (no node-lifecycle controller runs here).
async fn wait_ready(client: &Client, inner: &Inner, timeout: Duration) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let name = &inner.config.name;
    let boot = std::fs::read_to_string(inner.dir.join("boot_id"))
        .unwrap_or_default()
        .trim()
        .to_string();
    let started = Instant::now();
    loop {
        if let Some(n) = api.get_opt(name).await? {
            let status = n.status.clone().unwrap_or_default();
            let ready = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let booted = status.node_info.as_ref().is_some_and(|i| i.boot_id == boot);
            if ready && booted {
                crate::simnode::lift_not_ready(&api, n).await?;
                return Ok(());
            }
        }
        if started.elapsed() > timeout {
            let text = |f: &str| std::fs::read_to_string(inner.dir.join(f)).unwrap_or_default();
            let tail = |t: String| {
                t.lines()
                    .rev()
                    .take(30)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            bail!(
                "real node {name} not Ready after {timeout:?}\n--- node.log\n{}\n--- kubelet.log\n{}\n--- containerd.log\n{}",
                tail(text("node.log")),
                tail(text("kubelet.log")),
                tail(text("containerd.log"))
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Carries out the node's reboot requests: ends its namespaces and boots it again.
async fn reboots(inner: Arc<Inner>, client: Client) {
    let requested = inner.dir.join("state/reboot-requested");
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if !requested.exists() {
            continue;
        }
        let again = inner.clone();
        let rebooted = tokio::task::spawn_blocking(move || {
            again.halt();
            again.boot()
        })
        .await;
        match rebooted {
            Ok(Ok(_)) => {
                if let Err(e) = wait_ready(&client, &inner, Duration::from_secs(120)).await {
                    eprintln!("real node {}: {e:#}", inner.config.name);
                }
            }
            Ok(Err(e)) => eprintln!("real node {}: reboot failed: {e:#}", inner.config.name),
            Err(e) => eprintln!("real node {}: reboot task: {e}", inner.config.name),
        }
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.inner.halt();
        remove_cgroups(&self.inner.config.cgroup_root());
    }
}

/// The sandbox ("pause") image every pod of the node starts with: a static binary that
/// sleeps until it is signalled, compiled with musl-gcc into `work`; an index of the
/// host's architecture alone, as a published pause image is.
pub fn pause_image(work: &Path) -> Result<nodewright_images::Index> {
    std::fs::create_dir_all(work)?;
    let source = work.join("pause.c");
    std::fs::write(
        &source,
        "#include <signal.h>\n#include <unistd.h>\nstatic void done(int s) { (void)s; _exit(0); }\nint main(void) { signal(SIGTERM, done); signal(SIGINT, done); for (;;) pause(); }\n",
    )?;
    let binary = work.join("pause");
    let status = Command::new("musl-gcc")
        .args(["-static", "-O2", "-o"])
        .arg(&binary)
        .arg(&source)
        .status()
        .context("musl-gcc (musl-tools) builds the pause binary")?;
    if !status.success() {
        bail!("compiling the pause binary failed");
    }
    let contents = nodewright_images::Contents {
        arch: nodewright_images::Arch::host(),
        title: "pause".into(),
        description: "the real test node's pod sandbox".into(),
        files: vec![("pause".into(), std::fs::read(&binary)?, 0o755)],
        entrypoint: vec!["/pause".into()],
        user: "65535:65535".into(),
    };
    let inputs = nodewright_images::Inputs {
        binary,
        ca_bundle: None,
        version: "3.10".into(),
        revision: "test".into(),
        source: "nodewright tests".into(),
        created: "1970-01-01T00:00:00Z".into(),
    };
    let image = nodewright_images::Image::assemble(&contents, &inputs);
    Ok(nodewright_images::Index::new(vec![image])?)
}
