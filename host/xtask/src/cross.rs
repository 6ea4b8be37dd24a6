//! The images' second architecture: the operator and agent cross-compiled for the other
//! of `x86_64`/`aarch64` (arm64 on the CI machine), static (musl), release.
//!
//! Built with `cargo zigbuild`: zig's `cc` targets any Linux architecture's musl with the
//! C headers and libc it carries, so aws-lc's and mimalloc's C cross-compile with no
//! per-architecture sysroot, and it links. Both come from PyPI (`ziglang`, `cargo-zigbuild`),
//! pinned, installed once into the build cache beside the Python plugin tools. Only the
//! two binaries the images hold are built; docs/design.md ("Multi-arch images") says why
//! this and not Debian's cross gcc.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::cargo::{self, Built, cargo};

/// The zig release `cargo-zigbuild` drives (PyPI `ziglang`).
const ZIG: &str = "0.15.2";
/// The `cargo-zigbuild` release (PyPI).
const ZIGBUILD: &str = "0.24.1";

/// The other architecture's musl target: `aarch64-unknown-linux-musl` on an x86-64 machine.
pub fn triple() -> &'static str {
    if std::env::consts::ARCH == "aarch64" {
        "x86_64-unknown-linux-musl"
    } else {
        "aarch64-unknown-linux-musl"
    }
}

/// The Debian package and program that run its binaries here (qemu-user).
pub fn qemu() -> (&'static str, &'static str) {
    if std::env::consts::ARCH == "aarch64" {
        ("/usr/bin/qemu-x86_64-static", "qemu-user-static")
    } else {
        ("/usr/bin/qemu-aarch64-static", "qemu-user-static")
    }
}

/// Where its binaries are.
pub fn bin_dir(target: &Path) -> PathBuf {
    target.join(triple()).join("release")
}

/// The virtualenv holding zig and cargo-zigbuild.
fn venv(target: &Path) -> PathBuf {
    target
        .join("authoring-tools")
        .join(format!("zig-{ZIG}-zigbuild-{ZIGBUILD}"))
}

/// Installs the target and the zig tools when missing.
pub fn setup(target: &Path) -> Result<()> {
    crate::setup::rust_targets(&[triple()])?;
    let venv = venv(target);
    if venv.join("bin/cargo-zigbuild").is_file() {
        return Ok(());
    }
    crate::setup::pip_venv(
        &venv,
        &[
            format!("ziglang=={ZIG}"),
            format!("cargo-zigbuild=={ZIGBUILD}"),
        ],
        "the images' other architecture (zig)",
    )
}

/// The operator and agent for [`triple`], into `target`. Host build scripts and
/// proc-macros are shared with the native build.
pub fn build(target: &Path) -> Result<Built> {
    let venv = venv(target).join("bin");
    let path = std::env::join_paths(std::iter::once(venv.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    let mut cmd = cargo(target);
    // zig links (its lld): the native build's `-fuse-ld=mold` is not for it.
    let rustflags = format!(
        "CARGO_TARGET_{}_RUSTFLAGS",
        triple().to_uppercase().replace('-', "_")
    );
    cmd.env("PATH", path)
        .env(rustflags, "")
        .args(["zigbuild", "--release", "--locked", "--target", triple()])
        .args([
            "-p",
            "nodewright-operator",
            "-p",
            "nodewright-agent",
            "--bins",
        ]);
    let built = cargo::build(cmd, &[])?;
    built.ensure_fresh_if_built_once(&format!("the {} build", triple()))?;
    Ok(built)
}
