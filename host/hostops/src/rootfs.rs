//! Host files under grants.
//!
//! Every operation names the grant (`base`) it runs under and resolves its path from the
//! host root, component by component, following only symlinks the secure-path rule trusts
//! and ending within the grant (`resolve`); it then acts on the one name left, through the
//! directory handle the resolution holds. A grant names a directory when written with a
//! trailing `/` or when the node has one there; otherwise it is a single file: nothing lives
//! below it, it is never made a directory, and it must not be a symlink.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};
use rustix::fs::OFlags;
use serde::{Deserialize, Serialize};

use nodewright_api::grants::GrantedPath;

use crate::error::{HostError, Result};

/// What a path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Directory,
    /// Symbolic link (not followed).
    Symlink,
    /// Device, socket, FIFO.
    Other,
}

/// `stat` of a host path (symlinks are not followed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    /// Kind of file.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

/// How a write is done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// Mode of the file; `None` keeps an existing file's mode, else `0o644`.
    pub mode: Option<u32>,
    /// Keep setuid/setgid/sticky bits (from `mode` or the file being replaced). Without
    /// it only the permission bits (`0o777`) are applied.
    pub special_modes: bool,
    /// Refuse the write when the filesystem would have fewer free bytes than this after it.
    pub min_free_bytes: u64,
    /// Most missing parent directories the write may make (each counts as a written file);
    /// `None` for no bound beyond [`MAX_DEPTH`].
    pub max_new_dirs: Option<u32>,
}

/// Most path components below a grant that nodewright makes directories for.
pub const MAX_DEPTH: usize = 32;

/// Permission bits a file may get without an explicit special-modes grant.
pub const PERMISSION_BITS: u32 = 0o777;

/// Flags for every open of a plugin-chosen path: never block (a FIFO with no writer would
/// hang the open), never become the controlling terminal; with `follow == false`, never
/// follow a final symlink either. (cap-std confines any symlink it follows to the grant.)
pub(super) fn safe_open_flags(follow: bool) -> i32 {
    let flags = OFlags::NONBLOCK | OFlags::NOCTTY;
    (if follow {
        flags
    } else {
        flags | OFlags::NOFOLLOW
    })
    .bits() as i32
}

