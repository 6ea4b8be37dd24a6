//! The local cluster nodewright's end-to-end tests, its rollout benchmark and the demo run
//! on: a fresh control plane with the CRDs and the operator's namespace, simulated nodes, a
//! real registry with every first-party plugin pushed as `<registry>/plugins/<name>:1.0.0`,
//! and the operator binary as a child process configured for simulated nodes (its Jobs run
//! the real `nodewright-agent`).

pub mod docs;
pub mod real;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodewright_api::keys;
use nodewright_oci::{Registry, RegistryConfig};
use nodewright_testcluster::{ControlPlane, NodeSpec, SimKubelet};
use nodewright_testregistry::TestRegistry;
use serde_json::{Value, json};

/// The operator's namespace (Jobs, Lease, webhook Secret).
pub const NS: &str = "nodewright";

/// A running local cluster.
pub struct Cluster {
    /// etcd, kube-apiserver, kube-controller-manager.
    pub cp: ControlPlane,
    /// An admin client.
    pub client: Client,
    /// The simulated nodes.
    pub sim: SimKubelet,
    /// The registry holding the plugins.
    pub registry: TestRegistry,
    /// Node names, in creation order.
    pub nodes: Vec<String>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("nodes", &self.nodes)
            .field("registry", &self.registry.host())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Starts everything; nodes are `(name, labels)`, their roots under `work/nodes`.
    pub async fn start(work: &Path, nodes: &[(String, Vec<(String, String)>)]) -> Result<Cluster> {
        let dir = work.join("control-plane");
        let cp = tokio::task::spawn_blocking(move || ControlPlane::start_in(&dir)).await??;
        let client = cp.client().await?;
        install_crds(&client).await?;
        // Labelled as the getting-started guide says: the test apiserver enforces
        // `baseline` wherever a namespace says nothing.
        let ns: Namespace = serde_json::from_value(json!({"metadata": {
            "name": NS,
            "labels": {keys::POD_SECURITY_ENFORCE: keys::POD_SECURITY_PRIVILEGED}
        }}))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .context("creating the operator namespace")?;
        let specs: Vec<NodeSpec> = nodes
            .iter()
            .map(|(name, labels)| {
                labels
                    .iter()
                    .fold(NodeSpec::new(name, &work.join("nodes")), |s, (k, v)| {
                        s.label(k, v)
                    })
            })
            .collect();
        let sim = SimKubelet::start(client.clone(), specs).await?;
        let registry = tokio::task::spawn_blocking(TestRegistry::start).await?;
        let reg = Registry::new(RegistryConfig {
            insecure: vec![registry.host().into()],
            ..Default::default()
        });
        for (name, path) in nodewright_artifacts::PLUGINS {
            reg.push(
                &format!("{}/plugins/{name}:1.0.0", registry.host()),
                &nodewright_artifacts::read(path),
                Default::default(),
                &|_| {},
            )
            .await
            .with_context(|| format!("pushing plugin {name}"))?;
        }
        // The Python and JavaScript ports, when their tools were set up.
        for (name, built) in [
            ("sysctl-py", nodewright_artifacts::SYSCTL_PY),
            ("files-js", nodewright_artifacts::FILES_JS),
        ] {
            if let Some(path) = built {
                reg.push(
                    &format!("{}/plugins/{name}:1.0.0", registry.host()),
                    &nodewright_artifacts::read(path),
                    Default::default(),
                    &|_| {},
                )
                .await
                .with_context(|| format!("pushing plugin {name}"))?;
            }
        }
        Ok(Cluster {
            cp,
            client,
            sim,
            registry,
            nodes: nodes.iter().map(|(n, _)| n.clone()).collect(),
        })
    }

    /// `<registry>/plugins/<name>:1.0.0`.
    pub fn plugin(&self, name: &str) -> String {
        format!("{}/plugins/{name}:1.0.0", self.registry.host())
    }

    /// A file's path under a node's root.
    pub fn host_path(&self, node: &str, path: &str) -> PathBuf {
        self.sim.root(node).join(path.trim_start_matches('/'))
    }

    /// Writes a file under a node's root.
    pub fn host_file(&self, node: &str, path: &str, content: &str) -> Result<()> {
        let local = self.host_path(node, path);
        std::fs::create_dir_all(local.parent().context("a file path")?)?;
        std::fs::write(local, content)?;
        Ok(())
    }

