//! `nodewright-operator`: rolls NodeWright packages out to nodes.
//!
//! One level-triggered loop over the whole cluster: reflector caches of NodeWrights,
//! DeploymentPolicies, nodes, our Jobs and bound pods wake it; each pass builds the planner's
//! snapshot (with the operator's own unseen writes overlaid), calls
//! `nodewright_planner::plan`, and executes the actions. Plugins are resolved, pulled and
//! grant-checked once per CR generation before the planner may touch a node; Prometheus
//! health gates are asked in the background and held closed until they answer. With
//! `--leader-elect`, only the holder of a Lease plans; every replica serves the validating
//! admission webhook (`--webhook-addr`) and the metrics and probe endpoint (`--metrics-addr`).

// musl's allocator is slow for allocation-heavy work; see the workspace's `mimalloc`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod admission;
mod control;
mod convert;
mod crds;
mod events;
mod execute;
mod gates;
mod handover;
mod history;
mod jobs;
mod leader;
mod metrics;
mod plugins;
mod preview;
mod previews;
mod registries;
mod serve;
mod trust;
mod webhook;
mod world;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgAction, Parser};
use kube::Client;
use nodewright_api::agent::Backend;
use nodewright_planner::Settings;
use tokio::sync::Notify;

/// Flags (each also an environment variable). Boolean flags take `--flag`, `--flag=true` or
/// `--flag=false` (the chart passes values).
#[derive(Debug, Parser)]
#[command(
    name = "nodewright-operator",
    version,
    about = "Rolls NodeWright packages out to nodes, safely",
    // A flag given again replaces the earlier value: the chart's `extraArgs` come last.
    args_override_self = true,
    after_help = "`nodewright-operator apply-crds --help`: the chart's CRD upgrade hook."
)]
struct Flags {
    /// Namespace of the agent Jobs and the leader Lease.
    #[arg(long, env = "NODEWRIGHT_NAMESPACE", default_value = "nodewright")]
    namespace: String,
    /// Agent image for the Jobs.
    #[arg(long, env = "NODEWRIGHT_AGENT_IMAGE")]
    agent_image: String,
    /// The agent's command inside that image.
    #[arg(
        long,
        env = "NODEWRIGHT_AGENT_COMMAND",
        default_value = "/usr/local/bin/nodewright-agent"
    )]
    agent_command: String,
    /// Host-ops backend the agents use: `linux` (real nodes) or `sim` (simulated nodes).
    #[arg(
        long,
        env = "NODEWRIGHT_AGENT_BACKEND",
        value_enum,
        default_value = "linux"
    )]
    agent_backend: Backend,
    /// Service account of the agent pods.
    #[arg(long, env = "NODEWRIGHT_AGENT_SERVICE_ACCOUNT")]
    agent_service_account: Option<String>,
    /// Retries of a genuinely failed package stage.
    #[arg(long, env = "NODEWRIGHT_JOB_BACKOFF_LIMIT", default_value_t = 3)]
    job_backoff_limit: i32,
    /// Per-attempt deadline of package stages (whole stage for interrupts): `90s`, `1h`,
    /// or seconds; 0 = none.
    #[arg(long, env = "NODEWRIGHT_JOB_STAGE_TIMEOUT", default_value = "1h", value_parser = seconds)]
    job_stage_timeout: u64,
    /// `ttlSecondsAfterFinished` of the Jobs.
    #[arg(long, env = "NODEWRIGHT_JOB_TTL_SECONDS", default_value_t = 3600)]
    job_ttl_seconds_after_finished: i32,
    /// Where the operator caches pulled plugins and compiled code for grant checks.
    #[arg(
        long,
        env = "NODEWRIGHT_PLUGIN_CACHE_DIR",
        default_value = "/var/cache/nodewright-operator"
    )]
    plugin_cache_dir: PathBuf,
    /// Highest `sandbox.memory` a package may ask for.
    #[arg(long, env = "NODEWRIGHT_SANDBOX_MAX_MEMORY", default_value = "1Gi", value_parser = bytes)]
    sandbox_max_memory: u64,
    /// Highest `sandbox.writeBytes` a package may ask for.
    #[arg(long, env = "NODEWRIGHT_SANDBOX_MAX_WRITE_BYTES", default_value = "4Gi", value_parser = bytes)]
    sandbox_max_write_bytes: u64,
    /// Highest `sandbox.writeFiles` a package may ask for.
    #[arg(
        long,
        env = "NODEWRIGHT_SANDBOX_MAX_WRITE_FILES",
        default_value_t = 100_000
    )]
    sandbox_max_write_files: u32,
    /// Free space every plugin write must leave on the node's filesystem.
    #[arg(long, env = "NODEWRIGHT_AGENT_MIN_FREE_DISK", default_value = "256Mi", value_parser = bytes)]
    agent_min_free_disk: u64,
    /// Most the node cache of plugins and payloads may hold on each node (unset: no quota).
    /// A payload that would take it past this, after what no package on the node refers to
    /// is collected, is refused and the node reads erroring.
    #[arg(long, env = "NODEWRIGHT_NODE_CACHE_QUOTA", value_parser = bytes)]
    node_cache_quota: Option<u64>,
    /// Registries reached over plain HTTP (repeatable). Nothing else ever is.
    #[arg(
        long = "insecure-registry",
        env = "NODEWRIGHT_INSECURE_REGISTRIES",
        value_delimiter = ','
    )]
    insecure_registries: Vec<String>,
    /// A `kubernetes.io/dockerconfigjson` Secret in the operator's namespace holding logins
    /// for every NodeWright's plugin pulls (repeatable; asked after a NodeWright's own
    /// `spec.imagePullSecret`). The operator reads it; agent pods mount it.
    #[arg(
        long = "registry-secret",
        env = "NODEWRIGHT_REGISTRY_SECRETS",
        value_delimiter = ','
    )]
    registry_secrets: Vec<String>,
    /// A CA bundle for one registry with an internal CA, from a ConfigMap in the operator's
    /// namespace: `HOST[:PORT]=CONFIGMAP[/KEY]` (key default `ca.crt`; repeatable).
    #[arg(
        long = "registry-ca",
        env = "NODEWRIGHT_REGISTRY_CAS",
        value_delimiter = ','
    )]
    registry_cas: Vec<registries::CaRef>,
    /// A Secret the kubelet pulls the agent image with (repeatable): every agent pod's
    /// `imagePullSecrets`, beside its NodeWright's `spec.imagePullSecret`.
    #[arg(
        long = "image-pull-secret",
        env = "NODEWRIGHT_IMAGE_PULL_SECRETS",
        value_delimiter = ','
    )]
    image_pull_secrets: Vec<String>,
    /// Reset a node's packages when it reboots outside nodewright's own interrupts.
    #[arg(long, env = "NODEWRIGHT_REAPPLY_ON_REBOOT", action = ArgAction::Set, num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    reapply_on_reboot: bool,
    /// Units a `restartAllServices` interrupt restarts: `.service` units only, never one
    /// that powers off or reboots (that is interrupt type reboot, with the power grant).
    #[arg(
        long = "restart-all-services",
        env = "NODEWRIGHT_RESTART_ALL_SERVICES",
        value_delimiter = ',',
        default_value = "procps.service",
        value_parser = |s: &str| nodewright_api::hostargs::ServiceUnit::parse(s).map(|_| s.to_string())
    )]
    restart_all_services: Vec<String>,
    /// Plan only while holding the Lease.
    #[arg(long, env = "NODEWRIGHT_LEADER_ELECT", action = ArgAction::Set, num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    leader_elect: bool,
    /// Lease name.
    #[arg(
        long,
        env = "NODEWRIGHT_LEASE_NAME",
        default_value = "nodewright-operator"
    )]
    lease_name: String,
    /// The label selector of this operator's replicas (in --namespace): a rollout does not
    /// reboot the node of the last ready one while another is still starting elsewhere.
    #[arg(long, env = "NODEWRIGHT_REPLICA_SELECTOR")]
    replica_selector: Option<String>,
    /// Identity in the Lease (default: the hostname and pid).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// This replica's pod (the chart passes it): with the webhook on, a leader fenced for its
    /// node's reboot ends only once the webhook Service (--webhook-service) no longer
    /// routes to this pod.
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// The node this replica runs on (the chart passes the pod's `spec.nodeName`). While a
    /// rollout fences it before rebooting it (`nodewright.io/fence-operator.<cr>`), this
    /// replica reports not ready, so the webhook Service stops sending it requests, and
    /// does not lead (a leader hands over).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// How often a Prometheus health gate is asked again, seconds.
    #[arg(long, env = "NODEWRIGHT_HEALTH_GATE_INTERVAL", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    health_gate_interval: u64,
    /// Longest wait between passes when nothing changes, seconds.
    #[arg(long, env = "NODEWRIGHT_RESYNC_SECONDS", default_value_t = 30)]
    resync_seconds: u64,
    /// Most plan Jobs every NodeWrightPreview together runs at once.
    #[arg(long, env = "NODEWRIGHT_PREVIEW_JOBS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    preview_jobs: u64,
    /// Sustained API writes per second (Job creates and deletes, node patches, evictions,
    /// status writes, events): a large rollout waits for the limit rather than flooding
    /// the apiserver.
    #[arg(long, env = "NODEWRIGHT_API_QPS", default_value_t = 100)]
    api_qps: u32,
    /// API writes allowed at once above `--api-qps`.
    #[arg(long, env = "NODEWRIGHT_API_BURST", default_value_t = 200)]
    api_burst: u32,
    /// Serve `/metrics`, `/healthz` and `/readyz` over plain HTTP here (off when unset).
    #[arg(long, env = "NODEWRIGHT_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// Serve the validating admission webhook over TLS here (off when unset).
    #[arg(long, env = "NODEWRIGHT_WEBHOOK_ADDR")]
    webhook_addr: Option<SocketAddr>,
    /// The ValidatingWebhookConfiguration whose caBundle the operator keeps current.
    #[arg(long, env = "NODEWRIGHT_WEBHOOK_CONFIG", default_value = "nodewright")]
    webhook_config: String,
    /// The Service in front of the webhook: its names go into the serving certificate.
    #[arg(
        long,
        env = "NODEWRIGHT_WEBHOOK_SERVICE",
        default_value = "nodewright-webhook"
    )]
    webhook_service: String,
    /// The Secret (in --namespace) holding the self-managed CA and serving certificate.
    #[arg(
        long,
        env = "NODEWRIGHT_WEBHOOK_CERT_SECRET",
        default_value = "nodewright-webhook-cert"
    )]
    webhook_cert_secret: String,
    /// Extra DNS names or IP addresses for the serving certificate (repeatable), for a
    /// webhook reached by URL rather than through the Service.
    #[arg(
        long = "webhook-host",
        env = "NODEWRIGHT_WEBHOOK_HOSTS",
        value_delimiter = ','
    )]
    webhook_hosts: Vec<String>,
}

