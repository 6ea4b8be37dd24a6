//! The hostile-plugin suite: every escape attempt is contained with a specific, typed
//! error, and the host keeps running normal stages afterwards.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{Run, engine, grants, load, sim};
use nodewright_engine::{Capability, Error, RunError, RunStage, SandboxLimits, StepFailure};
use nodewright_hostops::{HostAction, SimHost};

/// Every capability the hostile guest imports, each granted narrowly.
pub(crate) const GRANTS: &[&str] = &[
    "files=/etc/app:rw",
    "files=/etc/ro",
    "kmod=br_netfilter",
    "service=containerd.service",
    "sysctl=net.ipv4.ip_forward",
    "command=/usr/bin/tool:--safe",
    "power",
];

pub(crate) fn fixture() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let etc = tmp.path().join("etc");
    std::fs::create_dir_all(etc.join("app")).unwrap();
    std::fs::create_dir_all(etc.join("ro")).unwrap();
    std::fs::write(etc.join("shadow"), "secret").unwrap();
    std::fs::write(etc.join("app/a.conf"), "a").unwrap();
    std::os::unix::fs::symlink("../shadow", etc.join("app/escape")).unwrap();
    tmp
}

async fn attack(
    name: &str,
    stage: RunStage,
) -> (
    Result<nodewright_engine::RunReport, RunError>,
    tempfile::TempDir,
) {
    let plugin = load(nodewright_artifacts::HOSTILE);
    let tmp = fixture();
    let host = sim(tmp.path());
    let config = [("attack", name)];
    let mut run = Run::new(&plugin, "hostile", GRANTS).config(&config);
    run.limits = SandboxLimits {
        // A bound for a stuck guest, not a speed test: the floods take seconds alone
        // and several times that beside other tests on two cores.
        timeout: Duration::from_secs(60),
        memory: 32 << 20,
        ..Default::default()
    };
    let result = run.stage(&host, stage).await;
    (result, tmp)
}

/// Asserts the stage ended with a denial mentioning `needle`, and returns its message.
async fn assert_denied(name: &str, needle: &str) -> tempfile::TempDir {
    let (result, tmp) = attack(name, RunStage::Apply).await;
    let report = result.unwrap_or_else(|e| panic!("{name}: sandbox error {e}"));
    match &report.result {
        Err(StepFailure::Denied(d)) => {
            assert!(
                d.message.contains(needle),
                "{name}: {:?} does not mention {needle:?}",
                d.message
            );
            assert_eq!(report.denials.len(), 1, "{name}: denial not recorded");
        }
        other => panic!("{name}: expected a denial, got {other:?}"),
    }
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("etc/shadow")).unwrap(),
        "secret"
    );
    tmp
}

