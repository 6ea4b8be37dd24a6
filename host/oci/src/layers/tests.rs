use std::os::unix::fs::PermissionsExt as _;

use super::*;

/// One tar entry, written byte by byte whatever its name (the builder refuses `..`).
fn entry(
    tar: &mut Vec<u8>,
    name: &str,
    kind: tar::EntryType,
    mode: u32,
    data: &[u8],
    link: Option<&str>,
) {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(data.len() as u64);
    if let Some(l) = link {
        h.set_link_name(l).unwrap();
    }
    h.set_cksum();
    tar.extend_from_slice(h.as_bytes());
    tar.extend_from_slice(data);
    tar.resize(tar.len().div_ceil(512) * 512, 0);
}

fn file(tar: &mut Vec<u8>, name: &str, data: &[u8]) {
    entry(tar, name, tar::EntryType::Regular, 0o644, data, None);
}

fn dir(tar: &mut Vec<u8>, name: &str) {
    entry(tar, name, tar::EntryType::Directory, 0o755, b"", None);
}

fn layer(build: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut tar = Vec::new();
    build(&mut tar);
    tar.extend_from_slice(&[0; 1024]);
    tar
}

/// The tree's files, relative, with their contents.
fn listing(root: &Path) -> Vec<(String, String)> {
    fn walk(root: &Path, at: &Path, out: &mut Vec<(String, String)>) {
        for e in std::fs::read_dir(at).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if e.file_type().unwrap().is_dir() {
                out.push((format!("{rel}/"), String::new()));
                walk(root, &p, out);
            } else {
                out.push((rel, std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

fn apply_all(layers: &[Vec<u8>], subtree: &str) -> (tempfile::TempDir, Result<Applied, Unsafe>) {
    let into = tempfile::tempdir().unwrap();
    let mut applied = Applied::default();
    for l in layers {
        if let Err(e) = apply_layer(
            "driver",
            &l[..],
            into.path(),
            Path::new(subtree),
            UnpackLimits::default(),
            &mut applied,
        ) {
            return (into, Err(e));
        }
    }
    (into, Ok(applied))
}

#[test]
fn later_layers_replace_files_and_whiteouts_remove_them() {
    let base = layer(|t| {
        dir(t, "./opt/");
        dir(t, "./opt/nvidia/");
        file(t, "./opt/nvidia/nvidia.ko", b"550");
        file(t, "./opt/nvidia/old-firmware.bin", b"fw1");
        dir(t, "./opt/nvidia/docs/");
        file(t, "./opt/nvidia/docs/README", b"old docs");
        file(t, "/etc/os-release", b"debian");
    });
    let update = layer(|t| {
        file(t, "opt/nvidia/nvidia.ko", b"560");
        file(t, "opt/nvidia/.wh.old-firmware.bin", b"");
        file(t, "opt/nvidia/.wh.docs", b"");
        file(t, "opt/nvidia/gsp.bin", b"fw2");
    });
    let (tree, applied) = apply_all(&[base, update], "");
    let applied = applied.unwrap();
    assert_eq!(applied.whiteouts, 2);
    assert_eq!(
        listing(tree.path()),
        [
            ("etc/".into(), String::new()),
            ("etc/os-release".into(), "debian".into()),
            ("opt/".into(), String::new()),
            ("opt/nvidia/".into(), String::new()),
            ("opt/nvidia/gsp.bin".into(), "fw2".into()),
            ("opt/nvidia/nvidia.ko".into(), "560".into()),
        ]
    );
    let mode = std::fs::metadata(tree.path().join("opt/nvidia/nvidia.ko"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o444);
}

#[test]
fn an_opaque_directory_hides_only_what_the_layers_below_put_there() {
    let base = layer(|t| {
        dir(t, "lib/");
        file(t, "lib/a.so", b"a");
        dir(t, "lib/sub/");
        file(t, "lib/sub/b.so", b"b");
        file(t, "keep", b"k");
    });
    // The marker may come after the layer's own entries in that directory.
    let top = layer(|t| {
        dir(t, "lib/");
        file(t, "lib/c.so", b"c");
        dir(t, "lib/sub/");
        file(t, "lib/.wh..wh..opq", b"");
    });
    let (tree, applied) = apply_all(&[base, top], "");
    applied.unwrap();
    assert_eq!(
        listing(tree.path()),
        [
            ("keep".into(), "k".into()),
            ("lib/".into(), String::new()),
            ("lib/c.so".into(), "c".into()),
            ("lib/sub/".into(), String::new()),
        ],
        "lib/sub stays (this layer made it) but loses what was below it"
    );
}

#[test]
fn a_subtree_is_rerooted_and_the_rest_left_out() {
    let l = layer(|t| {
        file(t, "usr/bin/tool", b"t");
        file(t, "opt/driver/nvidia.ko", b"560");
        file(t, "opt/driver/fw/gsp.bin", b"fw");
        file(t, "opt/driverless", b"no");
    });
    let (tree, applied) = apply_all(&[l], "opt/driver");
    applied.unwrap();
    assert_eq!(
        listing(tree.path()),
        [
            ("fw/".into(), String::new()),
            ("fw/gsp.bin".into(), "fw".into()),
            ("nvidia.ko".into(), "560".into()),
        ]
    );
}

#[test]
fn links_devices_and_setid_bits_are_left_out_never_followed() {
    let l = layer(|t| {
        file(t, "bin/real", b"binary");
        entry(
            t,
            "bin/alias",
            tar::EntryType::Symlink,
            0o777,
            b"",
            Some("/etc/shadow"),
        );
        entry(
            t,
            "bin/hard",
            tar::EntryType::Link,
            0o755,
            b"",
            Some("bin/real"),
        );
        entry(
            t,
            "bin/outside",
            tar::EntryType::Link,
            0o755,
            b"",
            Some("../../etc/shadow"),
        );
        entry(t, "dev/null", tar::EntryType::Char, 0o666, b"", None);
        entry(t, "bin/su", tar::EntryType::Regular, 0o4755, b"su", None);
    });
    let (tree, applied) = apply_all(&[l], "");
    let applied = applied.unwrap();
    assert_eq!(
        (
            applied.symlinks,
            applied.links,
            applied.special,
            applied.set_id
        ),
        (1, 1, 1, 1)
    );
    assert_eq!(
        applied.summary(),
        "3 file(s), 14 B; left out: 1 symlink(s), 1 hard link(s) to files outside it, 1 special file(s); 1 setid bit(s) dropped"
    );
    assert_eq!(
        std::fs::read(tree.path().join("bin/hard")).unwrap(),
        b"binary",
        "a hard link to a file in the tree is a copy of it"
    );
    assert!(tree.path().join("bin/alias").symlink_metadata().is_err());
    assert!(tree.path().join("dev/null").symlink_metadata().is_err());
    let su = std::fs::metadata(tree.path().join("bin/su")).unwrap();
    assert_eq!(su.permissions().mode() & 0o7777, 0o555, "no setuid bit");
    // Nothing in the tree is a link.
    for (path, _) in listing(tree.path()) {
        let m = tree
            .path()
            .join(path.trim_end_matches('/'))
            .symlink_metadata()
            .unwrap();
        assert!(!m.file_type().is_symlink(), "{path}");
    }
}

#[test]
fn escapes_and_excess_are_refused_naming_the_entry() {
    for (name, bad) in [
        ("dotdot", layer(|t| file(t, "../etc/cron.d/x", b"x"))),
        ("whiteout", layer(|t| file(t, "opt/.wh...", b""))),
        ("nested", layer(|t| file(t, "opt/../../x", b"x"))),
    ] {
        let (_tree, out) = apply_all(&[bad], "");
        let err = out.unwrap_err();
        assert_eq!(err.refusal, Refusal::Escapes, "{name}: {err}");
        assert_eq!(err.payload, "driver");
    }
    let big = layer(|t| file(t, "a", &[0; 2048]));
    let into = tempfile::tempdir().unwrap();
    let err = apply_layer(
        "driver",
        &big[..],
        into.path(),
        Path::new(""),
        UnpackLimits {
            max_bytes: 1024,
            max_entries: 10,
        },
        &mut Applied::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            err.refusal,
            Refusal::TooLarge {
                total: 2048,
                limit: 1024
            }
        ),
        "{err}"
    );
    assert_eq!(err.entry, "a");
}

#[test]
fn a_file_replaces_a_directory_and_a_directory_a_file() {
    let base = layer(|t| {
        file(t, "x", b"file");
        dir(t, "y/");
        file(t, "y/inner", b"i");
    });
    let top = layer(|t| {
        file(t, "x/now-a-dir", b"d");
        file(t, "y", b"now a file");
    });
    let (tree, applied) = apply_all(&[base, top], "");
    applied.unwrap();
    assert_eq!(
        listing(tree.path()),
        [
            ("x/".into(), String::new()),
            ("x/now-a-dir".into(), "d".into()),
            ("y".into(), "now a file".into()),
        ]
    );
}
