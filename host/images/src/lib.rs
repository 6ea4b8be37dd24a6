//! nodewright's container images, assembled without a container runtime.
//!
//! Both images are `FROM scratch`: one static (musl) binary, the CA certificates the
//! registry client may need, nothing else — no shell, no `nsenter`, no `kill` (the agent
//! does its own `setns(2)` and `kill(2)`). An image is built from bytes: one layer (a tar
//! with sorted entries, mtime 0, uid/gid 0, gzip without a timestamp), an OCI config with
//! the entrypoint, the user and the `org.opencontainers.image.*` labels, and an OCI
//! manifest. The same inputs give the same digests, byte for byte.
//!
//! An image is built for the architecture its binary's ELF header names (never a label
//! given beside it, so an arm64 image cannot hold an amd64 binary), and published as an
//! [`Index`]: the OCI image index over one image per architecture, which a node's runtime
//! resolves to its own platform. [`Index::push`] sends it to any registry through
//! nodewright's own OCI client.
//!
//! - the agent runs as root in the privileged stage Jobs (it must);
//! - the operator runs as `65532:65532` and writes only to its cache volume, so the pod
//!   can have a read-only root filesystem.

#![deny(missing_docs)]

use std::io::Write;
use std::path::{Path, PathBuf};

use flate2::Compression;
use serde_json::json;
use sha2::{Digest, Sha256};

/// OCI media types.
pub mod media {
    /// Image manifest.
    pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    /// Image config.
    pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    /// gzip-compressed layer.
    pub const LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    /// Image index (one manifest per platform).
    pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";
}

mod elf;
mod index;
pub use elf::{Arch, is_static, minimal_elf};
pub use index::Index;

/// Where the binaries live in the images.
pub const BIN_DIR: &str = "/usr/local/bin";

/// The user the operator runs as (the conventional "nonroot" of distroless images).
pub const NONROOT: &str = "65532:65532";

/// An image build failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An input could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An output could not be written.
    #[error("{path}: {source}")]
    Write {
        /// The file or directory.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A binary is not an executable for an architecture nodewright ships images for.
    #[error(
        "{path} is not an x86-64 or aarch64 ELF executable (ELF machine {machine:?}); nodewright's images are linux/amd64 and linux/arm64"
    )]
    UnknownArch {
        /// The file.
        path: String,
        /// Its ELF `e_machine`, when it is an ELF file at all.
        machine: Option<u16>,
    },
    /// Two images of an index are for the same architecture, or are not the same image.
    #[error("cannot index {0}")]
    Index(String),
    /// A binary is not statically linked, so it would not run `FROM scratch`.
    #[error(
        "{0} is not a static executable (an ELF with a program interpreter needs a libc the image does not have); build it for the musl target (`cargo xtask images` does)"
    )]
    NotStatic(String),
    /// Pushing failed.
    #[error(transparent)]
    Push(#[from] nodewright_oci::Error),
}

/// One of nodewright's images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageKind {
    /// `nodewright-agent`: privileged, root.
    Agent,
    /// `nodewright-operator`: non-root, read-only root filesystem.
    Operator,
}

impl ImageKind {
    /// Both, in publishing order.
    pub const ALL: [ImageKind; 2] = [ImageKind::Operator, ImageKind::Agent];

    /// The binary's name (and the repository's last segment without the prefix).
    pub fn binary(self) -> &'static str {
        match self {
            ImageKind::Agent => "nodewright-agent",
            ImageKind::Operator => "nodewright-operator",
        }
    }

    /// The repository name under a registry prefix: `agent`, `operator`.
    pub fn repository(self) -> &'static str {
        match self {
            ImageKind::Agent => "agent",
            ImageKind::Operator => "operator",
        }
    }

    fn user(self) -> &'static str {
        match self {
            ImageKind::Agent => "0:0",
            ImageKind::Operator => NONROOT,
        }
    }

    fn title(self) -> &'static str {
        match self {
            ImageKind::Agent => {
                "nodewright agent: runs one stage of a package in the wasm sandbox on a node"
            }
            ImageKind::Operator => "nodewright operator: rolls host packages out to nodes",
        }
    }
}

