//! A real Kubernetes control plane with simulated nodes, for end-to-end tests and the demo.
//!
//! [`ControlPlane::start`] runs etcd (embedded), kube-apiserver and kube-controller-manager
//! (job, garbagecollector, ttl-after-finished, disruption, namespace) built from the
//! upstream Go modules (`tests/cluster`, Kubernetes v1.36.3), each as its own process on
//! free loopback ports, with generated certificates and an admin kubeconfig. Processes get
//! their own process group, and a reaper process kills them when the test process exits,
//! however it exits. Logs are kept in the control plane's directory; [`ControlPlane::logs`]
//! returns their tails for failure messages.
//!
//! [`ControlPlane::shared`] gives one control plane per test process (`cargo xtask test`
//! runs each test in a process of its own; under plain `cargo test` the tests of a binary
//! share it); tests isolate by namespace and object names.
//!
//! [`SimKubelet`](simnode::SimKubelet) registers simulated nodes and really runs the
//! commands of the pods bound to them.

mod kubelet_api;
mod proctree;
pub mod realnode;
pub mod simnode;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use nodewright_testregistry::free_port;

pub use realnode::RealNode;
pub use simnode::{NodeSpec, SimKubelet};

/// The Kubernetes release the control plane is built from.
pub const KUBERNETES_VERSION: &str = "v1.36.3";

/// How a control plane differs from the default one.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// More addresses the apiserver serves on (it then listens on every interface), in
    /// its certificate too: the host end of a real node's link.
    pub extra_addresses: Vec<String>,
    /// What real nodes running a chart need: the ServiceAccount admission plugin (pods
    /// get tokens), the deployment, replicaset, serviceaccount, endpointslice and
    /// root-ca-cert-publisher controllers besides the default ones, and kube-scheduler
    /// (a Deployment's replicas placed as their affinity asks).
    pub workloads: bool,
}

/// The apiserver's admission configuration: Pod Security's cluster-wide default is
/// `baseline`, enforced (Kubernetes' own default is `privileged`).
const POD_SECURITY_BASELINE: &str = "\
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: PodSecurity
    configuration:
      apiVersion: pod-security.admission.config.k8s.io/v1
      kind: PodSecurityConfiguration
      defaults:
        enforce: baseline
        enforce-version: latest
        audit: baseline
        audit-version: latest
        warn: baseline
        warn-version: latest
      exemptions: {}
";

/// A running control plane.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    kubeconfig: PathBuf,
    children: Vec<(String, Child)>,
    /// Kept so the directory outlives the processes; `None` when kept on purpose.
    _tmp: Option<tempfile::TempDir>,
}

use nodewright_testregistry::workspace;

/// Builds (once, cached by source hash) the `ktest` binary and returns its path.
pub fn ktest_binary() -> Result<PathBuf> {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    if let Some(p) = PATH.get() {
        return Ok(p.clone());
    }
    let script = workspace().join("tests/cluster/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("run {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "building the test control plane failed ({})",
            script.display()
        );
    }
    let path = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    Ok(PATH.get_or_init(|| path).clone())
}

