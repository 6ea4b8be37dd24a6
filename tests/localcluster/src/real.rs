//! A cluster with a real node, for the tests of nodewright as installed: a control plane
//! serving the node's link, a registry on every interface with the pause image, one
//! [`RealNode`], and helpers to publish nodewright with `cargo xtask publish` and install
//! it with the `helm install` that prints.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use kube::Client;
use nodewright_api::pinned::PinnedRef;
use nodewright_oci::{Registry, RegistryConfig};
pub use nodewright_testcluster::realnode::real_node_available;
use nodewright_testcluster::realnode::{RealNodeConfig, pause_image};
use nodewright_testcluster::{ControlPlane, NodeSpec, Options, RealNode, SimKubelet};
use nodewright_testregistry::TestRegistry;

/// A control plane, a registry, one real node and any number of simulated ones.
pub struct RealCluster {
    /// The control plane.
    pub cp: ControlPlane,
    /// An admin client.
    pub client: Client,
    /// The registry (its loopback address is [`TestRegistry::host`]).
    pub registry: TestRegistry,
    /// The node.
    pub node: RealNode,
    /// The registry as the node reaches it: `10.222.<n>.1:<port>`.
    pub node_registry: String,
    /// Simulated nodes beside the real one.
    pub sim: SimKubelet,
    work: PathBuf,
}

impl std::fmt::Debug for RealCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealCluster")
            .field("node", &self.node)
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

impl RealCluster {
    /// Starts everything under `work`; the real node is named `name`, its link
    /// `10.222.<index>`; `sim_nodes` are simulated nodes in the same cluster.
    pub async fn start(
        work: &Path,
        name: &str,
        index: u8,
        sim_nodes: &[&str],
    ) -> Result<RealCluster> {
        let host_ip = RealNodeConfig::host_ip(index);
        let dir = work.join("control-plane");
        let options = Options {
            extra_addresses: vec![host_ip.clone()],
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
        let node_registry = format!("{host_ip}:{port}");
        let oci = Registry::new(RegistryConfig {
            insecure: vec![registry.host().into()],
            ..Default::default()
        });
        let pause = pause_image(&work.join("pause"))?;
        let pinned = pause
            .push(&oci, &format!("{}/pause:3.10", registry.host()), &|_| {})
            .await?;
        let config = RealNodeConfig {
            name: name.into(),
            index,
            registry: node_registry.clone(),
            pause_image: pinned.replace(registry.host(), &node_registry),
        };
        let node = RealNode::start(&cp, client.clone(), config, &work.join("node")).await?;
        let specs = sim_nodes
            .iter()
            .map(|n| NodeSpec::new(n, &work.join("sim-nodes")))
            .collect();
        let sim = SimKubelet::start(client.clone(), specs).await?;
        Ok(RealCluster {
            cp,
            client,
            registry,
            node,
            node_registry,
            sim,
            work: work.to_path_buf(),
        })
    }

    /// Runs `cargo xtask publish --registry <node registry>/nodewright --insecure [--tag T]`
    /// and reads what it printed.
    pub fn publish(&self, tag: Option<&str>) -> Result<Published> {
        self.publish_under("nodewright", tag)
    }

    /// The same, into `<node registry>/<path>`.
    pub fn publish_under(&self, path: &str, tag: Option<&str>) -> Result<Published> {
        let workspace = nodewright_testregistry::workspace();
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.current_dir(&workspace).args([
            "xtask",
            "publish",
            "--registry",
            &format!("{}/{path}", self.node_registry),
            "--insecure",
        ]);
        if let Some(t) = tag {
            cmd.args(["--tag", t]);
        }
        let out = cmd.output().context("running cargo xtask publish")?;
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success() {
            bail!(
                "cargo xtask publish failed:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
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
        cmd.args(words)
            .env("KUBECONFIG", self.cp.kubeconfig())
            .env("HELM_CACHE_HOME", self.work.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.work.join("helm/config"))
            .env("HELM_DATA_HOME", self.work.join("helm/data"));
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
