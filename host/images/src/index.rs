//! One image for several architectures: the OCI image index over one [`Image`] per
//! platform. A node's runtime reads the index and pulls the manifest of its own platform,
//! so one digest (`image.digest` in the chart) serves amd64 and arm64 nodes alike.

use std::path::{Path, PathBuf};

use nodewright_oci::{Blob, Registry};
use serde_json::json;

use crate::{Error, Image, media, sha256};

/// An OCI image index and the images it names, one per architecture.
#[derive(Clone, Debug)]
pub struct Index {
    /// The images, in [`crate::Arch::ALL`]'s order.
    pub images: Vec<Image>,
    /// The index JSON.
    pub index: Vec<u8>,
}

impl Index {
    /// Indexes `images`: the same image (title and labels) built for different
    /// architectures. Refuses none, two for one architecture, or different images.
    pub fn new(mut images: Vec<Image>) -> Result<Index, Error> {
        images.sort_by_key(|i| i.arch);
        let Some(first) = images.first() else {
            return Err(Error::Index("no images".into()));
        };
        if let Some(w) = images.windows(2).find(|w| w[0].arch == w[1].arch) {
            return Err(Error::Index(format!(
                "{}: two images for {}",
                w[0].title, w[0].arch
            )));
        }
        if let Some(other) = images
            .iter()
            .find(|i| i.title != first.title || i.labels != first.labels)
        {
            return Err(Error::Index(format!(
                "{} ({}) with {} ({}): an index holds one image, built for several architectures from the same inputs",
                first.title, first.arch, other.title, other.arch
            )));
        }
        let manifests: Vec<_> = images
            .iter()
            .map(|i| {
                let mut platform = json!({"architecture": i.arch.oci(), "os": "linux"});
                if let Some(variant) = i.arch.variant() {
                    platform["variant"] = variant.into();
                }
                json!({
                    "mediaType": media::MANIFEST,
                    "digest": i.digest(),
                    "size": i.manifest.len(),
                    "platform": platform,
                })
            })
            .collect();
        let index = json!({
            "schemaVersion": 2,
            "mediaType": media::INDEX,
            "manifests": manifests,
            "annotations": first.labels,
        });
        let index = serde_json::to_vec(&index).expect("JSON");
        Ok(Index { images, index })
    }

    /// `sha256:<hex>` of the index: what a node pulls by.
    pub fn digest(&self) -> String {
        sha256(&self.index)
    }

    /// Writes it as an OCI image layout in `dir` (`oci-layout`, `index.json` naming the
    /// image index, `blobs/sha256/…`), which `skopeo copy oci:DIR …` and other OCI tools read.
    pub fn write_layout(&self, dir: &Path) -> Result<(), Error> {
        let write = |path: PathBuf, bytes: &[u8]| {
            std::fs::write(&path, bytes).map_err(|source| Error::Write {
                path: path.display().to_string(),
                source,
            })
        };
        let blobs = dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).map_err(|source| Error::Write {
            path: blobs.display().to_string(),
            source,
        })?;
        let image_blobs = self.images.iter().flat_map(|i| i.blobs());
        for (_, bytes) in image_blobs.chain([("index", self.index.as_slice())]) {
            let digest = sha256(bytes);
            write(blobs.join(digest.trim_start_matches("sha256:")), bytes)?;
        }
        write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        let layout = json!({
            "schemaVersion": 2,
            "mediaType": media::INDEX,
            "manifests": [{"mediaType": media::INDEX, "digest": self.digest(), "size": self.index.len()}],
        });
        write(
            dir.join("index.json"),
            &serde_json::to_vec(&layout).expect("JSON"),
        )
    }

    /// Pushes each image by its digest, then the index to `repository:tag`; returns the
    /// index's pinned reference.
    pub async fn push(
        &self,
        registry: &Registry,
        reference: &str,
        progress: &(dyn Fn(nodewright_oci::Progress) + Sync),
    ) -> Result<String, Error> {
        let repository = match reference.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => repo,
            _ => reference,
        };
        for image in &self.images {
            let blobs = [
                Blob {
                    what: "layer",
                    bytes: image.layer.clone(),
                },
                Blob {
                    what: "config",
                    bytes: image.config.clone(),
                },
            ];
            registry
                .push_manifest(
                    &format!("{repository}@{}", image.digest()),
                    &blobs,
                    image.manifest.clone(),
                    media::MANIFEST,
                    progress,
                )
                .await?;
        }
        let (pinned, _) = registry
            .push_manifest(reference, &[], self.index.clone(), media::INDEX, progress)
            .await?;
        Ok(pinned)
    }
}
