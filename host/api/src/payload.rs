//! Payloads: the files a package carries beside its component, named once here for the
//! artifact (the layer's title), the node (the tree it unpacks to) and the sandbox (the
//! directory the guest reads them from).

use std::fmt;
use std::path::{Component, Path, PathBuf};

use crate::pinned::PinnedRef;

use serde::{Deserialize, Serialize};

/// Where the guest sees its payloads: `/payload/<name>`, read-only.
pub const GUEST_ROOT: &str = "/payload";

/// The longest payload name.
pub const MAX_NAME: usize = 128;

/// A payload's name: ASCII letters, digits, `.`, `_` and `-`, starting with a letter or a
/// digit, at most [`MAX_NAME`] bytes — one path component that is never `.`, `..` or
/// hidden, so `/payload/<name>` is always a directory of its own.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PayloadName(String);

/// A name that is not a payload name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{name:?} is not a payload name: {reason}")]
pub struct BadName {
    /// The text given.
    pub name: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl PayloadName {
    /// Checks `name`.
    pub fn parse(name: &str) -> Result<Self, BadName> {
        let bad = |reason| BadName {
            name: name.into(),
            reason,
        };
        let first = name.bytes().next().ok_or_else(|| bad("it is empty"))?;
        if name.len() > MAX_NAME {
            return Err(bad("it is longer than 128 bytes"));
        }
        if !first.is_ascii_alphanumeric() {
            return Err(bad("it must start with a letter or a digit"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(bad("only letters, digits, '.', '_' and '-' are allowed"));
        }
        Ok(PayloadName(name.into()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Where the guest reads this payload.
    pub fn guest_path(&self) -> String {
        format!("{GUEST_ROOT}/{}", self.0)
    }
}

/// Whether `rel` names something below a payload's root: relative, not empty, and nothing
/// but plain names (no `..`, no root) — what a payload file may be called, by the plugin
/// (`files.install`'s source) and again by the host that opens it.
pub fn is_below_root(rel: &Path) -> bool {
    !rel.as_os_str().is_empty() && rel.components().all(|c| matches!(c, Component::Normal(_)))
}

/// A payload taken from a container image rather than the plugin's artifact: the image's
/// layers applied in order into one read-only tree (only what lies under `path` in the
/// image, re-rooted there). Written `NAME=IMAGE@sha256:HEX` or `NAME=IMAGE@sha256:HEX#/PATH`
/// on an agent's command line.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImagePayload {
    /// The payload's name (`/payload/<name>` to the guest).
    pub name: PayloadName,
    /// The image (or image index), pinned by digest.
    pub image: PinnedRef,
    /// Where in the image the payload's root is: relative, plain names only (empty: the
    /// image's root).
    pub path: PathBuf,
}

impl ImagePayload {
    /// `path` as the image spells it (`/opt/driver`), normalised to what [`ImagePayload::path`]
    /// holds; `None` when it leaves the image's root or is not absolute.
    pub fn image_path(path: &str) -> Option<PathBuf> {
        let p = Path::new(path);
        if !p.is_absolute() {
            return None;
        }
        let mut out = PathBuf::new();
        for c in p.components() {
            match c {
                Component::RootDir | Component::CurDir => {}
                Component::Normal(n) => out.push(n),
                Component::ParentDir | Component::Prefix(_) => return None,
            }
        }
        Some(out)
    }
}

impl fmt::Display for ImagePayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.image)?;
        if !self.path.as_os_str().is_empty() {
            write!(f, "#/{}", self.path.display())?;
        }
        Ok(())
    }
}

impl std::str::FromStr for ImagePayload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, image, path) = image_source(s)?;
        Ok(ImagePayload {
            name,
            image: image
                .parse()
                .map_err(|e: crate::pinned::NotPinned| e.to_string())?,
            path,
        })
    }
}

/// `NAME=IMAGE[#/PATH]` split into the payload's name, the image reference as written (a
/// tag or a digest: the caller decides which it takes) and the path inside the image.
pub fn image_source(s: &str) -> Result<(PayloadName, &str, PathBuf), String> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=IMAGE[#/PATH]"))?;
    let (image, path) = match rest.split_once('#') {
        Some((image, path)) => (
            image,
            ImagePayload::image_path(path)
                .ok_or_else(|| format!("{path:?} is not an absolute path inside the image"))?,
        ),
        None => (rest, PathBuf::new()),
    };
    let name = PayloadName::parse(name).map_err(|e| e.to_string())?;
    Ok((name, image, path))
}

impl fmt::Display for PayloadName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for PayloadName {
    type Error = BadName;
    fn try_from(s: String) -> Result<Self, BadName> {
        PayloadName::parse(&s)
    }
}

impl From<PayloadName> for String {
    fn from(n: PayloadName) -> String {
        n.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_payloads_parse_what_they_print() {
        let pinned = format!("reg.example:5000/nvidia/driver@sha256:{}", "a".repeat(64));
        for text in [
            format!("driver={pinned}"),
            format!("driver={pinned}#/opt/nvidia/560"),
        ] {
            let p: ImagePayload = text.parse().unwrap();
            assert_eq!(p.to_string(), text);
        }
        let p: ImagePayload = format!("fw={pinned}#/lib/./firmware/").parse().unwrap();
        assert_eq!(p.path, PathBuf::from("lib/firmware"));
        for bad in [
            "driver=reg.example/nvidia/driver:560#/opt".to_string(),
            format!(".x={pinned}"),
            format!("driver={pinned}#opt"),
            format!("driver={pinned}#/opt/../etc"),
            pinned.clone(),
        ] {
            assert!(bad.parse::<ImagePayload>().is_err(), "{bad}");
        }
    }

    #[test]
    fn names() {
        for ok in ["nvidia-560.35.03.ko", "firmware", "a", "x_1"] {
            assert_eq!(PayloadName::parse(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "-x",
            "a/b",
            "a b",
            "a\0",
            "é",
            &"a".repeat(129),
        ] {
            assert!(PayloadName::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            PayloadName::parse("fw").unwrap().guest_path(),
            "/payload/fw"
        );
        for ok in ["lib/nvidia.ko", "a", "a/./b"] {
            assert!(is_below_root(Path::new(ok)), "{ok}");
        }
        for bad in ["", "/etc/shadow", "../x", "a/../../x", "."] {
            assert!(!is_below_root(Path::new(bad)), "{bad}");
        }
    }
}
