use super::write::create_private;
use super::*;
use std::os::unix::fs::MetadataExt as _;

const MAX: u64 = 1 << 20;

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
    let base = GrantedPath::as_found(Path::new("/etc/app"));
    fs.write(
        base,
        Path::new("/etc/app/sub/b.conf"),
        b"hello",
        &WriteOptions {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        fs.read(base, Path::new("/etc/app/sub/b.conf"), MAX)
            .unwrap(),
        b"hello"
    );
    let st = fs
        .stat(base, Path::new("/etc/app/sub/b.conf"))
        .unwrap()
        .unwrap();
    assert_eq!((st.kind, st.mode, st.size), (FileKind::File, 0o600, 5));
    // Rewriting keeps the mode when none is given.
    fs.write(
        base,
        Path::new("/etc/app/sub/b.conf"),
        b"bye",
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(
        fs.stat(base, Path::new("/etc/app/sub/b.conf"))
            .unwrap()
            .unwrap()
            .mode,
        0o600
    );
    assert_eq!(
        fs.list_dir(base, Path::new("/etc/app")).unwrap(),
        ["a.conf", "sub"]
    );
    assert!(tmp.path().join("etc/app/sub/b.conf").exists());
    fs.remove(base, Path::new("/etc/app/sub/b.conf")).unwrap();
    fs.remove(base, Path::new("/etc/app/sub/b.conf")).unwrap();
    assert_eq!(
        fs.stat(base, Path::new("/etc/app/sub/b.conf")).unwrap(),
        None
    );
}

#[test]
fn relative_symlink_out_of_the_grant_is_refused() {
    let (tmp, fs) = fixture();
    std::os::unix::fs::symlink("../shadow", tmp.path().join("etc/app/link")).unwrap();
    let err = fs
        .read(
            GrantedPath::as_found(Path::new("/etc/app")),
            Path::new("/etc/app/link"),
            MAX,
        )
        .unwrap_err();
    assert!(matches!(err, HostError::Escape { .. }), "{err:?}");
    let err = fs
        .write(
            GrantedPath::as_found(Path::new("/etc/app")),
            Path::new("/etc/app/link"),
            b"x",
            &WriteOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(err, HostError::Symlink(_)), "{err:?}");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("etc/shadow")).unwrap(),
        "secret"
    );
}

#[test]
fn absolute_symlink_is_refused() {
    let (tmp, fs) = fixture();
    std::os::unix::fs::symlink("/etc/shadow", tmp.path().join("etc/app/abs")).unwrap();
    let err = fs
        .read(
            GrantedPath::as_found(Path::new("/etc/app")),
            Path::new("/etc/app/abs"),
            MAX,
        )
        .unwrap_err();
    assert!(matches!(err, HostError::Escape { .. }), "{err:?}");
}

#[test]
fn single_file_grant_refuses_a_symlinked_file() {
    let (tmp, fs) = fixture();
    std::os::unix::fs::symlink("shadow", tmp.path().join("etc/motd")).unwrap();
    let err = fs
        .read(
            GrantedPath::as_found(Path::new("/etc/motd")),
            Path::new("/etc/motd"),
            MAX,
        )
        .unwrap_err();
    assert!(matches!(err, HostError::Escape { .. }), "{err:?}");
    std::fs::write(tmp.path().join("etc/hostname"), "n1").unwrap();
    assert_eq!(
        fs.read(
            GrantedPath::as_found(Path::new("/etc/hostname")),
            Path::new("/etc/hostname"),
            MAX
        )
        .unwrap(),
        b"n1"
    );
}

#[test]
fn path_outside_base_is_refused() {
    let (_tmp, fs) = fixture();
    let err = fs
        .read(
            GrantedPath::as_found(Path::new("/etc/app")),
            Path::new("/etc/shadow"),
            MAX,
        )
        .unwrap_err();
    assert!(matches!(err, HostError::Escape { .. }), "{err:?}");
}

#[test]
fn a_single_file_grant_has_nothing_below_it() {
    let (tmp, fs) = fixture();
    std::fs::write(tmp.path().join("etc/x"), "file").unwrap();
    let err = fs
        .write(
            GrantedPath::as_found(Path::new("/etc/x")),
            Path::new("/etc/x/y"),
            b"owned",
            &WriteOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(err, HostError::NotADirectory { .. }), "{err:?}");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("etc/x")).unwrap(),
        "file",
        "the file itself was not written"
    );
    assert!(matches!(
        fs.read(
            GrantedPath::as_found(Path::new("/etc/x")),
            Path::new("/etc/x/y"),
            MAX
        ),
        Err(HostError::NotADirectory { .. })
    ));
}

