//! The hostile suite, argument level: nothing a plugin passes to a granted capability can
//! be read as an option, a path or a wider pattern by the command a real node would run.
//! The simulated node records the exact argv a Linux node would run, so each test also
//! asserts that no helper command was built at all.

use crate::common;

use std::path::Path;

use common::{Attack, denial};
use nodewright_engine::{RequestedInterrupt, RunStage, StepFailure};
use nodewright_hostops::SimHost;

/// A kmod glob, a unit glob, a sysctl glob and wildcard command patterns, with a writable
/// directory beside them: the grants the attacks in the issue combined.
const GRANTS: &[&str] = &[
    "files=/etc/app:rw",
    "kmod=nvidia*",
    "service=*.service",
    "sysctl=net.*",
    "command=/usr/bin/cat:/etc/app/*",
    "command=/usr/bin/echo:*",
    "command=/usr/bin/tool:--safe",
];

async fn denied(name: &str, needle: &str) -> tempfile::TempDir {
    let (result, tmp) = Attack::new(name, GRANTS).run(|_| {}).await;
    let d = denial(name, &result);
    assert!(
        d.message.contains(needle),
        "{name}: {:?} does not say {needle:?}",
        d.message
    );
    assert_eq!(
        SimHost::argv_log(tmp.path()),
        Vec::<Vec<String>>::new(),
        "{name}: a helper command was built"
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("etc/shadow")).unwrap(),
        "secret"
    );
    tmp
}

