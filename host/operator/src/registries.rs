//! How the operator and its agents reach plugin registries: plain HTTP for the registries
//! listed as insecure, logins from `kubernetes.io/dockerconfigjson` Secrets (a NodeWright's
//! own `spec.imagePullSecret` first, then the operator-wide ones), and CA bundles from
//! ConfigMaps for registries with an internal CA.
//!
//! The operator reads the Secrets and ConfigMaps through the API when it resolves, judges
//! and checks a NodeWright's plugins (its Role may `get` only the ones the chart names). An
//! agent never reads them: its pod mounts them (the kubelet delivers the files) and the
//! agent is told the paths, so the agent needs no API access at all.

use std::path::PathBuf;
use std::str::FromStr;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};
use nodewright_api::agent::RegistryCa;
use nodewright_oci::{Credentials, Pem, RegistryConfig};
use serde_json::{Value, json};

/// The Secret type a registry login must have.
const DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
/// Its key.
const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";
/// Where an agent pod mounts the logins and CA bundles.
const MOUNT_ROOT: &str = "/etc/nodewright/registry";

/// A CA bundle for one registry, from a ConfigMap key: `HOST=CONFIGMAP[/KEY]` on the
/// operator's command line (the key defaults to `ca.crt`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaRef {
    /// The registry (`host[:port]`).
    pub registry: String,
    /// The ConfigMap in the operator's namespace.
    pub config_map: String,
    /// The key holding the PEM bundle.
    pub key: String,
}

impl FromStr for CaRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not HOST=CONFIGMAP[/KEY]");
        let (registry, source) = s.split_once('=').ok_or_else(bad)?;
        let (config_map, key) = source.split_once('/').unwrap_or((source, "ca.crt"));
        if registry.is_empty() || config_map.is_empty() || key.is_empty() {
            return Err(bad());
        }
        Ok(CaRef {
            registry: registry.into(),
            config_map: config_map.into(),
            key: key.into(),
        })
    }
}

/// Where a login came from: what to name in an error, and what to change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// A NodeWright's `spec.imagePullSecret`.
    Spec,
    /// The operator's `--registry-secret`.
    Operator,
}

impl Origin {
    fn field(self) -> &'static str {
        match self {
            Origin::Spec => "spec.imagePullSecret",
            Origin::Operator => "--registry-secret",
        }
    }

    /// The chart value that lets the operator read such a Secret.
    fn chart_value(self) -> &'static str {
        match self {
            Origin::Spec => "pluginRegistries.packageSecrets",
            Origin::Operator => "pluginRegistries.secrets",
        }
    }
}

/// Why the registry settings could not be read. Every one names the object and the field
/// or flag that refers to it; none is skipped (no silent anonymous pull).
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// The object does not exist.
    #[error("{field}: {kind} {namespace}/{name} does not exist")]
    Missing {
        field: &'static str,
        kind: &'static str,
        namespace: String,
        name: String,
    },
    /// The operator's Role does not cover it.
    #[error(
        "{field}: the operator may not read {kind} {namespace}/{name}; add it to the chart's {value}"
    )]
    Forbidden {
        field: &'static str,
        kind: &'static str,
        namespace: String,
        name: String,
        value: &'static str,
    },
    /// It exists but does not hold what it should.
    #[error("{field}: {kind} {namespace}/{name} {problem}")]
    Unusable {
        field: &'static str,
        kind: &'static str,
        namespace: String,
        name: String,
        problem: String,
    },
    /// The API could not be asked.
    #[error("{field}: reading {kind} {namespace}/{name}: {source}")]
    Api {
        field: &'static str,
        kind: &'static str,
        namespace: String,
        name: String,
        source: kube::Error,
    },
}

/// This deployment's registry settings.
#[derive(Clone, Debug, Default)]
pub struct RegistryAccess {
    /// The operator's (and its Jobs') namespace, where the Secrets and ConfigMaps live.
    pub namespace: String,
    /// Registries reached over plain HTTP.
    pub insecure: Vec<String>,
    /// Operator-wide logins for every NodeWright's plugins (`--registry-secret`).
    pub secrets: Vec<String>,
    /// CA bundles (`--registry-ca`).
    pub cas: Vec<CaRef>,
    /// Secrets the kubelet pulls the agent image with (`--image-pull-secret`).
    pub image_pull_secrets: Vec<String>,
}

