//! The wasm artifact layout.
//!
//! Written (CNCF TAG Runtime "Wasm OCI Artifact"): an OCI image manifest with
//! `artifactType` and config media type `application/vnd.wasm.config.v0+json`, exactly one
//! layer `application/wasm`. The config carries `architecture: wasm`, `os: wasip2`, the
//! layer digests and the component's imports and exports, so a registry browser (or the
//! operator) can see what a plugin needs without downloading it.
//!
//! A plugin may carry payloads beside its component: more layers of the same manifest, each
//! a tar of media type [`crate::payload::PAYLOAD_LAYER`] named by its title annotation
//! ([`crate::payload`]). The wasm layer stays the first.
//!
//! Read: the same, plus Kubewarden's legacy pair (`application/vnd.wasm.config.v1+json`,
//! `application/vnd.wasm.content.layer.v1+wasm`), for migration. We never write those.

use std::collections::BTreeMap;

use nodewright_api::payload::PayloadName;
use serde::{Deserialize, Serialize};

use crate::payload::{PAYLOAD_LAYER, Payload, TITLE};

/// OCI image manifest media type.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// CNCF wasm config media type (also the artifact type).
pub const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
/// CNCF wasm layer media type.
pub const WASM_LAYER: &str = "application/wasm";
/// Legacy (Kubewarden) config media type: read only.
pub const LEGACY_CONFIG: &str = "application/vnd.wasm.config.v1+json";
/// Legacy (Kubewarden) layer media type: read only.
pub const LEGACY_LAYER: &str = "application/vnd.wasm.content.layer.v1+wasm";

/// A content descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Media type.
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Size in bytes.
    pub size: i64,
    /// Annotations (a payload's name, in [`TITLE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

impl Descriptor {
    /// Its size in bytes (a negative one, which no verified content has, as 0).
    pub fn bytes(&self) -> u64 {
        self.size.max(0) as u64
    }

    /// The sizes of `descriptors` added up (saturating).
    pub fn total<'a>(descriptors: impl IntoIterator<Item = &'a Descriptor>) -> u64 {
        descriptors
            .into_iter()
            .map(Descriptor::bytes)
            .fold(0, u64::saturating_add)
    }

    /// A descriptor without annotations.
    pub fn new(media_type: &str, digest: String, size: i64) -> Self {
        Descriptor {
            media_type: media_type.into(),
            digest,
            size,
            annotations: None,
        }
    }
}

/// The manifest we write and read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Always 2.
    pub schema_version: u32,
    /// [`OCI_MANIFEST`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// [`WASM_CONFIG`] on write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// The config blob.
    pub config: Descriptor,
    /// The wasm layer, then the payloads.
    pub layers: Vec<Descriptor>,
}

/// The component's interface, as recorded in the config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentInfo {
    /// Import names.
    pub imports: Vec<String>,
    /// Export names.
    pub exports: Vec<String>,
    /// Target world.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// The CNCF wasm config blob.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WasmConfig {
    /// RFC 3339 creation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// `wasm`.
    pub architecture: String,
    /// `wasip2`.
    pub os: String,
    /// Digests of the layers.
    pub layer_digests: Vec<String>,
    /// Imports and exports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<ComponentInfo>,
}

impl Manifest {
    /// Checks the manifest has the plugin shape and returns the wasm layer.
    pub fn wasm_layer(&self, reference: &str) -> crate::error::Result<&Descriptor> {
        self.plugin_layers(reference).map(|(wasm, _)| wasm)
    }