/// What an image is made of.
#[derive(Clone, Debug)]
pub struct Inputs {
    /// The static binary.
    pub binary: PathBuf,
    /// A PEM bundle of CA certificates, installed at `/etc/ssl/certs/ca-certificates.crt`.
    pub ca_bundle: Option<PathBuf>,
    /// `org.opencontainers.image.version`.
    pub version: String,
    /// `org.opencontainers.image.revision` (a commit).
    pub revision: String,
    /// `org.opencontainers.image.source`.
    pub source: String,
    /// `created`, RFC 3339 (the commit's time, so it does not change between builds).
    pub created: String,
}

/// What goes into an image: its files and how it runs. [`Image::build`] makes one for an
/// [`ImageKind`]; tests make others (a pause image for a real node).
#[derive(Clone, Debug)]
pub struct Contents {
    /// The architecture its executables are for.
    pub arch: Arch,
    /// `org.opencontainers.image.title`.
    pub title: String,
    /// `org.opencontainers.image.description`.
    pub description: String,
    /// `(path without the leading /, bytes, mode)`.
    pub files: Vec<(String, Vec<u8>, u32)>,
    /// The entrypoint.
    pub entrypoint: Vec<String>,
    /// `uid:gid`.
    pub user: String,
}

/// An assembled image.
#[derive(Clone, Debug)]
pub struct Image {
    /// Its title (the binary's name for nodewright's own).
    pub title: String,
    /// The gzip-compressed layer.
    pub layer: Vec<u8>,
    /// The config JSON.
    pub config: Vec<u8>,
    /// The manifest JSON.
    pub manifest: Vec<u8>,
    /// The architecture it runs on.
    pub arch: Arch,
    /// Its `org.opencontainers.image.*` labels (the index carries them too).
    labels: serde_json::Value,
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Read {
        path: path.display().to_string(),
        source,
    })
}

/// One tar entry: a directory (`None`) or a file's bytes and mode.
type Entry<'a> = (String, Option<(&'a [u8], u32)>);

/// The layer's tar: parent directories, then files, all sorted, owned by root, mtime 0.
fn layer_tar(files: &[(String, Vec<u8>, u32)]) -> Vec<u8> {
    let mut dirs: Vec<String> = Vec::new();
    for (path, _, _) in files {
        for dir in Path::new(path)
            .ancestors()
            .skip(1)
            .filter(|d| !d.as_os_str().is_empty())
        {
            let dir = format!("{}/", dir.display());
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    let mut entries: Vec<Entry<'_>> = dirs.into_iter().map(|d| (d, None)).collect();
    entries.extend(
        files
            .iter()
            .map(|(p, b, m)| (p.clone(), Some((b.as_slice(), *m)))),
    );
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let mut tar = tar::Builder::new(Vec::new());
    for (path, file) in entries {
        let mut h = tar::Header::new_ustar();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        match file {
            None => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                h.set_cksum();
                tar.append_data(&mut h, &path, std::io::empty())
                    .expect("writing to memory");
            }
            Some((bytes, mode)) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(mode);
                h.set_size(bytes.len() as u64);
                h.set_cksum();
                tar.append_data(&mut h, &path, bytes)
                    .expect("writing to memory");
            }
        }
    }
    tar.into_inner().expect("writing to memory")
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    // No file name, mtime 0: the same bytes always compress to the same bytes.
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), Compression::best());
    gz.write_all(bytes).expect("writing to memory");
    gz.finish().expect("writing to memory")
}