/// What an agent pod carries for its plugin pull: volumes, their mounts, the paths the
/// agent is told, and the pod's `imagePullSecrets`.
#[derive(Debug, Default, PartialEq)]
pub struct PodAccess {
    /// Pod volumes.
    pub volumes: Vec<Value>,
    /// The agent container's mounts of them.
    pub mounts: Vec<Value>,
    /// Docker configs, in the order they are asked.
    pub configs: Vec<PathBuf>,
    /// CA bundles.
    pub cas: Vec<RegistryCa>,
    /// `imagePullSecrets` names.
    pub image_pull_secrets: Vec<String>,
}

impl RegistryAccess {
    /// The logins in the order they are asked: the NodeWright's own, then the operator's.
    fn logins<'a>(&'a self, own: Option<&'a str>) -> impl Iterator<Item = (Origin, &'a str)> {
        own.map(|s| (Origin::Spec, s)).into_iter().chain(
            self.secrets
                .iter()
                .filter(move |s| Some(s.as_str()) != own)
                .map(|s| (Origin::Operator, s.as_str())),
        )
    }

    /// The operator's own client settings for a NodeWright whose `spec.imagePullSecret` is
    /// `own`: read through the API now (so a rotated Secret is used at the next check).
    pub async fn config(
        &self,
        client: &Client,
        own: Option<&str>,
    ) -> Result<RegistryConfig, AccessError> {
        let mut logins = Vec::new();
        for (origin, name) in self.logins(own) {
            logins.push(self.login(client, origin, name).await?);
        }
        let mut ca_bundles = std::collections::BTreeMap::new();
        for ca in &self.cas {
            ca_bundles.insert(ca.registry.clone(), self.ca(client, ca).await?);
        }
        Ok(RegistryConfig {
            insecure: self.insecure.clone(),
            ca_bundles,
            credentials: Credentials::Chain(logins),
            ..Default::default()
        })
    }

    async fn login(
        &self,
        client: &Client,
        origin: Origin,
        name: &str,
    ) -> Result<Credentials, AccessError> {
        let secret = self
            .get::<Secret>(client, "secret", origin.field(), origin.chart_value(), name)
            .await?;
        let unusable = |problem: String| AccessError::Unusable {
            field: origin.field(),
            kind: "secret",
            namespace: self.namespace.clone(),
            name: name.into(),
            problem,
        };
        let kind = secret.type_.as_deref().unwrap_or("Opaque");
        if kind != DOCKER_CONFIG_JSON {
            return Err(unusable(format!(
                "is of type {kind}, not {DOCKER_CONFIG_JSON}"
            )));
        }
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(DOCKER_CONFIG_KEY))
            .ok_or_else(|| unusable(format!("has no {DOCKER_CONFIG_KEY} key")))?;
        let json = String::from_utf8(bytes.0.clone())
            .map_err(|_| unusable(format!("{DOCKER_CONFIG_KEY} is not UTF-8")))?;
        Ok(Credentials::DockerConfigText {
            origin: format!("{} (secret {}/{name})", origin.field(), self.namespace),
            json,
        })
    }

    async fn ca(&self, client: &Client, ca: &CaRef) -> Result<Pem, AccessError> {
        const FIELD: &str = "--registry-ca";
        let map = self
            .get::<ConfigMap>(
                client,
                "configmap",
                FIELD,
                "pluginRegistries.caBundles",
                &ca.config_map,
            )
            .await?;
        let pem = map
            .data
            .as_ref()
            .and_then(|d| d.get(&ca.key))
            .ok_or_else(|| AccessError::Unusable {
                field: FIELD,
                kind: "configmap",
                namespace: self.namespace.clone(),
                name: ca.config_map.clone(),
                problem: format!("has no key {} (the CA bundle for {})", ca.key, ca.registry),
            })?;
        Ok(Pem::Text {
            origin: format!(
                "{FIELD} {} (configmap {}/{} key {})",
                ca.registry, self.namespace, ca.config_map, ca.key
            ),
            pem: pem.clone(),
        })
    }

    async fn get<K>(
        &self,
        client: &Client,
        kind: &'static str,
        field: &'static str,
        value: &'static str,
        name: &str,
    ) -> Result<K, AccessError>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let api: Api<K> = Api::namespaced(client.clone(), &self.namespace);
        let (namespace, name) = (self.namespace.clone(), name.to_string());
        match api.get(&name).await {
            Ok(o) => Ok(o),
            Err(kube::Error::Api(e)) if e.code == 404 => Err(AccessError::Missing {
                field,
                kind,
                namespace,
                name,
            }),
            Err(kube::Error::Api(e)) if e.code == 403 => Err(AccessError::Forbidden {
                field,
                kind,
                namespace,
                name,
                value,
            }),
            Err(source) => Err(AccessError::Api {
                field,
                kind,
                namespace,
                name,
                source,
            }),
        }
    }

    /// What an agent pod of a NodeWright whose `spec.imagePullSecret` is `own` mounts and is
    /// told: the same logins in the same order, and the CA bundles.
    pub fn for_pod(&self, own: Option<&str>) -> PodAccess {
        let mut pod = PodAccess::default();
        for (i, (_, name)) in self.logins(own).enumerate() {
            let volume = format!("registry-login-{i}");
            let dir = format!("{MOUNT_ROOT}/logins/{i}");
            pod.volumes.push(json!({"name": volume, "secret": {
                "secretName": name,
                "items": [{"key": DOCKER_CONFIG_KEY, "path": DOCKER_CONFIG_KEY}]
            }}));
            pod.mounts
                .push(json!({"name": volume, "mountPath": dir, "readOnly": true}));
            pod.configs
                .push(PathBuf::from(format!("{dir}/{DOCKER_CONFIG_KEY}")));
        }
        for (i, ca) in self.cas.iter().enumerate() {
            let volume = format!("registry-ca-{i}");
            let dir = format!("{MOUNT_ROOT}/ca/{i}");
            pod.volumes.push(json!({"name": volume, "configMap": {
                "name": ca.config_map,
                "items": [{"key": ca.key, "path": "ca.pem"}]
            }}));
            pod.mounts
                .push(json!({"name": volume, "mountPath": dir, "readOnly": true}));
            pod.cas.push(RegistryCa {
                registry: ca.registry.clone(),
                pem: PathBuf::from(format!("{dir}/ca.pem")),
            });
        }
        pod.image_pull_secrets = own
            .into_iter()
            .chain(self.image_pull_secrets.iter().map(String::as_str))
            .fold(Vec::new(), |mut names, n| {
                if !names.iter().any(|m| m == n) {
                    names.push(n.to_string());
                }
                names
            });
        pod
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_reference_names_a_configmap_and_key() {
        assert_eq!(
            "reg.example:5000=corp-ca".parse::<CaRef>().unwrap(),
            CaRef {
                registry: "reg.example:5000".into(),
                config_map: "corp-ca".into(),
                key: "ca.crt".into()
            }
        );
        assert_eq!(
            "reg.example=corp-ca/bundle.pem"
                .parse::<CaRef>()
                .unwrap()
                .key,
            "bundle.pem"
        );
        for bad in [
            "reg.example",
            "=corp-ca",
            "reg.example=",
            "reg.example=corp-ca/",
        ] {
            assert!(bad.parse::<CaRef>().is_err(), "{bad}");
        }
    }

    #[test]
    fn an_agent_pod_mounts_each_login_once_its_own_first() {
        let access = RegistryAccess {
            namespace: "nodewright".into(),
            secrets: vec!["fleet".into(), "team".into()],
            cas: vec!["reg.example:5000=corp-ca".parse().unwrap()],
            image_pull_secrets: vec!["agent-pull".into()],
            ..Default::default()
        };
        let pod = access.for_pod(Some("team"));
        let secrets: Vec<_> = pod
            .volumes
            .iter()
            .filter_map(|v| v["secret"]["secretName"].as_str())
            .collect();
        assert_eq!(
            secrets,
            ["team", "fleet"],
            "the NodeWright's own login first"
        );
        assert_eq!(
            pod.configs,
            [
                PathBuf::from("/etc/nodewright/registry/logins/0/.dockerconfigjson"),
                PathBuf::from("/etc/nodewright/registry/logins/1/.dockerconfigjson")
            ]
        );
        assert_eq!(
            pod.cas[0].to_string(),
            "reg.example:5000=/etc/nodewright/registry/ca/0/ca.pem"
        );
        assert_eq!(pod.mounts.len(), pod.volumes.len());
        assert!(pod.mounts.iter().all(|m| m["readOnly"] == true));
        assert_eq!(pod.image_pull_secrets, ["team", "agent-pull"]);
        assert_eq!(
            access.for_pod(None).image_pull_secrets,
            ["agent-pull"],
            "no NodeWright secret: the deployment's only"
        );
    }
}