#[test]
fn reads_are_bounded() {
    let (tmp, fs) = fixture();
    std::fs::write(tmp.path().join("etc/app/big"), vec![b'x'; 4097]).unwrap();
    let err = fs
        .read(
            GrantedPath::as_found(Path::new("/etc/app")),
            Path::new("/etc/app/big"),
            4096,
        )
        .unwrap_err();
    assert!(
        matches!(err, HostError::TooLarge { limit: 4096, .. }),
        "{err:?}"
    );
    assert_eq!(
        fs.read(
            GrantedPath::as_found(Path::new("/etc/app")),
            Path::new("/etc/app/big"),
            4097
        )
        .unwrap()
        .len(),
        4097
    );
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let (tmp, fs) = fixture();
    let fifo = tmp.path().join("etc/app/pipe");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let base = GrantedPath::as_found(Path::new("/etc/app"));
    let pipe = Path::new("/etc/app/pipe");
    assert!(matches!(
        fs.read(base, pipe, MAX),
        Err(HostError::NotRegular { .. })
    ));
    assert!(matches!(
        fs.set_mode(base, pipe, 0o600),
        Err(HostError::NotRegular { .. })
    ));
    assert!(matches!(
        fs.set_owner(base, pipe, 0, 0),
        Err(HostError::NotRegular { .. })
    ));
    assert!(matches!(
        fs.write(base, pipe, b"x", &WriteOptions::default()),
        Err(HostError::NotRegular { .. })
    ));
}