fn no_effects(root: &Path) {
    assert_eq!(
        SimHost::journal(root),
        Vec::<HostAction>::new(),
        "a denied call reached the host"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn path_traversal_is_denied() {
    assert_denied("traverse", "'..'").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn symlink_escape_read_is_denied() {
    assert_denied("symlink", "outside the granted directory").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn symlink_write_is_denied() {
    assert_denied("symlink-write", "symlink").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn writing_a_read_only_grant_names_readwrite() {
    assert_denied("write-readonly", r#"add {path: "/etc/ro/x.conf", access: readWrite} to spec.packages.hostile.capabilities.files"#).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reading_outside_grants_is_denied() {
    assert_denied(
        "read-ungranted",
        r#"add {path: "/etc/shadow", access: read}"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ungranted_kernel_module_is_denied() {
    let tmp = assert_denied("kmod", r#"kmod.load("evil") denied: add "evil" to spec.packages.hostile.capabilities.kernelModules"#).await;
    no_effects(tmp.path());
}

#[tokio::test(flavor = "multi_thread")]
async fn ungranted_service_is_denied() {
    let tmp = assert_denied(
        "service",
        r#"add "kubelet.service" to spec.packages.hostile.capabilities.services"#,
    )
    .await;
    no_effects(tmp.path());
}

#[tokio::test(flavor = "multi_thread")]
async fn ungranted_sysctl_is_denied() {
    let tmp = assert_denied(
        "sysctl",
        r#"add "kernel.panic" to spec.packages.hostile.capabilities.sysctl"#,
    )
    .await;
    no_effects(tmp.path());
    assert!(!tmp.path().join("proc/sys/kernel/panic").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn ungranted_command_is_denied() {
    let tmp = assert_denied(
        "exec",
        r#"add "/bin/sh" to spec.packages.hostile.capabilities.commands"#,
    )
    .await;
    no_effects(tmp.path());
}

#[tokio::test(flavor = "multi_thread")]
async fn command_with_ungranted_arguments_is_denied() {
    assert_denied(
        "exec-args",
        "arguments do not match the granted patterns for /usr/bin/tool",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reboot_outside_the_interrupt_stage_is_refused() {
    let (result, tmp) = attack("reboot", RunStage::Apply).await;
    let report = result.unwrap();
    assert!(
        matches!(&report.result, Err(StepFailure::WrongStage(m)) if m.contains("only honoured in the interrupt stage")),
        "{:?}",
        report.result
    );
    assert!(SimHost::reboot_requested(tmp.path()).is_none());
    // In the interrupt stage, with the grant, the same call is honoured.
    let (result, tmp) = attack("reboot", RunStage::Interrupt).await;
    assert!(result.unwrap().result.is_ok());
    assert_eq!(
        SimHost::reboot_requested(tmp.path()).as_deref(),
        Some("hostile")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_are_refused_while_planning() {
    let (result, tmp) = attack("write-in-plan", RunStage::Plan).await;
    let report = result.unwrap();
    assert!(
        matches!(&report.result, Err(StepFailure::WrongStage(m)) if m.contains("read-only plan stage")),
        "{:?}",
        report.result
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("etc/app/a.conf")).unwrap(),
        "a"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn infinite_loop_hits_the_deadline() {
    let plugin = load(nodewright_artifacts::HOSTILE);
    let tmp = fixture();
    let host = sim(tmp.path());
    let config = [("attack", "loop")];
    let mut run = Run::new(&plugin, "hostile", GRANTS).config(&config);
    run.limits.timeout = Duration::from_millis(300);
    let err = run.stage(&host, RunStage::Apply).await.unwrap_err();
    assert!(matches!(err, RunError::Timeout { .. }), "{err}");
    assert!(err.is_package_fault());
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_bomb_hits_the_memory_limit() {
    let (result, _tmp) = attack("memory", RunStage::Apply).await;
    let err = result.unwrap_err();
    assert!(
        matches!(err, RunError::MemoryLimit { limit_mib: 32, .. }),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn log_flood_is_bounded() {
    let (result, _tmp) = attack("log-flood", RunStage::Apply).await;
    let report = result.unwrap();
    let limits = SandboxLimits::default();
    assert!(report.logs.len() <= limits.max_log_lines);
    assert!(report.logs.iter().map(|l| l.message.len()).sum::<usize>() <= limits.max_log_bytes);
    assert!(
        report.logs_dropped > 190_000,
        "dropped {}",
        report.logs_dropped
    );
    assert!(
        report
            .logs
            .last()
            .unwrap()
            .message
            .starts_with("flood line 199999"),
        "the most recent lines are kept"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stdout_flood_is_bounded_and_does_not_break_the_guest() {
    let (result, _tmp) = attack("stdout-flood", RunStage::Apply).await;
    let report = result.unwrap();
    assert!(report.result.is_ok(), "{:?}", report.result);
    assert!(report.logs.len() <= SandboxLimits::default().max_log_lines);
    assert!(report.logs_dropped > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panic_is_a_trap_that_carries_the_message_and_the_host_carries_on() {
    let (result, tmp) = attack("panic", RunStage::Apply).await;
    let err = result.unwrap_err();
    assert!(
        matches!(&err, RunError::Trap { message, .. } if message.contains("hostile plugin panicked on purpose")),
        "{err}"
    );
    // The same prepared plugin runs again in a fresh store.
    let plugin = load(nodewright_artifacts::HOSTILE);
    let host = sim(tmp.path());
    let config = [("attack", "traverse")];
    let report = Run::new(&plugin, "hostile", GRANTS)
        .config(&config)
        .stage(&host, RunStage::Apply)
        .await
        .unwrap();
    assert!(matches!(report.result, Err(StepFailure::Denied(_))));
}

#[tokio::test(flavor = "multi_thread")]
async fn imports_without_grants_fail_before_anything_runs() {
    let plugin = load(nodewright_artifacts::HOSTILE);
    let partial = grants(&["files=/etc/app:rw", "power"], "hostile");
    let err = engine().prepare(&plugin, &partial).unwrap_err();
    let Error::MissingGrants { check, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(
        check.missing,
        [
            Capability::Kmod,
            Capability::Services,
            Capability::Sysctl,
            Capability::Exec
        ]
    );
    let text = err.to_string();
    assert!(
        text.contains("kmod (grant it with spec.packages.hostile.capabilities.kernelModules)"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_stage_keeps_what_it_logged() {
    let (result, _tmp) = attack("panic", RunStage::Apply).await;
    let err = result.unwrap_err();
    assert!(
        err.logs().iter().any(|l| l.message.contains("panicked")),
        "{:?}",
        err.logs()
    );
}

#[tokio::test]
async fn the_plugin_environment_holds_the_node_order_and_nothing_of_the_host() {
    // The test process has PATH, HOME and the rest: none of it may reach the plugin.
    assert!(std::env::var_os("PATH").is_some());
    let plugin = load(nodewright_artifacts::HOSTILE);
    let tmp = fixture();
    let host = sim(tmp.path());
    let granted = grants(GRANTS, "hostile");
    let prepared = engine().prepare(&plugin, &granted).expect("prepare");
    for (order, want) in [
        (Some(7), "env: [NODEWRIGHT_NODE_ORDER=7]"),
        (None, "env: []"),
    ] {
        let mut ctx = nodewright_engine::StageContext::new("node-1", "hostile", "1.0.0")
            .with_config("attack", "environment");
        ctx.node_order = order;
        let report = prepared
            .run(
                RunStage::Apply,
                ctx,
                host.clone(),
                granted.clone(),
                &SandboxLimits::default(),
            )
            .await
            .expect("runs");
        assert!(report.result.is_ok(), "{:?}", report.result);
        let seen: Vec<&str> = report
            .logs
            .iter()
            .map(|l| l.message.as_str())
            .filter(|m| m.starts_with("env:"))
            .collect();
        assert_eq!(seen, [want], "node order {order:?}");
    }
    assert_eq!(nodewright_engine::NODE_ORDER_ENV, "NODEWRIGHT_NODE_ORDER");
}

/// `kmod.depmod`: runs `depmod -a -- RELEASE` for a release that is neither an option nor a
/// path, only where the host may change.
#[tokio::test]
async fn depmod_takes_only_a_kernel_release_and_only_when_the_host_may_change() {
    let plugin = load(nodewright_artifacts::HOSTILE);
    let tmp = fixture();
    let host = sim(tmp.path());
    let depmod = |release: &'static str, stage| {
        let host = host.clone();
        let plugin = &plugin;
        async move {
            let config = [("attack", "depmod"), ("release", release)];
            Run::new(plugin, "hostile", GRANTS)
                .config(&config)
                .stage(&host, stage)
                .await
                .expect("runs")
                .result
        }
    };
    let ok = depmod("6.8.0-45-generic", RunStage::Apply).await;
    assert!(ok.is_ok(), "{ok:?}");
    assert_eq!(
        SimHost::argv_log(tmp.path()),
        [["/sbin/depmod", "-a", "--", "6.8.0-45-generic"]]
    );
    for bad in ["-a", "../../etc", "6.8/x"] {
        match depmod(bad, RunStage::Apply).await {
            Err(StepFailure::Denied(d)) => assert_eq!(d.capability, "kmod", "{bad}"),
            other => panic!("{bad}: expected a denial, got {other:?}"),
        }
    }
    assert!(depmod("6.8.0-45-generic", RunStage::Plan).await.is_err());
    assert_eq!(SimHost::argv_log(tmp.path()).len(), 1, "nothing else ran");
}

/// Each stage calls its own export with its own stage in the context (a check calls the one
/// `check` export, naming the stage it verifies): where the engine finds each export once,
/// when the plugin is prepared, a stage routed to another export is a package running the
/// wrong code.
#[tokio::test(flavor = "multi_thread")]
async fn every_stage_reaches_its_own_export() {
    for stage in RunStage::ALL {
        let (result, _tmp) = attack("whoami", stage).await;
        let report = result.unwrap_or_else(|e| panic!("{stage}: {e}"));
        let export = if stage.is_check() {
            "check"
        } else {
            stage.as_str()
        };
        let outcome = report.result.unwrap_or_else(|e| panic!("{stage}: {e:?}"));
        assert_eq!(
            outcome.message.as_deref(),
            Some(format!("{export} {}", stage.stage()).as_str()),
            "{stage}"
        );
    }
}
