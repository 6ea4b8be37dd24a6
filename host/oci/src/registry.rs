//! Talking to registries: resolve, fetch by digest, push.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use nodewright_api::pinned::PinnedRef;
use oci_client::Reference;
use oci_client::client::{Certificate, CertificateEncoding};
#[cfg(feature = "push")]
use oci_client::{
    Client,
    client::{ClientConfig, ClientProtocol},
};

use crate::artifact::{self, Descriptor, Manifest};
use crate::auth::Credentials;
use crate::bounded::{Body, Credential};
use crate::digest::{parse_digest, sha256_digest};
use crate::error::{Error, Result};
#[cfg(feature = "push")]
use crate::payload::{PAYLOAD_LAYER, TITLE};
#[cfg(feature = "push")]
use crate::progress::Progress;
#[cfg(feature = "push")]
use nodewright_api::payload::PayloadName;

/// The default bound on one payload layer: 8 GiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: u64 = 8 << 30;

/// Bounds on what one pull may cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PullLimits {
    /// Largest layer accepted: checked against the manifest's declared size before
    /// anything is allocated, and against the bytes as they stream in.
    pub max_blob_bytes: u64,
    /// Largest payload layer accepted (streamed to disk, never held in memory), checked
    /// the same way.
    pub max_payload_bytes: u64,
    /// Wall-clock bound on a whole pull or resolve, so a registry that stalls or trickles
    /// cannot hold a caller forever.
    pub deadline: Duration,
    /// Bytes that must stay free on the node cache's filesystem once a payload's layer and
    /// its unpacked tree are there; a payload that would leave less is refused before a
    /// byte is fetched.
    pub min_free_bytes: u64,
    /// Most the node cache may hold, in bytes (none: no quota); a payload that would take
    /// it past this is refused before a byte is fetched.
    pub cache_quota: Option<u64>,
    /// Bytes of a plugin payload's download between the checkpoints a cut-off pull resumes
    /// from (each taken at the next boundary between the payload's files, after a sync).
    pub checkpoint_every: u64,
}

impl Default for PullLimits {
    /// 100 MiB (the engine's component size limit), 8 GiB per payload, 5 minutes, 256 MiB
    /// left free (the sandbox's disk floor), no cache quota, a checkpoint every 256 MiB.
    fn default() -> Self {
        PullLimits {
            max_blob_bytes: 100 << 20,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            deadline: Duration::from_secs(300),
            min_free_bytes: nodewright_api::limits::DEFAULT_MIN_FREE_BYTES,
            cache_quota: None,
            checkpoint_every: crate::resume::EVERY,
        }
    }
}

/// How to reach registries.
#[derive(Clone, Debug, Default)]
pub struct RegistryConfig {
    /// Size and time bounds of every pull.
    pub limits: PullLimits,
    /// Registries (`host[:port]`) that may be reached over plain HTTP. Nothing else ever
    /// is: there is no fallback from HTTPS to HTTP.
    pub insecure: Vec<String>,
    /// Extra CA bundles (PEM) trusted for one registry each, keyed by `host[:port]`.
    pub ca_bundles: BTreeMap<String, Pem>,
    /// Credentials.
    pub credentials: Credentials,
}

/// PEM text: a file read when a client is built, or text already in hand (a ConfigMap's
/// key, read through the API).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pem {
    /// A file.
    File(PathBuf),
    /// Text; `origin` names it in errors (e.g. `configmap nodewright/corp-ca key ca.crt`).
    Text {
        /// Where the text came from.
        origin: String,
        /// The PEM.
        pem: String,
    },
}

impl From<PathBuf> for Pem {
    fn from(path: PathBuf) -> Self {
        Pem::File(path)
    }
}

impl Pem {
    fn read(&self) -> Result<Vec<u8>> {
        match self {
            Pem::File(path) => std::fs::read(path).map_err(|e| Error::Config {
                path: path.display().to_string(),
                reason: format!("cannot read CA bundle: {e}"),
            }),
            Pem::Text { pem, .. } => Ok(pem.clone().into_bytes()),
        }
    }

    fn origin(&self) -> String {
        match self {
            Pem::File(path) => path.display().to_string(),
            Pem::Text { origin, .. } => origin.clone(),
        }
    }
}

/// A registry client. Clients are built once per registry host.
pub struct Registry {
    config: RegistryConfig,
    clients: Mutex<HashMap<String, Clients>>,
    /// Pull tokens by (registry, repository), while they live.
    tokens: Mutex<HashMap<(String, String), Credential>>,
}

