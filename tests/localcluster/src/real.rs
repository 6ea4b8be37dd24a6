//! A cluster with real nodes, for the tests of nodewright as installed: a control plane
//! serving the nodes' links (and scheduling their pods), a registry on every interface with
//! the pause image, one or more [`RealNode`]s, simulated nodes beside them, and helpers to
//! publish nodewright with `cargo xtask publish` and install it with the `helm install`
//! that prints.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use nodewright_api::pinned::PinnedRef;
use nodewright_oci::{Registry, RegistryConfig};
pub use nodewright_testcluster::realnode::real_node_available;
use nodewright_testcluster::realnode::{RealNodeConfig, pause_image};
use nodewright_testcluster::{ControlPlane, NodeSpec, Options, RealNode, SimKubelet};
use nodewright_testregistry::TestRegistry;

use crate::docs::Substitutions;

/// A control plane, a registry, real nodes and any number of simulated ones.
pub struct RealCluster {
    /// The control plane.
    pub cp: ControlPlane,
    /// An admin client.
    pub client: Client,
    /// The registry (its loopback address is [`TestRegistry::host`]).
    pub registry: TestRegistry,
    /// The real nodes, in the order they were named.
    pub nodes: Vec<RealNode>,
    /// The registry as the nodes reach it: `10.222.<n>.1:<port>`, the first node's link
    /// (the machine answers on each of its addresses from every link).
    pub node_registry: String,
    /// Simulated nodes beside the real ones, tainted [`SIMULATED_TAINT`] so that the
    /// scheduler places no pod there (their kubelet runs processes, not images).
    pub sim: SimKubelet,
    work: PathBuf,
}

impl std::fmt::Debug for RealCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealCluster")
            .field("nodes", &self.nodes)
            .field("registry", &self.node_registry)
            .finish_non_exhaustive()
    }
}

/// What `cargo xtask publish` printed.
#[derive(Clone, Debug)]
pub struct Published {
    /// The `kubectl ...` lines printed before it (the namespace and its Pod Security label).
    pub kubectl: Vec<String>,
    /// The `helm install ...` line, exactly as printed.
    pub helm_install: String,
    /// Every pinned reference it pushed (`.../operator@sha256:...`, `.../plugins/<name>@...`).
    pub pinned: Vec<PinnedRef>,
}

impl Published {
    /// The pinned reference of `repository` (`operator`, `agent`, `plugins/sysctl`).
    pub fn pinned(&self, repository: &str) -> Option<&PinnedRef> {
        let suffix = format!("/{repository}");
        self.pinned
            .iter()
            .find(|p| p.repository().ends_with(&suffix))
    }
}

impl Published {
    /// Reads what `cargo xtask publish` printed on its standard output.
    pub fn parse(stdout: &str) -> Result<Published> {
        let kubectl = stdout
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("kubectl "))
            .map(String::from)
            .collect();
        let helm_install = stdout
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("helm install"))
            .context("publish printed no helm install")?
            .to_string();
        let pinned = stdout
            .lines()
            .map(str::trim)
            .filter(|l| l.contains("@sha256:") && !l.contains(' '))
            .map(|l| {
                l.parse::<PinnedRef>()
                    .with_context(|| format!("publish printed {l:?}"))
            })
            .collect::<Result<_>>()?;
        Ok(Published {
            kubectl,
            helm_install,
            pinned,
        })
    }
}

/// The taint on a [`RealCluster`]'s simulated nodes, as virtual-kubelet providers taint
/// theirs: `nodewright.dev/simulated=true:NoSchedule`.
pub const SIMULATED_TAINT: (&str, &str) = ("nodewright.dev/simulated", "true");

