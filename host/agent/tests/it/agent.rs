//! The real agent binary against a real registry and a simulated node: pinned pulls, the
//! structured result, blame and exit codes, idempotence, and the reboot protocol.

use std::path::Path;
use std::process::{Command, Output};

use nodewright_hostops::{HostOps, NodeIdentity, SimHost};
use nodewright_oci::{Registry, RegistryConfig};
use nodewright_testregistry::TestRegistry;
use serde_json::Value;

pub(crate) const CAPS: &str =
    r#"{"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}], "sysctl": ["vm.swappiness"]}"#;

pub(crate) async fn pushed(reg: &TestRegistry) -> String {
    let registry = Registry::new(RegistryConfig {
        insecure: vec![reg.host().into()],
        ..Default::default()
    });
    registry
        .push(
            &format!("{}/plugins/sysctl:1.0.0", reg.host()),
            &nodewright_artifacts::read(nodewright_artifacts::SYSCTL),
            Default::default(),
            &|_| {},
        )
        .await
        .unwrap()
        .pinned
        .into()
}

fn agent(root: &Path, args: &[&str]) -> (Output, Value) {
    agent_env(root, args, &[])
}

fn agent_env(root: &Path, args: &[&str], env: &[(&str, &str)]) -> (Output, Value) {
    run_agent(
        Command::new(env!("CARGO_BIN_EXE_nodewright-agent")),
        root,
        args,
        env,
    )
}

/// Runs `cmd` (the agent, or qemu-user and the agent) with `args` against the simulated
/// node at `root`: its output and the structured result it wrote.
pub(crate) fn run_agent(
    mut cmd: Command,
    root: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Output, Value) {
    let term = root.join("termination-log");
    let out = cmd
        .args(args)
        .envs(env.iter().copied())
        .args([
            "--backend",
            "sim",
            "--host-root",
            root.to_str().unwrap(),
            "--node",
            "node-1",
            "--cr-uid",
            "uid-1",
            "--generation",
            "1",
        ])
        .arg("--termination-log")
        .arg(&term)
        .output()
        .unwrap();
    let result = serde_json::from_str(&std::fs::read_to_string(&term).unwrap_or_default())
        .unwrap_or(Value::Null);
    (out, result)
}

pub(crate) fn run_args<'a>(
    plugin: &'a str,
    host: &'a str,
    caps: &'a str,
    stage: &'a str,
) -> Vec<&'a str> {
    vec![
        "run",
        "--stage",
        stage,
        "--package",
        "tuning",
        "--version",
        "1.0.0",
        "--plugin",
        plugin,
        "--capabilities",
        caps,
        "--config",
        r#"{"vm.swappiness": "10"}"#,
        "--insecure-registry",
        host,
    ]
}