    /// Creates a workload pod on `node` in `default`, owned by an inert ReplicaSet (no
    /// ReplicaSet controller runs here) so the garbage collector leaves it alone and drains
    /// treat it as a managed pod.
    pub async fn workload_pod(&self, node: &str, name: &str, labels: Value) -> Result<()> {
        let sets: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
            Api::namespaced(self.client.clone(), "default");
        let owner = match sets.get_opt("workload").await? {
            Some(rs) => rs,
            None => {
                let rs = serde_json::from_value(json!({
                    "metadata": {"name": "workload"},
                    "spec": {"replicas": 0, "selector": {"matchLabels": {"owner": "workload"}},
                             "template": {"metadata": {"labels": {"owner": "workload"}}, "spec": {"containers": [{"name": "c", "image": "sleeper"}]}}}
                }))?;
                sets.create(&PostParams::default(), &rs).await?
            }
        };
        let uid = owner.metadata.uid.clone().context("owner uid")?;
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels, "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "workload", "uid": uid, "controller": true}]},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "sleeper"}]}
        }))?;
        Api::<Pod>::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &pod)
            .await?;
        Ok(())
    }

    /// Server-side applies a manifest (any kind) given as JSON.
    pub async fn apply(&self, manifest: &Value) -> Result<()> {
        let obj: kube::core::DynamicObject = serde_json::from_value(manifest.clone())?;
        let types = obj
            .types
            .clone()
            .context("manifest without apiVersion/kind")?;
        let gvk = kube::core::GroupVersionKind::try_from(&types)?;
        let (ar, caps) = kube::discovery::pinned_kind(&self.client, &gvk).await?;
        let api: Api<kube::core::DynamicObject> =
            match (&caps.scope, obj.metadata.namespace.as_deref()) {
                (kube::discovery::Scope::Cluster, _) => Api::all_with(self.client.clone(), &ar),
                (_, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, &ar),
                (_, None) => Api::default_namespaced_with(self.client.clone(), &ar),
            };
        let name = obj
            .metadata
            .name
            .clone()
            .context("manifest without metadata.name")?;
        api.patch(
            &name,
            &PatchParams::apply("nodewright-localcluster").force(),
            &Patch::Apply(&obj),
        )
        .await?;
        Ok(())
    }
}

