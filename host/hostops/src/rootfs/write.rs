//! Atomic whole-file writes under a grant.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, MetadataExt, OpenOptions, OpenOptionsExt};
use nodewright_api::grants::GrantedPath;

use super::resolve::{Last, Resolve};
use super::{FileKind, PERMISSION_BITS, RootFs, Scoped, WriteOptions, kind_of, safe_open_flags};
use crate::{HostError, Result};

/// Creates `name` in `dir` for writing (and reading back), mode `0600` whatever the umask,
/// never through a symlink and never over an existing file.
pub(super) fn create_private(dir: &Dir, name: &str) -> std::io::Result<std::fs::File> {
    let mut open = OpenOptions::new();
    open.read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(safe_open_flags(false));
    Ok(dir.open_with(name, &open)?.into_std())
}

/// What a write puts in the file.
enum Source<'a> {
    /// Bytes in hand (`files.write`).
    Bytes(&'a [u8]),
    /// A file of a payload tree, streamed (`files.install`), its length known.
    File(std::fs::File, u64),
}

impl Source<'_> {
    fn len(&self) -> u64 {
        match self {
            Source::Bytes(b) => b.len() as u64,
            Source::File(_, len) => *len,
        }
    }

    /// Fills `out`: the bytes, or the file copied while hashed, then the written file read
    /// back and hashed again — the two must match (a source that changed under the copy,
    /// or a write the disk did not keep, is an error, not an installed file).
    fn fill(self, out: &mut std::fs::File) -> std::io::Result<()> {
        use sha2::Digest as _;
        use std::io::{Read as _, Seek as _};
        match self {
            Source::Bytes(b) => out.write_all(b),
            Source::File(file, len) => {
                let mut copied = Hashing::new(file.take(len));
                let n = std::io::copy(&mut copied, out)?;
                if n != len {
                    return Err(std::io::Error::other(format!(
                        "the payload file ended at {n} of {len} bytes"
                    )));
                }
                out.sync_all()?;
                out.rewind()?;
                let mut again = Hashing::new(&*out);
                std::io::copy(&mut again, &mut std::io::sink())?;
                if copied.hasher.finalize() != again.hasher.finalize() {
                    return Err(std::io::Error::other(
                        "the bytes written differ from the payload's",
                    ));
                }
                Ok(())
            }
        }
    }
}

/// A reader that hashes what it reads.
struct Hashing<R> {
    inner: R,
    hasher: sha2::Sha256,
}

impl<R> Hashing<R> {
    fn new(inner: R) -> Self {
        use sha2::Digest as _;
        Hashing {
            inner,
            hasher: sha2::Sha256::new(),
        }
    }
}

impl<R: std::io::Read> std::io::Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use sha2::Digest as _;
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Opens the regular file `rel` inside the payload tree `tree`: relative, no `..`, never
/// through a link (cap-std keeps every step inside the tree, and a link at the end is
/// refused), and a regular file.
/// (`op` names the operation in an I/O error.) Returns the file and its metadata.
pub(crate) fn open_payload_file(
    op: &'static str,
    tree: &Path,
    rel: &Path,
) -> Result<(std::fs::File, std::fs::Metadata)> {
    let shown = || rel.display().to_string();
    if !nodewright_api::payload::is_below_root(rel) {
        return Err(HostError::Escape {
            path: shown(),
            base: tree.display().to_string(),
        });
    }
    let dir =
        Dir::open_ambient_dir(tree, ambient_authority()).map_err(|e| HostError::io(op, tree, e))?;
    let mut open = OpenOptions::new();
    open.read(true).custom_flags(safe_open_flags(false));
    let file = dir.open_with(rel, &open).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => HostError::NotFound(shown()),
        _ if is_link_refusal(&e) => HostError::Symlink(shown()),
        _ => HostError::io(op, rel, e),
    })?;
    let file = file.into_std();
    let meta = file.metadata().map_err(|e| HostError::io(op, rel, e))?;
    if !meta.is_file() {
        return Err(HostError::NotRegular {
            path: shown(),
            kind: if meta.is_dir() {
                "a directory"
            } else {
                "not a regular file"
            }
            .into(),
        });
    }
    Ok((file, meta))
}

/// `ELOOP` from `O_NOFOLLOW` on a link, or cap-std's refusal to leave the tree.
fn is_link_refusal(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
        || (e.kind() == std::io::ErrorKind::PermissionDenied
            && e.to_string().contains("outside of the filesystem"))
}

impl RootFs {
    /// Writes a whole file atomically: a temp file beside it (mode `0600` until it is
    /// complete, so a secret is never readable half-written), then rename. Creates parents
    /// (at most `options.max_new_dirs`) and returns how many directories it made.
    pub fn write(
        &self,
        base: GrantedPath<'_>,
        path: &Path,
        contents: &[u8],
        options: &WriteOptions,
    ) -> Result<u32> {
        self.write_from("write", base, path, Source::Bytes(contents), options)
    }

    /// Installs the regular file `rel` of the payload tree `tree` at `path`, as
    /// [`RootFs::write`] writes (atomic, parents made, the disk floor kept), streaming the
    /// bytes and checking what was written against what was read. `rel` is opened inside
    /// `tree` (never through `..` or a link). Without a mode the file gets `0o755` when the
    /// payload file has an execute bit, else `0o644` (whatever a replaced file had).
    /// Returns the directories made and the bytes installed.
    pub fn install(
        &self,
        base: GrantedPath<'_>,
        path: &Path,
        tree: &Path,
        rel: &Path,
        options: &WriteOptions,
    ) -> Result<(u32, u64)> {
        let (source, meta) = open_payload_file("install", tree, rel)?;
        let len = meta.len();
        let mut options = *options;
        options.mode = options
            .mode
            .or(Some(if meta.permissions().mode() & 0o111 != 0 {
                0o755
            } else {
                0o644
            }));
        let made = self.write_from("install", base, path, Source::File(source, len), &options)?;
        Ok((made, len))
    }

    // Long on purpose: open parent, temp file, mode, owner, sync and rename are one
    // sequence on the same handles; a failure at any step removes the temp file.
    fn write_from(
        &self,
        op: &'static str,
        base: GrantedPath<'_>,
        path: &Path,
        source: Source<'_>,
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
            if available < source.len().saturating_add(options.min_free_bytes) {
                return Err(HostError::DiskFloor {
                    path: path.display().to_string(),
                    available,
                    needed: source.len(),
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
            source.fill(&mut file)?;
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
            return Err(self.map(op, path, base.path, e));
        }
        Ok(made)
    }
}
