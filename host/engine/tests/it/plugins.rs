//! The first-party plugins, run by the real engine against a simulated node: each applies,
//! then plans as converged, then uninstalls; and each reports the interrupt it needs.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{Run, grants, load, sim};
use nodewright_engine::{
    Capability, RequestedInterrupt, RunStage, StageOutcome, StepFailure, check_grants,
};
use nodewright_hostops::{HostAction, HostOps as _, ServiceVerb};

fn ok(report: nodewright_engine::RunReport) -> StageOutcome {
    report
        .result
        .unwrap_or_else(|e| panic!("{} failed: {e}; logs: {:?}", report.stage, report.logs))
}

fn seed(root: &Path, rel: &str, contents: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, contents).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn sysctl_applies_persists_and_converges() {
    let plugin = load(nodewright_artifacts::SYSCTL);
    let tmp = tempfile::tempdir().unwrap();
    seed(tmp.path(), "proc/sys/net/ipv4/ip_forward", "0\n");
    seed(tmp.path(), "proc/sys/vm/swappiness", "60\n");
    let host = sim(tmp.path());
    let g = [
        "files=/etc/sysctl.d:rw",
        "sysctl=net.ipv4.ip_forward",
        "sysctl=vm.*",
    ];
    let config = [("net.ipv4.ip_forward", "1"), ("vm.swappiness", "10")];
    let run = Run::new(&plugin, "tuning", &g).config(&config);

    let plan = ok(run.stage(&host, RunStage::Plan).await.unwrap());
    let targets: Vec<_> = plan
        .changes
        .iter()
        .map(|c| (c.kind.as_str(), c.target.as_str()))
        .collect();
    assert_eq!(
        targets,
        [
            ("file", "/etc/sysctl.d/60-nodewright-tuning.conf"),
            ("sysctl", "net.ipv4.ip_forward"),
            ("sysctl", "vm.swappiness")
        ]
    );
    assert!(host.recorded().is_empty(), "plan changed the host");

    let applied = ok(run.stage(&host, RunStage::Apply).await.unwrap());
    assert_eq!(applied.interrupt, RequestedInterrupt::None);
    assert_eq!(
        host.recorded(),
        [
            HostAction::SysctlSet {
                key: "net.ipv4.ip_forward".into(),
                value: "1".into()
            },
            HostAction::SysctlSet {
                key: "vm.swappiness".into(),
                value: "10".into()
            },
        ]
    );
    let dropin =
        std::fs::read_to_string(tmp.path().join("etc/sysctl.d/60-nodewright-tuning.conf")).unwrap();
    assert!(
        dropin.ends_with("net.ipv4.ip_forward = 1\nvm.swappiness = 10\n"),
        "{dropin}"
    );

    assert!(ok(run.stage(&host, RunStage::Plan).await.unwrap()).is_converged());
    ok(run.stage(&host, RunStage::ApplyCheck).await.unwrap());

    // Drift is seen by plan and by the check.
    seed(tmp.path(), "proc/sys/vm/swappiness", "30\n");
    let plan = ok(run.stage(&host, RunStage::Plan).await.unwrap());
    assert_eq!(plan.changes[0].detail, "30 -> 10");
    assert!(
        run.stage(&host, RunStage::ApplyCheck)
            .await
            .unwrap()
            .result
            .is_err()
    );

    ok(run.stage(&host, RunStage::Uninstall).await.unwrap());
    assert!(
        !tmp.path()
            .join("etc/sysctl.d/60-nodewright-tuning.conf")
            .exists()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sysctl_without_the_key_granted_is_denied() {
    let plugin = load(nodewright_artifacts::SYSCTL);
    let tmp = tempfile::tempdir().unwrap();
    seed(tmp.path(), "proc/sys/kernel/panic", "0\n");
    let host = sim(tmp.path());
    let g = ["files=/etc/sysctl.d:rw", "sysctl=net.*"];
    let config = [("kernel.panic", "10")];
    let report = Run::new(&plugin, "tuning", &g)
        .config(&config)
        .stage(&host, RunStage::Apply)
        .await
        .unwrap();
    assert!(
        matches!(&report.result, Err(StepFailure::Denied(d)) if d.message.contains(r#"add "kernel.panic" to spec.packages.tuning.capabilities.sysctl"#)),
        "{:?}",
        report.result
    );
    assert!(host.recorded().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn kernel_module_loads_persists_and_asks_for_reboot_on_new_options() {
    let plugin = load(nodewright_artifacts::KERNEL_MODULE);
    let tmp = tempfile::tempdir().unwrap();
    let host = sim(tmp.path());
    let g = [
        "files=/etc/modules-load.d:rw",
        "files=/etc/modprobe.d:rw",
        "kmod=br_netfilter",
        "kmod=nvidia*",
    ];
    let config = [("modules", "br_netfilter,nvidia")];
    let run = Run::new(&plugin, "mods", &g).config(&config);
    ok(run.stage(&host, RunStage::Apply).await.unwrap());
    assert_eq!(
        host.recorded(),
        [
            HostAction::KmodLoad {
                name: "br_netfilter".into(),
                params: vec![]
            },
            HostAction::KmodLoad {
                name: "nvidia".into(),
                params: vec![]
            },
        ]
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("etc/modules-load.d/nodewright-mods.conf"))
            .unwrap(),
        "# Managed by nodewright.\nbr_netfilter\nnvidia\n"
    );
    assert!(ok(run.stage(&host, RunStage::Plan).await.unwrap()).is_converged());

    let config = [
        ("modules", "br_netfilter,nvidia"),
        ("options.nvidia", "NVreg_EnableMSI=1"),
    ];
    let run = Run::new(&plugin, "mods", &g).config(&config);
    let plan = ok(run.stage(&host, RunStage::Plan).await.unwrap());
    assert_eq!(plan.interrupt, RequestedInterrupt::Reboot, "{plan:?}");
    let applied = ok(run.stage(&host, RunStage::Apply).await.unwrap());
    assert_eq!(applied.interrupt, RequestedInterrupt::Reboot);
    // The check passes: only the reboot is pending.
    ok(run.stage(&host, RunStage::ApplyCheck).await.unwrap());
    // After a reboot the modules come back from modules-load.d and nothing is pending.
    host.reboot().unwrap();
    assert!(ok(run.stage(&host, RunStage::Plan).await.unwrap()).is_converged());

    ok(run.stage(&host, RunStage::Uninstall).await.unwrap());
    assert!(
        !tmp.path()
            .join("etc/modules-load.d/nodewright-mods.conf")
            .exists()
    );
    assert!(host.recorded().contains(&HostAction::KmodUnload {
        name: "nvidia".into()
    }));
}

#[tokio::test(flavor = "multi_thread")]
async fn files_plugin_writes_modes_and_reports_restarts() {
    let plugin = load(nodewright_artifacts::FILES);
    let tmp = tempfile::tempdir().unwrap();
    let host = sim(tmp.path());
    let g = ["files=/etc/containerd/:rw"];
    let config = [
        (
            "file:/etc/containerd/conf.d/mirror.toml",
            "[mirror]\nurl = \"a\"\n",
        ),
        ("mode:/etc/containerd/conf.d/mirror.toml", "0600"),
        ("restart", "containerd.service"),
    ];
    let run = Run::new(&plugin, "mirror", &g).config(&config);
    let plan = ok(run.stage(&host, RunStage::Plan).await.unwrap());
    assert_eq!(plan.changes[0].detail, "create, 19 bytes");
    assert_eq!(
        plan.interrupt,
        RequestedInterrupt::Service(vec!["containerd.service".into()])
    );
    ok(run.stage(&host, RunStage::Apply).await.unwrap());
    let written = tmp.path().join("etc/containerd/conf.d/mirror.toml");
    assert_eq!(
        std::fs::metadata(&written).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let plan = ok(run.stage(&host, RunStage::Plan).await.unwrap());
    assert!(plan.is_converged(), "{plan:?}");

    std::fs::write(&written, "[mirror]\nurl = \"b\"\n").unwrap();
    let plan = ok(run.stage(&host, RunStage::Plan).await.unwrap());
    assert_eq!(plan.changes[0].detail, "+1 -1 lines");
    ok(run.stage(&host, RunStage::Uninstall).await.unwrap());
    assert!(!written.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn systemd_plugin_reloads_enables_and_reports_restart_of_active_units() {
    let plugin = load(nodewright_artifacts::SYSTEMD);
    let tmp = tempfile::tempdir().unwrap();
    let host = sim(tmp.path());
    let g = ["files=/etc/systemd/system:rw", "service=containerd.service"];
    let config = [
        (
            "dropin:containerd.service/10-limits.conf",
            "[Service]\nLimitNOFILE=65536\n",
        ),
        ("enable", "containerd.service"),
        ("start", "containerd.service"),
    ];
    let run = Run::new(&plugin, "limits", &g).config(&config);
    let first = ok(run.stage(&host, RunStage::Apply).await.unwrap());
    assert_eq!(
        first.interrupt,
        RequestedInterrupt::None,
        "an inactive unit needs no restart"
    );
    assert_eq!(
        host.recorded(),
        [
            HostAction::DaemonReload,
            HostAction::Service {
                verb: ServiceVerb::Enable,
                unit: "containerd.service".into()
            },
            HostAction::Service {
                verb: ServiceVerb::Start,
                unit: "containerd.service".into()
            },
        ]
    );
    assert!(ok(run.stage(&host, RunStage::Plan).await.unwrap()).is_converged());

    let config = [
        (
            "dropin:containerd.service/10-limits.conf",
            "[Service]\nLimitNOFILE=1048576\n",
        ),
        ("enable", "containerd.service"),
        ("start", "containerd.service"),
    ];
    let run = Run::new(&plugin, "limits", &g).config(&config);
    let second = ok(run.stage(&host, RunStage::Apply).await.unwrap());
    assert_eq!(
        second.interrupt,
        RequestedInterrupt::Service(vec!["containerd.service".into()])
    );
    ok(run.stage(&host, RunStage::Uninstall).await.unwrap());
    assert!(
        !tmp.path()
            .join("etc/systemd/system/containerd.service.d/10-limits.conf")
            .exists()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn shell_plugin_runs_granted_commands_and_plans_with_exit_codes() {
    let plugin = load(nodewright_artifacts::SHELL);
    let tmp = tempfile::tempdir().unwrap();
    for (name, body) in [
        (
            "setup",
            "#!/bin/sh\necho configured > \"$NODEWRIGHT_SIM_ROOT/etc/setup-done\"\necho ok\n",
        ),
        (
            "is-set-up",
            "#!/bin/sh\ntest -f \"$NODEWRIGHT_SIM_ROOT/etc/setup-done\" && exit 0\nexit 1\n",
        ),
    ] {
        seed(tmp.path(), &format!("usr/local/bin/{name}"), body);
        std::fs::set_permissions(
            tmp.path().join(format!("usr/local/bin/{name}")),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
    }
    let host = sim(tmp.path());
    let g = [
        "command=/usr/local/bin/setup",
        "probe=/usr/local/bin/is-set-up",
    ];
    let config = [
        ("apply", "/usr/local/bin/setup"),
        ("plan", "/usr/local/bin/is-set-up"),
        ("check", "/usr/local/bin/is-set-up"),
        ("interrupt", "reboot"),
    ];
    let run = Run::new(&plugin, "setup", &g).config(&config);
    let plan = ok(run.stage(&host, RunStage::Plan).await.unwrap());
    assert_eq!(plan.interrupt, RequestedInterrupt::Reboot);
    assert!(
        run.stage(&host, RunStage::ApplyCheck)
            .await
            .unwrap()
            .result
            .is_err()
    );
    let applied = run.stage(&host, RunStage::Apply).await.unwrap();
    assert!(
        applied.logs.iter().any(|l| l.message == "ok"),
        "command output is logged"
    );
    assert!(ok(run.stage(&host, RunStage::Plan).await.unwrap()).is_converged());
    ok(run.stage(&host, RunStage::ApplyCheck).await.unwrap());
    // Commands not vouched read-only run only in mutating stages, even when granted.
    let config = [
        ("apply", "/usr/local/bin/setup"),
        ("check", "/usr/local/bin/setup"),
    ];
    let report = Run::new(&plugin, "setup", &g)
        .config(&config)
        .stage(&host, RunStage::ApplyCheck)
        .await
        .unwrap();
    assert!(
        matches!(&report.result, Err(StepFailure::WrongStage(m)) if m.contains("readOnly: true")),
        "{:?}",
        report.result
    );
}

#[test]
fn grant_check_reports_missing_and_excess() {
    let plugin = load(nodewright_artifacts::SYSCTL);
    assert_eq!(
        plugin.required_capabilities(),
        [Capability::Files, Capability::Sysctl]
    );
    let check = check_grants(
        &plugin,
        &grants(&["files=/etc/sysctl.d:rw", "kmod=x"], "tuning"),
    );
    assert_eq!(check.missing, [Capability::Sysctl]);
    assert_eq!(check.excess, [Capability::Kmod]);
    assert_eq!(
        check.hints,
        ["grant it with spec.packages.tuning.capabilities.sysctl"]
    );
}

/// A payload module with a modinfo `version=` entry, as a driver's `.ko` carries one.
fn module_file(version: &str) -> Vec<u8> {
    let mut bytes = b"\x7fELF".to_vec();
    bytes.extend(std::iter::repeat_n(0x5a, 100_000));
    bytes.extend_from_slice(format!("\0license=GPL\0version={version}\0").as_bytes());
    bytes.extend(std::iter::repeat_n(0xa5, 50_000));
    bytes
}

/// The `driver` plugin on a simulated node: the loaded module is replaced in place when it
/// is idle, at a reboot when it is in use; `plan` reports the version change and touches
/// nothing; the installed file is the payload's, byte for byte.
#[tokio::test(flavor = "multi_thread")]
async fn driver_installs_the_payload_module_and_swaps_it_idle_or_at_a_reboot() {
    let plugin = load(nodewright_artifacts::DRIVER);
    let tmp = tempfile::tempdir().unwrap();
    let host = sim(tmp.path());
    let root = tmp.path();
    // The node: kernel 6.1.0-nodewright-sim (the simulated node's), nvidia 550.54.14 loaded.
    std::fs::write(root.join("proc/modules"), "nvidia 1 0 - Live 0x0\n").unwrap();
    std::fs::create_dir_all(root.join("sys/module/nvidia")).unwrap();
    std::fs::write(root.join("sys/module/nvidia/version"), "550.54.14\n").unwrap();
    std::fs::write(root.join("sys/module/nvidia/initstate"), "live\n").unwrap();
    std::fs::write(root.join("sys/module/nvidia/refcnt"), "0\n").unwrap();
    std::fs::create_dir_all(root.join("lib/modules/6.1.0-nodewright-sim/kernel")).unwrap();
    let payload = tempfile::tempdir().unwrap();
    let ko = payload.path().join("nvidia.ko");
    std::fs::write(&ko, module_file("560.35.03")).unwrap();
    let g = [
        "files=/lib/modules:rw",
        "files=/sys/module",
        "kmod=nvidia",
        "power",
    ];
    let config = [("module", "nvidia")];
    let mut run = Run::new(&plugin, "gpu", &g).config(&config);
    run.payloads = vec![("driver", payload.path().to_path_buf())];
    let dest = root.join("lib/modules/6.1.0-nodewright-sim/updates/nvidia.ko");

    let plan = ok(run.stage(&host, RunStage::Plan).await.unwrap());
    let seen: Vec<(String, String)> = plan
        .changes
        .iter()
        .map(|c| (c.target.clone(), c.detail.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (
                "/lib/modules/6.1.0-nodewright-sim/updates/nvidia.ko".to_string(),
                "install nvidia 560.35.03".to_string()
            ),
            ("nvidia".to_string(), "550.54.14 -> 560.35.03".to_string()),
        ]
    );
    assert_eq!(plan.interrupt, RequestedInterrupt::None);
    assert!(
        host.recorded().is_empty() && !dest.exists(),
        "plan touches nothing"
    );

    ok(run.stage(&host, RunStage::Apply).await.unwrap());
    assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(&ko).unwrap());
    assert_eq!(
        host.recorded(),
        [
            HostAction::Depmod {
                release: "6.1.0-nodewright-sim".into()
            },
            HostAction::KmodUnload {
                name: "nvidia".into()
            },
            HostAction::KmodLoad {
                name: "nvidia".into(),
                params: vec![]
            },
        ]
    );
    assert_eq!(
        std::fs::read_to_string(root.join("sys/module/nvidia/version")).unwrap(),
        "560.35.03\n",
        "the kernel runs the installed module"
    );
    ok(run.stage(&host, RunStage::ApplyCheck).await.unwrap());
    assert!(ok(run.stage(&host, RunStage::Plan).await.unwrap()).is_converged());

    // The next version while the module is in use: installed now, swapped at the reboot.
    std::fs::write(&ko, module_file("565.57.01")).unwrap();
    std::fs::write(root.join("sys/module/nvidia/refcnt"), "3\n").unwrap();
    let plan = ok(run.stage(&host, RunStage::Plan).await.unwrap());
    assert_eq!(plan.interrupt, RequestedInterrupt::Reboot, "{plan:?}");
    let applied = ok(run.stage(&host, RunStage::Apply).await.unwrap());
    assert_eq!(applied.interrupt, RequestedInterrupt::Reboot);
    assert_eq!(
        std::fs::read_to_string(root.join("sys/module/nvidia/version")).unwrap(),
        "560.35.03\n",
        "still the old module until the reboot"
    );
    ok(run.stage(&host, RunStage::ApplyCheck).await.unwrap());
    host.reboot().unwrap();
    ok(run.stage(&host, RunStage::PostInterrupt).await.unwrap());
    ok(run
        .stage(&host, RunStage::PostInterruptCheck)
        .await
        .unwrap());
    assert_eq!(
        std::fs::read_to_string(root.join("sys/module/nvidia/version")).unwrap(),
        "565.57.01\n"
    );
    assert!(ok(run.stage(&host, RunStage::Plan).await.unwrap()).is_converged());

    ok(run.stage(&host, RunStage::Uninstall).await.unwrap());
    assert!(!dest.exists());
    assert!(!host.kmod_is_loaded("nvidia").unwrap());
}