pub(crate) fn node(root: &Path) -> SimHost {
    std::fs::create_dir_all(root.join("proc/sys/vm")).unwrap();
    std::fs::write(root.join("proc/sys/vm/swappiness"), "60").unwrap();
    SimHost::new(root, NodeIdentity::default()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_a_pinned_plugin_reports_and_is_idempotent() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let pinned = pushed(&reg).await;
    let tmp = tempfile::tempdir().unwrap();
    node(tmp.path());
    let (out, result) = agent(tmp.path(), &run_args(&pinned, reg.host(), CAPS, "apply"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(result["blame"], "none");
    assert_eq!(result["blame"], "none");
    assert_eq!(result["interrupt"], "none");
    assert_eq!(result["plugin"], pinned.as_str());
    assert!(
        result["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "sysctl vm.swappiness: 60 -> 10"),
        "{result}"
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("proc/sys/vm/swappiness")).unwrap(),
        "10"
    );
    assert!(
        tmp.path()
            .join("var/lib/nodewright/plugins/blobs/sha256")
            .read_dir()
            .unwrap()
            .count()
            >= 1,
        "the node cache holds the plugin"
    );

    // A retried pod for the same generation does not run the stage again.
    std::fs::write(tmp.path().join("proc/sys/vm/swappiness"), "60").unwrap();
    let (out, again) = agent(tmp.path(), &run_args(&pinned, reg.host(), CAPS, "apply"));
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already succeeded"));
    assert_eq!(again, result);
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("proc/sys/vm/swappiness")).unwrap(),
        "60"
    );

    // Checks always run (read-only).
    let (out, check) = agent(
        tmp.path(),
        &run_args(&pinned, reg.host(), CAPS, "apply-check"),
    );
    assert_eq!(out.status.code(), Some(1), "drift fails the check: {check}");
    assert_eq!(check["blame"], "package");
}

#[tokio::test(flavor = "multi_thread")]
async fn blame_and_exit_codes() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let pinned = pushed(&reg).await;
    let tmp = tempfile::tempdir().unwrap();
    node(tmp.path());

    let tag = format!("{}/plugins/sysctl:1.0.0", reg.host());
    let (out, r) = agent(tmp.path(), &run_args(&tag, reg.host(), CAPS, "apply"));
    assert_eq!(
        (out.status.code(), r["blame"].as_str(), r["stage"].as_str()),
        (Some(3), Some("config"), Some("apply")),
        "an argument the agent cannot take is the spec's fault, never exit 2 (denied): {r}"
    );
    let message = r["message"].as_str().unwrap();
    assert!(
        message.contains("--plugin") && message.contains("not pinned"),
        "{message}"
    );

    let narrow =
        r#"{"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}], "sysctl": ["net.*"]}"#;
    let (out, r) = agent(tmp.path(), &run_args(&pinned, reg.host(), narrow, "apply"));
    assert_eq!(
        (out.status.code(), r["blame"].as_str()),
        (Some(2), Some("denied"))
    );
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains(r#"add "vm.swappiness" to spec.packages.tuning.capabilities.sysctl"#),
        "{r}"
    );

    let (out, r) = agent(
        tmp.path(),
        &run_args(
            &pinned,
            reg.host(),
            r#"{"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}]}"#,
            "apply",
        ),
    );
    assert_eq!(
        (out.status.code(), r["blame"].as_str()),
        (Some(2), Some("denied")),
        "missing grants are caught before running: {r}"
    );

    // The node cache is content-addressed: a node that has the digest needs no registry.
    let mut down = TestRegistry::start();
    let elsewhere = pinned.replace(reg.host(), down.host());
    down.stop();
    let (out, _) = agent(tmp.path(), &run_args(&elsewhere, down.host(), CAPS, "plan"));
    assert_eq!(out.status.code(), Some(0), "served from the node cache");
    // A fresh node must pull, and an unreachable registry is a retryable host failure.
    let fresh = tempfile::tempdir().unwrap();
    node(fresh.path());
    let (out, r) = agent(
        fresh.path(),
        &run_args(&elsewhere, down.host(), CAPS, "plan"),
    );
    assert_eq!(
        (out.status.code(), r["blame"].as_str()),
        (Some(4), Some("host")),
        "an unreachable registry is retryable: {r}"
    );
}

#[test]
fn the_reboot_protocol_completes_only_on_a_new_boot_id() {
    let tmp = tempfile::tempdir().unwrap();
    let host = node(tmp.path());
    let boot = host.node_info().boot_id;
    let args = ["interrupt", "--type", "reboot", "--reboot-wait", "200ms"];

    // First run: marker with the current boot ID, reboot requested, node not down: fail.
    let (out, r) = agent(tmp.path(), &args);
    assert_eq!(
        (out.status.code(), r["blame"].as_str()),
        (Some(4), Some("host")),
        "{r}"
    );
    assert!(SimHost::reboot_requested(tmp.path()).is_some());
    let marker: Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("var/lib/nodewright/reboot-pending.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(marker["bootId"], boot.as_str());

    // Unchanged boot ID: the stale marker is replaced and the reboot requested again.
    std::fs::remove_file(tmp.path().join("run/nodewright-sim/reboot-requested")).unwrap();
    let (out, _) = agent(tmp.path(), &args);
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stale reboot marker"));
    assert!(SimHost::reboot_requested(tmp.path()).is_some());

    // The node reboots; the next run sees the new boot ID and completes.
    let new_boot = host.reboot().unwrap();
    let (out, r) = agent(tmp.path(), &args);
    assert_eq!(out.status.code(), Some(0), "{r}");
    assert!(r["message"].as_str().unwrap().contains(&new_boot));
    assert!(
        !tmp.path()
            .join("var/lib/nodewright/reboot-pending.json")
            .exists()
    );

    // Done once per generation: no second reboot.
    let (out, _) = agent(tmp.path(), &args);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already completed"));
    assert!(SimHost::reboot_requested(tmp.path()).is_none());
}

/// A service interrupt names a plain `.service`, but the unit as the node has it (a drop-in
/// adding `OnFailure=poweroff.target`) reaches the node's power state: the agent refuses it
/// before `systemctl restart` runs, as a denial, and restarts the units before it.
#[test]
fn a_service_interrupt_never_reaches_power_through_the_unit_on_the_node() {
    let tmp = tempfile::tempdir().unwrap();
    node(tmp.path());
    let units = tmp.path().join("etc/systemd/system");
    std::fs::create_dir_all(units.join("app.service.d")).unwrap();
    std::fs::write(units.join("ok.service"), "[Service]\nExecStart=/bin/true\n").unwrap();
    std::fs::write(
        units.join("app.service"),
        "[Service]\nExecStart=/bin/true\n",
    )
    .unwrap();
    std::fs::write(
        units.join("app.service.d/10-evil.conf"),
        "[Unit]\nOnFailure=poweroff.target\n",
    )
    .unwrap();
    let args = [
        "interrupt",
        "--type",
        "service",
        "--service",
        "ok.service",
        "--service",
        "app.service",
    ];
    let (out, r) = agent(tmp.path(), &args);
    assert_eq!(
        (out.status.code(), r["blame"].as_str()),
        (Some(2), Some("denied")),
        "{r}"
    );
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("app.service pulls in poweroff.target"),
        "{r}"
    );
    let restarts: Vec<Vec<String>> = SimHost::argv_log(tmp.path())
        .into_iter()
        .filter(|a| a.get(1).is_some_and(|v| v == "restart"))
        .collect();
    assert_eq!(
        restarts,
        [vec!["/bin/systemctl", "restart", "--", "ok.service"]]
    );
}