#[test]
fn special_bits_are_kept_only_when_asked() {
    let (tmp, fs) = fixture();
    let base = GrantedPath::as_found(Path::new("/etc/app"));
    let plain = WriteOptions {
        mode: Some(0o4777),
        ..Default::default()
    };
    fs.write(base, Path::new("/etc/app/s"), b"x", &plain)
        .unwrap();
    assert_eq!(
        std::fs::metadata(tmp.path().join("etc/app/s"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o777
    );
    let special = WriteOptions {
        mode: Some(0o4755),
        special_modes: true,
        ..Default::default()
    };
    fs.write(base, Path::new("/etc/app/s"), b"x", &special)
        .unwrap();
    assert_eq!(
        std::fs::metadata(tmp.path().join("etc/app/s"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o4755
    );
    // Rewriting without special modes drops the bits the file had.
    fs.write(
        base,
        Path::new("/etc/app/s"),
        b"y",
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(
        std::fs::metadata(tmp.path().join("etc/app/s"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o755
    );
}

#[test]
fn temporary_files_are_private_until_complete() {
    let (tmp, _fs) = fixture();
    let dir = Dir::open_ambient_dir(tmp.path().join("etc/app"), ambient_authority()).unwrap();
    let f = create_private(&dir, ".x.tmp").unwrap();
    assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
    assert!(
        create_private(&dir, ".x.tmp").is_err(),
        "never over an existing file"
    );
    std::os::unix::fs::symlink("../shadow", tmp.path().join("etc/app/.l.tmp")).unwrap();
    assert!(
        create_private(&dir, ".l.tmp").is_err(),
        "never through a symlink"
    );
}

#[test]
fn a_write_that_would_cross_the_free_space_floor_is_refused() {
    let (tmp, fs) = fixture();
    let floor = WriteOptions {
        min_free_bytes: u64::MAX / 2,
        ..Default::default()
    };
    let err = fs
        .write(
            GrantedPath::as_found(Path::new("/etc/app")),
            Path::new("/etc/app/n"),
            b"x",
            &floor,
        )
        .unwrap_err();
    assert!(matches!(err, HostError::DiskFloor { .. }), "{err:?}");
    assert!(!tmp.path().join("etc/app/n").exists());
}

#[test]
fn a_hard_link_never_carries_a_metadata_change_outside_the_grant() {
    let (tmp, fs) = fixture();
    std::fs::hard_link(tmp.path().join("etc/shadow"), tmp.path().join("etc/app/s")).unwrap();
    let before = std::fs::metadata(tmp.path().join("etc/shadow")).unwrap();
    let (base, link) = (
        GrantedPath::as_found(Path::new("/etc/app")),
        Path::new("/etc/app/s"),
    );
    assert!(matches!(
        fs.set_mode(base, link, 0o666),
        Err(HostError::HardLinked { links: 2, .. })
    ));
    assert!(matches!(
        fs.set_owner(base, link, 1234, 1234),
        Err(HostError::HardLinked { links: 2, .. })
    ));
    let after = std::fs::metadata(tmp.path().join("etc/shadow")).unwrap();
    assert_eq!(
        (before.mode(), before.uid()),
        (after.mode(), after.uid()),
        "the outside inode is untouched"
    );
    // A file with one link still changes.
    fs.set_mode(base, Path::new("/etc/app/a.conf"), 0o600)
        .unwrap();
}

/// A directory's mode and owner change through a descriptor that can carry the change (an
/// `O_PATH` descriptor, what cap-std opens a directory with, refuses `fchmod` and `fchown`
/// with `EBADF`: the fuzzer found both answered as host failures).
#[test]
fn a_directory_s_mode_and_owner_change() {
    let (tmp, fs) = fixture();
    std::fs::create_dir(tmp.path().join("etc/app/d")).unwrap();
    let base = GrantedPath::as_found(Path::new("/etc/app"));
    let dir = Path::new("/etc/app/d");
    fs.set_mode(base, dir, 0o700).unwrap();
    let uid = std::fs::metadata(tmp.path().join("etc/app/d"))
        .unwrap()
        .uid();
    fs.set_owner(base, dir, uid, uid).unwrap();
    let m = std::fs::metadata(tmp.path().join("etc/app/d")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o700);
    // The grant's own directory too.
    fs.set_mode(base, Path::new("/etc/app"), 0o750).unwrap();
    let m = std::fs::metadata(tmp.path().join("etc/app")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o750);
}

#[test]
fn stat_reports_each_kind_of_entry_as_lstat_does() {
    let (tmp, fs) = fixture();
    let base = GrantedPath::as_found(Path::new("/etc"));
    std::os::unix::fs::symlink("app/a.conf", tmp.path().join("etc/link")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        tmp.path().join("etc/pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o640),
        0,
    )
    .unwrap();
    std::fs::set_permissions(
        tmp.path().join("etc/shadow"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    for (name, kind) in [
        ("/etc", FileKind::Directory),
        ("/etc/app", FileKind::Directory),
        ("/etc/shadow", FileKind::File),
        ("/etc/link", FileKind::Symlink),
        ("/etc/pipe", FileKind::Other),
    ] {
        let host = std::fs::symlink_metadata(tmp.path().join(&name[1..])).unwrap();
        let st = fs.stat(base, Path::new(name)).unwrap().unwrap();
        assert_eq!(
            (st.kind, st.size, st.mode, st.uid, st.gid),
            (
                kind,
                host.len(),
                host.mode() & 0o7777,
                host.uid(),
                host.gid()
            ),
            "{name}"
        );
    }
    assert_eq!(fs.stat(base, Path::new("/etc/missing")).unwrap(), None);
    assert_eq!(fs.stat(base, Path::new("/etc/app/gone/x")).unwrap(), None);
    // The root itself: the directory the resolution holds, with no name to look up in it.
    let whole = GrantedPath::as_found(Path::new("/"));
    let root = std::fs::metadata(tmp.path()).unwrap();
    let st = fs.stat(whole, Path::new("/")).unwrap().unwrap();
    assert_eq!(
        (st.kind, st.mode, st.uid),
        (FileKind::Directory, root.mode() & 0o7777, root.uid())
    );
    let dir = fs.read(whole, Path::new("/"), MAX).unwrap_err().to_string();
    assert!(dir.contains("is a directory"), "{dir}");

    // A read decides from the same look what it may open.
    let read = |name: &str| fs.read(base, Path::new(name), MAX);
    assert_eq!(
        read("/etc/link").unwrap(),
        b"a",
        "a trusted link is read through"
    );
    assert!(
        matches!(read("/etc/missing"), Err(HostError::NotFound(p)) if p == "/etc/missing"),
        "{:?}",
        read("/etc/missing")
    );
    assert!(
        matches!(read("/etc/pipe"), Err(HostError::NotRegular { .. })),
        "{:?}",
        read("/etc/pipe")
    );
    let dir = read("/etc/app").unwrap_err().to_string();
    assert!(dir.contains("is a directory"), "{dir}");
}
