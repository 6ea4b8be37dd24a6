//! `nodewright plugin ...` end to end: the real binary, real components, a scratch root.

use crate::plugin_support;

use plugin_support::{nodewright, text};

#[test]
fn run_applies_then_plans_converged_from_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, root) = (tmp.path().join("cache"), tmp.path().join("root"));
    std::fs::create_dir_all(root.join("proc/sys/net/ipv4")).unwrap();
    std::fs::write(root.join("proc/sys/net/ipv4/ip_forward"), "0\n").unwrap();
    let root_s = root.to_str().unwrap();
    let args = |stage| {
        vec![
            "plugin",
            "run",
            nodewright_artifacts::SYSCTL,
            "--stage",
            stage,
            "--root",
            root_s,
            "--grant",
            "files=/etc/sysctl.d:rw",
            "--grant",
            "sysctl=net.ipv4.ip_forward",
            "--config",
            "net.ipv4.ip_forward=1",
            "--package",
            "tuning",
        ]
    };
    let apply = nodewright(&cache, &args("apply"));
    let out = text(&apply);
    assert!(apply.status.success(), "{out}");
    assert!(out.contains(", compiled in"), "{out}");
    assert!(out.contains("sysctl         net.ipv4.ip_forward"), "{out}");
    assert!(
        out.contains("host actions (simulated node)\n  sysctl net.ipv4.ip_forward=1"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("proc/sys/net/ipv4/ip_forward")).unwrap(),
        "1"
    );

    let plan = nodewright(&cache, &args("plan"));
    let out = text(&plan);
    assert!(plan.status.success(), "{out}");
    assert!(
        out.contains("loaded from cache"),
        "second run must come from the code cache: {out}"
    );
    assert!(
        out.contains("converged (no changes, no interrupt)"),
        "{out}"
    );

    let json = nodewright(&cache, &[args("plan"), vec!["-o", "json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        v["report"]["result"]["Ok"]["changes"],
        serde_json::json!([])
    );
    assert_eq!(v["fromCache"], true);
}

#[test]
fn bad_inputs_fail_with_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let root = tmp.path().join("root");
    let root = root.to_str().unwrap();
    let core = tmp.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let junk = tmp.path().join("junk.wasm");
    std::fs::write(&junk, b"not wasm").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["plugin", "inspect", core.to_str().unwrap()],
            "not a component: this is a core WebAssembly module",
        ),
        (
            vec!["plugin", "inspect", junk.to_str().unwrap()],
            "not a component: the file is not WebAssembly",
        ),
        (
            vec!["plugin", "inspect", nodewright_artifacts::WRONG_WORLD],
            "does not export nodewright:plugin/stages@0.1.0 (exports: run)",
        ),
        (
            vec!["plugin", "inspect", "/nonexistent.wasm"],
            "cannot read /nonexistent.wasm",
        ),
        (
            vec![
                "plugin",
                "run",
                nodewright_artifacts::SYSCTL,
                "--stage",
                "apply",
                "--root",
                root,
                "--grant",
                "kmods=x",
            ],
            "unknown grant \"kmods\"",
        ),
        (
            vec![
                "plugin",
                "run",
                nodewright_artifacts::SYSCTL,
                "--stage",
                "apply",
                "--root",
                root,
                "--grant",
                "files=etc:rw",
            ],
            "files[0].path: \"etc\" is not an absolute path",
        ),
        (
            vec![
                "plugin",
                "run",
                nodewright_artifacts::SYSCTL,
                "--stage",
                "apply",
                "--root",
                root,
                "--grant",
                "files=/etc/sysctl.d:rw",
            ],
            "sysctl (grant it with --grant sysctl=...)",
        ),
        (
            vec![
                "plugin",
                "run",
                nodewright_artifacts::SYSCTL,
                "--stage",
                "deploy",
                "--root",
                root,
            ],
            "unknown stage \"deploy\"",
        ),
        (
            vec![
                "plugin",
                "run",
                nodewright_artifacts::SYSCTL,
                "--stage",
                "apply",
                "--root",
                root,
                "--config",
                "novalue",
            ],
            "--config \"novalue\" is not KEY=VALUE",
        ),
    ];
    for (args, needle) in cases {
        let out = nodewright(&cache, &args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            text(&out).contains(needle),
            "{args:?}: {} lacks {needle:?}",
            text(&out)
        );
    }
}

#[test]
fn inspect_reports_capabilities_and_grant_check() {
    let tmp = tempfile::tempdir().unwrap();
    let out = nodewright(
        tmp.path(),
        &[
            "plugin",
            "inspect",
            nodewright_artifacts::KERNEL_MODULE,
            "-o",
            "json",
            "--grant",
            "kmod=br_*",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["requiredCapabilities"],
        serde_json::json!(["files", "kmod"])
    );
    assert_eq!(v["grantCheck"]["missing"], serde_json::json!(["files"]));
    assert!(v["digest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(out.status.code(), Some(1), "a missing grant fails inspect");
}

#[test]
fn denied_calls_fail_the_stage_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("proc/sys/kernel")).unwrap();
    std::fs::write(root.join("proc/sys/kernel/panic"), "0").unwrap();
    let out = nodewright(
        &tmp.path().join("cache"),
        &[
            "plugin",
            "run",
            nodewright_artifacts::SYSCTL,
            "--stage",
            "apply",
            "--root",
            root.to_str().unwrap(),
            "-g",
            "files=/etc/sysctl.d:rw",
            "-g",
            "sysctl=net.*",
            "-c",
            "kernel.panic=1",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out)
            .contains(r#"sysctl.get("kernel.panic") denied: pass --grant sysctl=kernel.panic"#),
        "{}",
        text(&out)
    );
}

/// The author loop from nothing: `plugin new`, `plugin build`, `plugin run`.
#[test]
fn plugin_text_cannot_drive_the_terminal_or_forge_our_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, root) = (tmp.path().join("cache"), tmp.path().join("root"));
    let run = nodewright(
        &cache,
        &[
            "plugin",
            "run",
            nodewright_artifacts::HOSTILE,
            "--stage",
            "apply",
            "--root",
            root.to_str().unwrap(),
            "--grant",
            "files=/etc/app:rw",
            "--grant",
            "kmod=x",
            "--grant",
            "service=x.service",
            "--grant",
            "sysctl=x",
            "--grant",
            "command=/x",
            "--grant",
            "power",
            "--config",
            "attack=ansi-log",
        ],
    );
    let out = text(&run);
    assert_eq!(run.status.code(), Some(1), "{out}");
    assert!(
        !out.contains('\u{1b}'),
        "an escape sequence reached the terminal: {out:?}"
    );
    assert!(out.contains("\\u{1b}[2J\\u{1b}[Hscreen wiped"), "{out}");
    // The forged line stays inside the failure message.
    assert!(
        out.contains("outcome  failed: oops\\r\\noutcome  ok in 1.0 ms"),
        "{out}"
    );
    assert!(!out.lines().any(|l| l.starts_with("outcome  ok")), "{out}");
}