/// A unit systemd refuses to restart (masked here) fails the interrupt as the package's
/// verdict — exit 1, counted against the retries — quoting systemctl, rather than as a host
/// failure retried for ever.
#[test]
fn a_service_restart_systemd_refuses_is_the_packages_failure() {
    let tmp = tempfile::tempdir().unwrap();
    node(tmp.path());
    let units = tmp.path().join("etc/systemd/system");
    std::fs::create_dir_all(&units).unwrap();
    std::os::unix::fs::symlink("/dev/null", units.join("gone.service")).unwrap();
    let args = [
        "interrupt",
        "--type",
        "service",
        "--service",
        "gone.service",
    ];
    let (out, r) = agent(tmp.path(), &args);
    assert_eq!(
        (out.status.code(), r["blame"].as_str()),
        (Some(1), Some("package")),
        "{r}"
    );
    let message = r["message"].as_str().unwrap();
    assert!(
        message.starts_with("restart gone.service:") && message.contains("is masked"),
        "{r}"
    );
}

/// The hostile guest through the real agent: a result the plugin inflates is bounded when
/// it is built, and an error the plugin invents cannot pick its blame.
#[tokio::test(flavor = "multi_thread")]
async fn hostile_results_are_bounded_and_forged_blame_is_the_packages() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let registry = Registry::new(RegistryConfig {
        insecure: vec![reg.host().into()],
        ..Default::default()
    });
    let pinned = registry
        .push(
            &format!("{}/plugins/hostile:1.0.0", reg.host()),
            &nodewright_artifacts::read(nodewright_artifacts::HOSTILE),
            Default::default(),
            &|_| {},
        )
        .await
        .unwrap()
        .pinned
        .to_string();
    let caps = r#"{"files": [{"path": "/etc/app", "access": "readWrite"}], "kernelModules": ["x"], "services": ["x.service"], "sysctl": ["x"], "commands": [{"path": "/x"}]}"#;
    // A fresh node each: a succeeded stage is not run again on the same one.
    let run = |attack: &str| {
        let tmp = tempfile::tempdir().unwrap();
        node(tmp.path());
        let root = tmp.path();
        let config = format!(r#"{{"attack": "{attack}"}}"#);
        let args = [
            "run",
            "--stage",
            "apply",
            "--package",
            "hostile",
            "--version",
            "1.0.0",
            "--plugin",
            &pinned,
            "--capabilities",
            caps,
            "--config",
            &config,
            "--insecure-registry",
            reg.host(),
            "--reboot-allowed",
            "--no-check",
        ];
        let term = root.join("termination-log");
        let out = agent(root, &args).0;
        (out, std::fs::read_to_string(term).unwrap())
    };
    let (out, message) = run("many-changes");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        message.len() <= nodewright_api::result::TERMINATION_MESSAGE_LIMIT,
        "{}",
        message.len()
    );
    let r: Value = serde_json::from_str(&message).unwrap();
    assert_eq!(r["changeCount"], 16_000);
    assert!(r["changes"].as_array().unwrap().len() <= nodewright_api::result::MAX_CHANGES);

    let (out, message) = run("forge-host-failure");
    let r: Value = serde_json::from_str(&message).unwrap();
    assert_eq!(
        (out.status.code(), r["blame"].as_str()),
        (Some(1), Some("package")),
        "{r}"
    );
    let (out, message) = run("forge-denied");
    let r: Value = serde_json::from_str(&message).unwrap();
    assert_eq!(
        (out.status.code(), r["blame"].as_str()),
        (Some(1), Some("package")),
        "{r}"
    );
}

