//! The webhook's self-managed serving certificate.
//!
//! A CA and a serving certificate signed by it live in one Secret (`ca.crt`, `tls.crt`,
//! `tls.key`), shared by every replica: the first to start creates it, the others read it.
//! The CA goes into the `ValidatingWebhookConfiguration`'s `caBundle` (re-injected whenever
//! something — a `helm upgrade` — resets it). A certificate is replaced when it would expire
//! within [`RENEW_BEFORE`] or does not name every wanted host; the previous CA stays in the
//! bundle until it expires, so replicas still serving the old certificate stay trusted. The
//! TLS server picks the current certificate per handshake, so renewal needs no restart.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::json;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

/// Replace a certificate this long before it expires.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Validity of a newly made CA and serving certificate.
const VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// Where the certificate lives and whom it must name.
#[derive(Clone, Debug)]
pub struct CertConfig {
    /// Namespace of the Secret.
    pub namespace: String,
    /// The Secret's name.
    pub secret: String,
    /// The `ValidatingWebhookConfiguration` to inject the CA into, if any.
    pub webhook_config: Option<String>,
    /// DNS names and IP addresses the serving certificate must carry.
    pub hosts: Vec<String>,
}

impl CertConfig {
    /// The names a Service `service` in `namespace` is reached by, plus `extra`.
    pub fn hosts_for(service: &str, namespace: &str, extra: &[String]) -> Vec<String> {
        let mut hosts = vec![
            service.to_string(),
            format!("{service}.{namespace}"),
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.cluster.local"),
        ];
        hosts.extend(extra.iter().cloned());
        hosts
    }
}

/// Why the certificate could not be made, loaded or published.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// Generating or signing failed.
    #[error("generating the webhook certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// The Secret holds something that is not a usable certificate and key.
    #[error("secret {secret}: {why}")]
    Invalid { secret: String, why: String },
    /// The API refused or failed.
    #[error("{what}: {source}")]
    Api { what: String, source: kube::Error },
    /// Another replica kept winning the race to write the Secret.
    #[error("secret {0}: gave up after repeated write conflicts")]
    Conflicts(String),
}

/// One certificate generation: what the Secret holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Material {
    /// PEM bundle of CAs to trust (current first).
    pub ca_bundle: String,
    /// PEM serving certificate.
    pub cert: String,
    /// PEM private key of the serving certificate.
    pub key: String,
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `notAfter` (unix seconds) and SANs of the first certificate in `pem`.
fn inspect(pem: &str) -> Option<(i64, Vec<String>)> {
    let der = CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()?
        .ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let not_after = cert.validity().not_after.timestamp();
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                x509_parser::extensions::GeneralName::DNSName(d) => names.push(d.to_string()),
                x509_parser::extensions::GeneralName::IPAddress(b) => match b.len() {
                    4 => names
                        .push(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).ok()?).to_string()),
                    16 => names
                        .push(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).ok()?).to_string()),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    Some((not_after, names))
}

/// Whether `m` can keep serving `hosts` at `now`: parses, names every host, and is not
/// within [`RENEW_BEFORE`] of expiring.
pub fn usable(m: &Material, hosts: &[String], now: i64) -> bool {
    let Some((not_after, names)) = inspect(&m.cert) else {
        return false;
    };
    not_after - now > RENEW_BEFORE.as_secs() as i64
        && hosts.iter().all(|h| names.contains(h))
        && certified_key(m).is_ok()
}

fn offset(unix: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(unix).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// A fresh CA and serving certificate for `hosts`, valid from `now`. CAs of `previous` that
/// are still valid stay in the bundle after the new one.
pub fn generate(
    hosts: &[String],
    now: i64,
    previous: Option<&Material>,
) -> Result<Material, CertError> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, format!("nodewright webhook CA {now}"));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    // Backdated a little: the apiserver's clock may trail ours.
    ca.not_before = offset(now - 300);
    ca.not_after = offset(now + VALIDITY.as_secs() as i64);
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(hosts.to_vec())?;
    leaf.distinguished_name.push(
        DnType::CommonName,
        hosts
            .first()
            .cloned()
            .unwrap_or_else(|| "nodewright-webhook".into()),
    );
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = offset(now - 300);
    leaf.not_after = offset(now + VALIDITY.as_secs() as i64);
    let cert = leaf.signed_by(&key, &issuer)?.pem();

    let mut ca_bundle = ca_pem;
    if let Some(prev) = previous {
        for old in CertificateDer::pem_slice_iter(prev.ca_bundle.as_bytes()).flatten() {
            let still_valid = x509_parser::parse_x509_certificate(&old)
                .is_ok_and(|(_, c)| c.validity().not_after.timestamp() > now);
            if still_valid {
                ca_bundle.push_str(&pem_of(&old));
            }
        }
    }
    Ok(Material {
        ca_bundle,
        cert,
        key: key.serialize_pem(),
    })
}

