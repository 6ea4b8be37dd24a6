use super::*;

#[test]
fn effects_are_recorded_and_stateful() {
    let tmp = tempfile::tempdir().unwrap();
    let host = SimHost::new(
        tmp.path(),
        NodeIdentity {
            name: "n1".into(),
            labels: vec![],
        },
    )
    .unwrap();
    host.sysctl_set("net.ipv4.ip_forward", "1").unwrap();
    assert_eq!(host.sysctl_get("net.ipv4.ip_forward").unwrap(), "1");
    assert!(!host.kmod_is_loaded("br_netfilter").unwrap());
    host.kmod_load("br_netfilter", &[]).unwrap();
    host.kmod_load("br_netfilter", &[]).unwrap();
    assert!(host.kmod_is_loaded("br-netfilter").unwrap());
    host.service(ServiceVerb::Restart, "containerd.service")
        .unwrap();
    assert_eq!(
        host.service_status("containerd.service")
            .unwrap()
            .active_state,
        "active"
    );
    host.request_reboot("driver").unwrap();
    assert_eq!(
        SimHost::reboot_requested(tmp.path()).as_deref(),
        Some("driver")
    );

    // A second process sees the same state and the whole journal.
    let again = SimHost::new(tmp.path(), NodeIdentity::default()).unwrap();
    assert!(again.kmod_is_loaded("br_netfilter").unwrap());
    assert_eq!(SimHost::journal(tmp.path()).len(), 5);
    assert!(again.recorded().is_empty());
    assert_eq!(
        SimHost::argv_log(tmp.path()),
        [
            vec!["/sbin/modprobe", "--", "br_netfilter"],
            vec!["/sbin/modprobe", "--", "br_netfilter"],
            vec!["/bin/systemctl", "restart", "--", "containerd.service"],
            vec![
                "/bin/systemctl",
                "show",
                "--property=ActiveState,UnitFileState,LoadState",
                "--",
                "containerd.service"
            ],
            vec!["/bin/systemctl", "reboot", "--no-wall"],
        ]
    );
}

#[test]
fn modules_are_matched_by_first_column_with_dash_folding() {
    let m = "br_netfilter 32768 0 - Live 0x0\nbridge 311296 1 br_netfilter, Live 0x0\n";
    assert!(modules_contains(m, "br_netfilter"));
    assert!(modules_contains(m, "br-netfilter"));
    assert!(!modules_contains(m, "br"));
}

#[test]
fn reboot_changes_boot_id_and_resets_runtime_state() {
    let tmp = tempfile::tempdir().unwrap();
    let host = SimHost::new(tmp.path(), NodeIdentity::default()).unwrap();
    let before = host.node_info().boot_id;
    std::fs::create_dir_all(tmp.path().join("etc/modules-load.d")).unwrap();
    std::fs::write(
        tmp.path().join("etc/modules-load.d/a.conf"),
        "# c\nbr_netfilter\n",
    )
    .unwrap();
    host.kmod_load("overlay", &[]).unwrap();
    host.request_reboot("x").unwrap();
    let after = host.reboot().unwrap();
    assert_ne!(before, after);
    assert_eq!(host.node_info().boot_id, after);
    assert!(SimHost::reboot_requested(tmp.path()).is_none());
    assert!(!host.kmod_is_loaded("overlay").unwrap());
    assert!(host.kmod_is_loaded("br_netfilter").unwrap());
}

#[test]
fn commands_run_only_from_inside_the_root() {
    let tmp = tempfile::tempdir().unwrap();
    let host = SimHost::new(tmp.path(), NodeIdentity::default()).unwrap();
    let err = host
        .exec(
            &Runnable::Host(Path::new("/bin/true")),
            &[],
            &[],
            &ExecLimits::default(),
        )
        .unwrap_err();
    assert!(matches!(err, HostError::NotFound(_)), "{err:?}");
    std::fs::create_dir_all(tmp.path().join("usr/bin")).unwrap();
    let script = tmp.path().join("usr/bin/hello");
    std::fs::write(&script, "#!/bin/sh\necho hi \"$1\"\n").unwrap();
    std::os::unix::fs::PermissionsExt::set_mode(
        &mut std::fs::metadata(&script).unwrap().permissions(),
        0o755,
    );
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = host
        .exec(
            &Runnable::Host(Path::new("/usr/bin/hello")),
            &["you".into()],
            &[],
            &ExecLimits::default(),
        )
        .unwrap();
    assert_eq!(out.stdout, b"hi you\n");
    assert_eq!(host.recorded().len(), 1);
}

