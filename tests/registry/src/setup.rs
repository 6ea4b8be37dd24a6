//! Whether what a test needs is set up on this machine. `cargo xtask setup` installs and
//! builds all of it once; a plain `cargo test` on a machine without it skips the tests that
//! need it, each saying what is missing and naming that command, rather than building a
//! control plane in the middle of a test run or failing on a missing binary.
//!
//! Under `cargo xtask test` (`NODEWRIGHT_REQUIRE_SETUP` set) anything missing is a failure:
//! CI never skips.

use std::path::Path;
use std::process::{Command, Stdio};

/// Something a test needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Debian's docker-registry (installed by the harness itself when running as root).
    Registry,
    /// The Go-built test control plane (etcd, kube-apiserver, kube-controller-manager,
    /// kubelet) and curl, which probes it.
    ControlPlane,
    /// helm, built from its Go module.
    Helm,
    /// cosign, built from its Go module.
    Cosign,
    /// The images' other architecture's build (`NODEWRIGHT_CROSS_BINARIES`, which `cargo
    /// xtask test` sets) and the qemu-user that runs it here.
    Cross,
}

/// The other architecture's binaries of the images and the qemu-user program that runs
/// them on this machine: `(qemu, directory)`, when both are there.
pub fn cross() -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let (qemu, triple) = if std::env::consts::ARCH == "aarch64" {
        ("/usr/bin/qemu-x86_64-static", "x86_64-unknown-linux-musl")
    } else {
        ("/usr/bin/qemu-aarch64-static", "aarch64-unknown-linux-musl")
    };
    let dir = std::env::var_os("NODEWRIGHT_CROSS_BINARIES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map_or_else(|| crate::workspace().join("target"), Into::into);
            target.join(triple).join("release")
        });
    (Path::new(qemu).is_file() && dir.join("nodewright-agent").is_file())
        .then(|| (qemu.into(), dir))
}

impl Need {
    /// What is missing, or `None` when it is there.
    fn missing(self) -> Option<&'static str> {
        let there = match self {
            Need::Registry => Path::new(crate::REGISTRY_BIN).exists() || crate::running_as_root(),
            Need::ControlPlane => {
                Path::new("/usr/bin/curl").exists() && built("tests/cluster/build.sh")
            }
            Need::Helm => built("tests/cluster/build-helm.sh"),
            Need::Cosign => built("tests/cluster/build-cosign.sh"),
            Need::Cross => cross().is_some(),
        };
        (!there).then_some(match self {
            Need::Registry => "Debian's docker-registry",
            Need::ControlPlane => "the test control plane (a Go-built Kubernetes) and curl",
            Need::Helm => "helm (built from its Go module)",
            Need::Cosign => "cosign (built from its Go module)",
            Need::Cross => {
                "the images' other architecture's build (NODEWRIGHT_CROSS_BINARIES) and Debian's qemu-user-static"
            }
        })
    }
}

/// Whether a cached build script's product is there, without building it.
fn built(script: &str) -> bool {
    Command::new("bash")
        .arg(crate::workspace().join(script))
        .env("NODEWRIGHT_CHECK_ONLY", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether everything in `needs` is here. When something is not: under
/// `NODEWRIGHT_REQUIRE_SETUP` a panic naming it; otherwise `false`, after saying the test is
/// skipped and why.
pub fn ready(needs: &[Need]) -> bool {
    let missing: Vec<&str> = needs.iter().filter_map(|n| n.missing()).collect();
    if missing.is_empty() {
        return true;
    }
    let what = missing.join(", ");
    if std::env::var_os("NODEWRIGHT_REQUIRE_SETUP").is_some() {
        panic!("this test needs {what}: run `cargo xtask setup`");
    }
    eprintln!("skipped: this test needs {what}; run `cargo xtask setup` first");
    false
}

/// Returns from the calling test, saying why, unless everything it names is set up:
/// `require!(ControlPlane, Helm)`.
#[macro_export]
macro_rules! require {
    ($($need:ident),+ $(,)?) => {
        if !$crate::setup::ready(&[$($crate::setup::Need::$need),+]) {
            return;
        }
    };
}
