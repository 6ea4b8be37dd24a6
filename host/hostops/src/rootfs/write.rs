//! Atomic whole-file writes under a grant.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use cap_std::fs::{Dir, MetadataExt, OpenOptions, OpenOptionsExt};
use nodewright_api::grants::GrantedPath;

use super::resolve::{Last, Resolve};
use super::{FileKind, PERMISSION_BITS, RootFs, Scoped, WriteOptions, kind_of, safe_open_flags};
use crate::{HostError, Result};

/// Creates `name` in `dir` for writing, mode `0600` whatever the umask, never through a
/// symlink and never over an existing file.
pub(super) fn create_private(dir: &Dir, name: &str) -> std::io::Result<std::fs::File> {
    let mut open = OpenOptions::new();
    open.write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(safe_open_flags(false));
    Ok(dir.open_with(name, &open)?.into_std())
}

impl RootFs {
    /// Writes a whole file atomically: a temp file beside it (mode `0600` until it is
    /// complete, so a secret is never readable half-written), then rename. Creates parents
    /// (at most `options.max_new_dirs`) and returns how many directories it made.
    // Long on purpose: open parent, temp file, mode, owner, sync and rename are one
    // sequence on the same handles; a failure at any step removes the temp file.
    pub fn write(
        &self,
        base: GrantedPath<'_>,
        path: &Path,
        contents: &[u8],
        options: &WriteOptions,
    ) -> Result<u32> {
        let how = Resolve {
            last: Last::Entry,
            create: Some(options.max_new_dirs.unwrap_or(u32::MAX)),
        };
        let Scoped { dir, rel, made, .. } = self.resolve(base, path, how)?;
        let name = rel
            .file_name()
            .ok_or_else(|| HostError::NotFound(path.display().to_string()))?;
        let existing = dir.symlink_metadata(name).ok();
        if existing.as_ref().is_some_and(|m| m.is_symlink()) {
            // Replacing the link would surprise; following it could leave the grant.
            return Err(HostError::Symlink(path.display().to_string()));
        }
        if existing.as_ref().is_some_and(|m| m.is_dir()) {
            return Err(HostError::io(
                "write",
                path,
                std::io::Error::other("is a directory"),
            ));
        }
        if existing
            .as_ref()
            .is_some_and(|m| kind_of(m) == FileKind::Other)
        {
            return Err(HostError::NotRegular {
                path: path.display().to_string(),
                kind: "a device, socket or FIFO".into(),
            });
        }
        if options.min_free_bytes > 0 {
            let fd = dir
                .open(".")
                .map_err(|e| self.map("write", path, base.path, e))?;
            let st =
                rustix::fs::fstatvfs(&fd).map_err(|e| HostError::io("statvfs", path, e.into()))?;
            let available = st.f_bavail.saturating_mul(st.f_frsize);
            if available < (contents.len() as u64).saturating_add(options.min_free_bytes) {
                return Err(HostError::DiskFloor {
                    path: path.display().to_string(),
                    available,
                    needed: contents.len() as u64,
                    floor: options.min_free_bytes,
                });
            }
        }
        let mask = if options.special_modes {
            0o7777
        } else {
            PERMISSION_BITS
        };
        let mode = options
            .mode
            .or_else(|| existing.as_ref().map(|m| m.mode()))
            .unwrap_or(0o644)
            & mask;
        let tmp = format!(
            ".{}.nodewright-{}.tmp",
            name.to_string_lossy(),
            std::process::id()
        );
        let result = (|| -> std::io::Result<()> {
            let mut file = create_private(&dir, &tmp)?;
            file.write_all(contents)?;
            if let Some(m) = &existing {
                // Keep ownership of the file being replaced (before the mode: a chown
                // clears setuid and setgid).
                std::os::unix::fs::fchown(&file, Some(m.uid()), Some(m.gid()))?;
            }
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
            file.sync_all()?;
            dir.rename(&tmp, &dir, name)
        })();
        if let Err(e) = result {
            let _ = dir.remove_file(&tmp);
            return Err(self.map("write", path, base.path, e));
        }
        Ok(made)
    }
}