fn seconds(s: &str) -> Result<u64, String> {
    nodewright_api::units::parse_duration(s).map(|d| d.round() as u64)
}

fn bytes(s: &str) -> Result<u64, String> {
    nodewright_api::units::parse_quantity(s).map(|q| q.round() as u64)
}

fn main() -> anyhow::Result<()> {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "apply-crds")
    {
        // The chart's pre-upgrade hook, from the same image.
        let args = crds::ApplyCrds::parse_from(std::env::args_os().skip(1));
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(crds::run(args));
    }
    let flags = Flags::parse();
    // Before any thread (see nodewright_oci::prepare_roots).
    nodewright_oci::prepare_roots(&flags.plugin_cache_dir.join("tls"))
        .map_err(|e| anyhow::anyhow!("--plugin-cache-dir: {e}"))?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(flags))
}

/// The startup, in the order it must happen: client, metrics, caches, webhook, leader
/// election, then the control loop.
async fn run(flags: Flags) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let client = client().await?;
    let metrics = Arc::new(metrics::Metrics::new());
    if let Some(addr) = flags.metrics_addr {
        serve_metrics(addr, &metrics).await?;
    }

    let notify = Arc::new(Notify::new());
    let world = world::World::start(
        client.clone(),
        &flags.namespace,
        flags.replica_selector.as_deref(),
        notify.clone(),
    )
    .await?;
    if let Some(node) = flags.node_name.clone() {
        watch_fence(world.clone(), node, metrics.clone());
    }
    let trust = trust::Trust::new(world.trust_policies());
    if let Some(addr) = flags.webhook_addr {
        start_webhook(
            &flags,
            addr,
            client.clone(),
            world.clone(),
            metrics.clone(),
            trust.clone(),
        )
        .await?;
    }
    metrics.set_ready();

    // Standby replicas serve the webhook and probes above while they wait here; a fenced
    // one waits for its node's reboot to be over first.
    while metrics.is_fenced() {
        tokio::time::sleep(FENCE_CHECK).await;
    }
    let lease = lead(&flags, &client).await?;
    metrics.leader.set(1);
    let gates = gates::Gates::new(
        client.clone(),
        &flags.namespace,
        Duration::from_secs(flags.health_gate_interval),
        notify.clone(),
    );
    let plugins = plugins::Plugins::new(
        client.clone(),
        flags.plugin_cache_dir.clone(),
        flags.registry_access(),
        flags.ceilings(),
        trust,
        notify.clone(),
    )?;
    let limits = execute::WriteLimits {
        qps: flags.api_qps,
        burst: flags.api_burst,
    };
    let executor = execute::Executor::new(
        client.clone(),
        flags.job_config(),
        world.clone(),
        "nodewright-operator",
        limits,
        metrics.api_requests.clone(),
    );
    tracing::info!(namespace = %flags.namespace, "operator started");
    // Previews run beside the rollout's loop, never inside a pass of it.
    // The stage history an earlier leader kept, and this one's kept from now on.
    let store = history::store::Store::new(client.clone(), &flags.namespace, &flags.lease_name);
    let history = Arc::new(store.open().await);
    tokio::spawn(store.keep(history.clone()));
    tokio::spawn(
        previews::Previews {
            client: client.clone(),
            jobs: flags.job_config(),
            limit: flags.preview_jobs as usize,
            history: history.clone(),
            writes: metrics.preview_writes.clone(),
        }
        .run(world.clone(), plugins.clone(), flags.settings()),
    );
    control::Loop {
        admission: admission::Admission::new(client.clone(), &flags.job_config()),
        world,
        plugins,
        gates,
        executor,
        metrics,
        settings: flags.settings(),
        lease,
        // Without the webhook no Service routes to a replica.
        routing: flags
            .webhook_addr
            .and(flags.pod_name.as_deref())
            .map(|pod| {
                handover::Routing::new(
                    client.clone(),
                    &flags.namespace,
                    &flags.webhook_service,
                    pod,
                )
            }),
        notify,
        resync: Duration::from_secs(flags.resync_seconds),
        history,
    }
    .run()
    .await
}