/// The simulated node reads a unit's power-relevant settings from its unit file and drop-ins
/// as systemd would, and refuses a state change that would reach the node's power state.
#[test]
fn a_unit_that_reaches_power_is_refused_before_systemctl() {
    let tmp = tempfile::tempdir().unwrap();
    let host = SimHost::new(tmp.path(), NodeIdentity::default()).unwrap();
    let etc = tmp.path().join("etc/systemd/system");
    let lib = tmp.path().join("usr/lib/systemd/system");
    std::fs::create_dir_all(etc.join("b.service.d")).unwrap();
    std::fs::create_dir_all(&lib).unwrap();
    let unit = |dir: &Path, name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    unit(
        &lib,
        "a.service",
        "[Unit]\n# Wants=reboot.target\n[Service]\nSuccessAction=reboot-force\n",
    );
    unit(&etc, "b.service", "[Service]\nExecStart=/bin/true\n");
    unit(
        &etc.join("b.service.d"),
        "x.conf",
        "[Unit]\nWants=network.target emergency.target\n",
    );
    unit(
        &etc,
        "c.service",
        "[Unit]\nWants=network-online.target\nFailureAction=none\n",
    );
    let refused = |verb, name: &str| match host.service(verb, name) {
        Err(HostError::PowerUnit { why, .. }) => why,
        other => panic!("{verb} {name}: {other:?}"),
    };
    assert!(refused(ServiceVerb::Restart, "a.service").contains("SuccessAction=reboot-force"));
    assert!(refused(ServiceVerb::Stop, "a.service").contains("SuccessAction"));
    assert!(refused(ServiceVerb::Start, "b.service").contains("pulls in emergency.target"));
    // Enabling changes no state now; a plain unit and a unit without a file restart.
    host.service(ServiceVerb::Enable, "a.service").unwrap();
    host.service(ServiceVerb::Restart, "c.service").unwrap();
    host.service(ServiceVerb::Restart, "missing.service")
        .unwrap();
    let verbs: Vec<String> = SimHost::argv_log(tmp.path())
        .into_iter()
        .map(|a| format!("{} {}", a[1], a[3]))
        .collect();
    assert_eq!(
        verbs,
        [
            "enable a.service",
            "restart c.service",
            "restart missing.service"
        ]
    );
}

/// A masked unit fails to start, restart, reload and enable as systemctl's does (exit 1,
/// naming the unit), records no effect, and stops and disables as systemd lets it.
#[test]
fn a_masked_unit_is_refused_as_systemd_refuses_it() {
    let tmp = tempfile::tempdir().unwrap();
    let host = SimHost::new(tmp.path(), NodeIdentity::default()).unwrap();
    let etc = tmp.path().join("etc/systemd/system");
    std::fs::create_dir_all(&etc).unwrap();
    std::os::unix::fs::symlink("/dev/null", etc.join("gone.service")).unwrap();
    for verb in [
        ServiceVerb::Start,
        ServiceVerb::Restart,
        ServiceVerb::Reload,
        ServiceVerb::Enable,
    ] {
        match host.service(verb, "gone.service") {
            Err(e @ HostError::Command { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains(&format!("systemctl {verb} -- gone.service"))
                        && text.contains("Unit gone.service is masked."),
                    "{text}"
                );
            }
            other => panic!("{verb}: {other:?}"),
        }
    }
    host.service(ServiceVerb::Stop, "gone.service").unwrap();
    host.service(ServiceVerb::Disable, "gone.service").unwrap();
    let effects: Vec<String> = SimHost::journal(tmp.path())
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        effects,
        [
            "systemctl stop gone.service",
            "systemctl disable gone.service"
        ]
    );
}
