//! The secure-path rule, tried the way an attacker owning part of the tree would.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use nodewright_api::grants::GrantedPath;

use crate::error::HostError;
use crate::rootfs::{RootFs, WriteOptions};

const MAX: u64 = 1 << 20;

/// A root with `/etc/cron.d`, `/var/lib` and a merged-/usr `/lib -> usr/lib`, every
/// directory `0755` whatever the umask.
fn host() -> (tempfile::TempDir, RootFs) {
    let tmp = tempfile::tempdir().unwrap();
    for d in [
        "etc/cron.d",
        "var/lib",
        "usr/lib/modules/6.1",
        "usr/src/linux",
    ] {
        std::fs::create_dir_all(tmp.path().join(d)).unwrap();
    }
    symlink("usr/lib", tmp.path().join("lib")).unwrap();
    for d in [
        "",
        "etc",
        "var",
        "var/lib",
        "usr",
        "usr/lib",
        "usr/lib/modules",
    ] {
        let p = tmp.path().join(d);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let fs = RootFs::open(tmp.path()).unwrap();
    (tmp, fs)
}

fn write(fs: &RootFs, base: &str, path: &str) -> crate::Result<u32> {
    fs.write(
        GrantedPath::as_found(Path::new(base)),
        Path::new(path),
        b"* * * * * root sh /tmp/x\n",
        &WriteOptions::default(),
    )
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A service account owns `/var/lib/svc` and puts `data -> /etc/cron.d` there; the grant
/// is `/var/lib/svc/data`. The root-run write must not land in `/etc/cron.d`.
#[test]
fn a_link_in_a_directory_someone_else_owns_is_not_followed() {
    if !is_root() {
        eprintln!("skipped: needs root to give the directory to another user");
        return;
    }
    let (tmp, fs) = host();
    let svc = tmp.path().join("var/lib/svc");
    std::fs::create_dir(&svc).unwrap();
    symlink("/etc/cron.d", svc.join("data")).unwrap();
    std::os::unix::fs::chown(&svc, Some(1000), Some(1000)).unwrap();
    let err = write(&fs, "/var/lib/svc/data", "/var/lib/svc/data/job").unwrap_err();
    assert!(matches!(err, HostError::UntrustedSymlink { .. }), "{err:?}");
    assert!(err.to_string().contains("owned by uid 1000"), "{err}");
    assert!(!tmp.path().join("etc/cron.d/job").exists());
    // Reads, listings and metadata changes take the same path.
    assert!(matches!(
        fs.list_dir(
            GrantedPath::as_found(Path::new("/var/lib/svc/data")),
            Path::new("/var/lib/svc/data")
        ),
        Err(HostError::UntrustedSymlink { .. })
    ));
    assert!(matches!(
        fs.create_dir(
            GrantedPath::as_found(Path::new("/var/lib/svc/data")),
            Path::new("/var/lib/svc/data/d"),
            None
        ),
        Err(HostError::UntrustedSymlink { .. })
    ));
}

#[test]
fn a_link_another_user_owns_is_not_followed_even_in_a_root_directory() {
    if !is_root() {
        eprintln!("skipped: needs root to give the link to another user");
        return;
    }
    let (tmp, fs) = host();
    let link = tmp.path().join("var/lib/data");
    symlink("/etc/cron.d", &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(1000), Some(1000)).unwrap();
    let err = write(&fs, "/var/lib/data", "/var/lib/data/job").unwrap_err();
    assert!(matches!(err, HostError::UntrustedSymlink { .. }), "{err:?}");
    assert!(!tmp.path().join("etc/cron.d/job").exists());
}

#[test]
fn a_link_in_a_directory_others_may_write_is_not_followed() {
    let (tmp, fs) = host();
    let shared = tmp.path().join("var/lib/shared");
    std::fs::create_dir(&shared).unwrap();
    symlink("/etc/cron.d", shared.join("data")).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let err = write(&fs, "/var/lib/shared/data", "/var/lib/shared/data/job").unwrap_err();
    assert!(
        err.to_string().contains("writable by group or others"),
        "{err}"
    );
    assert!(!tmp.path().join("etc/cron.d/job").exists());
}

/// Merged /usr: `/lib` is root's link to `usr/lib`; a driver's module lands below it.
#[test]
fn root_links_in_root_directories_are_followed() {
    let (tmp, fs) = host();
    let made = write(&fs, "/lib/modules", "/lib/modules/6.1/extra/nvidia.ko").unwrap();
    assert_eq!(made, 1, "only extra/ was missing");
    assert!(
        tmp.path()
            .join("usr/lib/modules/6.1/extra/nvidia.ko")
            .is_file()
    );
    assert_eq!(
        fs.list_dir(
            GrantedPath::as_found(Path::new("/lib")),
            Path::new("/lib/modules/6.1")
        )
        .unwrap(),
        ["extra"]
    );
    // A grant of the link itself covers the directory it names.
    assert_eq!(
        fs.list_dir(GrantedPath::as_found(Path::new("/lib")), Path::new("/lib"))
            .unwrap(),
        ["modules"]
    );
}

/// Even a trusted link may not take a path out of its grant: `build -> /usr/src/linux`
/// inside `/lib/modules/6.1` is followed by no write under the grant `/lib/modules`.
#[test]
fn a_trusted_link_still_ends_inside_the_grant() {
    let (tmp, fs) = host();
    symlink(
        "/usr/src/linux",
        tmp.path().join("usr/lib/modules/6.1/build"),
    )
    .unwrap();
    let err = write(&fs, "/lib/modules", "/lib/modules/6.1/build/Makefile").unwrap_err();
    assert!(matches!(err, HostError::Escape { .. }), "{err:?}");
    let err = fs
        .create_dir(
            GrantedPath::as_found(Path::new("/lib/modules")),
            Path::new("/lib/modules/6.1/build/x/y"),
            None,
        )
        .unwrap_err();
    assert!(matches!(err, HostError::Escape { .. }), "{err:?}");
    assert_eq!(
        std::fs::read_dir(tmp.path().join("usr/src/linux"))
            .unwrap()
            .count(),
        0,
        "nothing was made outside the grant"
    );
    // Within the grant a trusted link is read through.
    // Out of the grant and back in again on the way: only where it ends counts.
    symlink("../modules/6.1", tmp.path().join("usr/lib/modules/current")).unwrap();
    write(&fs, "/lib/modules", "/lib/modules/6.1/modules.dep").unwrap();
    assert!(
        fs.read(
            GrantedPath::as_found(Path::new("/lib/modules")),
            Path::new("/lib/modules/current/modules.dep"),
            MAX
        )
        .is_ok()
    );
}

/// A link loop is the request's failure, not a host fault to retry.
#[test]
fn a_link_loop_is_refused_as_the_request() {
    let (tmp, fs) = host();
    symlink("b", tmp.path().join("var/lib/a")).unwrap();
    symlink("a", tmp.path().join("var/lib/b")).unwrap();
    let err = write(&fs, "/var/lib", "/var/lib/a/x").unwrap_err();
    assert!(matches!(err, HostError::Refused { .. }), "{err:?}");
}

/// Errors the request provokes (`File exists`, `Not a directory`, a name too long) are
/// the request's, so the engine blames the package, never retries them as the host's.
#[test]
fn errors_the_request_provokes_are_refusals() {
    let (tmp, fs) = host();
    std::fs::write(tmp.path().join("var/lib/f"), "x").unwrap();
    let base = GrantedPath::as_found(Path::new("/var/lib"));
    for (what, result) in [
        (
            "mkdir over a file",
            fs.create_dir(base, Path::new("/var/lib/f"), None),
        ),
        (
            "below a file",
            fs.create_dir(base, Path::new("/var/lib/f/g"), None),
        ),
        (
            "a name too long",
            fs.create_dir(base, &Path::new("/var/lib").join("n".repeat(300)), None),
        ),
    ] {
        let err = result.unwrap_err();
        assert!(matches!(err, HostError::Refused { .. }), "{what}: {err:?}");
    }
    let err = fs.read(base, Path::new("/var/lib"), MAX).unwrap_err();
    assert!(
        matches!(err, HostError::Refused { .. }),
        "read of a directory: {err:?}"
    );
}

/// A grant written without a trailing `/` that is not a directory on the node covers one
/// file: removing it and making a directory in its place (or writing below its name, which
/// would make one) is refused, however the calls are ordered; written with the `/`, the
/// grant names a directory the plugin may make.
#[test]
fn a_file_grant_is_never_made_a_directory() {
    let (tmp, fs) = host();
    let conf = tmp.path().join("var/lib/app.conf");
    std::fs::write(&conf, "x").unwrap();
    let file = GrantedPath::as_found(Path::new("/var/lib/app.conf"));
    let below = Path::new("/var/lib/app.conf/sub/x");
    // While the file is there: nothing lives below a file.
    assert!(matches!(
        fs.create_dir(file, Path::new("/var/lib/app.conf"), None),
        Err(HostError::Refused { .. })
    ));
    fs.remove(file, Path::new("/var/lib/app.conf")).unwrap();
    for result in [
        fs.create_dir(file, Path::new("/var/lib/app.conf"), None),
        fs.create_dir(file, below, None),
        write(&fs, "/var/lib/app.conf", "/var/lib/app.conf/sub/x"),
    ] {
        let err = result.unwrap_err();
        assert!(matches!(err, HostError::FileGrant { .. }), "{err:?}");
        assert!(
            err.to_string().contains("grant `/var/lib/app.conf/`"),
            "{err}"
        );
    }
    assert!(!conf.exists());
    // The file itself may be written again, and its parents made on the way.
    fs.write(
        file,
        Path::new("/var/lib/app.conf"),
        b"y",
        &WriteOptions::default(),
    )
    .unwrap();
    assert!(conf.is_file());
    let nested = GrantedPath::as_found(Path::new("/var/lib/new/one.conf"));
    fs.write(nested, nested.path, b"z", &WriteOptions::default())
        .unwrap();

    // A directory grant is made when missing, with what is below it.
    let dir = GrantedPath::directory(Path::new("/var/lib/tree"));
    assert_eq!(
        fs.create_dir(dir, Path::new("/var/lib/tree/a/b"), None)
            .unwrap(),
        3
    );
    // A grant without the `/` that is a directory on the node still covers its tree.
    let found = GrantedPath::as_found(Path::new("/var/lib/tree"));
    fs.write(
        found,
        Path::new("/var/lib/tree/a/c/x"),
        b"w",
        &WriteOptions::default(),
    )
    .unwrap();
    assert!(tmp.path().join("var/lib/tree/a/c/x").is_file());
}

/// Wherever the one-call resolution (`openat2`) answers, the component walk answers the
/// same: the same directory, name, grant flag and `lstat` — over every path of up to three
/// names drawn from a tree with each kind of entry (directories, a file, a FIFO, relative,
/// absolute, looping and dangling links, a world-writable directory holding a link), under
/// directory and file grants, for looks, reads and writes. And it answers the plain paths,
/// so the comparison is not empty.
#[test]
fn the_one_call_resolution_agrees_with_the_walk_wherever_it_answers() {
    use super::{Last, Resolve};
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    for d in ["a/d/e", "w"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::write(root.join("a/f"), "x").unwrap();
    std::fs::write(root.join("a/d/f"), "y").unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("a/p"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    symlink("d", root.join("a/l")).unwrap();
    symlink("/a/d", root.join("a/abs")).unwrap();
    symlink("loop", root.join("a/loop")).unwrap();
    symlink("gone", root.join("a/dangling")).unwrap();
    symlink("../a/d", root.join("w/l")).unwrap();
    for (d, mode) in [("", 0o755), ("a", 0o755), ("a/d", 0o755), ("w", 0o777)] {
        std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let fs = RootFs::open(root).unwrap();
    let names = [
        "d", "e", "f", "p", "l", "abs", "loop", "dangling", "missing", "..", ".",
    ];
    let mut tails = vec![String::new()];
    for _ in 0..3 {
        let longer: Vec<String> = tails
            .iter()
            .flat_map(|t| names.iter().map(move |n| format!("{t}/{n}")))
            .collect();
        tails.extend(longer);
    }
    tails.sort();
    tails.dedup();
    let grants = [
        GrantedPath::directory(Path::new("/a")),
        GrantedPath::as_found(Path::new("/a/d")),
        GrantedPath::as_found(Path::new("/a/f")),
        GrantedPath::as_found(Path::new("/a/l")),
        GrantedPath::as_found(Path::new("/w")),
    ];
    let hows = [
        Resolve::LOOK,
        Resolve::FOLLOW,
        Resolve {
            last: Last::Entry,
            create: Some(8),
        },
    ];
    let inode = |d: &cap_std::fs::Dir| {
        let st = rustix::fs::fstat(d).unwrap();
        (st.st_dev, st.st_ino)
    };
    let seen = |s: &super::Seen| match s {
        super::Seen::Held => (0, 0, 0),
        super::Seen::Missing => (1, 0, 0),
        super::Seen::Entry(st) => (2, st.st_ino, st.st_mode),
    };
    let (mut answered, mut compared) = (0, 0);
    for grant in grants {
        for tail in &tails {
            let path = format!("{}{tail}", grant.path.display());
            let path = Path::new(&path);
            for how in hows {
                compared += 1;
                let Some(fast) = fs.resolve_plain(grant, path, how) else {
                    continue;
                };
                answered += 1;
                let walked = fs.walk(grant, path, how).unwrap_or_else(|e| {
                    panic!("{path:?} under {grant:?} ({how:?}): one call answered, the walk: {e}")
                });
                let what = format!("{path:?} under {grant:?} ({how:?})");
                assert_eq!(inode(&fast.dir), inode(&walked.dir), "{what}: directory");
                assert_eq!(fast.rel, walked.rel, "{what}: name");
                assert_eq!(fast.is_base, walked.is_base, "{what}: is the grant");
                assert_eq!(fast.made, walked.made, "{what}: made");
                assert_eq!(seen(&fast.seen), seen(&walked.seen), "{what}: lstat");
            }
        }
    }
    assert!(
        answered > 300,
        "the one-call resolution answered {answered} of {compared}"
    );
    // What it must leave to the walk: links (anywhere), `..`, a name at the root.
    for (grant, path) in [
        ("/a", "/a/l/f"),
        ("/a", "/a/l"),
        ("/a", "/a/d/../f"),
        ("/a/l", "/a/l/f"),
        ("/w", "/w/l/f"),
        ("/a", "/a"),
    ] {
        let grant = GrantedPath::as_found(Path::new(grant));
        assert!(
            fs.resolve_plain(grant, Path::new(path), Resolve::FOLLOW)
                .is_none(),
            "{path} under {grant:?}"
        );
    }
    assert!(
        fs.resolve_plain(
            GrantedPath::as_found(Path::new("/a")),
            Path::new("/a/d/f"),
            Resolve::FOLLOW
        )
        .is_some()
    );
}