impl RealCluster {
    /// Starts everything under `work`: a real node per name in `names`, the first on the
    /// link `10.222.<first_index>`, the next on the index after it, and so on;
    /// `sim_nodes` are simulated nodes in the same cluster.
    pub async fn start(
        work: &Path,
        names: &[&str],
        first_index: u8,
        sim_nodes: &[&str],
    ) -> Result<RealCluster> {
        let indices: Vec<u8> = (0..names.len())
            .map(|i| {
                u8::try_from(i)
                    .ok()
                    .and_then(|i| first_index.checked_add(i))
            })
            .collect::<Option<_>>()
            .context("real node link indices past 255")?;
        let Some(&first) = indices.first() else {
            bail!("a real cluster needs at least one real node");
        };
        let dir = work.join("control-plane");
        let options = Options {
            extra_addresses: indices
                .iter()
                .map(|&i| RealNodeConfig::host_ip(i))
                .collect(),
            workloads: true,
        };
        let cp =
            tokio::task::spawn_blocking(move || ControlPlane::start_with(&dir, &options)).await??;
        let client = cp.client().await?;
        crate::install_crds(&client).await?;
        let registry = tokio::task::spawn_blocking(TestRegistry::start_on_all_interfaces).await?;
        let port = registry
            .host()
            .rsplit(':')
            .next()
            .context("registry port")?
            .to_string();
        let node_registry = format!("{}:{port}", RealNodeConfig::host_ip(first));
        let oci = Registry::new(RegistryConfig {
            insecure: vec![registry.host().into()],
            ..Default::default()
        });
        let pause = pause_image(&work.join("pause"))?;
        let pinned = pause
            .push(&oci, &format!("{}/pause:3.10", registry.host()), &|_| {})
            .await?;
        let mut nodes = Vec::new();
        for (name, index) in names.iter().zip(indices) {
            let config = RealNodeConfig {
                name: (*name).into(),
                index,
                registry: node_registry.clone(),
                pause_image: pinned.replace(registry.host(), &node_registry),
            };
            // The first keeps the directory a single-node cluster has always had.
            let dir = match nodes.len() {
                0 => work.join("node"),
                _ => work.join(format!("node-{name}")),
            };
            nodes.push(RealNode::start(&cp, client.clone(), config, &dir).await?);
        }
        let specs = sim_nodes
            .iter()
            .map(|n| NodeSpec::new(n, &work.join("sim-nodes")))
            .collect();
        let sim = SimKubelet::start(client.clone(), specs).await?;
        let (key, value) = SIMULATED_TAINT;
        let api = Api::<Node>::all(client.clone());
        for name in sim_nodes {
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"taints": [
                    {"key": key, "value": value, "effect": "NoSchedule"}
                ]}})),
            )
            .await
            .with_context(|| format!("tainting the simulated node {name}"))?;
        }
        Ok(RealCluster {
            cp,
            client,
            registry,
            nodes,
            node_registry,
            sim,
            work: work.to_path_buf(),
        })
    }

    /// The first real node.
    pub fn node(&self) -> &RealNode {
        &self.nodes[0]
    }

    /// Runs `cargo xtask publish --registry <node registry>/nodewright --insecure [--tag T]`
    /// and reads what it printed.
    pub fn publish(&self, tag: Option<&str>) -> Result<Published> {
        self.publish_under("nodewright", tag)
    }

    /// The same, into `<node registry>/<path>`.
    pub fn publish_under(&self, path: &str, tag: Option<&str>) -> Result<Published> {
        let mut line = format!(
            "cargo xtask publish --registry {}/{path} --insecure",
            self.node_registry
        );
        if let Some(t) = tag {
            line.push_str(&format!(" --tag {t}"));
        }
        Published::parse(&self.shell(&line)?)
    }

    /// What a reader of the docs substitutes: the registry (`registry.example.com/nodewright`,
    /// here `<node registry>/nodewright`) and a node's name (`worker-1`, here the first real
    /// node).
    pub fn doc_substitutions(&self) -> Substitutions {
        Substitutions::default()
            .with(
                "registry.example.com/nodewright",
                &format!("{}/nodewright", self.node_registry),
            )
            .with("worker-1", self.node().name())
    }

    /// Runs one command line as a reader of the docs would, with `sh` in the workspace:
    /// `kubectl`, `helm` and the `nodewright` CLI on the `PATH` (the test control plane's
    /// kubectl, the real helm, the CLI of this build) and the admin kubeconfig; a file the
    /// line names that holds a name to substitute (an example manifest) is replaced by a
    /// copy with [`RealCluster::doc_substitutions`] made. Returns its standard output.
    pub fn shell(&self, line: &str) -> Result<String> {
        let workspace = nodewright_testregistry::workspace();
        let line = self.doc_substitutions().localize_files(
            line,
            &workspace,
            &self.work.join("doc-files"),
        )?;
        let bin = self.tools()?;
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &line])
            .current_dir(&workspace)
            .env("PATH", path)
            .env("KUBECONFIG", self.cp.kubeconfig());
        self.helm_env(&mut cmd);
        let out = cmd.output().with_context(|| format!("running {line}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success() {
            bail!("{line}\n{stdout}{}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(stdout)
    }

    /// A directory with `kubectl`, `helm` and `nodewright` as a reader has them.
    fn tools(&self) -> Result<PathBuf> {
        let bin = self.work.join("doc-bin");
        if bin.join("nodewright").exists() {
            return Ok(bin);
        }
        std::fs::create_dir_all(&bin)?;
        let kubectl = bin.join("kubectl");
        std::fs::write(
            &kubectl,
            format!(
                "#!/bin/sh\nexec {} kubectl \"$@\"\n",
                nodewright_testcluster::ktest_binary()?.display()
            ),
        )?;
        std::fs::set_permissions(&kubectl, std::fs::Permissions::from_mode(0o755))?;
        std::os::unix::fs::symlink(nodewright_testcluster::helm_binary()?, bin.join("helm"))?;
        // The cargo running this test, where cargo set it.
        if let Some(cargo) = std::env::var_os("CARGO") {
            std::os::unix::fs::symlink(cargo, bin.join("cargo"))?;
        }
        // The CLI of this build, beside the test binary's `deps/` directory.
        let exe = std::env::current_exe()?;
        let cli = exe
            .parent()
            .and_then(Path::parent)
            .map(|d| d.join("nodewright"))
            .filter(|p| p.is_file())
            .context("the nodewright CLI is not built beside this test")?;
        std::os::unix::fs::symlink(cli, bin.join("nodewright"))?;
        Ok(bin)
    }

    fn helm_env(&self, cmd: &mut Command) {
        cmd.env("HELM_CACHE_HOME", self.work.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.work.join("helm/config"))
            .env("HELM_DATA_HOME", self.work.join("helm/data"));
    }

    /// Runs a `kubectl ...` command line (as printed, split on whitespace) with the test
    /// control plane's kubectl and the admin kubeconfig; returns its output.
    pub fn kubectl(&self, line: &str) -> Result<String> {
        let mut words = line.split_whitespace();
        if words.next() != Some("kubectl") {
            bail!("not a kubectl command: {line}");
        }
        let mut cmd = Command::new(nodewright_testcluster::ktest_binary()?);
        cmd.arg("kubectl")
            .args(words)
            .env("KUBECONFIG", self.cp.kubeconfig());
        printed(line, &mut cmd)
    }

    /// Runs a `helm ...` command line (as printed, split on whitespace) with the real helm
    /// and the admin kubeconfig; returns its output.
    pub fn helm(&self, line: &str) -> Result<String> {
        let mut words = line.split_whitespace();
        if words.next() != Some("helm") {
            bail!("not a helm command: {line}");
        }
        let mut cmd = Command::new(nodewright_testcluster::helm_binary()?);
        cmd.args(words).env("KUBECONFIG", self.cp.kubeconfig());
        self.helm_env(&mut cmd);
        printed(line, &mut cmd)
    }
}

/// Runs `cmd` (the command `line` an admin was told to run): its output, or an error with
/// the line and the output.
fn printed(line: &str, cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {line}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("{line}\n{text}");
    }
    Ok(text)
}
