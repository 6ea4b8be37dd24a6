//! `files`: drop configuration files on the host.
//!
//! Config:
//! - `file:<absolute path>`: the file's content, e.g. `file:/etc/containerd/conf.d/10-mirror.toml`;
//! - `mode:<path>`: octal permissions (default `0644`);
//! - `owner:<path>`: `uid:gid` (default: unchanged, root for new files);
//! - `restart`: comma-separated units to restart when any file changed (reported as a
//!   `services` interrupt, performed by the host, not by this plugin).
//!
//! `plan` shows, per file, whether it is created, how many lines differ, and mode/owner
//! drift. `uninstall` removes the files.
//!
//! Grants: `files: [{path: <each file or its directory>, access: readWrite}]`.

use nodewright_sdk::{
    Change, Context, Interrupt, Outcome, Package, StepError, describe_file_change, export_package,
};

/// One managed file.
#[derive(Debug, PartialEq, Eq)]
pub struct Managed {
    /// Absolute host path.
    pub path: String,
    /// Content.
    pub content: String,
    /// Permissions.
    pub mode: u32,
    /// Owner, when set.
    pub owner: Option<(u32, u32)>,
}

/// Parses `file:`, `mode:` and `owner:` keys.
pub fn managed(
    config: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<Managed>, StepError> {
    let mut out = Vec::new();
    for (key, content) in config {
        let Some(path) = key.strip_prefix("file:") else {
            continue;
        };
        if !path.starts_with('/') || path.split('/').any(|p| p == "..") {
            return Err(StepError::invalid_config(format!(
                "{key:?}: the path must be absolute, without '..'"
            )));
        }
        let mode = match config.get(&format!("mode:{path}")) {
            Some(m) => u32::from_str_radix(m.trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| {
                    StepError::invalid_config(format!("mode:{path} = {m:?} is not an octal mode"))
                })?,
            None => 0o644,
        };
        let owner = match config.get(&format!("owner:{path}")) {
            Some(o) => {
                let parsed = o
                    .split_once(':')
                    .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)));
                Some(parsed.ok_or_else(|| {
                    StepError::invalid_config(format!("owner:{path} = {o:?} is not uid:gid"))
                })?)
            }
            None => None,
        };
        out.push(Managed {
            path: path.to_string(),
            content: content.clone(),
            mode,
            owner,
        });
    }
    for key in config.keys() {
        if let Some(path) = key
            .strip_prefix("mode:")
            .or_else(|| key.strip_prefix("owner:"))
            && !config.contains_key(&format!("file:{path}"))
        {
            return Err(StepError::invalid_config(format!(
                "{key:?} has no matching file:{path}"
            )));
        }
    }
    if out.is_empty() {
        return Err(StepError::invalid_config("no file:<path> keys configured"));
    }
    Ok(out)
}

fn drift(ctx: &Context, files: &[Managed]) -> Result<Vec<Change>, StepError> {
    let fs = ctx.files();
    let mut changes = Vec::new();
    for f in files {
        let current = fs.read_opt(&f.path)?;
        let mut details = Vec::new();
        if let Some(d) = describe_file_change(current.as_deref(), f.content.as_bytes()) {
            details.push(d);
        }
        if current.is_some()
            && let Some(st) = fs.stat(&f.path)?
        {
            if st.mode != f.mode {
                details.push(format!("mode {:04o} -> {:04o}", st.mode, f.mode));
            }
            if let Some((uid, gid)) = f.owner
                && (st.uid, st.gid) != (uid, gid)
            {
                details.push(format!("owner {}:{} -> {uid}:{gid}", st.uid, st.gid));
            }
        }
        if !details.is_empty() {
            changes.push(Change::new("file", &f.path, details.join(", ")));
        }
    }
    Ok(changes)
}

fn interrupt_for(ctx: &Context, changes: &[Change]) -> Interrupt {
    match ctx.config("restart") {
        Some(units) if !changes.is_empty() => Interrupt::Services(
            units
                .split(',')
                .map(|u| u.trim().to_string())
                .filter(|u| !u.is_empty())
                .collect(),
        ),
        _ => Interrupt::None,
    }
}

struct Files;

impl Package for Files {
    fn plan(ctx: &Context) -> Result<Outcome, StepError> {
        let changes = drift(ctx, &managed(&ctx.config)?)?;
        let interrupt = interrupt_for(ctx, &changes);
        Ok(Outcome::changed(changes, interrupt))
    }

    fn apply(ctx: &Context) -> Result<Outcome, StepError> {
        let files = managed(&ctx.config)?;
        let changes = drift(ctx, &files)?;
        let fs = ctx.files();
        for f in files
            .iter()
            .filter(|f| changes.iter().any(|c| c.target == f.path))
        {
            fs.write(&f.path, f.content.as_bytes(), Some(f.mode))?;
            fs.set_mode(&f.path, f.mode)?;
            if let Some((uid, gid)) = f.owner {
                fs.set_owner(&f.path, uid, gid)?;
            }
        }
        let interrupt = interrupt_for(ctx, &changes);
        Ok(Outcome::changed(changes, interrupt))
    }

    fn uninstall(ctx: &Context) -> Result<Outcome, StepError> {
        let mut changes = Vec::new();
        for f in managed(&ctx.config)? {
            if ctx.files().stat(&f.path)?.is_some() {
                ctx.files().remove(&f.path)?;
                changes.push(Change::new("file", &f.path, "removed"));
            }
        }
        Ok(Outcome::changed(changes, Interrupt::None))
    }
}

export_package!(Files);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn cfg(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_files_with_mode_and_owner() {
        let m = managed(&cfg(&[
            ("file:/etc/a.conf", "x"),
            ("mode:/etc/a.conf", "0600"),
            ("owner:/etc/a.conf", "0:10"),
        ]))
        .unwrap();
        assert_eq!(
            m,
            [Managed {
                path: "/etc/a.conf".into(),
                content: "x".into(),
                mode: 0o600,
                owner: Some((0, 10))
            }]
        );
    }

    #[test]
    fn rejects_bad_entries() {
        assert!(managed(&cfg(&[("file:etc/a", "x")])).is_err());
        assert!(managed(&cfg(&[("file:/etc/../a", "x")])).is_err());
        assert!(managed(&cfg(&[("file:/a", "x"), ("mode:/a", "999")])).is_err());
        assert!(managed(&cfg(&[("file:/a", "x"), ("mode:/b", "0600")])).is_err());
        assert!(managed(&cfg(&[("other", "x")])).is_err());
    }
}
