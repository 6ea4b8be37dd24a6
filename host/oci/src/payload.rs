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
        place(&mut entry, into, limits, &mut made).map_err(|r| fail(&raw, r))?;
        let end = entry.raw_file_position() + entry.size().div_ceil(512) * 512;
        at.ended(end);
    }
    Ok(made)
}

/// Checks one entry and writes what it makes under `into`, counted in `made`.
fn place<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    into: &Path,
    limits: UnpackLimits,
    made: &mut Made,
) -> Result<(), Refusal> {
    let io = |e: std::io::Error| Refusal::Io(e.to_string());
    made.entries = made.entries.saturating_add(1);
    if made.entries > limits.max_entries {
        return Err(Refusal::TooManyEntries(made.entries));
    }
    let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
    let header = entry.header();
    let kind = header.entry_type();
    let mode = header.mode().map_err(io)?;
    let declared = header.size().map_err(io)?;
    let rel = inside(Path::new(&raw))?;
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
mod tests {
    use super::*;

    /// A tar entry written byte by byte, whatever its name (the builder refuses `..`).
    fn entry(tar: &mut Vec<u8>, name: &str, kind: tar::EntryType, mode: u32, data: &[u8]) {
        entry_declaring(tar, name, kind, mode, data.len() as u64, data);
    }

    fn entry_declaring(
        tar: &mut Vec<u8>,
        name: &str,
        kind: tar::EntryType,
        mode: u32,
        size: u64,
        data: &[u8],
    ) {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        if kind == tar::EntryType::Symlink || kind == tar::EntryType::Link {
            h.set_link_name("/etc/shadow").unwrap();
        }
        h.set_cksum();
        tar.extend_from_slice(h.as_bytes());
        tar.extend_from_slice(data);
        tar.resize(tar.len().div_ceil(512) * 512, 0);
    }

    fn finish(mut tar: Vec<u8>) -> Vec<u8> {
        tar.extend_from_slice(&[0; 1024]);
        tar
    }

    fn name() -> PayloadName {
        PayloadName::parse("driver").unwrap()
    }

    /// A file past several early-writeback steps (and not a multiple of one) is written
    /// whole and byte for byte, read-only.
    #[test]
    fn a_large_file_is_written_whole_while_its_writeback_starts_early() {
        let dir = tempfile::tempdir().unwrap();
        let size = 2 * EarlyWriteback::EVERY + 12_345;
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let target = dir.path().join("module.ko");
        write_read_only(&target, &mut data.as_slice(), size, 0o644).unwrap();
        assert!(std::fs::read(&target).unwrap() == data, "the same bytes");
        let mode = std::fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o444);
        let short = dir.path().join("short.ko");
        assert!(matches!(
            write_read_only(&short, &mut &data[..100], 200, 0o644),
            Err(Refusal::Truncated {
                declared: 200,
                read: 100
            })
        ));
    }

    fn unpack_bytes(
        tar: &[u8],
        limits: UnpackLimits,
    ) -> (tempfile::TempDir, Result<Unpacked, Unsafe>) {
        let dir = tempfile::tempdir().unwrap();
        let out = unpack(&name(), tar, dir.path(), limits);
        (dir, out)
    }

    /// Every boundary an unpack reports, with what the tree held there.
    #[derive(Default)]
    struct Recorded {
        ended: Option<u64>,
        points: Vec<(u64, Made)>,
    }

    impl Boundaries for Recorded {
        fn ended(&mut self, offset: u64) {
            self.ended = Some(offset);
        }
        fn before_next(&mut self, made: &Made) {
            // The first entry has none before it.
            if let Some(offset) = self.ended.take() {
                self.points.push((offset, made.clone()));
            }
        }
    }

    /// Every file and directory under `root`: path, mode, content.
    fn listing(root: &Path) -> Vec<(PathBuf, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut dirs = vec![PathBuf::new()];
        while let Some(rel) = dirs.pop() {
            for e in std::fs::read_dir(root.join(&rel)).unwrap() {
                let e = e.unwrap();
                let inner = rel.join(e.file_name());
                let meta = e.metadata().unwrap();
                let mode = meta.permissions().mode() & 0o7777;
                if meta.is_dir() {
                    dirs.push(inner.clone());
                    out.push((inner, mode, Vec::new()));
                } else {
                    out.push((inner, mode, std::fs::read(e.path()).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    /// Cut off anywhere after a boundary, pruned to what the boundary's record lists and
    /// resumed from it with the rest of the tar, an unpack makes the very tree an unbroken
    /// one makes — with what the cut left half-written gone.
    #[test]
    fn an_unpack_resumed_from_a_boundary_makes_the_same_tree() {
        let mut tar = Vec::new();
        entry(&mut tar, "lib/", tar::EntryType::Directory, 0o755, b"");
        entry(
            &mut tar,
            "lib/a.ko",
            tar::EntryType::Regular,
            0o644,
            &[7; 1000],
        );
        entry(
            &mut tar,
            "bin/tool",
            tar::EntryType::Regular,
            0o755,
            &[1; 600],
        );
        entry(&mut tar, "c/", tar::EntryType::Directory, 0o755, b"");
        entry(&mut tar, "c/d/e", tar::EntryType::Regular, 0o644, b"last");
        let tar = finish(tar);
        let whole = tempfile::tempdir().unwrap();
        let mut recorded = Recorded::default();
        let made = unpack_from(
            &name(),
            tar.as_slice(),
            whole.path(),
            UnpackLimits::default(),
            Made::default(),
            &mut recorded,
        )
        .unwrap();
        assert_eq!(
            made.done,
            Unpacked {
                files: 3,
                dirs: 2,
                bytes: 1604
            }
        );
        let offsets: Vec<u64> = recorded.points.iter().map(|(o, _)| *o).collect();
        assert_eq!(offsets, [512, 2048, 3584, 4096], "one per entry boundary");
        for (offset, at) in recorded.points {
            let at_len = at.paths.len();
            for cut in [offset + 512, offset + 700, tar.len() as u64 - 1024] {
                let dir = tempfile::tempdir().unwrap();
                let cut = usize::try_from(cut).unwrap().min(tar.len());
                // What a download cut off there left: the entries before it, and part of the
                // one it was in.
                let _ = unpack(&name(), &tar[..cut], dir.path(), UnpackLimits::default());
                prune(dir.path(), &at).unwrap();
                let kept = listing(dir.path());
                assert!(
                    kept.iter()
                        .all(|(p, _, _)| at.paths.iter().any(|m| m.starts_with(p))),
                    "pruned to the record at {offset}: {kept:?}"
                );
                let resumed = unpack_from(
                    &name(),
                    &tar[usize::try_from(offset).unwrap()..],
                    dir.path(),
                    UnpackLimits::default(),
                    at.clone(),
                    &mut (),
                )
                .unwrap_or_else(|e| panic!("resumed at {offset} after a cut at {cut}: {e}"));
                assert_eq!(resumed, made, "resumed at {offset} ({at_len} paths kept)");
                assert_eq!(listing(dir.path()), listing(whole.path()), "at {offset}");
            }
        }
    }

    #[test]
    fn files_and_directories_unpack_read_only() {
        let mut tar = Vec::new();
        entry(&mut tar, "./", tar::EntryType::Directory, 0o755, b"");
        entry(&mut tar, "lib/", tar::EntryType::Directory, 0o755, b"");
        entry(
            &mut tar,
            "lib/nvidia.ko",
            tar::EntryType::Regular,
            0o644,
            b"module",
        );
        entry(&mut tar, "bin/tool", tar::EntryType::Regular, 0o755, b"#!");
        let (dir, out) = unpack_bytes(&finish(tar), UnpackLimits::default());
        assert_eq!(
            out.unwrap(),
            Unpacked {
                files: 2,
                dirs: 1,
                bytes: 8
            }
        );
        let ko = dir.path().join("lib/nvidia.ko");
        assert_eq!(std::fs::read(&ko).unwrap(), b"module");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&ko), 0o444);
        assert_eq!(mode(&dir.path().join("bin/tool")), 0o555);
    }

    /// Every entry a payload may not hold, each refused with its own reason and nothing
    /// written outside the directory.
    #[test]
    fn hostile_tars_are_refused_naming_the_entry() {
        use tar::EntryType as T;
        type Case = (&'static str, Vec<u8>, fn(&Refusal) -> bool);
        let cases: Vec<Case> = vec![
            ("../escape", one("../escape", T::Regular, 0o644), |r| {
                *r == Refusal::Escapes
            }),
            (
                "a/../../escape",
                one("a/../../escape", T::Regular, 0o644),
                |r| *r == Refusal::Escapes,
            ),
            ("/etc/evil", one("/etc/evil", T::Regular, 0o644), |r| {
                *r == Refusal::Escapes
            }),
            ("link", one("link", T::Symlink, 0o777), |r| {
                *r == Refusal::Link
            }),
            ("hard", one("hard", T::Link, 0o644), |r| *r == Refusal::Link),
            ("dev", one("dev", T::Char, 0o600), |r| {
                matches!(r, Refusal::Special(_))
            }),
            ("blk", one("blk", T::Block, 0o600), |r| {
                matches!(r, Refusal::Special(_))
            }),
            ("fifo", one("fifo", T::Fifo, 0o600), |r| {
                matches!(r, Refusal::Special(_))
            }),
            ("suid", one("suid", T::Regular, 0o4755), |r| {
                *r == Refusal::SetId(0o4755)
            }),
            ("sgid", one("sgid", T::Regular, 0o2755), |r| {
                *r == Refusal::SetId(0o2755)
            }),
            ("sticky", one("sticky", T::Directory, 0o1777), |r| {
                *r == Refusal::SetId(0o1777)
            }),
            (
                "twice",
                {
                    let mut t = Vec::new();
                    entry(&mut t, "twice", T::Regular, 0o644, b"a");
                    entry(&mut t, "twice", T::Regular, 0o644, b"b");
                    finish(t)
                },
                |r| *r == Refusal::Duplicate,
            ),
            (
                "bomb",
                {
                    // A header declaring 2^40 bytes, with none behind it.
                    let mut t = Vec::new();
                    entry_declaring(&mut t, "bomb", T::Regular, 0o644, 1 << 40, b"");
                    t
                },
                |r| matches!(r, Refusal::TooLarge { total, .. } if *total == 1 << 40),
            ),
            (
                "short",
                {
                    let mut t = Vec::new();
                    entry_declaring(&mut t, "short", T::Regular, 0o644, 4096, b"only this");
                    t
                },
                |r| {
                    matches!(
                        r,
                        Refusal::Truncated { declared: 4096, .. } | Refusal::Io(_)
                    )
                },
            ),
        ];
        for (entry_name, tar, expected) in cases {
            let outside = tempfile::tempdir().unwrap();
            let root = outside.path().join("root");
            std::fs::create_dir(&root).unwrap();
            let err = unpack(&name(), tar.as_slice(), &root, UnpackLimits::default())
                .expect_err(entry_name);
            assert_eq!(err.payload, "driver");
            assert_eq!(err.entry, entry_name);
            assert!(expected(&err.refusal), "{entry_name}: {err}");
            let escaped: Vec<_> = std::fs::read_dir(outside.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(escaped, ["root"], "{entry_name}: nothing beside the root");
            assert!(!Path::new("/etc/evil").exists());
        }
        let mut many = Vec::new();
        for i in 0..3 {
            entry(
                &mut many,
                &format!("f{i}"),
                tar::EntryType::Regular,
                0o644,
                b"x",
            );
        }
        let limits = UnpackLimits {
            max_bytes: 10,
            max_entries: 2,
        };
        let (_d, out) = unpack_bytes(&finish(many), limits);
        assert_eq!(out.unwrap_err().refusal, Refusal::TooManyEntries(3));
    }

    fn one(name: &str, kind: tar::EntryType, mode: u32) -> Vec<u8> {
        let mut t = Vec::new();
        entry(
            &mut t,
            name,
            kind,
            mode,
            if kind == tar::EntryType::Regular {
                b"x"
            } else {
                b""
            },
        );
        finish(t)
    }

    #[cfg(feature = "push")]
    #[test]
    fn pack_is_reproducible_and_refuses_what_unpack_would() {
        use std::os::unix::fs::PermissionsExt as _;
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir(src.path().join("lib")).unwrap();
        std::fs::write(src.path().join("lib/b.ko"), b"bee").unwrap();
        std::fs::write(src.path().join("a.txt"), b"a").unwrap();
        let one = pack(&name(), src.path()).unwrap();
        assert_eq!(one, pack(&name(), src.path()).unwrap(), "byte for byte");
        let on_disk = src.path().with_extension("tar");
        let (digest, size) = pack_to(&name(), src.path(), &on_disk).unwrap();
        assert_eq!(
            std::fs::read(&on_disk).unwrap(),
            one,
            "packed to a file, the same bytes"
        );
        assert_eq!(
            (digest, size),
            (crate::digest::sha256_digest(&one), one.len() as u64)
        );
        let out = tempfile::tempdir().unwrap();
        let done = unpack(&name(), one.as_slice(), out.path(), UnpackLimits::default()).unwrap();
        assert_eq!((done.files, done.dirs, done.bytes), (2, 1, 4));
        assert_eq!(std::fs::read(out.path().join("lib/b.ko")).unwrap(), b"bee");

        let file = pack(&name(), &src.path().join("a.txt")).unwrap();
        let out = tempfile::tempdir().unwrap();
        unpack(
            &name(),
            file.as_slice(),
            out.path(),
            UnpackLimits::default(),
        )
        .unwrap();
        assert_eq!(
            std::fs::read(out.path().join("a.txt")).unwrap(),
            b"a",
            "a file packs under its own name"
        );

        std::os::unix::fs::symlink("/etc/shadow", src.path().join("lib/link")).unwrap();
        assert_eq!(
            pack(&name(), src.path()).unwrap_err().refusal,
            Refusal::Link
        );
        std::fs::remove_file(src.path().join("lib/link")).unwrap();
        std::fs::set_permissions(
            src.path().join("a.txt"),
            std::fs::Permissions::from_mode(0o4755),
        )
        .unwrap();
        assert_eq!(
            pack(&name(), src.path()).unwrap_err().refusal,
            Refusal::SetId(0o4755)
        );
    }
}