impl Image {
    /// Assembles `kind` from `inputs`, for the architecture the binary is built for.
    /// Refuses a binary that is not static or not for an architecture we ship.
    pub fn build(kind: ImageKind, inputs: &Inputs) -> Result<Image, Error> {
        let binary = read(&inputs.binary)?;
        let arch = Arch::of_elf(&binary).map_err(|machine| Error::UnknownArch {
            path: inputs.binary.display().to_string(),
            machine,
        })?;
        if !is_static(&binary) {
            return Err(Error::NotStatic(inputs.binary.display().to_string()));
        }
        let mut files = vec![(
            format!("{}/{}", BIN_DIR.trim_start_matches('/'), kind.binary()),
            binary,
            0o755,
        )];
        if let Some(ca) = &inputs.ca_bundle {
            files.push(("etc/ssl/certs/ca-certificates.crt".into(), read(ca)?, 0o644));
        }
        let contents = Contents {
            arch,
            title: kind.binary().into(),
            description: kind.title().into(),
            files,
            entrypoint: vec![format!("{BIN_DIR}/{}", kind.binary())],
            user: kind.user().into(),
        };
        Ok(Image::assemble(&contents, inputs))
    }

    /// Assembles `contents`, labelled with `inputs`' version, revision, source and time
    /// (its binary and CA bundle are not used).
    pub fn assemble(contents: &Contents, inputs: &Inputs) -> Image {
        let tar = layer_tar(&contents.files);
        let layer = gzip(&tar);
        let labels = json!({
            "org.opencontainers.image.title": contents.title,
            "org.opencontainers.image.description": contents.description,
            "org.opencontainers.image.version": inputs.version,
            "org.opencontainers.image.revision": inputs.revision,
            "org.opencontainers.image.source": inputs.source,
            "org.opencontainers.image.licenses": "Apache-2.0",
            "org.opencontainers.image.created": inputs.created,
        });
        let mut config = json!({
            "architecture": contents.arch.oci(),
            "os": "linux",
            "created": inputs.created,
            "config": {
                "Entrypoint": contents.entrypoint,
                "User": contents.user,
                "Env": [format!("PATH={BIN_DIR}")],
                "Labels": labels,
            },
            "rootfs": {"type": "layers", "diff_ids": [sha256(&tar)]},
            "history": [{"created": inputs.created, "created_by": "cargo xtask images (nodewright-images)"}],
        });
        if let Some(variant) = contents.arch.variant() {
            config["variant"] = variant.into();
        }
        let config = serde_json::to_vec(&config).expect("JSON");
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": media::MANIFEST,
            "config": {"mediaType": media::CONFIG, "digest": sha256(&config), "size": config.len()},
            "layers": [{"mediaType": media::LAYER, "digest": sha256(&layer), "size": layer.len()}],
            "annotations": labels,
        });
        let manifest = serde_json::to_vec(&manifest).expect("JSON");
        Image {
            title: contents.title.clone(),
            layer,
            config,
            manifest,
            arch: contents.arch,
            labels,
        }
    }

    /// `sha256:<hex>` of the manifest: the image's identity.
    pub fn digest(&self) -> String {
        sha256(&self.manifest)
    }

    /// Bytes a pull transfers (config, layer, manifest).
    pub fn compressed_size(&self) -> usize {
        self.layer.len() + self.config.len() + self.manifest.len()
    }

    /// Its layer, config and manifest, each named.
    fn blobs(&self) -> [(&'static str, &[u8]); 3] {
        [
            ("layer", &self.layer),
            ("config", &self.config),
            ("manifest", &self.manifest),
        ]
    }
}