/// The clients for one registry: a plain HTTP client for the requests whose bodies must
/// be bounded ([`crate::bounded`]: every pull), and, for pushes, oci-client's with the same
/// TLS settings.
#[derive(Clone)]
pub(crate) struct Clients {
    #[cfg(feature = "push")]
    pub(crate) oci: Client,
    pub(crate) http: reqwest::Client,
    pub(crate) scheme: &'static str,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// What resolving a tag accepts: single manifests and indexes, OCI's and Docker's (what
/// `docker`, `crane` and oci-client ask for).
pub(crate) const RESOLVE_TYPES: &[&str] = &[
    artifact::OCI_MANIFEST,
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// Parses a reference, naming it in the error.
pub(crate) fn parse_reference(reference: &str) -> Result<Reference> {
    Reference::from_str(reference).map_err(|e| Error::InvalidReference {
        reference: reference.into(),
        reason: e.to_string(),
    })
}

impl Registry {
    /// A registry client with `config`.
    pub fn new(config: RegistryConfig) -> Self {
        Registry {
            config,
            clients: Mutex::default(),
            tokens: Mutex::default(),
        }
    }

    pub(crate) fn tokens(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, String), Credential>> {
        self.tokens.lock().expect("token cache lock")
    }

    pub(crate) fn clients(&self, registry: &str) -> Result<Clients> {
        if let Some(c) = self
            .clients
            .lock()
            .expect("client cache lock")
            .get(registry)
        {
            return Ok(c.clone());
        }
        let mut extra = Vec::new();
        if let Some(pem) = self.config.ca_bundles.get(registry) {
            let data = pem.read()?;
            use rustls_pki_types::pem::PemObject as _;
            if rustls_pki_types::CertificateDer::pem_slice_iter(&data)
                .next()
                .is_none_or(|c| c.is_err())
            {
                return Err(Error::Config {
                    path: pem.origin(),
                    reason: format!("the CA bundle for {registry} holds no PEM certificate"),
                });
            }
            extra.push(Certificate {
                encoding: CertificateEncoding::Pem,
                data,
            });
        }
        let plain = self.config.insecure.iter().any(|h| h == registry);
        if !plain && extra.is_empty() && crate::tls::system_roots() == 0 {
            return Err(crate::tls::missing_roots(registry));
        }
        let setup_failed = |e: String| Error::Config {
            path: registry.to_string(),
            reason: format!("cannot set up a client for this registry: {e}"),
        };
        let mut http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT);
        if !extra.is_empty() {
            let certs = extra
                .iter()
                .map(|c| reqwest::Certificate::from_pem(&c.data))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| setup_failed(e.to_string()))?;
            http = http.tls_certs_merge(certs);
        }
        #[cfg(feature = "push")]
        let oci = Client::try_from(ClientConfig {
            protocol: if plain {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            extra_root_certificates: extra,
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            ..Default::default()
        })
        .map_err(|e| setup_failed(e.to_string()))?;
        let clients = Clients {
            #[cfg(feature = "push")]
            oci,
            http: http.build().map_err(|e| setup_failed(e.to_string()))?,
            scheme: if plain { "http" } else { "https" },
        };
        self.clients
            .lock()
            .expect("client cache lock")
            .insert(registry.to_string(), clients.clone());
        Ok(clients)
    }

    /// The credentials for `registry`.
    pub(crate) fn auth_for(&self, registry: &str) -> Result<oci_client::secrets::RegistryAuth> {
        self.config.credentials.for_registry(registry)
    }

    /// The pull bounds.
    pub fn limits(&self) -> PullLimits {
        self.config.limits
    }

    /// Runs `work` within the pull deadline.
    pub(crate) async fn bounded<T>(
        &self,
        reference: &str,
        work: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let deadline = self.config.limits.deadline;
        tokio::time::timeout(deadline, work)
            .await
            .unwrap_or_else(|_| {
                Err(Error::Deadline {
                    reference: reference.into(),
                    seconds: deadline.as_secs_f64(),
                })
            })
    }

    /// `reference` pinned: as it is when it names a digest, else its tag resolved (once,
    /// within the pull deadline).
    pub async fn pinned(&self, reference: &str) -> Result<PinnedRef> {
        if reference.contains('@') {
            return pinned_ref(reference);
        }
        let digest = self.resolve(reference).await?;
        pin(reference, &digest)
    }

    /// Resolves `reference` (tag or digest) to the manifest digest, once, within the pull
    /// deadline.
    pub async fn resolve(&self, reference: &str) -> Result<String> {
        self.bounded(reference, self.resolve_unbounded(reference))
            .await
    }

    async fn resolve_unbounded(&self, reference: &str) -> Result<String> {
        let r = parse_reference(reference)?;
        if let Some(d) = r.digest() {
            return Ok(d.to_string());
        }
        // The digest pinned is the hash of the bytes read (bounded), never a header.
        let raw = self.manifest_body(reference, &r, RESOLVE_TYPES).await?;
        Ok(sha256_digest(&raw))
    }

    /// Fetches the manifest a *tag* names, raw, accepting `media_types`; `None` when the tag
    /// does not exist. For content found by convention (a signature tag), within the pull
    /// deadline; nothing is trusted about it but what the caller verifies.
    pub async fn fetch_tagged(
        &self,
        reference: &str,
        media_types: &[&str],
    ) -> Result<Option<Vec<u8>>> {
        self.bounded(reference, async {
            let r = parse_reference(reference)?;
            match self.manifest_body(reference, &r, media_types).await {
                Ok(raw) => Ok(Some(raw)),
                Err(Error::NotFound { .. }) => Ok(None),
                Err(other) => Err(other),
            }
        })
        .await
    }

    /// Fetches the manifest of a pinned reference and checks it hashes to the digest.
    /// Returns the raw bytes (for the cache) and the parsed manifest.
    pub async fn fetch_manifest(&self, pinned: &str) -> Result<(Vec<u8>, Manifest)> {
        let r = parse_reference(pinned)?;
        let Some(want) = r.digest().map(str::to_string) else {
            return Err(Error::NotPinned {
                reference: pinned.into(),
            });
        };
        let raw = self
            .manifest_body(pinned, &r, &[artifact::OCI_MANIFEST])
            .await?;
        let actual = sha256_digest(&raw);
        if actual != want {
            return Err(Error::DigestMismatch {
                reference: pinned.into(),
                what: "manifest".into(),
                expected: want,
                actual,
            });
        }
        let manifest = parse_manifest(pinned, &raw)?;
        Ok((raw, manifest))
    }

    /// Fetches a blob and checks its size and digest. The declared size is checked against
    /// the limit before anything is allocated, and the stream is cut off as soon as it
    /// passes the declared size.
    pub async fn fetch_blob(&self, pinned: &str, descriptor: &Descriptor) -> Result<Vec<u8>> {
        self.fetch_blob_within(pinned, descriptor, self.config.limits.max_blob_bytes)
            .await
    }

    /// [`Registry::fetch_blob`] with a tighter bound than the pull limit (a signature's
    /// payload); the smaller of the two applies.
    pub async fn fetch_blob_within(
        &self,
        pinned: &str,
        descriptor: &Descriptor,
        limit: u64,
    ) -> Result<Vec<u8>> {
        let limit = limit.min(self.config.limits.max_blob_bytes);
        let declared = declared_size(pinned, descriptor, limit)?;
        let r = parse_reference(pinned)?;
        // Read to at most the declared size: a body past it is refused as it arrives.
        let body = Body {
            what: "layer",
            limit: declared,
        };
        let path = format!("blobs/{}", descriptor.digest);
        let out = self.get_within(pinned, &r, &path, None, body).await?;
        let actual = sha256_digest(&out);
        if actual != descriptor.digest {
            return Err(Error::DigestMismatch {
                reference: pinned.into(),
                what: "layer".into(),
                expected: descriptor.digest.clone(),
                actual,
            });
        }
        Ok(out)
    }
}

/// A layer's declared size, refused before anything is fetched when it is negative or past
/// `limit`, or when its digest is not sha256.
impl Registry {
    /// A payload layer's declared size, within the payload limit and with a sha256 digest:
    /// what staging checks of every layer before it fetches any.
    pub(crate) fn payload_size(&self, pinned: &str, descriptor: &Descriptor) -> Result<u64> {
        declared_size(pinned, descriptor, self.config.limits.max_payload_bytes)
    }
}

fn declared_size(pinned: &str, descriptor: &Descriptor, limit: u64) -> Result<u64> {
    let declared = u64::try_from(descriptor.size).map_err(|_| Error::InvalidArtifact {
        reference: pinned.into(),
        reason: format!("layer size {} is negative", descriptor.size),
    })?;
    if declared > limit {
        return Err(Error::TooLarge {
            reference: pinned.into(),
            what: "layer".into(),
            size: declared,
            limit,
        });
    }
    if parse_digest(&descriptor.digest).is_none() {
        return Err(Error::InvalidArtifact {
            reference: pinned.into(),
            reason: format!("layer digest {:?} is not sha256", descriptor.digest),
        });
    }
    Ok(declared)
}

/// `registry/repo@digest` for the repository `reference` names (its tag is dropped).
pub fn pin(reference: &str, digest: &str) -> Result<PinnedRef> {
    let r = parse_reference(reference)?;
    pinned_ref(&format!("{}/{}@{digest}", r.registry(), r.repository()))
}

/// `text` as a [`PinnedRef`], refused as an invalid reference naming it.
fn pinned_ref(text: &str) -> Result<PinnedRef> {
    PinnedRef::parse(text).map_err(|e| Error::InvalidReference {
        reference: e.reference,
        reason: e.reason,
    })
}

/// Parses manifest JSON, naming the reference on failure.
pub(crate) fn parse_manifest(reference: &str, raw: &[u8]) -> Result<Manifest> {
    serde_json::from_slice(raw).map_err(|e| Error::InvalidArtifact {
        reference: reference.into(),
        reason: format!("manifest is not an OCI image manifest: {e}"),
    })
}

/// The result of a push.
#[cfg(feature = "push")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pushed {
    /// `registry/repo@sha256:...`: what to put in a NodeWright spec.
    pub pinned: PinnedRef,
    /// Manifest digest.
    pub manifest_digest: String,
    /// Layer (component) digest.
    pub layer_digest: String,
}

