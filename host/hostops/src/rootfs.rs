//! Host files confined with cap-std.
//!
//! Every operation names the granted directory (`base`) it runs under. The directory is
//! opened as a capability first, and the rest of the path is resolved inside it, so a
//! symlink or `..` that would lead out of the grant fails instead of being followed. When
//! the grant is a single file, its parent is opened and the file must not be a symlink.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;

use cap_std::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use serde::{Deserialize, Serialize};

use crate::{HostError, Result};

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

/// The host filesystem below a root directory.
#[derive(Debug)]
pub struct RootFs {
    root_path: PathBuf,
    root: Dir,
}

/// A granted path opened for an operation: the directory capability and the path inside it.
struct Scoped {
    dir: Dir,
    rel: PathBuf,
}

fn strip_root(path: &Path) -> &Path {
    path.strip_prefix("/").unwrap_or(path)
}

fn is_escape(e: &std::io::Error) -> bool {
    // cap-std reports an attempt to leave the directory as PermissionDenied with this text.
    e.kind() == std::io::ErrorKind::PermissionDenied && e.to_string().contains("outside of the filesystem")
}

impl RootFs {
    /// Opens `root` (the host's `/` as seen by this process).
    pub fn open(root: &Path) -> Result<Self> {
        let dir = Dir::open_ambient_dir(root, ambient_authority()).map_err(|e| HostError::io("open", root, e))?;
        Ok(RootFs { root_path: root.to_path_buf(), root: dir })
    }

    /// The root on this machine's filesystem.
    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Where a host path lives on this machine (for diagnostics and the simulated node).
    pub fn host_to_local(&self, path: &Path) -> PathBuf {
        self.root_path.join(strip_root(path))
    }

    fn map(&self, op: &'static str, path: &Path, base: &Path, e: std::io::Error) -> HostError {
        if is_escape(&e) {
            HostError::Escape { path: path.display().to_string(), base: base.display().to_string() }
        } else {
            HostError::io(op, path, e)
        }
    }

    /// Opens the grant `base` and returns the capability plus `path` relative to it.
    /// `create` makes a missing granted directory (writes only).
    fn scope(&self, op: &'static str, base: &Path, path: &Path, create: bool) -> Result<Scoped> {
        let escape = || HostError::Escape { path: path.display().to_string(), base: base.display().to_string() };
        let rest = path.strip_prefix(base).map_err(|_| escape())?;
        let base_rel = strip_root(base);
        if base_rel.as_os_str().is_empty() {
            let dir = self.root.try_clone().map_err(|e| self.map(op, path, base, e))?;
            return Ok(Scoped { dir, rel: rest.to_path_buf() });
        }
        let is_dir = match self.root.metadata(base_rel) {
            Ok(m) => m.is_dir(),
            // A missing grant is a directory when something below it is addressed.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => !rest.as_os_str().is_empty(),
            Err(e) => return Err(self.map(op, path, base, e)),
        };
        if is_dir {
            if create {
                self.root.create_dir_all(base_rel).map_err(|e| self.map("create", base, base, e))?;
            }
            let dir = self.root.open_dir(base_rel).map_err(|e| self.map(op, path, base, e))?;
            return Ok(Scoped { dir, rel: rest.to_path_buf() });
        }
        // A single-file grant: open its parent; the file itself must not be a symlink.
        let parent = base_rel.parent().unwrap_or(Path::new(""));
        let name = base_rel.file_name().ok_or_else(escape)?;
        if create && !parent.as_os_str().is_empty() {
            self.root.create_dir_all(parent).map_err(|e| self.map("create", base, base, e))?;
        }
        let dir = if parent.as_os_str().is_empty() {
            self.root.try_clone()
        } else {
            self.root.open_dir(parent)
        }
        .map_err(|e| self.map(op, path, base, e))?;
        if dir.symlink_metadata(name).is_ok_and(|m| m.is_symlink()) {
            return Err(escape());
        }
        Ok(Scoped { dir, rel: PathBuf::from(name) })
    }

    /// Reads a whole file.
    pub fn read(&self, base: &Path, path: &Path) -> Result<Vec<u8>> {
        let s = self.scope("read", base, path, false)?;
        s.dir.read(&s.rel).map_err(|e| self.map("read", path, base, e))
    }

