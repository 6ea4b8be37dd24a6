//! Plugins written in Python and JavaScript, run by the same engine on the same simulated
//! node as the Rust ones: each port leaves exactly the host the Rust plugin leaves (files,
//! modes, live values, recorded actions, outcomes, logs and errors, stage by stage), and
//! the sandbox's deadline and memory limit hold for an interpreter as they do for Rust.

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::{Run, load, sim};
use nodewright_engine::{RunError, RunStage, StepFailure};

/// Everything a run of stages leaves behind that a node or an admin could see.
#[derive(Debug, PartialEq)]
struct Trace {
    /// Per stage: the outcome or the failure, and the logs.
    stages: Vec<String>,
    /// Host actions and the argv each would run, as the simulated node recorded them.
    actions: String,
    /// Every file under the node's root (the simulator's own records and the random boot
    /// ID aside): mode, bytes.
    tree: BTreeMap<String, (u32, Vec<u8>)>,
}

fn snapshot(root: &Path, dir: &Path, out: &mut BTreeMap<String, (u32, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let rel = path.strip_prefix(root).unwrap().display().to_string();
        // The simulator's own records, and the boot ID it draws at random per node.
        if rel.contains("nodewright-sim") || rel == "proc/sys/kernel/random/boot_id" {
            continue;
        }
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() {
            snapshot(root, &path, out);
        } else {
            let mode = meta.permissions().mode() & 0o7777;
            out.insert(rel, (mode, std::fs::read(&path).unwrap()));
        }
    }
}

/// Runs `stages` of `plugin` on a fresh node seeded by `seed`.
async fn drive(
    plugin: &str,
    grants: &[&str],
    config: &[(&str, &str)],
    stages: &[RunStage],
    seed: fn(&Path),
) -> Trace {
    let plugin = load(plugin);
    let tmp = tempfile::tempdir().unwrap();
    seed(tmp.path());
    let host = sim(tmp.path());
    let run = Run::new(&plugin, "tuning", grants).config(config);
    let mut trace = Vec::new();
    for stage in stages {
        let report = run.stage(&host, *stage).await.expect("no sandbox error");
        trace.push(format!(
            "{stage}: {:?} logs {:?}",
            report.result, report.logs
        ));
    }
    let mut tree = BTreeMap::new();
    snapshot(tmp.path(), tmp.path(), &mut tree);
    Trace {
        stages: trace,
        actions: format!("{:?} {:?}", host.recorded(), host.recorded_argv()),
        tree,
    }
}

fn write(root: &Path, rel: &str, contents: &str, mode: u32) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, contents).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn sysctl_node(root: &Path) {
    write(root, "proc/sys/net/ipv4/ip_forward", "0\n", 0o644);
    write(root, "proc/sys/vm/swappiness", "60\n", 0o644);
    write(
        root,
        "proc/sys/net/ipv4/tcp_rmem",
        "4096\t87380\t6291456\n",
        0o644,
    );
}

const SYSCTL_GRANTS: &[&str] = &[
    "files=/etc/sysctl.d:rw",
    "sysctl=net.ipv4.*",
    "sysctl=vm.swappiness",
];

const ROUND: &[RunStage] = &[
    RunStage::Plan,
    RunStage::Apply,
    RunStage::ApplyCheck,
    RunStage::Plan,
    RunStage::Config,
    RunStage::Uninstall,
    RunStage::Plan,
];

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sysctl_leaves_the_host_the_rust_one_leaves() {
    let Some(python) = nodewright_artifacts::port(nodewright_artifacts::SYSCTL_PY, "SYSCTL_PY")
    else {
        return;
    };
    let cases: [(&str, &[(&str, &str)]); 5] = [
        (
            "three keys, one already set by fields",
            &[
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv4.tcp_rmem", "4096 87380 6291456"),
                ("vm.swappiness", "10"),
            ],
        ),
        ("no keys", &[]),
        ("a key that is not dotted", &[("net/ipv4", "1")]),
        ("a value with a newline", &[("vm.swappiness", "1\n2")]),
        ("a key outside the grant", &[("kernel.panic", "1")]),
    ];
    for (case, config) in cases {
        let rust = drive(
            nodewright_artifacts::SYSCTL,
            SYSCTL_GRANTS,
            config,
            ROUND,
            sysctl_node,
        )
        .await;
        let py = drive(python, SYSCTL_GRANTS, config, ROUND, sysctl_node).await;
        assert_eq!(py, rust, "{case}: the Python port differs");
    }
    // The comparison is not vacuous: the first case really changed the host.
    let rust = drive(
        nodewright_artifacts::SYSCTL,
        SYSCTL_GRANTS,
        &[("vm.swappiness", "10")],
        &[RunStage::Apply],
        sysctl_node,
    )
    .await;
    assert!(rust.actions.contains("vm.swappiness"), "{}", rust.actions);
    assert!(
        rust.tree
            .contains_key("etc/sysctl.d/60-nodewright-tuning.conf")
    );
}

