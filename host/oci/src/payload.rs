//! Payloads: files a package carries beside its component, as layers of the plugin's own
//! manifest.
//!
//! A payload layer is an uncompressed tar with the media type [`PAYLOAD_LAYER`] and the
//! payload's name in the `org.opencontainers.image.title` annotation. Because it is a layer
//! of the same manifest, the digest a NodeWright pins — and every signature and trust
//! policy over it — covers every payload byte.
//!
//! On the node a payload is a blob in the cache, like the component, and a tree unpacked
//! from it under `trees/sha256/<layer hex>`, which the sandbox opens read-only to the
//! guest at `/payload/<name>`. A payload tar holds regular files and directories only: no
//! links, devices or fifos, no setuid, setgid or sticky bit, no absolute path and no `..`.
//! [`pack`] refuses what [`unpack`] refuses, so an author learns it when pushing.

use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nodewright_api::payload::PayloadName;

use crate::artifact::Descriptor;

/// The payload layer media type.
pub const PAYLOAD_LAYER: &str = "application/vnd.nodewright.payload.v1.tar";

/// The annotation that names a layer (OCI's; ORAS uses it for file names too).
pub const TITLE: &str = "org.opencontainers.image.title";

/// One payload of a plugin artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payload {
    /// Its name.
    pub name: PayloadName,
    /// Its layer.
    pub layer: Descriptor,
}

/// Bounds on unpacking one payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnpackLimits {
    /// Bytes of file content, as the entries declare them, before any is written.
    pub max_bytes: u64,
    /// Entries (files and directories).
    pub max_entries: u32,
}

impl Default for UnpackLimits {
    /// 8 GiB, 100,000 entries.
    fn default() -> Self {
        UnpackLimits {
            max_bytes: 8 << 30,
            max_entries: 100_000,
        }
    }
}

/// Why a payload's tar was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An absolute path, a `..`, or an empty name.
    #[error("its path leaves the payload's root")]
    Escapes,
    /// A symlink or a hard link.
    #[error("it is a link (a payload holds regular files and directories only)")]
    Link,
    /// A device, fifo or anything else that is neither a file nor a directory.
    #[error("it is a {0} (a payload holds regular files and directories only)")]
    Special(String),
    /// A setuid, setgid or sticky bit.
    #[error("its mode {0:o} has a setuid, setgid or sticky bit")]
    SetId(u32),
    /// Declared content past the limit.
    #[error("it takes the payload to {total} bytes; the limit is {limit}")]
    TooLarge {
        /// Bytes declared so far, with this entry.
        total: u64,
        /// The limit.
        limit: u64,
    },
    /// More entries than the limit.
    #[error("it is entry number {0}, past the limit")]
    TooManyEntries(u32),
    /// The same path twice, or a file where a directory is.
    #[error("the path is already in the payload")]
    Duplicate,
    /// The tar ends before the entry does.
    #[error("the tar ends inside it ({declared} bytes declared, {read} read)")]
    Truncated {
        /// Declared size.
        declared: u64,
        /// Bytes there were.
        read: u64,
    },
    /// Not a tar, or an I/O error reading or writing it.
    #[error("{0}")]
    Io(String),
}

/// A refused entry: which payload, which entry, why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("payload {payload}: entry {entry:?}: {refusal}")]
pub struct Unsafe {
    /// The payload.
    pub payload: String,
    /// The entry's path as the tar gives it.
    pub entry: String,
    /// Why.
    pub refusal: Refusal,
}

/// What unpacking wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Unpacked {
    /// Files.
    pub files: u32,
    /// Directories.
    pub dirs: u32,
    /// Content bytes.
    pub bytes: u64,
}

/// `path` relative to the payload's root, or why it cannot be.
fn inside(path: &Path) -> Result<PathBuf, Refusal> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::RootDir | Component::ParentDir | Component::Prefix(_) => {
                return Err(Refusal::Escapes);
            }
        }
    }
    Ok(out)
}

