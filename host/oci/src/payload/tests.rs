//! Unpacking and packing payload tars: what is written, what is refused, and resuming.

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

fn unpack_bytes(tar: &[u8], limits: UnpackLimits) -> (tempfile::TempDir, Result<Unpacked, Unsafe>) {
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
        let err =
            unpack(&name(), tar.as_slice(), &root, UnpackLimits::default()).expect_err(entry_name);
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