fn pem_of(der: &CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap_or_default())
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}

/// The rustls form of `m`.
pub fn certified_key(m: &Material) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(m.cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls.crt: {e}"))?;
    let key =
        PrivateKeyDer::from_pem_slice(m.key.as_bytes()).map_err(|e| format!("tls.key: {e}"))?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    CertifiedKey::from_der(chain, key, &provider).map_err(|e| format!("tls.crt/tls.key: {e}"))
}

fn from_secret(s: &Secret) -> Option<Material> {
    let data = s.data.as_ref()?;
    let text = |k: &str| {
        data.get(k)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    Some(Material {
        ca_bundle: text("ca.crt")?,
        cert: text("tls.crt")?,
        key: text("tls.key")?,
    })
}

fn to_data(m: &Material) -> BTreeMap<String, ByteString> {
    BTreeMap::from([
        (
            "ca.crt".to_string(),
            ByteString(m.ca_bundle.clone().into_bytes()),
        ),
        (
            "tls.crt".to_string(),
            ByteString(m.cert.clone().into_bytes()),
        ),
        (
            "tls.key".to_string(),
            ByteString(m.key.clone().into_bytes()),
        ),
    ])
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> CertError {
    let what = what.into();
    move |source| CertError::Api { what, source }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// The current certificate from the Secret, made (or renewed) first when needed. Safe to
/// race with other replicas: whoever loses re-reads the winner's Secret.
pub async fn ensure(client: &Client, cfg: &CertConfig) -> Result<Material, CertError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &cfg.namespace);
    let what = format!("secret {}/{}", cfg.namespace, cfg.secret);
    for _ in 0..5 {
        let existing = api
            .get_opt(&cfg.secret)
            .await
            .map_err(api_err(format!("reading {what}")))?;
        let current = existing.as_ref().and_then(from_secret);
        if let Some(m) = &current
            && usable(m, &cfg.hosts, unix_now())
        {
            return Ok(m.clone());
        }
        let fresh = generate(&cfg.hosts, unix_now(), current.as_ref())?;
        let result = match existing {
            None => {
                let secret = Secret {
                    metadata: kube::api::ObjectMeta {
                        name: Some(cfg.secret.clone()),
                        namespace: Some(cfg.namespace.clone()),
                        labels: Some(BTreeMap::from([(
                            "app.kubernetes.io/managed-by".into(),
                            "nodewright-operator".into(),
                        )])),
                        ..Default::default()
                    },
                    type_: Some("kubernetes.io/tls".into()),
                    data: Some(to_data(&fresh)),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &secret)
                    .await
                    .map(|_| ())
            }
            Some(mut secret) => {
                tracing::info!(secret = %what, "renewing the webhook serving certificate");
                secret.data = Some(to_data(&fresh));
                api.replace(&cfg.secret, &PostParams::default(), &secret)
                    .await
                    .map(|_| ())
            }
        };
        match result {
            Ok(()) => return Ok(fresh),
            // Another replica wrote first: use theirs.
            Err(e) if is_status(&e, 409) => continue,
            Err(e) => return Err(api_err(format!("writing {what}"))(e)),
        }
    }
    Err(CertError::Conflicts(what))
}

/// Puts `ca_bundle` into every webhook of the configuration, if it is not there already.
/// Returns whether it wrote.
pub async fn inject(client: &Client, config: &str, ca_bundle: &str) -> Result<bool, CertError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let what = format!("validatingwebhookconfiguration {config}");
    let vwc = api
        .get(config)
        .await
        .map_err(api_err(format!("reading {what}")))?;
    let want = ByteString(ca_bundle.as_bytes().to_vec());
    let mut webhooks = vwc.webhooks.unwrap_or_default();
    if webhooks
        .iter()
        .all(|w| w.client_config.ca_bundle.as_ref() == Some(&want))
    {
        return Ok(false);
    }
    for w in &mut webhooks {
        w.client_config.ca_bundle = Some(want.clone());
    }
    // A merge patch replaces the list whole; the resourceVersion makes it fail rather than
    // undo a concurrent edit (the next round retries on the fresh object).
    let patch = json!({"metadata": {"resourceVersion": vwc.metadata.resource_version}, "webhooks": webhooks});
    api.patch(config, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(api_err(format!("patching {what}")))?;
    tracing::info!(config, "injected the webhook CA bundle");
    Ok(true)
}

/// Serves whichever certificate was installed last.
#[derive(Debug)]
pub struct Resolver(RwLock<Arc<CertifiedKey>>);

impl Resolver {
    /// A resolver serving `m`.
    pub fn new(m: &Material, secret: &str) -> Result<Arc<Resolver>, CertError> {
        let key = certified_key(m).map_err(|why| CertError::Invalid {
            secret: secret.into(),
            why,
        })?;
        Ok(Arc::new(Resolver(RwLock::new(Arc::new(key)))))
    }

    /// Serve `m` from the next handshake on.
    pub fn install(&self, m: &Material, secret: &str) -> Result<(), CertError> {
        let key = certified_key(m).map_err(|why| CertError::Invalid {
            secret: secret.into(),
            why,
        })?;
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(key);
        Ok(())
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// Keeps the certificate fresh and the CA injected: every `every`, re-reads the Secret
/// (renewing when due), installs a changed certificate, and re-injects the bundle.
pub async fn maintain(
    client: Client,
    cfg: CertConfig,
    resolver: Arc<Resolver>,
    mut current: Material,
    every: Duration,
) {
    loop {
        if let Some(name) = &cfg.webhook_config
            && let Err(e) = inject(&client, name, &current.ca_bundle).await
        {
            tracing::warn!("{e}");
        }
        tokio::time::sleep(every).await;
        match ensure(&client, &cfg).await {
            Ok(m) if m != current => match resolver.install(&m, &cfg.secret) {
                Ok(()) => {
                    tracing::info!(secret = %cfg.secret, "serving a new webhook certificate");
                    current = m;
                }
                Err(e) => tracing::warn!("{e}"),
            },
            Ok(_) => {}
            Err(e) => tracing::warn!("{e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts() -> Vec<String> {
        CertConfig::hosts_for("nw-webhook", "nodewright", &["127.0.0.1".into()])
    }

    #[test]
    fn a_fresh_certificate_names_every_host_and_loads() {
        let now = unix_now();
        let m = generate(&hosts(), now, None).unwrap();
        assert!(usable(&m, &hosts(), now));
        let (not_after, names) = inspect(&m.cert).unwrap();
        assert!(
            names.contains(&"nw-webhook.nodewright.svc".to_string()),
            "{names:?}"
        );
        assert!(names.contains(&"127.0.0.1".to_string()), "{names:?}");
        assert!(not_after > now + 300 * 24 * 3600);
    }

    #[test]
    fn renewal_is_due_near_expiry_or_for_a_new_host() {
        let now = unix_now();
        let m = generate(&hosts(), now, None).unwrap();
        // Eleven months on, inside the renewal window.
        assert!(!usable(&m, &hosts(), now + 340 * 24 * 3600));
        let mut more = hosts();
        more.push("webhook.example".into());
        assert!(!usable(&m, &more, now));
    }

    #[test]
    fn a_renewed_bundle_keeps_the_previous_ca_while_it_is_valid() {
        let now = unix_now();
        let first = generate(&hosts(), now, None).unwrap();
        let second = generate(&hosts(), now + 10, Some(&first)).unwrap();
        let cas: Vec<_> = CertificateDer::pem_slice_iter(second.ca_bundle.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(cas.len(), 2);
        let first_ca = CertificateDer::pem_slice_iter(first.ca_bundle.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(cas[1], first_ca);
        // Once the old CA has expired it is dropped.
        let third = generate(&hosts(), now + 400 * 24 * 3600, Some(&second)).unwrap();
        assert_eq!(
            CertificateDer::pem_slice_iter(third.ca_bundle.as_bytes()).count(),
            1
        );
    }

    #[test]
    fn garbage_is_not_usable() {
        let m = Material {
            ca_bundle: "x".into(),
            cert: "not a pem".into(),
            key: "nope".into(),
        };
        assert!(!usable(&m, &hosts(), unix_now()));
    }
}