/// How often a replica looks at its node's fence marks.
const FENCE_CHECK: Duration = Duration::from_secs(1);

/// Keeps the metrics' fenced flag to what `node`'s annotations say (from the node cache).
fn watch_fence(world: world::World, node: String, metrics: Arc<metrics::Metrics>) {
    // Read once now (the caches are synced): a replica started on a fenced node must not
    // take the lease before the first look.
    metrics.set_fenced(world.fences_operator(&node));
    tokio::spawn(async move {
        loop {
            let fenced = world.fences_operator(&node);
            if fenced != metrics.is_fenced() {
                tracing::info!(%node, fenced, "this replica's node fence changed");
                metrics.set_fenced(fenced);
            }
            tokio::time::sleep(FENCE_CHECK).await;
        }
    });
}

/// With `--leader-elect`, the lease, once this replica holds it.
async fn lead(flags: &Flags, client: &Client) -> anyhow::Result<Option<leader::Leader>> {
    if !flags.leader_elect {
        return Ok(None);
    }
    let lease = leader::Leader::new(
        client.clone(),
        &flags.namespace,
        &flags.lease_name,
        &flags.identity(),
        control::LEASE,
    );
    lease.acquire().await?;
    Ok(Some(lease))
}

/// The API client, from the pod's service account or the kubeconfig.
async fn client() -> anyhow::Result<Client> {
    let mut config = kube::Config::infer().await?;
    // A PodDisruptionBudget refusal is a 429; retrying it inside the client would block the
    // whole pass for minutes. The planner retries it, throttled.
    config.default_retry = false;
    Ok(Client::try_from(config)?)
}

