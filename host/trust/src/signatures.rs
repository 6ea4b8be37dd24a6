//! Signatures of plugins, stored as cosign stores them: for an artifact `repo@sha256:<hex>`,
//! an OCI manifest under the tag `repo:sha256-<hex>.sig` whose layers are *simple signing*
//! payloads naming the signed digest, each with its base64 signature in the layer
//! annotation `dev.cosignproject.cosign/signature`. `cosign sign --key` writes the same, and
//! `cosign verify --key` reads what [`attach`] writes.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use nodewright_api::pinned::PinnedRef;
use nodewright_oci::Registry;
use nodewright_oci::artifact::Descriptor;
use serde_json::{Value, json};

use crate::error::Error;
#[cfg(feature = "sign")]
use crate::keys::KeyPair;
use crate::keys::PublicKey;

/// The payload media type.
pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The payload's `critical.type`.
const PAYLOAD_TYPE: &str = "cosign container image signature";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
#[cfg(feature = "sign")]
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// One signature found beside an artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// The signed payload, as stored.
    pub payload: Vec<u8>,
    /// The signature bytes (ASN.1 DER).
    pub signature: Vec<u8>,
}

/// Where the signatures of `pinned` live: `repo:sha256-<hex>.sig`.
pub fn signature_reference(pinned: &PinnedRef) -> String {
    format!("{}:sha256-{}.sig", pinned.repository(), pinned.hex())
}

/// The simple signing payload for `digest` in `repository`, as cosign writes it.
pub fn payload(repository: &str, digest: &str) -> Vec<u8> {
    let v = json!({
        "critical": {
            "identity": {"docker-reference": repository},
            "image": {"docker-manifest-digest": digest},
            "type": PAYLOAD_TYPE,
        },
        "optional": null,
    });
    serde_json::to_vec(&v).expect("JSON")
}

/// The digest a payload signs, when it is a cosign image-signature payload.
pub fn signed_digest(payload: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(payload).ok()?;
    (v["critical"]["type"] == PAYLOAD_TYPE).then(|| {
        v["critical"]["image"]["docker-manifest-digest"]
            .as_str()
            .map(String::from)
    })?
}

/// The signature manifest of `pinned`, when there is one.
async fn signature_manifest(
    registry: &Registry,
    pinned: &PinnedRef,
) -> Result<Option<Value>, Error> {
    let reference = signature_reference(pinned);
    let Some(raw) = registry.fetch_tagged(&reference, &[OCI_MANIFEST]).await? else {
        return Ok(None);
    };
    let v = serde_json::from_slice(&raw)
        .map_err(|e| Error::Signature(format!("{reference}: not a manifest: {e}")))?;
    Ok(Some(v))
}

/// Most signature layers read beside one artifact.
pub const MAX_SIGNATURES: usize = 64;

/// Largest signature payload read (a simple-signing payload is a few hundred bytes).
pub const MAX_SIGNATURE_PAYLOAD: u64 = 64 << 10;

/// Every signature stored beside `pinned` (none when it was never signed). Bounded before
/// anything is fetched: at most [`MAX_SIGNATURES`] layers of at most
/// [`MAX_SIGNATURE_PAYLOAD`] bytes each, so what a registry serves here costs at most
/// 4 MiB whatever it declares.
pub async fn signatures(registry: &Registry, pinned: &PinnedRef) -> Result<Vec<Signature>, Error> {
    let Some(manifest) = signature_manifest(registry, pinned).await? else {
        return Ok(Vec::new());
    };
    let layers = manifest["layers"].as_array().map_or(&[][..], Vec::as_slice);
    if layers.len() > MAX_SIGNATURES {
        return Err(Error::Signature(format!(
            "{pinned}: the signature manifest lists {} layers; at most {MAX_SIGNATURES} are read",
            layers.len()
        )));
    }
    let mut out = Vec::new();
    for layer in layers {
        if layer["mediaType"] != SIMPLE_SIGNING {
            continue;
        }
        let Some(sig) = layer["annotations"][SIGNATURE_ANNOTATION]
            .as_str()
            .and_then(|s| B64.decode(s).ok())
        else {
            continue;
        };
        let descriptor: Descriptor = serde_json::from_value(layer.clone())
            .map_err(|e| Error::Signature(format!("a signature layer: {e}")))?;
        let payload = registry
            .fetch_blob_within(pinned.as_str(), &descriptor, MAX_SIGNATURE_PAYLOAD)
            .await?;
        out.push(Signature {
            payload,
            signature: sig,
        });
    }
    Ok(out)
}

