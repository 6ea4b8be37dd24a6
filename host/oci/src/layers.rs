//! A container image's layers as one payload tree: how an existing image (a driver
//! container, say) becomes a read-only payload without repacking.
//!
//! Layers are applied in order, as a container runtime would: a later file replaces an
//! earlier one, a whiteout (`.wh.<name>`) removes `<name>` from the layers below, an opaque
//! marker (`.wh..wh..opq`) hides everything the layers below put in its directory. What a
//! payload cannot hold is left out, counted, never refused outright — images are full of it:
//! symbolic links and devices are skipped, a hard link becomes a copy of the file it names
//! (when that file is in the tree), setuid, setgid and sticky bits are dropped. What would
//! put a file outside the tree (`..`) is refused, as are sizes and entry counts past the
//! limits. Files are read-only (`0444`, `0555` when executable), directories `0755`. With a
//! `subtree`, only what lies under it in the image is kept, re-rooted there.

use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::payload::{Refusal, UnpackLimits, Unsafe, duplicate_or};

/// Layer media types whose content is a plain tar.
pub const TAR_LAYERS: [&str; 2] = [
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.docker.image.rootfs.diff.tar",
];

/// Layer media types whose content is a gzip-compressed tar.
pub const GZIP_LAYERS: [&str; 2] = [
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
];

/// How a layer's bytes are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// gzip.
    Gzip,
}

impl Compression {
    /// The compression of a layer of `media_type`, if it is a layer we can read.
    pub fn of(media_type: &str) -> Option<Compression> {
        if TAR_LAYERS.contains(&media_type) {
            Some(Compression::None)
        } else if GZIP_LAYERS.contains(&media_type) {
            Some(Compression::Gzip)
        } else {
            None
        }
    }
}

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// What was left out of the tree, and what went in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Files written (a later layer's replacement counts again).
    pub files: u32,
    /// Content bytes written.
    pub bytes: u64,
    /// Entries read, over every layer.
    pub entries: u32,
    /// Symbolic links skipped.
    pub symlinks: u32,
    /// Hard links whose file was not in the tree, skipped.
    pub links: u32,
    /// Devices, fifos and other special files skipped.
    pub special: u32,
    /// Files whose setuid, setgid or sticky bit was dropped.
    pub set_id: u32,
    /// Whiteouts and opaque markers applied.
    pub whiteouts: u32,
}

impl Applied {
    /// For people: `12 file(s), 4.0 MiB; left out: 3 symlink(s), 1 special file(s); 1 setid
    /// bit(s) dropped; 2 whiteout(s)`.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "{} file(s), {}",
            self.files,
            nodewright_api::units::format_bytes(self.bytes)
        );
        let left: Vec<String> = [
            (self.symlinks, "symlink(s)"),
            (self.links, "hard link(s) to files outside it"),
            (self.special, "special file(s)"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        if !left.is_empty() {
            out.push_str(&format!("; left out: {}", left.join(", ")));
        }
        if self.set_id > 0 {
            out.push_str(&format!("; {} setid bit(s) dropped", self.set_id));
        }
        if self.whiteouts > 0 {
            out.push_str(&format!("; {} whiteout(s)", self.whiteouts));
        }
        out
    }
}