impl Flags {
    /// The ceilings on every package's sandbox bounds.
    fn ceilings(&self) -> nodewright_api::limits::Ceilings {
        nodewright_api::limits::Ceilings {
            memory: self.sandbox_max_memory,
            write_bytes: self.sandbox_max_write_bytes,
            write_files: self.sandbox_max_write_files,
        }
    }

    /// How the operator and its agents reach plugin registries.
    fn registry_access(&self) -> registries::RegistryAccess {
        registries::RegistryAccess {
            namespace: self.namespace.clone(),
            insecure: self.insecure_registries.clone(),
            secrets: self.registry_secrets.clone(),
            cas: self.registry_cas.clone(),
            image_pull_secrets: self.image_pull_secrets.clone(),
        }
    }

    /// Where and how the agent Jobs run.
    fn job_config(&self) -> jobs::JobConfig {
        jobs::JobConfig {
            namespace: self.namespace.clone(),
            image: self.agent_image.clone(),
            command: self.agent_command.clone(),
            backend: self.agent_backend,
            ttl_seconds: self.job_ttl_seconds_after_finished,
            registry: self.registry_access(),
            service_account: self.agent_service_account.clone(),
            min_free_bytes: self.agent_min_free_disk,
            cache_quota: self.node_cache_quota,
        }
    }