    /// Checks the manifest has the plugin shape — the wasm layer first, then payload layers
    /// with distinct valid names — and returns the wasm layer and the payloads.
    pub fn plugin_layers(
        &self,
        reference: &str,
    ) -> crate::error::Result<(&Descriptor, Vec<Payload>)> {
        use crate::error::Error;
        if let Some(mt) = &self.media_type
            && mt != OCI_MANIFEST
        {
            return Err(Error::WrongMediaType {
                reference: reference.into(),
                what: "manifest".into(),
                media_type: mt.clone(),
                expected: OCI_MANIFEST.into(),
            });
        }
        if self.config.media_type != WASM_CONFIG && self.config.media_type != LEGACY_CONFIG {
            return Err(Error::WrongMediaType {
                reference: reference.into(),
                what: "config".into(),
                media_type: self.config.media_type.clone(),
                expected: format!("{WASM_CONFIG} (or legacy {LEGACY_CONFIG})"),
            });
        }
        let invalid = |reason: String| Error::InvalidArtifact {
            reference: reference.into(),
            reason,
        };
        let Some((layer, rest)) = self.layers.split_first() else {
            return Err(invalid(
                "a plugin artifact has a wasm layer, this one has no layer".into(),
            ));
        };
        if layer.media_type != WASM_LAYER && layer.media_type != LEGACY_LAYER {
            return Err(Error::WrongMediaType {
                reference: reference.into(),
                what: "layer".into(),
                media_type: layer.media_type.clone(),
                expected: format!("{WASM_LAYER} (or legacy {LEGACY_LAYER})"),
            });
        }
        let mut payloads: Vec<Payload> = Vec::with_capacity(rest.len());
        for (i, l) in self.layers.iter().enumerate() {
            if crate::digest::parse_digest(&l.digest).is_none() {
                return Err(invalid(format!(
                    "layer {i}'s digest {:?} is not sha256",
                    l.digest
                )));
            }
            if l.size < 0 {
                return Err(invalid(format!("layer {i}'s size {} is negative", l.size)));
            }
        }
        for (i, l) in rest.iter().enumerate().map(|(i, l)| (i + 1, l)) {
            if l.media_type == WASM_LAYER || l.media_type == LEGACY_LAYER {
                return Err(invalid(format!(
                    "a plugin artifact has exactly one wasm layer, layer {i} is another"
                )));
            }
            if l.media_type != PAYLOAD_LAYER {
                return Err(Error::WrongMediaType {
                    reference: reference.into(),
                    what: format!("layer {i}"),
                    media_type: l.media_type.clone(),
                    expected: format!("{PAYLOAD_LAYER} (a payload)"),
                });
            }
            let title = l.annotations.as_ref().and_then(|a| a.get(TITLE));
            let name = title
                .ok_or_else(|| invalid(format!("payload layer {i} has no {TITLE} annotation")))
                .and_then(|t| {
                    PayloadName::parse(t).map_err(|e| invalid(format!("payload layer {i}: {e}")))
                })?;
            if payloads.iter().any(|p| p.name == name) {
                return Err(invalid(format!("two payloads are named {name}")));
            }
            payloads.push(Payload {
                name,
                layer: l.clone(),
            });
        }
        Ok((layer, payloads))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(config: &str, layers: &[&str]) -> Manifest {
        Manifest {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST.into()),
            artifact_type: Some(WASM_CONFIG.into()),
            config: Descriptor::new(config, crate::digest::sha256_digest(b"{}"), 2),
            layers: layers
                .iter()
                .map(|m| Descriptor::new(m, crate::digest::sha256_digest(b"x"), 1))
                .collect(),
        }
    }

    #[test]
    fn plugin_shape() {
        assert!(manifest(WASM_CONFIG, &[WASM_LAYER]).wasm_layer("r").is_ok());
        assert!(
            manifest(LEGACY_CONFIG, &[LEGACY_LAYER])
                .wasm_layer("r")
                .is_ok(),
            "legacy media types are read"
        );
        let err = manifest(
            "application/vnd.oci.image.config.v1+json",
            &["application/vnd.oci.image.layer.v1.tar+gzip"],
        )
        .wasm_layer("r")
        .unwrap_err();
        assert!(err.to_string().contains("config has media type"), "{err}");
        let err = manifest(WASM_CONFIG, &["application/vnd.oci.image.layer.v1.tar"])
            .wasm_layer("r")
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("layer has media type \"application/vnd.oci.image.layer.v1.tar\""),
            "{err}"
        );
        let err = manifest(WASM_CONFIG, &[WASM_LAYER, WASM_LAYER])
            .wasm_layer("r")
            .unwrap_err();
        assert!(err.to_string().contains("exactly one wasm layer"), "{err}");
    }

    fn with_payloads(titles: &[Option<&str>]) -> Manifest {
        let mut m = manifest(WASM_CONFIG, &[WASM_LAYER]);
        for (i, title) in titles.iter().enumerate() {
            let mut d =
                Descriptor::new(PAYLOAD_LAYER, crate::digest::sha256_digest(&[i as u8]), 10);
            d.annotations = title.map(|t| BTreeMap::from([(TITLE.to_string(), t.to_string())]));
            m.layers.push(d);
        }
        m
    }

    #[test]
    fn payload_layers_are_named_and_distinct() {
        let m = with_payloads(&[Some("driver"), Some("firmware.bin")]);
        let (wasm, payloads) = m.plugin_layers("r").unwrap();
        assert_eq!(wasm.media_type, WASM_LAYER);
        let names: Vec<&str> = payloads.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["driver", "firmware.bin"]);
        assert_eq!(payloads[1].layer, m.layers[2]);

        for (titles, says) in [
            (&[None][..], "has no org.opencontainers.image.title"),
            (&[Some("../etc")][..], "is not a payload name"),
            (&[Some("a"), Some("a")][..], "two payloads are named a"),
        ] {
            let err = with_payloads(titles).plugin_layers("r").unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
        let mut m = with_payloads(&[Some("a")]);
        m.layers[1].media_type = "application/vnd.oci.image.layer.v1.tar+gzip".into();
        let err = m.plugin_layers("r").unwrap_err();
        assert!(err.to_string().contains("layer 1 has media type"), "{err}");
        let mut m = with_payloads(&[Some("a")]);
        m.layers.swap(0, 1);
        assert!(m.plugin_layers("r").is_err(), "the wasm layer comes first");
    }

    #[test]
    fn manifest_serializes_with_oci_field_names() {
        let json = serde_json::to_value(manifest(WASM_CONFIG, &[WASM_LAYER])).unwrap();
        assert_eq!(json["schemaVersion"], 2);
        assert_eq!(json["artifactType"], WASM_CONFIG);
        assert_eq!(json["layers"][0]["mediaType"], WASM_LAYER);
    }
}