/// Applies one layer's tar, read from `tar`, onto `into` (a directory of ours that only
/// this process writes), keeping what lies under `subtree` (relative; empty: everything).
/// `applied` carries the counts and limits across the image's layers.
pub fn apply_layer(
    payload: &str,
    tar: impl Read,
    into: &Path,
    subtree: &Path,
    limits: UnpackLimits,
    applied: &mut Applied,
) -> Result<(), Unsafe> {
    let fail = |entry: &str, refusal: Refusal| Unsafe {
        payload: payload.into(),
        entry: entry.into(),
        refusal,
    };
    let io = |e: std::io::Error| Refusal::Io(e.to_string());
    // Paths this layer wrote: an opaque marker hides only what the layers below wrote.
    let mut written: HashSet<PathBuf> = HashSet::new();
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().map_err(|e| fail("", io(e)))? {
        let mut entry = entry.map_err(|e| fail("", io(e)))?;
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        applied.entries = applied.entries.saturating_add(1);
        if applied.entries > limits.max_entries {
            return Err(fail(&raw, Refusal::TooManyEntries(applied.entries)));
        }
        let path = in_image(Path::new(&raw)).map_err(|r| fail(&raw, r))?;
        let Some(rel) = rerooted(&path, subtree) else {
            continue;
        };
        // Whiteouts first: they name what to remove, not what to write.
        let file_name = rel.file_name().map(|n| n.to_string_lossy().into_owned());
        if let Some(name) = file_name.as_deref().filter(|n| n.starts_with(WHITEOUT)) {
            let dir = rel.parent().unwrap_or(Path::new(""));
            if name == OPAQUE {
                hide_below(&into.join(dir), dir, &written).map_err(|e| fail(&raw, io(e)))?;
            } else {
                let gone = &name[WHITEOUT.len()..];
                if gone.is_empty() || gone == "." || gone == ".." || gone.contains('/') {
                    return Err(fail(&raw, Refusal::Escapes));
                }
                remove_any(&into.join(dir).join(gone)).map_err(|e| fail(&raw, io(e)))?;
            }
            applied.whiteouts += 1;
            continue;
        }
        let header = entry.header();
        let kind = header.entry_type();
        let mode = header.mode().map_err(|e| fail(&raw, io(e)))?;
        let target = into.join(&rel);
        match kind {
            tar::EntryType::Directory => {
                if !rel.as_os_str().is_empty() {
                    if target.symlink_metadata().is_ok_and(|m| !m.is_dir()) {
                        remove_any(&target).map_err(|e| fail(&raw, io(e)))?;
                    }
                    make_dirs(&target).map_err(|e| fail(&raw, duplicate_or(e)))?;
                    written.insert(rel);
                }
                continue;
            }
            tar::EntryType::Symlink => {
                applied.symlinks += 1;
                continue;
            }
            tar::EntryType::Link => {
                let source = entry
                    .link_name()
                    .map_err(|e| fail(&raw, io(e)))?
                    .and_then(|l| in_image(&l).ok())
                    .and_then(|l| rerooted(&l, subtree))
                    .map(|l| into.join(l))
                    .filter(|l| l.symlink_metadata().is_ok_and(|m| m.is_file()));
                let Some(source) = source else {
                    applied.links += 1;
                    continue;
                };
                let size = source.metadata().map_err(|e| fail(&raw, io(e)))?.len();
                count_bytes(applied, size, limits).map_err(|r| fail(&raw, r))?;
                replace_parent(into, &rel).map_err(|e| fail(&raw, duplicate_or(e)))?;
                remove_any(&target).map_err(|e| fail(&raw, io(e)))?;
                let mut from = std::fs::File::open(&source).map_err(|e| fail(&raw, io(e)))?;
                let exec = source
                    .metadata()
                    .map_err(|e| fail(&raw, io(e)))?
                    .permissions()
                    .mode();
                write_file(&target, &mut from, size, exec).map_err(|r| fail(&raw, r))?;
                applied.files += 1;
                written.insert(rel);
                continue;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {}
            _ => {
                applied.special += 1;
                continue;
            }
        }
        if rel.as_os_str().is_empty() {
            return Err(fail(&raw, Refusal::Escapes));
        }
        if mode & 0o7000 != 0 {
            applied.set_id += 1;
        }
        let declared = header.size().map_err(|e| fail(&raw, io(e)))?;
        count_bytes(applied, declared, limits).map_err(|r| fail(&raw, r))?;
        replace_parent(into, &rel).map_err(|e| fail(&raw, duplicate_or(e)))?;
        remove_any(&target).map_err(|e| fail(&raw, io(e)))?;
        write_file(&target, &mut entry, declared, mode).map_err(|r| fail(&raw, r))?;
        applied.files += 1;
        written.insert(rel);
    }
    Ok(())
}

/// `path` as the image roots it: a leading `/` and `.` are the root; `..` is refused.
fn in_image(path: &Path) -> Result<PathBuf, Refusal> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return Err(Refusal::Escapes),
        }
    }
    Ok(out)
}

/// `path` relative to `subtree`, if it lies under it (or is it).
fn rerooted(path: &Path, subtree: &Path) -> Option<PathBuf> {
    path.strip_prefix(subtree).ok().map(Path::to_path_buf)
}

fn count_bytes(applied: &mut Applied, size: u64, limits: UnpackLimits) -> Result<(), Refusal> {
    let total = applied.bytes.saturating_add(size);
    if total > limits.max_bytes {
        return Err(Refusal::TooLarge {
            total,
            limit: limits.max_bytes,
        });
    }
    applied.bytes = total;
    Ok(())
}

fn make_dirs(path: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
}

/// The directories above `rel` exist as directories: a file a lower layer left where a
/// directory now goes is replaced by it, as a runtime's overlay would.
fn replace_parent(into: &Path, rel: &Path) -> std::io::Result<()> {
    let mut at = into.to_path_buf();
    for part in rel.parent().into_iter().flat_map(Path::components) {
        at.push(part);
        match at.symlink_metadata() {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                std::fs::remove_file(&at)?;
                make_dirs(&at)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => make_dirs(&at)?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes `size` bytes of `from` to the new file `target`, read-only (executable when
/// `mode` has an execute bit; never setuid, setgid or sticky).
fn write_file(target: &Path, from: &mut impl Read, size: u64, mode: u32) -> Result<(), Refusal> {
    // Nothing but us writes under the tree and no entry makes a link, so no component of
    // `target` leads elsewhere; the write refuses anything already there.
    crate::payload::write_read_only(target, from, size, mode)
}

/// Removes what is at `path`, a file or a whole directory, if anything is.
fn remove_any(path: &Path) -> std::io::Result<()> {
    match path.symlink_metadata() {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// An opaque directory: everything under `dir` (at `rel` in the tree) that this layer did
/// not write goes; what it wrote stays, and is pruned the same way below.
fn hide_below(dir: &Path, rel: &Path, written: &HashSet<PathBuf>) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let child = rel.join(entry.file_name());
        if !written.contains(&child) {
            remove_any(&entry.path())?;
        } else if entry.file_type()?.is_dir() {
            hide_below(&entry.path(), &child, written)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