    /// The planner's settings.
    fn settings(&self) -> Settings {
        Settings {
            namespace: self.namespace.clone(),
            backoff_limit: self.job_backoff_limit,
            stage_timeout: self.job_stage_timeout,
            reapply_on_reboot: self.reapply_on_reboot,
            restart_all_services: self.restart_all_services.clone(),
            ..Settings::default()
        }
    }

    /// Who this replica is to the leader Lease: `--identity`, else the pod's name and the
    /// process id.
    fn identity(&self) -> String {
        self.identity.clone().unwrap_or_else(|| {
            format!(
                "{}-{}",
                std::env::var("HOSTNAME").unwrap_or_else(|_| "operator".into()),
                std::process::id()
            )
        })
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr`, in the background.
async fn serve_metrics(addr: SocketAddr, metrics: &Arc<metrics::Metrics>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--metrics-addr {addr}: {e}"))?;
    tracing::info!(%addr, "serving metrics and probes");
    let metrics = metrics.clone();
    tokio::spawn(serve::serve(
        listener,
        None,
        None,
        move |_, path: String, _| {
            let metrics = metrics.clone();
            async move { probe_or_metrics(&metrics, &path) }
        },
    ));
    Ok(())
}

fn probe_or_metrics(metrics: &metrics::Metrics, path: &str) -> serve::Reply {
    use hyper::StatusCode;
    match path {
        "/metrics" => serve::Reply {
            status: StatusCode::OK,
            content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body: metrics.encode().into_bytes(),
        },
        "/healthz" => serve::Reply::text(StatusCode::OK, "ok"),
        "/readyz" if metrics.is_fenced() => serve::Reply::text(
            StatusCode::SERVICE_UNAVAILABLE,
            "fenced: a rollout reboots this replica's node once it is out of the Service",
        ),
        "/readyz" if metrics.is_ready() => serve::Reply::text(StatusCode::OK, "ok"),
        "/readyz" => serve::Reply::text(StatusCode::SERVICE_UNAVAILABLE, "caches not synced yet"),
        _ => serve::Reply::text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz",
        ),
    }
}

/// Makes or loads the serving certificate, injects its CA, and serves admission reviews on
/// `addr`. Returns once the listener is bound and a certificate is loaded.
async fn start_webhook(
    flags: &Flags,
    addr: SocketAddr,
    client: Client,
    world: world::World,
    metrics: Arc<metrics::Metrics>,
    trust: trust::Trust,
) -> anyhow::Result<()> {
    use hyper::{Method, StatusCode};
    let cfg = webhook::cert::CertConfig {
        namespace: flags.namespace.clone(),
        secret: flags.webhook_cert_secret.clone(),
        webhook_config: Some(flags.webhook_config.clone()),
        hosts: webhook::cert::CertConfig::hosts_for(
            &flags.webhook_service,
            &flags.namespace,
            &flags.webhook_hosts,
        ),
    };
    let material = webhook::cert::ensure(&client, &cfg).await?;
    let resolver = webhook::cert::Resolver::new(&material, &cfg.secret)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--webhook-addr {addr}: {e}"))?;
    tracing::info!(%addr, secret = %cfg.secret, "serving the admission webhook");
    // While fenced, the replica drains its webhook connections (see `serve`).
    let drain = Some(metrics.fence_changes());
    let admission = webhook::Admission::new(
        client.clone(),
        world,
        metrics,
        trust,
        flags.registry_access(),
        flags.settings(),
    );
    tokio::spawn(serve::serve(
        listener,
        Some(serve::tls_acceptor(resolver.clone())),
        drain,
        move |method, path: String, body| {
            let admission = admission.clone();
            async move {
                match (method, path.as_str()) {
                    (
                        Method::POST,
                        "/validate/nodewright"
                        | "/validate/deploymentpolicy"
                        | "/validate/plugintrustpolicy"
                        | "/validate/nodewrightpreview",
                    ) => {
                        let review = admission.review(&body).await;
                        match serde_json::to_vec(&review) {
                            Ok(body) => serve::Reply {
                                status: StatusCode::OK,
                                content_type: "application/json",
                                body,
                            },
                            Err(e) => {
                                serve::Reply::text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
                            }
                        }
                    }
                    (_, "/healthz") => serve::Reply::text(StatusCode::OK, "ok"),
                    _ => serve::Reply::text(
                        StatusCode::NOT_FOUND,
                        "not found: POST /validate/nodewright, /validate/deploymentpolicy, /validate/plugintrustpolicy or /validate/nodewrightpreview",
                    ),
                }
            }
        },
    ));
    tokio::spawn(webhook::cert::maintain(
        client,
        cfg,
        resolver,
        material,
        Duration::from_secs(30),
    ));
    Ok(())
}
