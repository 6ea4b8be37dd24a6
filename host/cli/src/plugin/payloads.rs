//! `--payload [NAME=]PATH`: the files a package carries, for `plugin push` (packed into the
//! artifact) and `plugin run` (served to the plugin as a node serves them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::Context as _;
use nodewright_api::payload::{ImagePayload, PayloadName};
use nodewright_oci::artifact::Descriptor;
use nodewright_oci::payload::{PAYLOAD_LAYER, Payload, UnpackLimits, pack};
use nodewright_oci::{NodeCache, PayloadFile, Puller};

/// A payload given on the command line: a file or a directory, and its name (by default
/// the file or directory name).
#[derive(Clone, Debug)]
pub struct PayloadArg {
    pub name: PayloadName,
    pub path: PathBuf,
}

impl FromStr for PayloadArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, path) = match s.split_once('=') {
            Some((name, path)) => (name.to_string(), PathBuf::from(path)),
            None => {
                let path = PathBuf::from(s);
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .ok_or_else(|| format!("{s:?}: name the payload: NAME={s}"))?;
                (name, path)
            }
        };
        let name = PayloadName::parse(&name).map_err(|e| format!("{e} (give one: NAME=PATH)"))?;
        Ok(PayloadArg { name, path })
    }
}

/// `--payload-image NAME=IMAGE[#/PATH]`: a payload taken from a container image (a tag or
/// a digest; an index narrowed to this machine's platform), as a spec's
/// `payloads: [{name, image, path}]` gives it to a node.
#[derive(Clone, Debug)]
pub struct ImageArg {
    pub name: PayloadName,
    pub image: String,
    /// Relative, plain names (empty: the whole image).
    pub path: PathBuf,
}

impl FromStr for ImageArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, image, path) = nodewright_api::payload::image_source(s)?;
        nodewright_api::names::check_plugin_reference(image)
            .map_err(|e| format!("{image:?}: {e}"))?;
        Ok(ImageArg {
            name,
            image: image.into(),
            path,
        })
    }
}

/// Each `--payload-image` pinned (a tag resolved) and staged in `puller`'s cache as a node
/// stages it, added to `trees`; a name already there is refused, as a node refuses it.
pub async fn stage_images(
    puller: &Puller,
    args: &[ImageArg],
    trees: &mut BTreeMap<PayloadName, PathBuf>,
    progress: &(dyn Fn(nodewright_oci::Progress) + Sync),
) -> anyhow::Result<()> {
    for arg in args {
        if trees.contains_key(&arg.name) {
            anyhow::bail!(
                "--payload-image {}: a payload is already named so",
                arg.name
            );
        }
        let image = puller.registry().pinned(&arg.image).await?;
        let payload = ImagePayload {
            name: arg.name.clone(),
            image,
            path: arg.path.clone(),
        };
        let staged = puller
            .stage_image(&payload, progress)
            .await
            .with_context(|| format!("--payload-image {}", arg.name))?;
        trees.insert(staged.name, staged.tree);
    }
    Ok(())
}

fn distinct(args: &[PayloadArg]) -> anyhow::Result<()> {
    for (i, arg) in args.iter().enumerate() {
        if args[..i].iter().any(|a| a.name == arg.name) {
            anyhow::bail!("two payloads are named {}", arg.name);
        }
    }
    Ok(())
}

fn context(arg: &PayloadArg) -> String {
    format!("--payload {}={}", arg.name, arg.path.display())
}

/// Each payload packed in memory as its layer will be (for a local run), refused (naming
/// the file) for what a node would refuse; names must be distinct.
fn packed(args: &[PayloadArg]) -> anyhow::Result<Vec<(PayloadName, Vec<u8>)>> {
    distinct(args)?;
    args.iter()
        .map(|arg| {
            let tar = pack(&arg.name, &arg.path).with_context(|| context(arg))?;
            Ok((arg.name.clone(), tar))
        })
        .collect()
}

/// The payloads of a push, each packed into a tar file under a directory of this process's
/// own (removed when dropped), so a payload of any size is never held in memory.
pub struct PackedFiles {
    dir: PathBuf,
    pub files: Vec<PayloadFile>,
}

impl PackedFiles {
    pub fn pack(args: &[PayloadArg]) -> anyhow::Result<Self> {
        distinct(args)?;
        let dir = std::env::temp_dir().join(format!("nodewright-push-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let mut packed = PackedFiles {
            dir,
            files: Vec::with_capacity(args.len()),
        };
        for arg in args {
            let dest = packed.dir.join(format!("{}.tar", arg.name));
            let file = PayloadFile::pack(arg.name.clone(), &arg.path, dest)
                .with_context(|| context(arg))?;
            packed.files.push(file);
        }
        Ok(packed)
    }
}

impl Drop for PackedFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Local payloads staged as a node stages them — packed, stored by digest in the local
/// cache (laid out like a node's) and unpacked into its read-only trees — over `trees`
/// (a pulled artifact's payloads), a local one replacing a pulled one of the same name.
pub fn stage_local(
    cache_root: &Path,
    args: &[PayloadArg],
    mut trees: BTreeMap<PayloadName, PathBuf>,
) -> anyhow::Result<BTreeMap<PayloadName, PathBuf>> {
    if args.is_empty() {
        return Ok(trees);
    }
    let cache = NodeCache::open(cache_root)?;
    for (name, tar) in packed(args)? {
        let digest = nodewright_oci::sha256_digest(&tar);
        cache.put_blob(&digest, &tar)?;
        let payload = Payload {
            name: name.clone(),
            layer: Descriptor::new(PAYLOAD_LAYER, digest, tar.len() as i64),
        };
        let tree = cache
            .payload_tree("--payload", &payload, UnpackLimits::default())?
            .context("the payload's blob vanished from the local cache")?;
        trees.insert(name, tree);
    }
    Ok(trees)
}