/// Unpacks the payload tar read from `tar` into `into` (a new, empty directory of ours):
/// files read-only (`0444`, or `0555` when any execute bit is set), directories `0755`.
/// Stops at the first refused entry; the caller removes `into` then.
pub fn unpack(
    payload: &PayloadName,
    tar: impl Read,
    into: &Path,
    limits: UnpackLimits,
) -> Result<Unpacked, Unsafe> {
    unpack_from(payload, tar, into, limits, Made::default(), &mut ()).map(|made| made.done)
}

/// How far an unpack got — what a download checkpoint records with the stream's offset and
/// hash, and what a resumed unpack goes on from.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Made {
    /// Entries read (what [`UnpackLimits::max_entries`] counts).
    pub(crate) entries: u32,
    /// Files, directories and bytes written.
    pub(crate) done: Unpacked,
    /// Every file and directory an entry made, relative to the tree's root, in order.
    pub(crate) paths: Vec<PathBuf>,
}

/// What an unpack tells the stream it reads at each boundary between entries, so a
/// checkpoint can be taken there (see `resume`).
pub(crate) trait Boundaries {
    /// The entry just unpacked ends — its data and its padding — at `offset` of the tar.
    /// Called before the tar is read past its data.
    fn ended(&mut self, offset: u64);
    /// The next entry's headers were read and nothing of it is written: the tree holds
    /// exactly `made`.
    fn before_next(&mut self, made: &Made);
}

/// An unpack that nothing resumes.
impl Boundaries for () {
    fn ended(&mut self, _: u64) {}
    fn before_next(&mut self, _: &Made) {}
}

/// [`unpack`] going on from `made`: `tar` starts at an entry's first header, `into` holds
/// exactly what `made` lists (see [`prune`]), and `at` hears every boundary between entries.
pub(crate) fn unpack_from(
    payload: &PayloadName,
    tar: impl Read,
    into: &Path,
    limits: UnpackLimits,
    mut made: Made,
    at: &mut dyn Boundaries,
) -> Result<Made, Unsafe> {
    let fail = |entry: &str, refusal: Refusal| Unsafe {
        payload: payload.to_string(),
        entry: entry.into(),
        refusal,
    };
    let io = |e: std::io::Error| Refusal::Io(e.to_string());
    let mut archive = tar::Archive::new(tar);
    let entries = archive.entries().map_err(|e| fail("", io(e)))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| fail("", io(e)))?;
        at.before_next(&made);
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        place(&mut entry, &raw, into, limits, &mut made).map_err(|r| fail(&raw, r))?;
        let end = entry.raw_file_position() + entry.size().div_ceil(512) * 512;
        at.ended(end);
    }
    Ok(made)
}

/// Checks one entry (its path as the tar gives it: `raw`) and writes what it makes under
/// `into`, counted in `made`.
fn place<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    raw: &str,
    into: &Path,
    limits: UnpackLimits,
    made: &mut Made,
) -> Result<(), Refusal> {
    let io = |e: std::io::Error| Refusal::Io(e.to_string());
    made.entries = made.entries.saturating_add(1);
    if made.entries > limits.max_entries {
        return Err(Refusal::TooManyEntries(made.entries));
    }
    let header = entry.header();
    let kind = header.entry_type();
    let mode = header.mode().map_err(io)?;
    let declared = header.size().map_err(io)?;
    let rel = inside(Path::new(raw))?;
    match kind {
        tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::Directory => {}
        tar::EntryType::Symlink | tar::EntryType::Link => return Err(Refusal::Link),
        other => return Err(Refusal::Special(format!("{other:?}"))),
    }
    if mode & 0o7000 != 0 {
        return Err(Refusal::SetId(mode));
    }
    let target = into.join(&rel);
    if kind == tar::EntryType::Directory {
        if rel.as_os_str().is_empty() {
            return Ok(());
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&target)
            .map_err(duplicate_or)?;
        made.done.dirs += 1;
        made.paths.push(rel);
        return Ok(());
    }
    if rel.as_os_str().is_empty() {
        return Err(Refusal::Escapes);
    }
    let total = made.done.bytes.saturating_add(declared);
    if total > limits.max_bytes {
        return Err(Refusal::TooLarge {
            total,
            limit: limits.max_bytes,
        });
    }
    if let Some(parent) = target.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(duplicate_or)?;
    }
    // Nothing but us writes under `into`, and no entry makes a link, so no path component
    // can lead elsewhere.
    write_read_only(&target, entry, declared, mode)?;
    made.done.files += 1;
    made.done.bytes = total;
    made.paths.push(rel);
    Ok(())
}