/// A payload to push: its name and its tar on disk, with the digest and size
/// [`crate::payload::pack_to`] computed while writing it.
#[cfg(feature = "push")]
#[derive(Clone, Debug)]
pub struct PayloadFile {
    /// The payload's name.
    pub name: PayloadName,
    /// The tar.
    pub path: PathBuf,
    /// Its digest.
    pub digest: String,
    /// Its size.
    pub size: u64,
}

#[cfg(feature = "push")]
impl PayloadFile {
    /// Packs `source` (a file or a directory) as payload `name` into the tar `dest`.
    pub fn pack(
        name: PayloadName,
        source: &std::path::Path,
        dest: PathBuf,
    ) -> std::result::Result<Self, crate::payload::Unsafe> {
        let (digest, size) = crate::payload::pack_to(&name, source, &dest)?;
        Ok(PayloadFile {
            name,
            path: dest,
            digest,
            size,
        })
    }
}

/// A blob to push: its media type and bytes.
#[cfg(feature = "push")]
#[derive(Clone, Debug)]
pub struct Blob {
    /// Media type (for progress output; the manifest carries it).
    pub what: &'static str,
    /// Content.
    pub bytes: Vec<u8>,
}

#[cfg(feature = "push")]
impl Registry {
    /// Pushes `blobs` (config and layers, any order), then `manifest` (a JSON manifest or
    /// index of `media_type` naming them) to `reference`: `repo:tag`, or `repo@digest` where
    /// the digest is the manifest's own (an index's platform images). Returns the pinned
    /// reference. Used for plugins ([`Registry::push`]) and for container images alike.
    pub async fn push_manifest(
        &self,
        reference: &str,
        blobs: &[Blob],
        manifest: Vec<u8>,
        media_type: &str,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<(String, String)> {
        let r = parse_reference(reference)?;
        let manifest_digest = sha256_digest(&manifest);
        let fits = match (r.tag(), r.digest()) {
            (Some(_), None) => true,
            (None, Some(digest)) => digest == manifest_digest,
            _ => false,
        };
        if !fits {
            return Err(Error::InvalidReference {
                reference: reference.into(),
                reason: format!(
                    "push needs a tag (repo:tag) or the manifest's own digest (repo@{manifest_digest}), not both"
                ),
            });
        }
        let client = self.push_client(reference, &r).await?;
        for blob in blobs {
            let digest = sha256_digest(&blob.bytes);
            progress(Progress::Uploading {
                what: blob.what,
                digest: digest.clone(),
                bytes: blob.bytes.len() as u64,
            });
            client
                .push_blob(&r, blob.bytes.clone(), &digest)
                .await
                .map_err(|e| Error::from_oci(reference, e))?;
        }
        progress(Progress::Uploading {
            what: "manifest",
            digest: manifest_digest.clone(),
            bytes: manifest.len() as u64,
        });
        let header = media_type.parse().map_err(|_| Error::InvalidArtifact {
            reference: reference.into(),
            reason: format!("media type {media_type:?}"),
        })?;
        client
            .push_manifest_raw(&r, manifest, header)
            .await
            .map_err(|e| Error::from_oci(reference, e))?;
        Ok((
            format!("{}/{}@{manifest_digest}", r.registry(), r.repository()),
            manifest_digest,
        ))
    }

    /// The push client for `r`, authenticated for pushing.
    async fn push_client(&self, reference: &str, r: &Reference) -> Result<Client> {
        let auth = self.config.credentials.for_registry(r.resolve_registry())?;
        let client = self.clients(r.resolve_registry())?.oci;
        client
            .auth(r, &auth, oci_client::RegistryOperation::Push)
            .await
            .map_err(|e| Error::from_oci(reference, e))?;
        Ok(client)
    }

    /// Streams payload tars from disk to `reference`'s repository, a few MiB at a time.
    async fn push_payloads(
        &self,
        reference: &str,
        payloads: &[PayloadFile],
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<()> {
        if payloads.is_empty() {
            return Ok(());
        }
        let r = parse_reference(reference)?;
        let client = self.push_client(reference, &r).await?;
        for p in payloads {
            progress(Progress::Uploading {
                what: "payload",
                digest: p.digest.clone(),
                bytes: p.size,
            });
            let file = std::fs::File::open(&p.path).map_err(|e| Error::Config {
                path: p.path.display().to_string(),
                reason: format!("cannot read payload {}: {e}", p.name),
            })?;
            let chunks = futures::stream::unfold(file, |mut file| async move {
                use std::io::Read as _;
                let mut buf = vec![0u8; 4 << 20];
                match file.read(&mut buf) {
                    Ok(0) => None,
                    Ok(n) => {
                        buf.truncate(n);
                        Some((Ok(bytes::Bytes::from(buf)), file))
                    }
                    Err(e) => Some((
                        Err(oci_client::errors::OciDistributionError::IoError(e)),
                        file,
                    )),
                }
            });
            client
                .push_blob_stream(&r, chunks, &p.digest, Some(p.size))
                .await
                .map_err(|e| Error::from_oci(reference, e))?;
        }
        Ok(())
    }

    /// Pushes `component` to `reference` (which must carry a tag) in the CNCF wasm layout.
    pub async fn push(
        &self,
        reference: &str,
        component: &[u8],
        info: artifact::ComponentInfo,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<Pushed> {
        self.push_package(reference, component, info, &[], progress)
            .await
    }

    /// Pushes `component` and its `payloads` (tars on disk from
    /// [`crate::payload::pack_to`], streamed, never held in memory) to `reference` (which
    /// must carry a tag): the wasm layer first, then one layer per payload, named by its
    /// title annotation, all under one manifest digest.
    pub async fn push_package(
        &self,
        reference: &str,
        component: &[u8],
        info: artifact::ComponentInfo,
        payloads: &[PayloadFile],
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<Pushed> {
        let layer_digest = sha256_digest(component);
        let mut layers = vec![Descriptor::new(
            artifact::WASM_LAYER,
            layer_digest.clone(),
            component.len() as i64,
        )];
        for p in payloads {
            let size = i64::try_from(p.size).unwrap_or(i64::MAX);
            let mut d = Descriptor::new(PAYLOAD_LAYER, p.digest.clone(), size);
            d.annotations = Some(BTreeMap::from([(TITLE.to_string(), p.name.to_string())]));
            layers.push(d);
        }
        let config = artifact::WasmConfig {
            created: None,
            architecture: "wasm".into(),
            os: "wasip2".into(),
            layer_digests: layers.iter().map(|l| l.digest.clone()).collect(),
            component: Some(info),
        };
        let config_bytes = serde_json::to_vec(&config).expect("config serializes");
        let manifest = Manifest {
            schema_version: 2,
            media_type: Some(artifact::OCI_MANIFEST.into()),
            artifact_type: Some(artifact::WASM_CONFIG.into()),
            config: Descriptor::new(
                artifact::WASM_CONFIG,
                sha256_digest(&config_bytes),
                config_bytes.len() as i64,
            ),
            layers,
        };
        // What is pushed is what a node will accept.
        manifest.plugin_layers(reference)?;
        let body = serde_json::to_vec(&manifest).expect("manifest serializes");
        self.push_payloads(reference, payloads, progress).await?;
        let blobs = [
            Blob {
                what: "layer",
                bytes: component.to_vec(),
            },
            Blob {
                what: "config",
                bytes: config_bytes,
            },
        ];
        let (pinned, manifest_digest) = self
            .push_manifest(reference, &blobs, body, artifact::OCI_MANIFEST, progress)
            .await?;
        Ok(Pushed {
            pinned: pinned_ref(&pinned)?,
            manifest_digest,
            layer_digest,
        })
    }
}
