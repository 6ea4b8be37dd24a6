//! `--payload [NAME=]PATH`: the files a package carries, for `plugin push` (packed into the
//! artifact) and `plugin run` (served to the plugin as a node serves them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::Context as _;
use nodewright_api::payload::PayloadName;
use nodewright_oci::NodeCache;
use nodewright_oci::artifact::Descriptor;
use nodewright_oci::payload::{PAYLOAD_LAYER, Payload, UnpackLimits, pack};

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

/// Each payload packed as its layer will be, refused (naming the file) for what a node
/// would refuse; names must be distinct.
pub fn packed(args: &[PayloadArg]) -> anyhow::Result<Vec<(PayloadName, Vec<u8>)>> {
    let mut out: Vec<(PayloadName, Vec<u8>)> = Vec::with_capacity(args.len());
    for arg in args {
        if out.iter().any(|(n, _)| *n == arg.name) {
            anyhow::bail!("two payloads are named {}", arg.name);
        }
        let tar = pack(&arg.name, &arg.path)
            .with_context(|| format!("--payload {}={}", arg.name, arg.path.display()))?;
        out.push((arg.name.clone(), tar));
    }
    Ok(out)
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
