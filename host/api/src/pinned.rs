//! A plugin reference pinned by digest, checked once where it enters and carried typed
//! from there: the operator's resolution, the node's record, the agent's call.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use crate::names::check_plugin_reference;

/// `registry/repository[:tag]@sha256:<64 lowercase hex>`: what nodes pull, what a node's
/// state records as run, what signatures and trust policies judge. Parsing checks the
/// grammar of [`check_plugin_reference`] and requires the digest; nothing else about a
/// reference (the registry, the repository, the digest) is ever split out of a string
/// again. No I/O.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PinnedRef {
    text: String,
    /// Byte offset of the `@` before the digest.
    at: usize,
}

/// A reference that is not pinned, or not a reference.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reference:?}: {reason}")]
pub struct NotPinned {
    /// The text given.
    pub reference: String,
    /// What is wrong with it.
    pub reason: String,
}

impl PinnedRef {
    /// Parses a pinned reference.
    pub fn parse(reference: &str) -> Result<Self, NotPinned> {
        let fail = |reason: String| NotPinned {
            reference: reference.into(),
            reason,
        };
        check_plugin_reference(reference).map_err(fail)?;
        let at = reference.rfind('@').ok_or_else(|| {
            fail("not pinned: nodes pull only by digest (repo@sha256:...)".into())
        })?;
        Ok(PinnedRef {
            text: reference.into(),
            at,
        })
    }

    /// The whole reference, as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// `registry/repository`, without tag or digest (where signatures live beside it).
    pub fn repository(&self) -> &str {
        let name = &self.text[..self.at];
        match name.rsplit_once(':') {
            // A `:` after the last `/` is a tag; before it, a registry's port.
            Some((repo, tag)) if !tag.contains('/') => repo,
            _ => name,
        }
    }

    /// `sha256:<64 hex>`.
    pub fn digest(&self) -> &str {
        &self.text[self.at + 1..]
    }

    /// The 64 hex characters of the digest.
    pub fn hex(&self) -> &str {
        &self.digest()["sha256:".len()..]
    }
}

impl FromStr for PinnedRef {
    type Err = NotPinned;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PinnedRef::parse(s)
    }
}

impl TryFrom<String> for PinnedRef {
    type Error = NotPinned;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        PinnedRef::parse(&s)
    }
}

impl From<PinnedRef> for String {
    fn from(p: PinnedRef) -> String {
        p.text
    }
}

impl fmt::Display for PinnedRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl AsRef<str> for PinnedRef {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

impl JsonSchema for PinnedRef {
    fn schema_name() -> Cow<'static, str> {
        "PinnedRef".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        String::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(c: char) -> String {
        c.to_string().repeat(64)
    }

    #[test]
    fn the_parts_of_a_pinned_reference() {
        let r = PinnedRef::parse(&format!(
            "reg.example:5000/plugins/sysctl@sha256:{}",
            hex('a')
        ))
        .unwrap();
        assert_eq!(r.repository(), "reg.example:5000/plugins/sysctl");
        assert_eq!(r.digest(), format!("sha256:{}", hex('a')));
        assert_eq!(r.hex(), hex('a'));
        let tagged =
            PinnedRef::parse(&format!("reg.example:5000/p/x:1.0@sha256:{}", hex('b'))).unwrap();
        assert_eq!(tagged.repository(), "reg.example:5000/p/x");
        assert_eq!(tagged.to_string(), tagged.as_str());
    }

    #[test]
    fn tags_bad_digests_and_junk_are_refused_naming_the_text() {
        for bad in [
            "reg.example/plugins/sysctl:1.0.0".to_string(),
            "reg.example/plugins/sysctl@sha256:00".into(),
            format!("reg.example/plugins/sysctl@sha512:{}", hex('a')),
            format!("sysctl@sha256:{}", hex('a')),
            String::new(),
        ] {
            let e = PinnedRef::parse(&bad).unwrap_err();
            assert_eq!(e.reference, bad);
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn serde_checks_on_the_way_in_and_writes_the_text() {
        let text = format!("reg.example/p/x@sha256:{}", hex('c'));
        let r: PinnedRef = serde_json::from_value(serde_json::json!(text)).unwrap();
        assert_eq!(serde_json::to_value(&r).unwrap(), serde_json::json!(text));
        assert!(
            serde_json::from_value::<PinnedRef>(serde_json::json!("reg.example/p/x:1")).is_err()
        );
    }
}
