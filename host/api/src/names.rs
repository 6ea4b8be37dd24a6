//! Names and references the API accepts: NodeWright and package names, DNS labels,
//! plugin references, `configInterrupts` key patterns, and the reserved compartment.

/// The compartment name the default compartment uses; reserved.
pub const DEFAULT_COMPARTMENT: &str = "__default__";

/// Maximum NodeWright name length: per-CR annotation keys are `nodewright.io/<what>.<name>`
/// and the name part of an annotation key is at most 63 characters.
pub const MAX_NODEWRIGHT_NAME: usize = 48;

/// A DNS label of at most `max` characters: lowercase letters, digits and inner hyphens.
pub fn is_dns_label(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS subdomain (most object names, Secrets among them): dot-separated DNS labels,
/// at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(|l| is_dns_label(l, 63))
}

/// Package names: `^[a-z][-a-z0-9]{0,41}[a-z]$`, as NodeWright.
pub fn is_package_name(s: &str) -> bool {
    let b = s.as_bytes();
    (2..=43).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// Checks a plugin reference: `registry/repo[:tag]` or `registry/repo@sha256:<64 hex>`.
pub fn check_plugin_reference(r: &str) -> Result<(), String> {
    if r.is_empty() || r.chars().any(char::is_whitespace) {
        return Err("must be an OCI reference like registry.example.com/plugins/name:1.0.0".into());
    }
    let (name, digest) = match r.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (r, None),
    };
    if let Some(d) = digest {
        let ok = d.strip_prefix("sha256:").is_some_and(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if !ok {
            return Err(format!("digest {d:?} must be sha256:<64 lowercase hex>"));
        }
    }
    let Some((registry, path)) = name.split_once('/') else {
        return Err("must name a registry and a repository (registry/repo)".into());
    };
    if !(registry.contains('.') || registry.contains(':') || registry == "localhost") {
        return Err(format!(
            "{registry:?} is not a registry host; references must be fully qualified"
        ));
    }
    let (repo, tag) = match path.rsplit_once(':') {
        Some((repo, tag)) => (repo, Some(tag)),
        None => (path, None),
    };
    if repo.is_empty()
        || !repo.split('/').all(|c| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        })
    {
        return Err(format!(
            "repository {repo:?} must be lowercase path components"
        ));
    }
    if let Some(tag) = tag
        && (tag.is_empty()
            || tag.len() > 128
            || !tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)))
    {
        return Err(format!("tag {tag:?} is not a valid tag"));
    }
    if tag.is_none() && digest.is_none() {
        return Err("must pin a tag or a digest (no implicit :latest)".into());
    }
    Ok(())
}

/// Whether a `configInterrupts` key pattern (an exact key, or one `*` glob) matches a
/// config key. Shared by validation and the planner so both read patterns the same way.
pub fn config_key_matches(pattern: &str, key: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == key,
        Some((pre, post)) => {
            key.len() >= pre.len() + post.len()
                && key.starts_with(pre)
                && key.ends_with(post)
                && !post.contains('*')
        }
    }
}