/// Makes `into` hold exactly what `made` lists — the files and directories its entries made
/// and the directories above them — by removing everything else: what an unpack wrote after
/// the checkpoint `made` came from (a file cut short, a directory of an entry not counted).
pub(crate) fn prune(into: &Path, made: &Made) -> std::io::Result<()> {
    let mut keep = std::collections::HashSet::new();
    for path in &made.paths {
        keep.extend(path.ancestors().filter(|p| !p.as_os_str().is_empty()));
    }
    prune_under(into, Path::new(""), &keep)
}

fn prune_under(
    root: &Path,
    rel: &Path,
    keep: &std::collections::HashSet<&Path>,
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(root.join(rel))? {
        let entry = entry?;
        let inner = rel.join(entry.file_name());
        let kind = entry.file_type()?;
        if keep.contains(inner.as_path()) {
            if kind.is_dir() {
                prune_under(root, &inner, keep)?;
            }
        } else if kind.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Writes the `size` bytes `from` holds to the new file `target` — `create_new` (O_EXCL)
/// refuses a second entry for a path, and a link there if one ever were — then makes it
/// read-only (`0444`, or `0555` when `mode` has an execute bit). Copied through a buffer of
/// up to 1 MiB (`io::copy` reads straight into it), not `io::copy`'s own 8 KiB: a 1 GiB
/// module is a thousand writes, not a hundred thousand.
pub(crate) fn write_read_only(
    target: &Path,
    from: &mut impl Read,
    size: u64,
    mode: u32,
) -> Result<(), Refusal> {
    let io = |e: std::io::Error| Refusal::Io(e.to_string());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(target)
        .map_err(duplicate_or)?;
    let capacity = usize::try_from(size)
        .unwrap_or(usize::MAX)
        .clamp(8 << 10, 1 << 20);
    let mut out = std::io::BufWriter::with_capacity(capacity, EarlyWriteback::new(file));
    let read = std::io::copy(&mut from.take(size), &mut out).map_err(io)?;
    if read != size {
        return Err(Refusal::Truncated {
            declared: size,
            read,
        });
    }
    let file = out.into_inner().map_err(|e| io(e.into_error()))?.file;
    let ro = if mode & 0o111 != 0 { 0o555 } else { 0o444 };
    file.set_permissions(std::fs::Permissions::from_mode(ro))
        .map_err(io)
}

/// A file being written that asks the kernel to start writing each 16 MiB back to disk as
/// soon as it is written (`POSIX_FADV_DONTNEED` on dirty pages starts their writeback and
/// does not wait for it), so the one sync before a tree is renamed into use waits for the
/// last few MiB, not for the whole payload: the disk works while the download goes on.
/// Nothing is skipped: the sync still makes every byte durable; this only moves when the
/// disk does the work.
struct EarlyWriteback {
    file: std::fs::File,
    written: u64,
    started: u64,
}

impl EarlyWriteback {
    const EVERY: u64 = 16 << 20;

    fn new(file: std::fs::File) -> Self {
        EarlyWriteback {
            file,
            written: 0,
            started: 0,
        }
    }
}

impl std::io::Write for EarlyWriteback {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = std::io::Write::write(&mut self.file, buf)?;
        self.written += n as u64;
        if self.written - self.started >= Self::EVERY {
            let len = std::num::NonZeroU64::new(self.written - self.started);
            // Advice only: a kernel that ignores it leaves the sync all the work, as before.
            let _ =
                rustix::fs::fadvise(&self.file, self.started, len, rustix::fs::Advice::DontNeed);
            self.started = self.written;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::Write::flush(&mut self.file)
    }
}

pub(crate) fn duplicate_or(e: std::io::Error) -> Refusal {
    if e.kind() == std::io::ErrorKind::AlreadyExists
        || e.kind() == std::io::ErrorKind::NotADirectory
    {
        Refusal::Duplicate
    } else {
        Refusal::Io(e.to_string())
    }
}

/// Packs `path` — a file, or a directory's contents — as a payload tar, reproducibly
/// (entries sorted, times zero, owner root, permissions kept but for write bits). Refuses
/// what [`unpack`] would: links, special files, setuid/setgid/sticky bits.
#[cfg(feature = "push")]
pub fn pack(name: &PayloadName, path: &Path) -> Result<Vec<u8>, Unsafe> {
    pack_into(name, path, Vec::new())
}

/// [`pack`], written to the file `dest` (created) instead of memory, for payloads of any
/// size: returns its digest and size, computed as it was written.
#[cfg(feature = "push")]
pub fn pack_to(name: &PayloadName, path: &Path, dest: &Path) -> Result<(String, u64), Unsafe> {
    let fail = |refusal: Refusal| Unsafe {
        payload: name.to_string(),
        entry: dest.display().to_string(),
        refusal,
    };
    let file = std::fs::File::create(dest).map_err(|e| fail(Refusal::Io(e.to_string())))?;
    let out = pack_into(
        name,
        path,
        crate::digest::Hashing::new(std::io::BufWriter::with_capacity(1 << 20, file)),
    )?;
    let size = out.size;
    let (digest, inner) = out.finish();
    inner
        .into_inner()
        .map_err(|e| fail(Refusal::Io(e.to_string())))?
        .sync_all()
        .map_err(|e| fail(Refusal::Io(e.to_string())))?;
    Ok((digest, size))
}

#[cfg(feature = "push")]
fn pack_into<W: std::io::Write>(name: &PayloadName, path: &Path, sink: W) -> Result<W, Unsafe> {
    let fail = |entry: &Path, refusal: Refusal| Unsafe {
        payload: name.to_string(),
        entry: entry.display().to_string(),
        refusal,
    };
    let io = |e: std::io::Error| Refusal::Io(e.to_string());
    let mut out = tar::Builder::new(sink);
    let meta = std::fs::symlink_metadata(path).map_err(|e| fail(path, io(e)))?;
    let mut entries = Vec::new();
    if meta.is_dir() {
        walk(path, Path::new(""), &mut entries).map_err(|(p, r)| fail(&p, r))?;
    } else {
        let file_name = path
            .file_name()
            .map(PathBuf::from)
            .ok_or_else(|| fail(path, Refusal::Escapes))?;
        entries.push((file_name, path.to_path_buf()));
    }
    for (rel, source) in entries {
        let meta = std::fs::symlink_metadata(&source).map_err(|e| fail(&source, io(e)))?;
        let kind = meta.file_type();
        let mode = meta.permissions().mode() & 0o7777;
        if kind.is_symlink() {
            return Err(fail(&source, Refusal::Link));
        }
        if !kind.is_file() && !kind.is_dir() {
            return Err(fail(&source, Refusal::Special(format!("{kind:?}"))));
        }
        if mode & 0o7000 != 0 {
            return Err(fail(&source, Refusal::SetId(mode)));
        }
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mode(mode & 0o755);
        if kind.is_dir() {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
            out.append_data(&mut h, &rel, std::io::empty())
                .map_err(|e| fail(&source, io(e)))?;
        } else {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(meta.len());
            let file = std::fs::File::open(&source).map_err(|e| fail(&source, io(e)))?;
            out.append_data(&mut h, &rel, file.take(meta.len()))
                .map_err(|e| fail(&source, io(e)))?;
        }
    }
    out.into_inner().map_err(|e| fail(path, io(e)))
}

/// Every entry under `dir`, depth first in name order, as (path in the tar, path on disk).
#[cfg(feature = "push")]
fn walk(
    dir: &Path,
    rel: &Path,
    out: &mut Vec<(PathBuf, PathBuf)>,
) -> Result<(), (PathBuf, Refusal)> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| (dir.to_path_buf(), Refusal::Io(e.to_string())))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(|e| (dir.to_path_buf(), Refusal::Io(e.to_string())))?;
    names.sort();
    for name in names {
        let source = dir.join(&name);
        let inner = rel.join(&name);
        out.push((inner.clone(), source.clone()));
        let is_dir = std::fs::symlink_metadata(&source)
            .map_err(|e| (source.clone(), Refusal::Io(e.to_string())))?
            .is_dir();
        if is_dir {
            walk(&source, &inner, out)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