/// Installs the generated CRDs and waits until each is established.
pub async fn install_crds(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, yaml) in nodewright_api::crdgen::generated() {
        let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&yaml)?;
        crds.patch(
            crd.metadata.name.as_deref().context("CRD name")?,
            &PatchParams::apply("nodewright-localcluster").force(),
            &Patch::Apply(&crd),
        )
        .await?;
    }
    for name in nodewright_api::crdgen::CRD_NAMES {
        let start = Instant::now();
        loop {
            let c = crds.get(name).await?;
            if c.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
            {
                break;
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!("CRD {name} not established after 30 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // A fresh client's discovery may not know the kinds yet; give it a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}

/// Where the operator and agent binaries are.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// `nodewright-operator`.
    pub operator: PathBuf,
    /// `nodewright-agent`, run by the stage Jobs' pods.
    pub agent: PathBuf,
}

/// The crates whose sources make up the operator and the agent (relative to the workspace).
const BINARY_SOURCES: &[&str] = &[
    "host/api/src",
    "host/planner/src",
    "host/engine/src",
    "host/hostops/src",
    "host/oci/src",
    "host/agent/src",
    "host/operator/src",
    "host/api/Cargo.toml",
    "host/planner/Cargo.toml",
    "host/engine/Cargo.toml",
    "host/hostops/Cargo.toml",
    "host/oci/Cargo.toml",
    "host/agent/Cargo.toml",
    "host/operator/Cargo.toml",
    "wit",
    "Cargo.lock",
];

/// The newest modification time of any file under `path`.
fn newest(path: &Path) -> Option<std::time::SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_file() {
        return meta.modified().ok();
    }
    std::fs::read_dir(path)
        .ok()?
        .flatten()
        .filter_map(|e| newest(&e.path()))
        .max()
}

impl Binaries {
    /// `nodewright-operator` and `nodewright-agent` in `dir` (a cargo profile directory).
    /// A test must never run a stale operator or agent: when either is missing or older
    /// than any of its sources, the workspace's binaries are built again in that profile
    /// (all of them, so the features match a workspace test build and nothing churns), and
    /// when that fails the test stops saying so.
    pub fn in_dir(dir: &Path) -> Result<Binaries> {
        let bins = Binaries {
            operator: dir.join("nodewright-operator"),
            agent: dir.join("nodewright-agent"),
        };
        let workspace = nodewright_testregistry::workspace();
        let sources = BINARY_SOURCES
            .iter()
            .filter_map(|rel| newest(&workspace.join(rel)))
            .max();
        let stale = [&bins.operator, &bins.agent].iter().any(|bin| {
            let built = std::fs::metadata(bin).and_then(|m| m.modified()).ok();
            match (built, sources) {
                (None, _) => true,
                (Some(built), Some(src)) => built < src,
                (Some(_), None) => false,
            }
        });
        if stale {
            let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            cmd.current_dir(&workspace)
                .args(["build", "--workspace", "--bins"]);
            if dir.file_name().is_some_and(|p| p == "release") {
                cmd.arg("--release");
            }
            // `<target>/<triple>/<profile>`: built for that target (`cargo xtask` builds
            // for this machine's musl target).
            if let Some(triple) = dir
                .parent()
                .and_then(Path::file_name)
                .and_then(|t| t.to_str())
                .filter(|t| t.contains("-linux-"))
            {
                cmd.args(["--target", triple]);
            }
            if !cmd.status().context("running cargo")?.success() {
                bail!(
                    "the operator or agent binary in {} is older than its sources and rebuilding it failed",
                    dir.display()
                );
            }
        }
        Ok(bins)
    }
}

/// The operator running as a child process; killed (SIGKILL) on drop.
#[derive(Debug)]
pub struct Operator {
    child: Child,
}

impl Operator {
    /// Starts the operator against `cluster` for simulated nodes, logging to `log` (appended),
    /// with `extra` flags after the defaults.
    pub fn start(
        cluster: &Cluster,
        bins: &Binaries,
        cache: &Path,
        log: &Path,
        rust_log: &str,
        extra: &[&str],
    ) -> Result<Operator> {
        let mut args: Vec<String> = [
            "--namespace",
            NS,
            "--agent-backend",
            "sim",
            "--agent-image",
            "nodewright/agent:local",
        ]
        .map(String::from)
        .to_vec();
        // Tests resync every 5 s so a missed wakeup costs them little; a caller measuring
        // the operator as deployed passes its own (the operator's default is 30 s).
        if !extra.iter().any(|a| a.starts_with("--resync-seconds")) {
            args.extend(["--resync-seconds".to_string(), "5".to_string()]);
        }
        args.push(format!("--agent-command={}", bins.agent.display()));
        args.push(format!("--insecure-registry={}", cluster.registry.host()));
        args.push(format!("--plugin-cache-dir={}", cache.display()));
        args.extend(extra.iter().map(|s| s.to_string()));
        Operator::start_with(
            &bins.operator,
            cluster.cp.kubeconfig(),
            &args,
            log,
            rust_log,
        )
    }

    /// Starts `operator` with exactly `args`, as `kubeconfig` authenticates it.
    pub fn start_with(
        operator: &Path,
        kubeconfig: &Path,
        args: &[String],
        log: &Path,
        rust_log: &str,
    ) -> Result<Operator> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let child = Command::new(operator)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", rust_log)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", operator.display()))?;
        Ok(Operator { child })
    }

    /// The operator's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it now (no chance to tidy up).
    pub fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Cluster {
    /// Routes the Service `namespace/service`'s port `port_name` to `ip:port` with an
    /// EndpointSlice, as the endpoint controller would for a ready pod there. The control
    /// plane routes Services to their endpoints (aggregator routing), so a webhook behind
    /// the Service is reached at `ip:port` and verified against the Service's DNS name.
    /// `ip` must not be loopback (the API refuses it): see [`host_ip`].
    pub async fn route_service(
        &self,
        namespace: &str,
        service: &str,
        port_name: &str,
        ip: std::net::Ipv4Addr,
        port: u16,
    ) -> Result<()> {
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{service}-e2e"), "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": service, "endpointslice.kubernetes.io/managed-by": "nodewright-localcluster"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip.to_string()], "conditions": {"ready": true}}],
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
        });
        self.apply(&slice)
            .await
            .with_context(|| format!("routing Service {namespace}/{service}"))
    }
}

/// The chart's ValidatingWebhookConfiguration `name`, reaching the operator by URL at
/// `https://127.0.0.1:<port>` (the Service route needs a non-loopback address; see
/// [`Cluster::route_service`]); the operator injects its CA bundle.
pub fn webhook_config(name: &str, port: u16) -> Value {
    let hook = |hook: &str, path: &str, resource: &str, ops: Value| {
        json!({
            "name": hook, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 15,
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{path}")},
            "rules": [{"apiGroups": ["nodewright.io"], "apiVersions": ["v1alpha1"], "operations": ops, "resources": [resource], "scope": "Cluster"}]
        })
    };
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            hook("nodewrights.nodewright.io", "/validate/nodewright", "nodewrights", json!(["CREATE", "UPDATE"])),
            hook("deploymentpolicies.nodewright.io", "/validate/deploymentpolicy", "deploymentpolicies", json!(["CREATE", "UPDATE", "DELETE"])),
            hook("plugintrustpolicies.nodewright.io", "/validate/plugintrustpolicy", "plugintrustpolicies", json!(["CREATE", "UPDATE"])),
            hook("nodewrightpreviews.nodewright.io", "/validate/nodewrightpreview", "nodewrightpreviews", json!(["CREATE", "UPDATE"])),
        ]
    })
}