    /// Writes a whole file atomically: a temp file beside it, then rename. Creates parents.
    pub fn write(&self, base: &Path, path: &Path, contents: &[u8], mode: Option<u32>) -> Result<()> {
        let s = self.scope("write", base, path, true)?;
        let name = s.rel.file_name().ok_or_else(|| HostError::NotFound(path.display().to_string()))?;
        let parent = s.rel.parent().unwrap_or(Path::new(""));
        let dir = if parent.as_os_str().is_empty() {
            s.dir
        } else {
            s.dir.create_dir_all(parent).map_err(|e| self.map("create", path, base, e))?;
            s.dir.open_dir(parent).map_err(|e| self.map("write", path, base, e))?
        };
        let existing = dir.symlink_metadata(name).ok();
        if existing.as_ref().is_some_and(|m| m.is_symlink()) {
            // Replacing the link would surprise; following it could leave the grant.
            return Err(HostError::Symlink(path.display().to_string()));
        }
        if existing.as_ref().is_some_and(|m| m.is_dir()) {
            return Err(HostError::io("write", path, std::io::Error::other("is a directory")));
        }
        let mode = mode.or_else(|| existing.as_ref().map(|m| m.mode() & 0o7777)).unwrap_or(0o644);
        let tmp = format!(".{}.nodewright-{}.tmp", name.to_string_lossy(), std::process::id());
        let result = (|| -> std::io::Result<()> {
            let file = dir.create(&tmp)?;
            let mut file = file.into_std();
            file.write_all(contents)?;
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
            if let Some(m) = &existing {
                // Keep ownership of the file being replaced.
                std::os::unix::fs::fchown(&file, Some(m.uid()), Some(m.gid()))?;
            }
            file.sync_all()?;
            dir.rename(&tmp, &dir, name)
        })();
        if let Err(e) = result {
            let _ = dir.remove_file(&tmp);
            return Err(self.map("write", path, base, e));
        }
        Ok(())
    }

    /// `lstat`; `None` when missing.
    pub fn stat(&self, base: &Path, path: &Path) -> Result<Option<FileStat>> {
        let s = match self.scope("stat", base, path, false) {
            Err(HostError::NotFound(_)) => return Ok(None),
            other => other?,
        };
        let meta = if s.rel.as_os_str().is_empty() { s.dir.dir_metadata() } else { s.dir.symlink_metadata(&s.rel) };
        match meta {
            Ok(m) => {
                let kind = if m.is_symlink() {
                    FileKind::Symlink
                } else if m.is_dir() {
                    FileKind::Directory
                } else if m.is_file() {
                    FileKind::File
                } else {
                    FileKind::Other
                };
                Ok(Some(FileStat { kind, size: m.len(), mode: m.mode() & 0o7777, uid: m.uid(), gid: m.gid() }))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.map("stat", path, base, e)),
        }
    }

    /// Sorted entry names of a directory.
    pub fn list_dir(&self, base: &Path, path: &Path) -> Result<Vec<String>> {
        let s = self.scope("list", base, path, false)?;
        let rel = if s.rel.as_os_str().is_empty() { Path::new(".") } else { &s.rel };
        let mut names = Vec::new();
        for entry in s.dir.read_dir(rel).map_err(|e| self.map("list", path, base, e))? {
            let entry = entry.map_err(|e| self.map("list", path, base, e))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    /// `mkdir -p`.
    pub fn create_dir(&self, base: &Path, path: &Path) -> Result<()> {
        let s = self.scope("create", base, path, true)?;
        if s.rel.as_os_str().is_empty() {
            return Ok(());
        }
        s.dir.create_dir_all(&s.rel).map_err(|e| self.map("create", path, base, e))
    }

    /// Removes a file, symlink or empty directory; a missing path is fine.
    pub fn remove(&self, base: &Path, path: &Path) -> Result<()> {
        let s = match self.scope("remove", base, path, false) {
            Err(HostError::NotFound(_)) => return Ok(()),
            other => other?,
        };
        if s.rel.as_os_str().is_empty() {
            return Err(HostError::io("remove", path, std::io::Error::other("cannot remove the granted directory itself")));
        }
        let result = match s.dir.symlink_metadata(&s.rel) {
            Ok(m) if m.is_dir() => s.dir.remove_dir(&s.rel),
            Ok(_) => s.dir.remove_file(&s.rel),
            Err(e) => Err(e),
        };
        match result {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other.map_err(|e| self.map("remove", path, base, e)),
        }
    }

    fn open_std(&self, op: &'static str, base: &Path, path: &Path) -> Result<std::fs::File> {
        let s = self.scope(op, base, path, false)?;
        if s.rel.as_os_str().is_empty() {
            return Ok(s.dir.into_std_file());
        }
        match s.dir.symlink_metadata(&s.rel) {
            Ok(m) if m.is_symlink() => {
                return Err(HostError::Escape { path: path.display().to_string(), base: base.display().to_string() });
            }
            Ok(m) if m.is_dir() => {
                return s.dir.open_dir(&s.rel).map(Dir::into_std_file).map_err(|e| self.map(op, path, base, e));
            }
            _ => {}
        }
        s.dir.open(&s.rel).map(cap_std::fs::File::into_std).map_err(|e| self.map(op, path, base, e))
    }

    /// `chown` (symlinks refused).
    pub fn set_owner(&self, base: &Path, path: &Path, uid: u32, gid: u32) -> Result<()> {
        let f = self.open_std("chown", base, path)?;
        std::os::unix::fs::fchown(&f, Some(uid), Some(gid)).map_err(|e| HostError::io("chown", path, e))
    }

    /// `chmod` (symlinks refused).
    pub fn set_mode(&self, base: &Path, path: &Path, mode: u32) -> Result<()> {
        let f = self.open_std("chmod", base, path)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777)).map_err(|e| HostError::io("chmod", path, e))
    }