fn files_node(root: &Path) {
    write(root, "etc/app/existing.conf", "a\nb\n", 0o600);
    write(root, "etc/app/same.conf", "same\n", 0o644);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_javascript_files_leaves_the_host_the_rust_one_leaves() {
    let Some(js) = nodewright_artifacts::port(nodewright_artifacts::FILES_JS, "FILES_JS") else {
        return;
    };
    let grants = &["files=/etc/app:rw"];
    let cases: [(&str, &[(&str, &str)]); 6] = [
        (
            "create, rewrite with a mode, leave one alone, restart units",
            &[
                ("file:/etc/app/existing.conf", "a\nc\n"),
                ("file:/etc/app/new.conf", "fresh\n"),
                ("file:/etc/app/same.conf", "same\n"),
                ("mode:/etc/app/existing.conf", "0640"),
                ("mode:/etc/app/new.conf", "0o600"),
                ("owner:/etc/app/new.conf", "0:0"),
                ("restart", "app.service, other.service"),
            ],
        ),
        ("no files", &[("restart", "app.service")]),
        ("a relative path", &[("file:etc/app/x", "x")]),
        (
            "a bad mode",
            &[("file:/etc/app/x", "x"), ("mode:/etc/app/x", "999")],
        ),
        (
            "a mode without its file",
            &[("file:/etc/app/x", "x"), ("mode:/etc/app/y", "0600")],
        ),
        ("a path outside the grant", &[("file:/etc/other.conf", "x")]),
    ];
    for (case, config) in cases {
        let rust = drive(
            nodewright_artifacts::FILES,
            grants,
            config,
            ROUND,
            files_node,
        )
        .await;
        let port = drive(js, grants, config, ROUND, files_node).await;
        assert_eq!(port, rust, "{case}: the JavaScript port differs");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interpreter_in_an_endless_loop_is_ended_by_the_deadline() {
    for (name, built) in [
        ("HOSTILE_PY", nodewright_artifacts::HOSTILE_PY),
        ("HOSTILE_JS", nodewright_artifacts::HOSTILE_JS),
    ] {
        let Some(path) = nodewright_artifacts::port(built, name) else {
            return;
        };
        let plugin = load(path);
        let tmp = tempfile::tempdir().unwrap();
        let mut run = Run::new(&plugin, "hostile", &[]).config(&[("attack", "spin")]);
        run.limits.timeout = Duration::from_secs(2);
        let err = run
            .stage(&sim(tmp.path()), RunStage::Apply)
            .await
            .unwrap_err();
        assert!(matches!(err, RunError::Timeout { .. }), "{name}: {err}");
        assert!(err.is_package_fault(), "{name}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interpreter_hoarding_memory_stops_at_the_limit() {
    for (name, built) in [
        ("HOSTILE_PY", nodewright_artifacts::HOSTILE_PY),
        ("HOSTILE_JS", nodewright_artifacts::HOSTILE_JS),
    ] {
        let Some(path) = nodewright_artifacts::port(built, name) else {
            return;
        };
        let plugin = load(path);
        let tmp = tempfile::tempdir().unwrap();
        // The default limit: enough for the interpreter itself (every other test here runs
        // under it), not for a hoard.
        let run = Run::new(&plugin, "hostile", &[]).config(&[("attack", "memory")]);
        assert_eq!(run.limits.memory, 128 << 20);
        let err = run
            .stage(&sim(tmp.path()), RunStage::Apply)
            .await
            .unwrap_err();
        assert!(
            matches!(err, RunError::MemoryLimit { limit_mib: 128, .. }),
            "{name}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_undeclared_capability_is_a_typed_failure_naming_the_manifest_entry() {
    for (name, built, manifest) in [
        (
            "HOSTILE_PY",
            nodewright_artifacts::HOSTILE_PY,
            "[tool.nodewright] in pyproject.toml",
        ),
        (
            "HOSTILE_JS",
            nodewright_artifacts::HOSTILE_JS,
            "\"nodewright\": {\"capabilities\": [...]} in package.json",
        ),
    ] {
        let Some(path) = nodewright_artifacts::port(built, name) else {
            return;
        };
        let plugin = load(path);
        // The component imports no capability at all: nothing is needed to run it.
        assert!(plugin.required_capabilities().is_empty(), "{name}");
        let tmp = tempfile::tempdir().unwrap();
        let run = Run::new(&plugin, "hostile", &[]).config(&[("attack", "undeclared")]);
        let report = run.stage(&sim(tmp.path()), RunStage::Apply).await.unwrap();
        assert!(
            matches!(&report.result, Err(StepFailure::Failed(m))
                if m.contains("'sysctl' capability") && m.contains(manifest)),
            "{name}: {:?}",
            report.result
        );
    }
}