pub(super) fn kind_of(m: &cap_std::fs::Metadata) -> FileKind {
    if m.is_symlink() {
        FileKind::Symlink
    } else if m.is_dir() {
        FileKind::Directory
    } else if m.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// The host filesystem below a root directory.
#[derive(Debug)]
pub struct RootFs {
    root_path: PathBuf,
    root: Dir,
}

/// A granted path resolved for an operation: the directory holding it and its one name
/// there (empty when the path is that directory itself).
pub(super) struct Scoped {
    pub(super) dir: Dir,
    pub(super) rel: PathBuf,
    /// The path is the grant's own path.
    pub(super) is_base: bool,
    /// Directories the resolution made.
    pub(super) made: u32,
    /// What the resolution's own `lstat` of `rel` found.
    pub(super) seen: Seen,
}

/// What a resolution saw of a path's last name, which it `lstat`s in the directory it holds
/// before handing it over: an operation that only wants that (`stat`) need not look again.
#[derive(Clone, Copy, Debug)]
pub(super) enum Seen {
    /// The path names the directory the resolution holds (`rel` is empty): nothing to look
    /// up in it.
    Held,
    /// No entry by that name.
    Missing,
    /// The entry itself (a link not followed).
    Entry(rustix::fs::Stat),
}

impl FileStat {
    fn of(st: &rustix::fs::Stat) -> Self {
        use rustix::fs::FileType;
        FileStat {
            kind: match FileType::from_raw_mode(st.st_mode) {
                FileType::Symlink => FileKind::Symlink,
                FileType::Directory => FileKind::Directory,
                FileType::RegularFile => FileKind::File,
                _ => FileKind::Other,
            },
            size: u64::try_from(st.st_size).unwrap_or_default(),
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
        }
    }
}

fn strip_root(path: &Path) -> &Path {
    path.strip_prefix("/").unwrap_or(path)
}

fn is_escape(e: &std::io::Error) -> bool {
    // cap-std reports an attempt to leave the directory as PermissionDenied with this text.
    e.kind() == std::io::ErrorKind::PermissionDenied
        && e.to_string().contains("outside of the filesystem")
}

impl RootFs {
    /// Opens `root` (the host's `/` as seen by this process).
    pub fn open(root: &Path) -> Result<Self> {
        let dir = Dir::open_ambient_dir(root, ambient_authority())
            .map_err(|e| HostError::io("open", root, e))?;
        Ok(RootFs {
            root_path: root.to_path_buf(),
            root: dir,
        })
    }

    /// The root on this machine's filesystem.
    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Where a host path lives on this machine (for diagnostics and the simulated node).
    pub fn host_to_local(&self, path: &Path) -> PathBuf {
        self.root_path.join(strip_root(path))
    }

    pub(super) fn map(
        &self,
        op: &'static str,
        path: &Path,
        base: &Path,
        e: std::io::Error,
    ) -> HostError {
        if is_escape(&e) {
            HostError::Escape {
                path: path.display().to_string(),
                base: base.display().to_string(),
            }
        } else {
            HostError::io(op, path, e)
        }
    }

    /// Reads a whole regular file of at most `max_bytes`.
    pub fn read(&self, base: GrantedPath<'_>, path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
        let file = self.open_std("read", base, path, &[FileKind::File], true)?;
        let too_large = || HostError::TooLarge {
            path: path.display().to_string(),
            limit: max_bytes,
        };
        // Size-checked on the open file before a byte is read or a buffer grown; the bounded
        // read below still catches a file that grows in between.
        let size = file
            .metadata()
            .map_err(|e| HostError::io("read", path, e))?
            .len();
        if size > max_bytes {
            return Err(too_large());
        }
        let mut out = Vec::with_capacity(size as usize);
        file.take(max_bytes.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| HostError::io("read", path, e))?;
        if out.len() as u64 > max_bytes {
            return Err(too_large());
        }
        Ok(out)
    }

    /// `lstat`; `None` when missing.
    pub fn stat(&self, base: GrantedPath<'_>, path: &Path) -> Result<Option<FileStat>> {
        let s = match self.resolve(base, path, Resolve::LOOK) {
            Err(HostError::NotFound(_)) => return Ok(None),
            other => other?,
        };
        let st = match s.seen {
            Seen::Missing => return Ok(None),
            Seen::Entry(st) => st,
            Seen::Held => rustix::fs::fstat(&s.dir)
                .map_err(|e| self.map("stat", path, base.path, e.into()))?,
        };
        Ok(Some(FileStat::of(&st)))
    }

    /// Sorted entry names of a directory.
    pub fn list_dir(&self, base: GrantedPath<'_>, path: &Path) -> Result<Vec<String>> {
        let s = self.resolve(base, path, Resolve::FOLLOW)?;
        let rel = if s.rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            &s.rel
        };
        let mut names = Vec::new();
        for entry in s
            .dir
            .read_dir(rel)
            .map_err(|e| self.map("list", path, base.path, e))?
        {
            let entry = entry.map_err(|e| self.map("list", path, base.path, e))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    /// `mkdir -p`, making at most `max_new` directories (see [`WriteOptions::max_new_dirs`]);
    /// returns how many it made.
    pub fn create_dir(
        &self,
        base: GrantedPath<'_>,
        path: &Path,
        max_new: Option<u32>,
    ) -> Result<u32> {
        let how = Resolve {
            last: Last::Dir,
            create: Some(max_new.unwrap_or(u32::MAX)),
        };
        Ok(self.resolve(base, path, how)?.made)
    }

    /// Removes a file, symlink or empty directory; a missing path is fine.
    pub fn remove(&self, base: GrantedPath<'_>, path: &Path) -> Result<()> {
        let s = match self.resolve(base, path, Resolve::LOOK) {
            Err(HostError::NotFound(_)) => return Ok(()),
            other => other?,
        };
        let granted_dir = || {
            HostError::io(
                "remove",
                path,
                std::io::Error::other("cannot remove the granted directory itself"),
            )
        };
        if s.rel.as_os_str().is_empty() {
            return Err(granted_dir());
        }
        let result = match s.dir.symlink_metadata(&s.rel) {
            Ok(m) if m.is_dir() && s.is_base => return Err(granted_dir()),
            Ok(m) if m.is_dir() => s.dir.remove_dir(&s.rel),
            Ok(_) => s.dir.remove_file(&s.rel),
            Err(e) => Err(e),
        };
        match result {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other.map_err(|e| self.map("remove", path, base.path, e)),
        }
    }

    /// Opens a path of one of the `allowed` kinds without blocking. The kind is checked
    /// before the open (so a device is never opened) and again on the open file (so a swap
    /// in between is caught). `follow` follows a symlink that stays inside the grant;
    /// without it a symlink is refused.
    fn open_std(
        &self,
        op: &'static str,
        base: GrantedPath<'_>,
        path: &Path,
        allowed: &[FileKind],
        follow: bool,
    ) -> Result<std::fs::File> {
        let how = if follow {
            Resolve::FOLLOW
        } else {
            Resolve::LOOK
        };
        let s = self.resolve(base, path, how)?;
        let refuse = |kind: FileKind| -> Result<()> {
            match kind {
                FileKind::Symlink => Err(HostError::Escape {
                    path: path.display().to_string(),
                    base: base.path.display().to_string(),
                }),
                k if allowed.contains(&k) => Ok(()),
                FileKind::Directory => Err(HostError::io(
                    op,
                    path,
                    std::io::Error::other("is a directory"),
                )),
                FileKind::File => Err(HostError::io(
                    op,
                    path,
                    std::io::Error::other("is a file, not a directory"),
                )),
                FileKind::Other => Err(HostError::NotRegular {
                    path: path.display().to_string(),
                    kind: "a device, socket or FIFO".into(),
                }),
            }
        };
        // A directory is opened for reading, never as cap-std's `open_dir` would (`O_PATH`,
        // on which `fchmod` and `fchown` fail with `EBADF`).
        let open_dir = |rel: &Path| {
            let mut open = OpenOptions::new();
            open.read(true)
                .custom_flags(safe_open_flags(false) | OFlags::DIRECTORY.bits() as i32);
            s.dir
                .open_with(rel, &open)
                .map(cap_std::fs::File::into_std)
                .map_err(|e| self.map(op, path, base.path, e))
        };
        // What the resolution's `lstat` saw decides what may be opened (with `follow`, a
        // trusted last link was followed there: never a link); the open below is checked
        // again on the file it opened.
        let kind = match s.seen {
            Seen::Held => {
                refuse(FileKind::Directory)?;
                return open_dir(Path::new("."));
            }
            Seen::Entry(st) => FileStat::of(&st).kind,
            Seen::Missing => {
                let missing = rustix::io::Errno::NOENT.raw_os_error();
                return Err(self.map(
                    op,
                    path,
                    base.path,
                    std::io::Error::from_raw_os_error(missing),
                ));
            }
        };
        refuse(kind)?;
        if kind == FileKind::Directory {
            return open_dir(&s.rel);
        }
        let mut open = OpenOptions::new();
        open.read(true).custom_flags(safe_open_flags(follow));
        let file = s
            .dir
            .open_with(&s.rel, &open)
            .map_err(|e| self.map(op, path, base.path, e))?
            .into_std();
        let opened = file.metadata().map_err(|e| HostError::io(op, path, e))?;
        if !opened.is_file() {
            return Err(HostError::NotRegular {
                path: path.display().to_string(),
                kind: "not a regular file".into(),
            });
        }
        Ok(file)
    }

    /// Opens a file or directory for a metadata change: a regular file must have exactly one
    /// link, checked on the open file (so a link made after the check of the path is seen).
    fn open_for_metadata(
        &self,
        op: &'static str,
        base: GrantedPath<'_>,
        path: &Path,
    ) -> Result<std::fs::File> {
        let f = self.open_std(
            op,
            base,
            path,
            &[FileKind::File, FileKind::Directory],
            false,
        )?;
        let meta = f.metadata().map_err(|e| HostError::io(op, path, e))?;
        let links = std::os::unix::fs::MetadataExt::nlink(&meta);
        if meta.is_file() && links != 1 {
            return Err(HostError::HardLinked {
                path: path.display().to_string(),
                links,
            });
        }
        Ok(f)
    }

    /// `chown` of a regular file with one link, or a directory (symlinks, devices, FIFOs
    /// and hard-linked files refused).
    pub fn set_owner(&self, base: GrantedPath<'_>, path: &Path, uid: u32, gid: u32) -> Result<()> {
        let f = self.open_for_metadata("chown", base, path)?;
        std::os::unix::fs::fchown(&f, Some(uid), Some(gid))
            .map_err(|e| HostError::io("chown", path, e))
    }

    /// `chmod` of a regular file with one link, or a directory (symlinks, devices, FIFOs
    /// and hard-linked files refused). The caller decides whether bits above `0o777` are
    /// allowed; this keeps `0o7777`.
    pub fn set_mode(&self, base: GrantedPath<'_>, path: &Path, mode: u32) -> Result<()> {
        let f = self.open_for_metadata("chmod", base, path)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))
            .map_err(|e| HostError::io("chmod", path, e))
    }

    /// Reads a file by host path without a grant scope: for the host's own bookkeeping
    /// (os-release, boot ID), never for plugin calls.
    pub fn read_host_file(&self, path: &Path) -> Option<String> {
        self.root.read_to_string(strip_root(path)).ok()
    }

    /// [`Self::read_host_file`] for state the kernel shows (`/sys/module/<m>/initstate`):
    /// `None` when there is no such file, any other failure an error.
    pub fn read_host_state(&self, path: &Path) -> Result<Option<String>> {
        match self.root.read_to_string(strip_root(path)) {
            Ok(text) => Ok(Some(text)),
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error()) =>
            {
                Ok(None)
            }
            Err(e) => Err(HostError::io("read", path, e)),
        }
    }
}

mod resolve;
mod write;

pub(crate) use write::open_payload_file;

use resolve::{Last, Resolve};

#[cfg(test)]
mod tests;