/// The names of the `keys` (in their order) that signed exactly `digest` among
/// `signatures`.
pub fn verified_by(
    signatures: &[Signature],
    digest: &str,
    keys: &[(String, PublicKey)],
) -> Vec<String> {
    let over_digest: Vec<&Signature> = signatures
        .iter()
        .filter(|s| signed_digest(&s.payload).as_deref() == Some(digest))
        .collect();
    keys.iter()
        .filter(|(_, key)| {
            over_digest
                .iter()
                .any(|s| key.verifies(&s.payload, &s.signature))
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// Signs `pinned` with `key` and stores the signature beside the ones already there.
#[cfg(feature = "sign")]
pub async fn attach(registry: &Registry, pinned: &PinnedRef, key: &KeyPair) -> Result<(), Error> {
    let payload = payload(pinned.repository(), pinned.digest());
    let signature = key.sign(&payload);
    let mut layers: Vec<Value> = match signature_manifest(registry, pinned).await? {
        Some(m) => m["layers"].as_array().cloned().unwrap_or_default(),
        None => Vec::new(),
    };
    let payload_digest = nodewright_oci::sha256_digest(&payload);
    layers.retain(|l| {
        l["digest"] != payload_digest.as_str()
            || l["annotations"][SIGNATURE_ANNOTATION] != B64.encode(&signature).as_str()
    });
    layers.push(json!({
        "mediaType": SIMPLE_SIGNING,
        "size": payload.len(),
        "digest": payload_digest,
        "annotations": {SIGNATURE_ANNOTATION: B64.encode(&signature)},
    }));
    let diff_ids: Vec<Value> = layers.iter().map(|l| l["digest"].clone()).collect();
    let config = json!({
        "architecture": "", "os": "", "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "config": {},
    });
    let config = serde_json::to_vec(&config).expect("JSON");
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "size": config.len(), "digest": nodewright_oci::sha256_digest(&config)},
        "layers": layers,
    });
    use nodewright_oci::Blob;
    let blobs = [
        Blob {
            what: "signature",
            bytes: payload,
        },
        Blob {
            what: "config",
            bytes: config,
        },
    ];
    registry
        .push_manifest(
            &signature_reference(pinned),
            &blobs,
            serde_json::to_vec(&manifest).expect("JSON"),
            OCI_MANIFEST,
            &|_| {},
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeyPair;

    #[test]
    fn references_and_payloads_are_cosigns() {
        let pinned: PinnedRef = format!("r.example/plugins/sysctl@sha256:{}", "a".repeat(64))
            .parse()
            .unwrap();
        assert_eq!(
            signature_reference(&pinned),
            format!("r.example/plugins/sysctl:sha256-{}.sig", "a".repeat(64))
        );
        let p = payload(
            "r.example/plugins/sysctl",
            &format!("sha256:{}", "a".repeat(64)),
        );
        assert_eq!(
            signed_digest(&p).as_deref(),
            Some(format!("sha256:{}", "a".repeat(64)).as_str())
        );
        assert_eq!(
            signed_digest(br#"{"critical":{"type":"something else"}}"#),
            None
        );
    }

    #[test]
    fn only_a_trusted_key_over_the_same_digest_counts() {
        let (a, b) = (KeyPair::generate(), KeyPair::generate());
        let digest = format!("sha256:{}", "b".repeat(64));
        let p = payload("r/p", &digest);
        let sigs = [Signature {
            payload: p.clone(),
            signature: a.sign(&p),
        }];
        let keys = [
            ("team-a".to_string(), a.public()),
            ("team-b".to_string(), b.public()),
        ];
        assert_eq!(verified_by(&sigs, &digest, &keys), ["team-a"]);
        assert!(
            verified_by(&sigs, &format!("sha256:{}", "c".repeat(64)), &keys).is_empty(),
            "a signature for another digest"
        );
    }
}