/// The Debian/Ubuntu CA bundle, when this machine has one.
pub fn system_ca_bundle() -> Option<PathBuf> {
    let p = PathBuf::from("/etc/ssl/certs/ca-certificates.crt");
    p.is_file().then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn inputs(dir: &Path, interp: bool) -> Inputs {
        inputs_for(dir, Arch::Amd64, interp)
    }

    fn inputs_for(dir: &Path, arch: Arch, interp: bool) -> Inputs {
        let bin = dir.join(format!("bin-{}", arch.oci()));
        std::fs::write(&bin, minimal_elf(arch, interp)).unwrap();
        Inputs {
            binary: bin,
            ca_bundle: None,
            version: "0.1.0".into(),
            revision: "abc".into(),
            source: "https://example.org/nodewright".into(),
            created: "2026-12-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn the_same_inputs_give_the_same_digest() {
        let tmp = tempfile::tempdir().unwrap();
        let a = Image::build(ImageKind::Operator, &inputs(tmp.path(), false)).unwrap();
        // Touch the input: its mtime must not matter.
        std::thread::sleep(std::time::Duration::from_millis(10));
        let b = Image::build(ImageKind::Operator, &inputs(tmp.path(), false)).unwrap();
        assert_eq!(a.digest(), b.digest());
        let mut other = inputs(tmp.path(), false);
        other.revision = "def".into();
        assert_ne!(
            Image::build(ImageKind::Operator, &other).unwrap().digest(),
            a.digest()
        );
    }

    #[test]
    fn configs_say_who_runs_it_and_from_where() {
        let tmp = tempfile::tempdir().unwrap();
        let op: Value = serde_json::from_slice(
            &Image::build(ImageKind::Operator, &inputs(tmp.path(), false))
                .unwrap()
                .config,
        )
        .unwrap();
        assert_eq!(op["config"]["User"], NONROOT);
        assert_eq!(
            op["config"]["Entrypoint"][0],
            "/usr/local/bin/nodewright-operator"
        );
        assert_eq!(
            op["config"]["Labels"]["org.opencontainers.image.revision"],
            "abc"
        );
        let agent: Value = serde_json::from_slice(
            &Image::build(ImageKind::Agent, &inputs(tmp.path(), false))
                .unwrap()
                .config,
        )
        .unwrap();
        assert_eq!(agent["config"]["User"], "0:0");
    }

    #[test]
    fn a_dynamically_linked_binary_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(
            Image::build(ImageKind::Agent, &inputs(tmp.path(), true)),
            Err(Error::NotStatic(_))
        ));
    }

    #[test]
    fn the_architecture_is_the_binary_s_own() {
        let tmp = tempfile::tempdir().unwrap();
        let arm = Image::build(
            ImageKind::Agent,
            &inputs_for(tmp.path(), Arch::Arm64, false),
        )
        .unwrap();
        assert_eq!(arm.arch, Arch::Arm64);
        let config: Value = serde_json::from_slice(&arm.config).unwrap();
        assert_eq!(config["architecture"], "arm64");
        assert_eq!(config["variant"], "v8");
        let amd = Image::build(ImageKind::Agent, &inputs(tmp.path(), false)).unwrap();
        let config: Value = serde_json::from_slice(&amd.config).unwrap();
        assert_eq!(config["architecture"], "amd64");
        assert!(config.get("variant").is_none());

        // Any other machine (RISC-V here) is refused, naming it, as is a non-ELF file.
        let mut riscv = minimal_elf(Arch::Amd64, false);
        riscv[0x12..0x14].copy_from_slice(&243u16.to_le_bytes());
        let bin = tmp.path().join("riscv");
        std::fs::write(&bin, riscv).unwrap();
        let other = Inputs {
            binary: bin,
            ..inputs(tmp.path(), false)
        };
        let err = Image::build(ImageKind::Agent, &other).unwrap_err();
        assert!(
            matches!(
                err,
                Error::UnknownArch {
                    machine: Some(243),
                    ..
                }
            ),
            "{err}"
        );
        std::fs::write(&other.binary, "#!/bin/sh\n").unwrap();
        assert!(matches!(
            Image::build(ImageKind::Agent, &other),
            Err(Error::UnknownArch { machine: None, .. })
        ));
    }

    #[test]
    fn an_index_names_each_architecture_s_manifest() {
        let tmp = tempfile::tempdir().unwrap();
        let build =
            |arch| Image::build(ImageKind::Agent, &inputs_for(tmp.path(), arch, false)).unwrap();
        let (amd, arm) = (build(Arch::Amd64), build(Arch::Arm64));
        // Given in any order, listed in one: the same inputs give the same index.
        let index = Index::new(vec![arm.clone(), amd.clone()]).unwrap();
        assert_eq!(
            index.digest(),
            Index::new(vec![amd.clone(), arm.clone()]).unwrap().digest()
        );
        let json: Value = serde_json::from_slice(&index.index).unwrap();
        assert_eq!(json["mediaType"], media::INDEX);
        let manifests = json["manifests"].as_array().unwrap();
        let listed: Vec<(&str, &str, Option<&str>)> = manifests
            .iter()
            .map(|m| {
                (
                    m["digest"].as_str().unwrap(),
                    m["platform"]["architecture"].as_str().unwrap(),
                    m["platform"]["variant"].as_str(),
                )
            })
            .collect();
        assert_eq!(
            listed,
            [
                (amd.digest().as_str(), "amd64", None),
                (arm.digest().as_str(), "arm64", Some("v8"))
            ]
        );
        assert_eq!(manifests[0]["size"], amd.manifest.len());
        assert_eq!(
            json["annotations"]["org.opencontainers.image.revision"],
            "abc"
        );

        // The layout holds every blob the index reaches.
        let dir = tmp.path().join("layout");
        index.write_layout(&dir).unwrap();
        let blob = |digest: &str| {
            std::fs::read(
                dir.join("blobs/sha256")
                    .join(digest.trim_start_matches("sha256:")),
            )
            .unwrap()
        };
        let top: Value =
            serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
        assert_eq!(top["manifests"][0]["digest"], index.digest());
        assert_eq!(blob(&index.digest()), index.index);
        for image in [&amd, &arm] {
            let manifest: Value = serde_json::from_slice(&blob(&image.digest())).unwrap();
            blob(manifest["config"]["digest"].as_str().unwrap());
            blob(manifest["layers"][0]["digest"].as_str().unwrap());
        }
    }

    #[test]
    fn an_index_refuses_two_builds_of_one_architecture_or_two_images() {
        let tmp = tempfile::tempdir().unwrap();
        let agent = Image::build(ImageKind::Agent, &inputs(tmp.path(), false)).unwrap();
        let err = Index::new(vec![agent.clone(), agent.clone()]).unwrap_err();
        assert!(
            err.to_string().contains("two images for linux/amd64"),
            "{err}"
        );
        let operator = Image::build(
            ImageKind::Operator,
            &inputs_for(tmp.path(), Arch::Arm64, false),
        )
        .unwrap();
        let err = Index::new(vec![agent.clone(), operator]).unwrap_err();
        assert!(err.to_string().contains("one image"), "{err}");
        let mut later = inputs_for(tmp.path(), Arch::Arm64, false);
        later.version = "0.2.0".into();
        let later = Image::build(ImageKind::Agent, &later).unwrap();
        assert!(Index::new(vec![agent, later]).is_err());
        assert!(Index::new(Vec::new()).is_err());
    }

    #[test]
    fn the_layer_lists_parents_before_children_owned_by_root() {
        let tar = layer_tar(&[
            ("usr/local/bin/x".into(), b"x".to_vec(), 0o755),
            ("etc/ssl/certs/ca.crt".into(), b"c".to_vec(), 0o644),
        ]);
        let mut archive = tar::Archive::new(tar.as_slice());
        let names: Vec<(String, u64, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.header().mtime().unwrap(),
                    e.header().uid().unwrap(),
                )
            })
            .collect();
        let paths: Vec<&str> = names.iter().map(|(p, _, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "etc/",
                "etc/ssl/",
                "etc/ssl/certs/",
                "etc/ssl/certs/ca.crt",
                "usr/",
                "usr/local/",
                "usr/local/bin/",
                "usr/local/bin/x"
            ]
        );
        assert!(names.iter().all(|(_, m, u)| *m == 0 && *u == 0));
    }
}