/// An image without CA certificates: a plain-HTTP registry needs none, and an HTTPS one is
/// a clear error naming what is missing (it used to be a panic, exit 101).
#[tokio::test(flavor = "multi_thread")]
async fn no_system_ca_certificates_is_not_a_panic() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let pinned = pushed(&reg).await;
    let tmp = tempfile::tempdir().unwrap();
    node(tmp.path());
    let no_roots = [
        ("SSL_CERT_FILE", "/nonexistent/ca.crt"),
        ("SSL_CERT_DIR", "/nonexistent"),
    ];
    let (out, r) = agent_env(
        tmp.path(),
        &run_args(&pinned, reg.host(), CAPS, "plan"),
        &no_roots,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "plain HTTP needs no CA: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(r["blame"], "none");

    let tls = TestRegistry::start_tls();
    let elsewhere = pinned.replace(reg.host(), tls.host());
    let fresh = tempfile::tempdir().unwrap();
    node(fresh.path());
    let args = [
        "run",
        "--stage",
        "plan",
        "--package",
        "tuning",
        "--version",
        "1.0.0",
        "--plugin",
        &elsewhere,
        "--capabilities",
        CAPS,
    ];
    let (out, r) = agent_env(fresh.path(), &args, &no_roots);
    assert_ne!(
        out.status.code(),
        Some(101),
        "a panic: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(r["blame"], "none", "{r}");
    assert!(
        r["message"].as_str().unwrap().contains("CA certificates"),
        "{r}"
    );
}

/// A package with a payload through the real agent: the `driver` plugin pushed with its
/// module as a payload, pulled by digest with it, the module installed on the node from
/// the payload (byte for byte) and loaded — and the payload's tree left in the node cache.
#[tokio::test(flavor = "multi_thread")]
async fn a_payload_reaches_the_node_through_the_agent() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let src = tempfile::tempdir().unwrap();
    let mut module = b"\x7fELF".to_vec();
    module.extend(std::iter::repeat_n(0x42, 300_000));
    module.extend_from_slice(b"\0version=560.35.03\0");
    std::fs::write(src.path().join("nvidia.ko"), &module).unwrap();
    let name = nodewright_api::payload::PayloadName::parse("driver").unwrap();
    let packed = tempfile::tempdir().unwrap();
    let payload =
        nodewright_oci::PayloadFile::pack(name, src.path(), packed.path().join("driver.tar"))
            .unwrap();
    let registry = Registry::new(RegistryConfig {
        insecure: vec![reg.host().into()],
        ..Default::default()
    });
    let pinned: String = registry
        .push_package(
            &format!("{}/plugins/driver:1.0.0", reg.host()),
            &nodewright_artifacts::read(nodewright_artifacts::DRIVER),
            Default::default(),
            &[payload],
            &|_| {},
        )
        .await
        .unwrap()
        .pinned
        .into();
    let tmp = tempfile::tempdir().unwrap();
    let host = node(tmp.path());
    let release = host.node_info().kernel_release;
    std::fs::create_dir_all(tmp.path().join("lib/modules").join(&release)).unwrap();
    let caps = r#"{"files": [{"path": "/lib/modules", "access": "readWrite"}, {"path": "/sys/module", "access": "read"}], "kernelModules": ["nvidia"]}"#;
    let (out, result) = agent(
        tmp.path(),
        &[
            "run",
            "--stage",
            "apply",
            "--package",
            "gpu",
            "--version",
            "560.35.3",
            "--plugin",
            &pinned,
            "--capabilities",
            caps,
            "--config",
            r#"{"module": "nvidia"}"#,
            "--insecure-registry",
            reg.host(),
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{result} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(result["blame"], "none", "{result}");
    let installed = tmp
        .path()
        .join("lib/modules")
        .join(&release)
        .join("updates/nvidia.ko");
    assert_eq!(std::fs::read(installed).unwrap(), module);
    assert!(host.kmod_is_loaded("nvidia").unwrap());
    let trees = tmp.path().join("var/lib/nodewright/plugins/trees/sha256");
    assert_eq!(
        trees.read_dir().unwrap().count(),
        1,
        "the payload's tree is cached"
    );
}