/// Builds (once) helm from its Go module and returns its path.
pub fn helm_binary() -> Result<PathBuf> {
    let script = workspace().join("tests/cluster/build-helm.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("run {}", script.display()))?;
    if !out.status.success() {
        bail!("building helm failed ({})", script.display());
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// The Helm chart's directory (`deploy/chart/nodewright`).
pub fn chart_dir() -> PathBuf {
    workspace().join("deploy/chart/nodewright")
}

/// The chart rendered by `helm template` (CRDs included) into `namespace` with `extra`
/// arguments (`--set k=v`, …): its objects, in order.
pub fn render_chart(namespace: &str, extra: &[&str]) -> Result<Vec<serde_json::Value>> {
    let out = Command::new(helm_binary()?)
        .args(["template", "nw"])
        .arg(chart_dir())
        .args([
            "--namespace",
            namespace,
            "--include-crds",
            "--kube-version",
            KUBERNETES_VERSION.trim_start_matches('v'),
        ])
        .args(extra)
        .output()
        .context("run helm template")?;
    if !out.status.success() {
        bail!(
            "helm template failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&String::from_utf8(out.stdout)?) {
        let v: serde_json::Value =
            serde::Deserialize::deserialize(doc).context("a rendered document")?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

/// Starts a process in its own process group with output to `<dir>/<name>.log`.
fn spawn(dir: &Path, name: &str, bin: &Path, args: &[String]) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("start {name}"))
}

/// Removes `dir` once process `watch` has exited and its control plane is stopped (the
/// reaper's kills come first; a dir already removed by its owner is left alone).
fn spawn_remover(watch: u32, dir: &Path) -> Result<()> {
    let dir = dir
        .to_str()
        .filter(|d| !d.contains('\''))
        .context("a plain temp dir path")?;
    let script = format!(
        "while kill -0 {watch} 2>/dev/null; do sleep 0.5; done; sleep 5; rm -rf -- '{dir}'"
    );
    spawn_watcher(&script).context("start the temp dir's remover")
}

/// Kills the process groups `pgids` when process `watch` exits (a test binary that
/// panics, is killed or simply ends never leaves a control plane behind).
fn spawn_reaper(watch: u32, pgids: &[u32]) -> Result<()> {
    let kills: String = pgids
        .iter()
        .map(|p| format!("/bin/kill -TERM -- -{p} 2>/dev/null; "))
        .collect();
    let hard: String = pgids
        .iter()
        .map(|p| format!("/bin/kill -KILL -- -{p} 2>/dev/null; "))
        .collect();
    let script =
        format!("while kill -0 {watch} 2>/dev/null; do sleep 0.5; done; {kills} sleep 2; {hard}");
    spawn_watcher(&script).context("start the reaper")
}

/// Runs the shell `script` in a process group of its own, detached from ours.
fn spawn_watcher(script: &str) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    Command::new("sh")
        .args(["-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map(drop)
}

impl ControlPlane {
    /// One control plane per test process.
    pub fn shared() -> &'static ControlPlane {
        static SHARED: OnceLock<ControlPlane> = OnceLock::new();
        SHARED.get_or_init(|| {
            ControlPlane::start().unwrap_or_else(|e| panic!("control plane: {e:#}"))
        })
    }

    /// Starts a control plane in a temporary directory.
    pub fn start() -> Result<Self> {
        let tmp = tempfile::Builder::new()
            .prefix("nodewright-cp-")
            .tempdir()?;
        let dir = tmp.path().to_path_buf();
        // The directory goes with the process even when nothing drops it: the shared
        // control plane lives in a static (never dropped), and a killed test drops nothing.
        spawn_remover(std::process::id(), &dir)?;
        let mut cp = Self::start_in(&dir)?;
        cp._tmp = Some(tmp);
        Ok(cp)
    }

    /// Starts a control plane whose state and logs live in `dir` (kept after exit).
    ///
    /// A component that lost its port to another process between our pick and its bind
    /// ("address already in use") is not a failure of the cluster: the whole start is
    /// retried on fresh ports, twice at most.
    pub fn start_in(dir: &Path) -> Result<Self> {
        Self::start_with(dir, &Options::default())
    }

    /// [`ControlPlane::start_in`] with `options`.
    pub fn start_with(dir: &Path, options: &Options) -> Result<Self> {
        let mut attempt = 1;
        loop {
            match Self::start_once(dir, options) {
                Err(e) if attempt < 3 && format!("{e:#}").contains("address already in use") => {
                    eprintln!(
                        "control plane: a port was taken before its component bound it; starting again on fresh ports"
                    );
                    let _ = std::fs::remove_dir_all(dir.join("etcd"));
                    attempt += 1;
                }
                started => return started,
            }
        }
    }

    fn start_once(dir: &Path, options: &Options) -> Result<Self> {
        let bin = ktest_binary()?;
        std::fs::create_dir_all(dir)?;
        let started = Instant::now();
        let pki = dir.join("pki");
        let hosts = std::iter::once("127.0.0.1".to_string())
            .chain(options.extra_addresses.iter().cloned())
            .collect::<Vec<_>>()
            .join(",");
        let status = Command::new(&bin)
            .args(["certs", "--host", &hosts, "--dir"])
            .arg(&pki)
            .status()?;
        if !status.success() {
            bail!("ktest certs failed");
        }
        let (etcd_port, etcd_peer, api_port) = (free_port(), free_port(), free_port());
        let server = format!("https://127.0.0.1:{api_port}");
        let p = |f: &str| pki.join(f).display().to_string();
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: nodewright-test\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: admin\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: nodewright-test\n  context:\n    cluster: nodewright-test\n    user: admin\ncurrent-context: nodewright-test\n",
                p("ca.crt"),
                p("admin.crt"),
                p("admin.key")
            ),
        )?;

        let mut cp = ControlPlane {
            dir: dir.to_path_buf(),
            server: server.clone(),
            kubeconfig: kubeconfig.clone(),
            children: Vec::new(),
            _tmp: None,
        };
        let etcd_args: Vec<String> = vec![
            "etcd".into(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--client-url=http://127.0.0.1:{etcd_port}"),
            format!("--peer-url=http://127.0.0.1:{etcd_peer}"),
        ];
        cp.children
            .push(("etcd".into(), spawn(dir, "etcd", &bin, &etcd_args)?));
        cp.wait_for("etcd", Duration::from_secs(60), |cp| {
            cp.log_contains("etcd", "etcd ready")
        })?;

        // Pod Security enforces `baseline` wherever a namespace says nothing, as a hardened
        // cluster does: the agent's privileged pods run only where the namespace is labelled
        // for them, in every test.
        let admission = dir.join("admission.yaml");
        std::fs::write(&admission, POD_SECURITY_BASELINE)?;
        let bind = if options.extra_addresses.is_empty() {
            "127.0.0.1"
        } else {
            "0.0.0.0"
        };
        let mut api_args: Vec<String> = [
            "kube-apiserver".to_string(),
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            format!("--bind-address={bind}"),
            format!("--secure-port={api_port}"),
            "--advertise-address=127.0.0.1".into(),
            "--endpoint-reconciler-type=none".into(),
            // Services reach their EndpointSlices' addresses (there is no kube-proxy for
            // ClusterIPs): a webhook behind a Service works once a test publishes a slice.
            "--enable-aggregator-routing=true".into(),
            // Simulated nodes' kubelet endpoint is on loopback; their Hostname resolves nowhere.
            "--kubelet-preferred-address-types=InternalIP".into(),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            "--authorization-mode=RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p("sa.key")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            format!(
                "--disable-admission-plugins={}",
                if options.workloads {
                    ""
                } else {
                    "ServiceAccount"
                }
            ),
            format!("--admission-control-config-file={}", admission.display()),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            "--enable-priority-and-fairness=false".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ]
        .into();
        api_args.retain(|a| a != "--disable-admission-plugins=");
        cp.children.push((
            "kube-apiserver".into(),
            spawn(dir, "kube-apiserver", &bin, &api_args)?,
        ));
        cp.wait_for("kube-apiserver /readyz", Duration::from_secs(90), |cp| {
            cp.readyz()
        })?;

        let mut controllers =
            "job,garbagecollector,ttl-after-finished,disruption,namespace".to_string();
        if options.workloads {
            controllers.push_str(
                ",deployment,replicaset,serviceaccount,endpointslice,root-ca-cert-publisher",
            );
        }
        let kcm_args: Vec<String> = vec![
            "kube-controller-manager".into(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--controllers={controllers}"),
            format!("--root-ca-file={}", p("ca.crt")),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--kube-api-qps=200".into(),
            "--kube-api-burst=400".into(),
            "--concurrent-job-syncs=10".into(),
            "--v=1".into(),
        ];
        cp.children.push((
            "kube-controller-manager".into(),
            spawn(dir, "kube-controller-manager", &bin, &kcm_args)?,
        ));
        if options.workloads {
            let scheduler_args: Vec<String> = vec![
                "kube-scheduler".into(),
                format!("--kubeconfig={}", kubeconfig.display()),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--v=1".into(),
            ];
            cp.children.push((
                "kube-scheduler".into(),
                spawn(dir, "kube-scheduler", &bin, &scheduler_args)?,
            ));
        }
        let pgids: Vec<u32> = cp.children.iter().map(|(_, c)| c.id()).collect();
        spawn_reaper(std::process::id(), &pgids)?;
        cp.wait_for("kube-controller-manager", Duration::from_secs(60), |cp| {
            cp.log_contains("kube-controller-manager", "Caches are synced")
        })?;
        eprintln!(
            "control plane {KUBERNETES_VERSION} ready at {server} in {:.1}s (kubeconfig {})",
            started.elapsed().as_secs_f64(),
            kubeconfig.display()
        );
        Ok(cp)
    }

    fn log_contains(&self, name: &str, needle: &str) -> bool {
        std::fs::read_to_string(self.dir.join(format!("{name}.log")))
            .is_ok_and(|t| t.contains(needle))
    }

    fn readyz(&self) -> bool {
        let pki = self.dir.join("pki");
        Command::new("curl")
            .args(["-sf", "-o", "/dev/null", "--max-time", "2", "--cacert"])
            .arg(pki.join("ca.crt"))
            .arg("--cert")
            .arg(pki.join("admin.crt"))
            .arg("--key")
            .arg(pki.join("admin.key"))
            .arg(format!("{}/readyz", self.server))
            .status()
            .is_ok_and(|s| s.success())
    }

    fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        ready: impl Fn(&Self) -> bool,
    ) -> Result<()> {
        let started = Instant::now();
        loop {
            if ready(self) {
                return Ok(());
            }
            let mut exited = None;
            for (name, child) in &mut self.children {
                if let Some(status) = child.try_wait()? {
                    exited = Some(format!("{name} exited with {status}"));
                }
            }
            if let Some(exited) = exited {
                bail!("{exited} while waiting for {what}:\n{}", self.logs());
            }
            if started.elapsed() > timeout {
                bail!("{what} not ready after {timeout:?}:\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The admin kubeconfig (client certificate in group system:masters).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The directory holding state, certificates and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A client with the admin credentials.
    ///
    /// kube-rs retries 429 answers by default, for minutes; an eviction refused by a PDB is a
    /// 429, and tests (like the operator) want that answer at once, so retries are off.
    pub async fn client(&self) -> Result<Client> {
        let kc = Kubeconfig::read_from(&self.kubeconfig)?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        config.default_retry = false;
        Ok(Client::try_from(config)?)
    }

    /// A client authenticated as `user` in `groups` (a client certificate from the cluster's
    /// CA): what RBAC lets that user do, and what a webhook sees in its requests.
    pub async fn user_client(&self, user: &str, groups: &[&str]) -> Result<Client> {
        let pki = self.dir.join("pki");
        let status = Command::new(ktest_binary()?)
            .args([
                "certs",
                "--user",
                user,
                "--groups",
                &groups.join(","),
                "--dir",
            ])
            .arg(&pki)
            .status()?;
        if !status.success() {
            bail!("ktest certs --user {user} failed");
        }
        let text = std::fs::read_to_string(&self.kubeconfig)?
            .replace(
                &pki.join("admin.crt").display().to_string(),
                &pki.join(format!("user-{user}.crt")).display().to_string(),
            )
            .replace(
                &pki.join("admin.key").display().to_string(),
                &pki.join(format!("user-{user}.key")).display().to_string(),
            );
        let kc = Kubeconfig::from_yaml(&text)?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        config.default_retry = false;
        Ok(Client::try_from(config)?)
    }

    /// The last lines of every component's log.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["etcd", "kube-apiserver", "kube-controller-manager"] {
            let text =
                std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            out.push_str(&format!("--- {name} (last {} lines)\n", tail.len()));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// Stops every component (SIGTERM to each process group, then SIGKILL).
    pub fn stop(&mut self) {
        for (_, child) in self.children.iter().rev() {
            let _ = Command::new("kill")
                .args(["-TERM", "--", &format!("-{}", child.id())])
                .stderr(Stdio::null())
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (_, child) in self.children.iter_mut().rev() {
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .stderr(Stdio::null())
                .status();
            let _ = child.wait();
        }
        self.children.clear();
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}