    /// Reads a file by host path without a grant scope: for the host's own bookkeeping
    /// (os-release, boot ID), never for plugin calls.
    pub fn read_host_file(&self, path: &Path) -> Option<String> {
        self.root.read_to_string(strip_root(path)).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> (tempfile::TempDir, RootFs) {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("etc/app")).unwrap();
        std::fs::write(tmp.path().join("etc/shadow"), "secret").unwrap();
        std::fs::write(tmp.path().join("etc/app/a.conf"), "a").unwrap();
        let fs = RootFs::open(tmp.path()).unwrap();
        (tmp, fs)
    }

    #[test]
    fn read_write_roundtrip_with_mode() {
        let (tmp, fs) = fixture();
        let base = Path::new("/etc/app");
        fs.write(base, Path::new("/etc/app/sub/b.conf"), b"hello", Some(0o600)).unwrap();
        assert_eq!(fs.read(base, Path::new("/etc/app/sub/b.conf")).unwrap(), b"hello");
        let st = fs.stat(base, Path::new("/etc/app/sub/b.conf")).unwrap().unwrap();
        assert_eq!((st.kind, st.mode, st.size), (FileKind::File, 0o600, 5));
        // Rewriting keeps the mode when none is given.
        fs.write(base, Path::new("/etc/app/sub/b.conf"), b"bye", None).unwrap();
        assert_eq!(fs.stat(base, Path::new("/etc/app/sub/b.conf")).unwrap().unwrap().mode, 0o600);
        assert_eq!(fs.list_dir(base, Path::new("/etc/app")).unwrap(), ["a.conf", "sub"]);
        assert!(tmp.path().join("etc/app/sub/b.conf").exists());
        fs.remove(base, Path::new("/etc/app/sub/b.conf")).unwrap();
        fs.remove(base, Path::new("/etc/app/sub/b.conf")).unwrap();
        assert_eq!(fs.stat(base, Path::new("/etc/app/sub/b.conf")).unwrap(), None);
    }

    #[test]
    fn relative_symlink_out_of_the_grant_is_refused() {
        let (tmp, fs) = fixture();
        std::os::unix::fs::symlink("../shadow", tmp.path().join("etc/app/link")).unwrap();
        let err = fs.read(Path::new("/etc/app"), Path::new("/etc/app/link")).unwrap_err();
        assert!(matches!(err, HostError::Escape { .. }), "{err:?}");
        let err = fs.write(Path::new("/etc/app"), Path::new("/etc/app/link"), b"x", None).unwrap_err();
        assert!(matches!(err, HostError::Symlink(_)), "{err:?}");
        assert_eq!(std::fs::read_to_string(tmp.path().join("etc/shadow")).unwrap(), "secret");
    }

    #[test]
    fn absolute_symlink_is_refused() {
        let (tmp, fs) = fixture();
        std::os::unix::fs::symlink("/etc/shadow", tmp.path().join("etc/app/abs")).unwrap();
        let err = fs.read(Path::new("/etc/app"), Path::new("/etc/app/abs")).unwrap_err();
        assert!(matches!(err, HostError::Escape { .. }), "{err:?}");
    }

    #[test]
    fn single_file_grant_refuses_a_symlinked_file() {
        let (tmp, fs) = fixture();
        std::os::unix::fs::symlink("shadow", tmp.path().join("etc/motd")).unwrap();
        let err = fs.read(Path::new("/etc/motd"), Path::new("/etc/motd")).unwrap_err();
        assert!(matches!(err, HostError::Escape { .. }), "{err:?}");
        std::fs::write(tmp.path().join("etc/hostname"), "n1").unwrap();
        assert_eq!(fs.read(Path::new("/etc/hostname"), Path::new("/etc/hostname")).unwrap(), b"n1");
    }

    #[test]
    fn path_outside_base_is_refused() {
        let (_tmp, fs) = fixture();
        let err = fs.read(Path::new("/etc/app"), Path::new("/etc/shadow")).unwrap_err();
        assert!(matches!(err, HostError::Escape { .. }), "{err:?}");
    }
}
