//! Container images for tests that need one a vendor might publish: gzip layers of given
//! files (a whiteout is a file named `.wh.<name>`), and the OCI manifest naming them. The
//! caller pushes the parts (`nodewright_oci::Registry::push_manifest`).

use std::io::Write as _;

use sha2::{Digest as _, Sha256};

/// The OCI image manifest media type.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// The gzip layer media type.
pub const GZIP_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// An image's parts: its config, its layers (in order) and its manifest.
#[derive(Clone, Debug)]
pub struct TestImage {
    /// The config blob.
    pub config: Vec<u8>,
    /// The layers, bottom first.
    pub layers: Vec<Vec<u8>>,
    /// The manifest.
    pub manifest: Vec<u8>,
}

impl TestImage {
    /// `layers` (gzip tars, bottom first) as a linux/amd64 image.
    pub fn new(layers: Vec<Vec<u8>>) -> TestImage {
        let config =
            br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#
                .to_vec();
        let describe = |media_type: &str, bytes: &[u8]| serde_json::json!({"mediaType": media_type, "digest": digest(bytes), "size": bytes.len()});
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": describe("application/vnd.oci.image.config.v1+json", &config),
            "layers": layers.iter().map(|l| describe(GZIP_LAYER, l)).collect::<Vec<_>>(),
        }))
        .expect("a manifest serializes");
        TestImage {
            config,
            layers,
            manifest,
        }
    }

    /// The manifest's digest.
    pub fn digest(&self) -> String {
        digest(&self.manifest)
    }
}

/// A gzip-compressed layer of `(path, content)` regular files, in order.
pub fn gzip_layer(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, content) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(content.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, path, *content)
            .expect("a tar entry in memory");
    }
    let tar = tar.into_inner().expect("a tar in memory");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).expect("gzip in memory");
    gz.finish().expect("gzip in memory")
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}
