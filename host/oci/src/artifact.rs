//! The wasm artifact layout.
//!
//! Written (CNCF TAG Runtime "Wasm OCI Artifact"): an OCI image manifest with
//! `artifactType` and config media type `application/vnd.wasm.config.v0+json`, exactly one
//! layer `application/wasm`. The config carries `architecture: wasm`, `os: wasip2`, the
//! layer digests and the component's imports and exports, so a registry browser (or the
//! operator) can see what a plugin needs without downloading it.
//!
//! Read: the same, plus Kubewarden's legacy pair (`application/vnd.wasm.config.v1+json`,
//! `application/vnd.wasm.content.layer.v1+wasm`), for migration. We never write those.

use serde::{Deserialize, Serialize};

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
    /// Exactly one wasm layer.
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
        if let Some(mt) = &self.media_type
            && mt != OCI_MANIFEST
        {
            return Err(crate::error::Error::WrongMediaType {
                reference: reference.into(),
                what: "manifest".into(),
                media_type: mt.clone(),
                expected: OCI_MANIFEST.into(),
            });
        }
        if self.config.media_type != WASM_CONFIG && self.config.media_type != LEGACY_CONFIG {
            return Err(crate::error::Error::WrongMediaType {
                reference: reference.into(),
                what: "config".into(),
                media_type: self.config.media_type.clone(),
                expected: format!("{WASM_CONFIG} (or legacy {LEGACY_CONFIG})"),
            });
        }
        let [layer] = self.layers.as_slice() else {
            return Err(crate::error::Error::InvalidArtifact {
                reference: reference.into(),
                reason: format!(
                    "a plugin artifact has exactly one layer, this one has {}",
                    self.layers.len()
                ),
            });
        };
        if layer.media_type != WASM_LAYER && layer.media_type != LEGACY_LAYER {
            return Err(crate::error::Error::WrongMediaType {
                reference: reference.into(),
                what: "layer".into(),
                media_type: layer.media_type.clone(),
                expected: format!("{WASM_LAYER} (or legacy {LEGACY_LAYER})"),
            });
        }
        if crate::digest::parse_digest(&layer.digest).is_none() {
            return Err(crate::error::Error::InvalidArtifact {
                reference: reference.into(),
                reason: format!("layer digest {:?} is not sha256", layer.digest),
            });
        }
        Ok(layer)
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
            config: Descriptor {
                media_type: config.into(),
                digest: crate::digest::sha256_digest(b"{}"),
                size: 2,
            },
            layers: layers
                .iter()
                .map(|m| Descriptor {
                    media_type: (*m).into(),
                    digest: crate::digest::sha256_digest(b"x"),
                    size: 1,
                })
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
        assert!(err.to_string().contains("exactly one layer"), "{err}");
    }

    #[test]
    fn manifest_serializes_with_oci_field_names() {
        let json = serde_json::to_value(manifest(WASM_CONFIG, &[WASM_LAYER])).unwrap();
        assert_eq!(json["schemaVersion"], 2);
        assert_eq!(json["artifactType"], WASM_CONFIG);
        assert_eq!(json["layers"][0]["mediaType"], WASM_LAYER);
    }
}