impl Cluster {
    /// Registers the admission webhook as the chart does (by URL on this machine) and
    /// returns the operator flags that serve it. Admission fails closed until the operator
    /// serves and has injected its CA.
    pub async fn admission(&self, port: u16) -> Result<Vec<String>> {
        self.apply(&webhook_config("nodewright", port))
            .await
            .context("registering the admission webhook")?;
        Ok(vec![
            format!("--webhook-addr=127.0.0.1:{port}"),
            "--webhook-host=127.0.0.1".into(),
            "--webhook-config=nodewright".into(),
        ])
    }

    /// `Some(())` once every webhook [`Cluster::admission`] registered carries a CA bundle
    /// (the operator serves and injected its CA), for polling.
    pub async fn webhook_ca(&self) -> Option<()> {
        use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
        let vwc = Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
            .get("nodewright")
            .await
            .ok()?;
        vwc.webhooks
            .unwrap_or_default()
            .iter()
            .all(|w| w.client_config.ca_bundle.is_some())
            .then_some(())
    }
}

/// This machine's address on its default route: a non-loopback IPv4 an EndpointSlice may
/// name (found by "connecting" a UDP socket, which sends nothing).
pub fn host_ip() -> Result<std::net::Ipv4Addr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
    s.connect("198.51.100.1:9").context("no IPv4 default route: the Service-routing test needs a non-loopback address on this machine")?;
    match s.local_addr()?.ip() {
        std::net::IpAddr::V4(ip) if !ip.is_loopback() && !ip.is_unspecified() => Ok(ip),
        other => bail!("this machine's default-route address {other} cannot be an endpoint"),
    }
}

/// Polls `check` every 250 ms until it returns `Some`, or `None` once `timeout` has passed.
/// When a node was first seen staged for a NodeWright (with its mark) and first seen
/// cordoned, by [`watch_staging`].
#[derive(Clone, Debug, Default)]
pub struct StagingSeen {
    /// The node's `staged.<cr>` mark, when it first showed.
    pub staged: Option<(Instant, nodewright_api::node_state::Staged)>,
    /// When the node first showed unschedulable.
    pub cordoned: Option<Instant>,
}

/// Polls `nodes` every 50 ms for their staged mark of NodeWright `cr` and their cordon,
/// until the task is aborted; what it saw, per node, is in the returned map.
pub fn watch_staging(
    client: Client,
    cr: &str,
    nodes: &[&str],
) -> (
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, StagingSeen>>>,
) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
    let (key, nodes) = (
        keys::staged(cr),
        nodes.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
    );
    let watcher = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
            loop {
                for n in &nodes {
                    let Ok(node) = api.get(n).await else {
                        continue;
                    };
                    let now = Instant::now();
                    let mut seen = seen.lock().expect("the watch's map");
                    let entry: &mut StagingSeen = seen.entry(n.clone()).or_default();
                    let staged = node
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(&key))
                        .and_then(|v| v.parse().ok());
                    if entry.staged.is_none() {
                        entry.staged = staged.map(|s| (now, s));
                    }
                    if entry.cordoned.is_none()
                        && node.spec.and_then(|s| s.unschedulable) == Some(true)
                    {
                        entry.cordoned = Some(now);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    (watcher, seen)
}

/// What the payload trees of the node cache at `cache` (`/var/lib/nodewright/plugins` as
/// the machine sees it) hold: per tree, its top-level names, sorted; the trees sorted.
pub fn payload_trees(cache: &Path) -> Vec<Vec<String>> {
    let names = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|f| f.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let trees = cache.join("trees/sha256");
    let mut out: Vec<Vec<String>> = names(&trees)
        .into_iter()
        .map(|t| names(&trees.join(t)))
        .collect();
    out.sort();
    out
}

/// Pushes a test image (its config, layers and manifest) as `reference`; returns the
/// manifest's digest.
pub async fn push_image(
    registry: &Registry,
    reference: &str,
    image: &nodewright_testregistry::image::TestImage,
) -> Result<String> {
    let mut blobs = vec![nodewright_oci::Blob {
        what: "config",
        bytes: image.config.clone(),
    }];
    blobs.extend(image.layers.iter().map(|l| nodewright_oci::Blob {
        what: "layer",
        bytes: l.clone(),
    }));
    let (_, digest) = registry
        .push_manifest(
            reference,
            &blobs,
            image.manifest.clone(),
            nodewright_testregistry::image::OCI_MANIFEST,
            &|_| {},
        )
        .await?;
    Ok(digest)
}

pub async fn poll<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if start.elapsed() > timeout {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A plain HTTP/1.1 GET to a local listener (the operator's metrics port): status and body.
pub async fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((out.as_str(), ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}