#[tokio::test(flavor = "multi_thread")]
async fn modprobe_config_option_as_a_parameter_is_denied() {
    denied(
        "kmod-config-option",
        "parameters are key=value, never modprobe options",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn modprobe_module_dir_option_as_a_parameter_is_denied() {
    denied("kmod-dir-option", "never modprobe options").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn modprobe_option_as_the_module_name_is_denied() {
    denied("kmod-name-option", "module names are never options").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn module_name_with_a_path_is_denied_before_the_glob() {
    // `nvidia*` would match it as a string.
    denied("kmod-name-path", "kernel module names use only").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn module_parameter_with_a_newline_is_denied() {
    denied("kmod-param-newline", "control character").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn modprobe_argv_ends_options_before_the_module() {
    let (result, tmp) = Attack::new("kmod-ok", GRANTS).run(|_| {}).await;
    assert!(result.unwrap().result.is_ok());
    assert_eq!(
        SimHost::argv_log(tmp.path()),
        [[
            "/sbin/modprobe",
            "--",
            "nvidia_uvm",
            "NVreg_EnableMSI=1",
            "opts=\"a b\""
        ]]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn enabling_a_unit_file_by_path_is_denied() {
    denied("unit-path", "not in systemd's unit-name character set").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn systemctl_root_option_as_a_unit_is_denied() {
    denied("unit-option", "never options").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn systemctl_host_option_as_a_unit_is_denied() {
    denied("unit-host-option", "never options").await;
}

/// Runs attack `name` and asserts the stage failed as the package's fault, saying `needle`.
async fn fails_as_the_package(name: &str, needle: &str) {
    let (result, _tmp) = Attack::new(name, GRANTS).run(|_| {}).await;
    let report = result.unwrap();
    assert!(
        matches!(&report.result, Err(StepFailure::Failed(m)) if m.contains(needle)),
        "{name}: {:?}",
        report.result
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reported_unit_path_fails_the_stage_as_the_packages_fault() {
    fails_as_the_package("report-bad-unit", "invalid unit").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_services_grant_never_reaches_a_power_unit() {
    denied("unit-power", "no services grant reaches it").await;
}

/// A granted, plain `.service` whose unit file on the node pulls in `reboot.target` when it
/// fails: restarting it would reach power, so the host op refuses before `systemctl` runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_granted_unit_that_pulls_in_power_is_refused() {
    let (result, tmp) = Attack::new("unit-pulls-power", GRANTS)
        .run(|root| {
            let dir = root.join("etc/systemd/system");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("app.service"), "[Unit]\nOnFailure=reboot.target\n").unwrap();
        })
        .await;
    let d = denial("unit-pulls-power", &result);
    assert!(
        d.message.contains("app.service pulls in reboot.target"),
        "{}",
        d.message
    );
    assert_eq!(SimHost::argv_log(tmp.path()), Vec::<Vec<String>>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sysctl_value_with_a_newline_is_denied() {
    denied("sysctl-newline", "a sysctl value is one line").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reported_power_target_fails_the_stage_as_the_packages_fault() {
    fails_as_the_package("report-power-unit", ".service units only").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reported_units_are_deduplicated() {
    let (result, _tmp) = Attack::new("report-units", GRANTS).run(|_| {}).await;
    let outcome = result.unwrap().result.unwrap();
    assert_eq!(
        outcome.interrupt,
        RequestedInterrupt::Service(vec!["containerd.service".into()])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sysctl_key_with_a_path_is_denied_before_the_glob() {
    let tmp = denied("sysctl-path", "sysctl keys are dotted names").await;
    assert!(!tmp.path().join("proc/sys/kernel/panic").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn dotdot_argument_cannot_widen_a_command_pattern() {
    denied("exec-dotdot", "'..' path component").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn option_argument_cannot_match_a_leading_wildcard() {
    denied("exec-option", "is an option").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unnormalised_command_path_is_denied_for_what_it_is() {
    denied(
        "exec-unnormalised",
        "command paths must be exact and normalised; call /usr/bin/tool as granted",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn setuid_write_is_denied_naming_the_grant() {
    let tmp = denied("setuid-write", "specialModes: true").await;
    assert!(!tmp.path().join("etc/app/suid").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn setuid_chmod_is_denied_and_allowed_only_by_an_explicit_grant() {
    let tmp = denied("setuid-chmod", "sets setuid, setgid or sticky bits").await;
    let mode = |root: &Path| {
        std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(root.join("etc/app/a.conf"))
                .unwrap()
                .permissions(),
        )
    };
    assert_eq!(mode(tmp.path()) & 0o7000, 0);
    let (result, tmp) = Attack::new("setuid-chmod", &["files=/etc/app:rw+special"])
        .run(|_| {})
        .await;
    assert!(result.unwrap().result.is_ok());
    assert_eq!(mode(tmp.path()) & 0o7777, 0o6777);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_single_file_grant_is_not_a_directory() {
    let (result, tmp) = Attack::new("single-file-grant", &["files=/etc/single:rw"])
        .run(|root| std::fs::write(root.join("etc/single"), "file").unwrap())
        .await;
    let d = denial("single-file-grant", &result);
    assert!(
        d.message.contains("which is a file, not a directory"),
        "{}",
        d.message
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("etc/single")).unwrap(),
        "file"
    );
}

/// Removing a granted file and writing below its name would turn a one-file grant into a
/// tree; only a grant written as a directory (`/etc/single/`) may be made one.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_grant_never_becomes_a_directory() {
    let seed = |root: &Path| std::fs::write(root.join("etc/single"), "file").unwrap();
    let (result, tmp) = Attack::new("file-grant-to-tree", &["files=/etc/single:rw"])
        .run(seed)
        .await;
    let d = denial("file-grant-to-tree", &result);
    assert!(d.message.contains("grant `/etc/single/`"), "{}", d.message);
    // The remove went through (the grant covers the file); nothing was made in its place.
    assert!(!tmp.path().join("etc/single").exists());

    let (result, tmp) = Attack::new("file-grant-to-tree", &["files=/etc/single/:rw"])
        .run(seed)
        .await;
    assert!(result.unwrap().result.is_ok());
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("etc/single/below")).unwrap(),
        "owned"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_reboot_requests_are_one() {
    let mut attack = Attack::new("reboot-flood", &["power"]);
    attack.stage = RunStage::Interrupt;
    let (result, tmp) = attack.run(|_| {}).await;
    assert!(result.unwrap().result.is_ok());
    let requests = SimHost::journal(tmp.path())
        .iter()
        .filter(|a| matches!(a, nodewright_hostops::HostAction::RebootRequested { .. }))
        .count();
    assert_eq!(requests, 1);
}
