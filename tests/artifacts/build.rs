//! Builds every first-party plugin and test guest for `wasm32-wasip2` with the `plugin`
//! profile, in a target directory of its own (a nested cargo cannot share the outer one's
//! lock), and writes their paths as constants.

use std::path::{Path, PathBuf};
use std::process::Command;

/// (constant name, package, wasm file stem)
const GUESTS: &[(&str, &str)] = &[
    ("SYSCTL", "nodewright-plugin-sysctl"),
    ("KERNEL_MODULE", "nodewright-plugin-kernel-module"),
    ("FILES", "nodewright-plugin-files"),
    ("SYSTEMD", "nodewright-plugin-systemd"),
    ("SHELL", "nodewright-plugin-shell"),
    ("HOSTILE", "nodewright-guest-hostile"),
    ("WRONG_WORLD", "nodewright-guest-wrong-world"),
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest.ancestors().nth(2).unwrap().to_path_buf();
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    // Share one wasm build between profiles: CARGO_TARGET_DIR when set, else the target
    // dir OUT_DIR sits in (<target>/<profile>/build/<pkg>/out).
    let outer = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| out.ancestors().nth(4).unwrap_or(&out).to_path_buf());
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");
    let target_dir = outer.join("wasm-artifacts");

    for dir in ["wit", "sdk", "plugins", "tests/guests"] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&workspace)
        .args([
            "build",
            "--profile",
            "plugin",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&target_dir);
    for (_, package) in GUESTS {
        cmd.args(["-p", package]);
    }
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        cmd.env_remove(var);
    }
    let output = cmd.output().expect("run cargo for the wasm guests");
    if !output.status.success() {
        panic!(
            "building the wasm plugins failed (is the target installed? `rustup target add wasm32-wasip2`):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    let wasm_dir = target_dir.join("wasm32-wasip2/plugin");
    let mut consts = String::new();
    let mut all = String::from(
        "/// Every first-party plugin: (package name, path).\npub const PLUGINS: &[(&str, &str)] = &[\n",
    );
    for (name, package) in GUESTS {
        let path = wasm_dir.join(format!("{}.wasm", package.replace('-', "_")));
        assert!(
            Path::new(&path).exists(),
            "{} was not produced",
            path.display()
        );
        consts.push_str(&format!(
            "/// `{package}` built for wasm32-wasip2.\npub const {name}: &str = {:?};\n",
            path.display().to_string()
        ));
        if package.starts_with("nodewright-plugin-") {
            all.push_str(&format!(
                "    ({:?}, {name}),\n",
                package.trim_start_matches("nodewright-plugin-")
            ));
        }
    }
    all.push_str("];\n");
    std::fs::write(out.join("artifacts.rs"), consts + &all).unwrap();
}
