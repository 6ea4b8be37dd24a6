//! Builds every first-party plugin and test guest for `wasm32-wasip2` with the `plugin`
//! profile, in a target directory of its own (a nested cargo cannot share the outer one's
//! lock), and writes their paths as constants.

use std::path::{Path, PathBuf};
use std::process::Command;

/// (constant name, package, wasm file stem)
const GUESTS: &[(&str, &str)] = &[
    ("SYSCTL", "nodewright-plugin-sysctl"),
    ("KERNEL_MODULE", "nodewright-plugin-kernel-module"),
    ("DRIVER", "nodewright-plugin-driver"),
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

    for dir in [
        "wit",
        "sdk",
        "plugins",
        "tests/guests",
        "host/authoring/src",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }

    ensure_wasm_target();
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
    let ports = build_ports(&workspace, &outer.join("wasm-artifacts/ports"));
    std::fs::write(out.join("artifacts.rs"), consts + &all + &ports).unwrap();
}

/// (constant name, project directory) of the plugins in Python and JavaScript.
const PORTS: &[(&str, &str)] = &[
    ("SYSCTL_PY", "plugins/python/sysctl"),
    ("FILES_JS", "plugins/js/files"),
    ("HOSTILE_PY", "tests/guests/python/hostile"),
    ("HOSTILE_JS", "tests/guests/js/hostile"),
];

/// Builds the Python and JavaScript plugins with the tools `cargo xtask setup` installs
/// (`NODEWRIGHT_COMPONENTIZE_PY`, `NODEWRIGHT_JS_TOOLS`). Without them the constants are
/// `None` and the tests that need them say how to get them; the build never installs
/// into the source tree.
fn build_ports(workspace: &Path, out: &Path) -> String {
    println!("cargo:rerun-if-env-changed=NODEWRIGHT_COMPONENTIZE_PY");
    println!("cargo:rerun-if-env-changed=NODEWRIGHT_JS_TOOLS");
    let mut tools = nodewright_authoring::Toolchain::from_env();
    tools.install = false;
    let mut consts = String::new();
    for (name, rel) in PORTS {
        let dir = workspace.join(rel);
        let language = nodewright_authoring::Language::detect(&dir).expect("a port's manifest");
        let configured = match language {
            nodewright_authoring::Language::Python => tools.componentize_py.is_some(),
            _ => tools.js_tools.is_some(),
        };
        let path = if configured {
            let opts = nodewright_authoring::BuildOptions {
                out_dir: Some(
                    out.join(rel.rsplit('/').next().unwrap())
                        .join(language.as_str()),
                ),
                tools: tools.clone(),
                quiet: true,
                ..Default::default()
            };
            let built = nodewright_authoring::build(&dir, &opts)
                .unwrap_or_else(|e| panic!("building {rel}: {e}"));
            format!("Some({:?})", built.wasm.display().to_string())
        } else {
            println!(
                "cargo:warning={rel} not built: its tools are not set up (run `cargo xtask setup`, which sets NODEWRIGHT_COMPONENTIZE_PY and NODEWRIGHT_JS_TOOLS for `cargo xtask test`)"
            );
            "None".to_string()
        };
        consts.push_str(&format!(
            "/// `{rel}` built with nodewright-authoring, when its tools are set up.\npub const {name}: Option<&str> = {path};\n"
        ));
    }
    consts
}

/// The `wasm32-wasip2` target, added with rustup when it is missing (what `cargo xtask
/// setup` does), so a plain `cargo test` on a fresh clone builds the plugins too.
fn ensure_wasm_target() {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    let Ok(installed) = installed else {
        return; // No rustup: the build below says what is missing.
    };
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.trim() == "wasm32-wasip2")
    {
        return;
    }
    println!("cargo:warning=adding the wasm32-wasip2 target with rustup (the plugins need it)");
    let _ = Command::new("rustup")
        .args(["target", "add", "wasm32-wasip2"])
        .status();
}
