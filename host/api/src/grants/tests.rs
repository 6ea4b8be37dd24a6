use std::path::{Path, PathBuf};

use super::*;

fn parse(caps: &Capabilities) -> Result<GrantSet, Vec<GrantError>> {
    GrantSet::parse(
        caps,
        false,
        GrantSource::Spec {
            package: "drv".into(),
        },
    )
}

#[test]
fn deny_by_default() {
    let set = parse(&Capabilities::default()).unwrap();
    for c in Capability::ALL {
        assert!(!set.grants(c), "{c} granted by an empty spec");
    }
    assert_eq!(set.file_access(Path::new("/etc/passwd")), None);
    assert!(!set.allows_module("nvidia"));
    assert!(!set.allows_command("/bin/sh", &[]));
}

#[test]
fn file_grants_cover_subtrees_and_take_the_strongest_access() {
    let caps = Capabilities {
        files: vec![
            FileGrant {
                path: "/etc".into(),
                access: FileAccess::Read,
                special_modes: false,
            },
            FileGrant {
                path: "/etc/sysctl.d/".into(),
                access: FileAccess::ReadWrite,
                special_modes: false,
            },
        ],
        ..Default::default()
    };
    let set = parse(&caps).unwrap();
    assert_eq!(
        set.file_access(Path::new("/etc/hosts")),
        Some(FileAccess::Read)
    );
    assert_eq!(
        set.file_access(Path::new("/etc/sysctl.d/99-x.conf")),
        Some(FileAccess::ReadWrite)
    );
    assert_eq!(
        set.file_access(Path::new("/etcetera")),
        None,
        "prefix match must be by component"
    );
    assert_eq!(set.file_access(Path::new("/var/lib")), None);
}

#[test]
fn bad_paths_are_rejected_with_field_paths() {
    let caps = Capabilities {
        files: vec![
            FileGrant {
                path: "etc/x".into(),
                access: FileAccess::Read,
                special_modes: false,
            },
            FileGrant {
                path: "/etc/../root".into(),
                access: FileAccess::Read,
                special_modes: false,
            },
        ],
        commands: vec![CommandGrant {
            path: "bin/sh".into(),
            args: None,
            read_only: false,
        }],
        ..Default::default()
    };
    let errs = parse(&caps).unwrap_err();
    let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        ["files[0].path", "files[1].path", "commands[0].path"]
    );
    assert!(errs[1].message.contains(".."), "{}", errs[1]);
}

#[test]
fn name_globs() {
    let caps = Capabilities {
        kernel_modules: vec!["nvidia*".into(), "br_netfilter".into()],
        services: vec!["containerd.service".into()],
        sysctl: vec!["net.ipv4.*".into()],
        ..Default::default()
    };
    let set = parse(&caps).unwrap();
    assert!(set.allows_module("nvidia_uvm"));
    assert!(set.allows_module("br_netfilter"));
    assert!(!set.allows_module("br_netfilter2"));
    assert!(set.allows_service("containerd.service"));
    assert!(!set.allows_service("kubelet.service"));
    assert!(set.allows_sysctl("net.ipv4.ip_forward"));
    assert!(!set.allows_sysctl("net.ipv6.conf.all.forwarding"));
}

#[test]
fn bad_globs_and_characters_name_the_entry() {
    let caps = Capabilities {
        kernel_modules: vec!["ok".into(), "nv[idia".into()],
        services: vec!["a b".into()],
        sysctl: vec![String::new()],
        ..Default::default()
    };
    let errs = parse(&caps).unwrap_err();
    let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["kernelModules[1]", "services[0]", "sysctl[0]"]);
}

#[test]
fn command_argument_patterns() {
    let caps = Capabilities {
        commands: vec![
            CommandGrant {
                path: "/usr/bin/nvidia-smi".into(),
                args: Some(vec!["-pm".into(), "[01]".into()]),
                read_only: false,
            },
            CommandGrant {
                path: "/usr/bin/true".into(),
                args: None,
                read_only: true,
            },
        ],
        ..Default::default()
    };
    let set = parse(&caps).unwrap();
    let smi = "/usr/bin/nvidia-smi";
    assert!(set.allows_command(smi, &["-pm".into(), "1".into()]));
    assert!(!set.allows_command(smi, &["-pm".into(), "2".into()]));
    assert!(
        !set.allows_command(smi, &["-pm".into()]),
        "argument count must match"
    );
    assert!(set.allows_command("/usr/bin/true", &["anything".into()]));
    assert!(
        !set.allows_command("/usr/bin/../bin/true", &[]),
        "paths are exact"
    );
    assert!(
        set.check_command("/usr/bin/true", &[])
            .unwrap()
            .rule
            .read_only
    );
    assert!(
        !set.check_command(smi, &["-pm".into(), "1".into()])
            .unwrap()
            .rule
            .read_only
    );
}

#[test]
fn every_command_question_is_answered_by_check_command_with_its_reason() {
    let caps = Capabilities {
        commands: vec![CommandGrant {
            path: "/usr/bin/nvidia-smi".into(),
            args: Some(vec!["-pm".into(), "[01]".into()]),
            read_only: false,
        }],
        ..Default::default()
    };
    let set = parse(&caps).unwrap();
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let checked = set
        .check_command("/usr/bin/nvidia-smi", &args(&["-pm", "1"]))
        .unwrap();
    assert_eq!(
        (checked.target, checked.rule.read_only),
        (
            CommandTarget::Host(PathBuf::from("/usr/bin/nvidia-smi")),
            false
        )
    );
    let refused = |p: &str, a: &[&str]| set.check_command(p, &args(a)).unwrap_err();
    assert!(
        matches!(refused("/usr/bin/./nvidia-smi", &["-pm", "1"]), CommandRefusal::Invalid(why) if why.contains("call /usr/bin/nvidia-smi as granted")),
        "another spelling of a granted path is malformed, not ungranted"
    );
    assert!(matches!(refused("bin/sh", &[]), CommandRefusal::Invalid(_)));
    assert!(matches!(
        refused("/usr/bin/nvidia-smi", &["-pm", "1\0"]),
        CommandRefusal::Invalid(why) if why.starts_with("argument 1")
    ));
    assert!(matches!(
        refused("/usr/bin/nvidia-smi", &["-pm", "2"]),
        CommandRefusal::Arguments(_)
    ));
    assert_eq!(refused("/bin/sh", &[]), CommandRefusal::NotGranted);
}

#[test]
fn every_file_question_is_answered_by_check_file_with_the_most_specific_rule() {
    let caps = Capabilities {
        files: vec![
            FileGrant {
                path: "/etc/app/".into(),
                access: FileAccess::Read,
                special_modes: false,
            },
            FileGrant {
                path: "/etc/app/conf.d/".into(),
                access: FileAccess::ReadWrite,
                special_modes: false,
            },
        ],
        ..Default::default()
    };
    let set = parse(&caps).unwrap();
    let (rule, path) = set.check_file("/etc/app/conf.d/./x.conf", true).unwrap();
    assert_eq!(
        (rule.path.as_path(), path.as_path()),
        (
            Path::new("/etc/app/conf.d"),
            Path::new("/etc/app/conf.d/x.conf")
        )
    );
    assert_eq!(
        set.check_file("/etc/app/main.conf", true).unwrap_err(),
        PathRefusal::NotGranted("/etc/app/main.conf".into()),
        "read-only there"
    );
    assert!(set.check_file("/etc/app/main.conf", false).is_ok());
    assert!(matches!(
        set.check_file("etc/app", false),
        Err(PathRefusal::Invalid(_))
    ));
}

#[test]
fn an_exact_name_matches_itself_alone_and_a_glob_still_matches_its_names() {
    let escaped = r"dev-disk-by\x2duuid-0a1b.device";
    let caps = Capabilities {
        kernel_modules: vec!["nvidia".into()],
        services: vec![escaped.into(), "app@*.service".into()],
        sysctl: vec!["net.ipv4.ip_forward".into()],
        ..Default::default()
    };
    let set = parse(&caps).unwrap();
    assert!(set.allows_module("nvidia"));
    for other in ["nvidia_uvm", "NVIDIA", "nvidi", ""] {
        assert!(!set.allows_module(other), "{other:?}");
    }
    assert!(set.allows_sysctl("net.ipv4.ip_forward"));
    for other in ["net.ipv4.ip_forwardx", "net.ipv4", "net.ipv4.ip.forward"] {
        assert!(!set.allows_sysctl(other), "{other:?}");
    }
    // systemd's escape is part of the unit's name, not a glob escape.
    assert!(set.allows_service(escaped));
    assert!(!set.allows_service("dev-disk-byx2duuid-0a1b.device"));
    assert!(set.allows_service("app@1.service"));
    assert!(!set.allows_service("app.service"));
    // In a unit glob too: `\x2d` is the escape of `-`, spelled as systemd spells it.
    let globbed = parse(&Capabilities {
        services: vec![r"dev-disk-by\x2duuid-*.device".into()],
        ..Default::default()
    })
    .unwrap();
    assert!(globbed.allows_service(escaped));
    assert!(!globbed.allows_service("dev-disk-byx2duuid-0a1b.device"));
}

#[test]
fn names_are_checked_against_their_grammar_before_the_glob() {
    let caps = Capabilities {
        kernel_modules: vec!["nvidia*".into()],
        services: vec!["*.service".into()],
        sysctl: vec!["net.*".into()],
        ..Default::default()
    };
    let set = parse(&caps).unwrap();
    assert!(matches!(
        set.check_module("nvidia/../../evil"),
        Err(NameRefusal::Invalid(_))
    ));
    assert!(matches!(
        set.check_module("nvidia -C"),
        Err(NameRefusal::Invalid(_))
    ));
    assert_eq!(set.check_module("nvidia_uvm"), Ok(()));
    assert_eq!(set.check_module("evil"), Err(NameRefusal::NotGranted));
    assert!(matches!(
        set.check_service("/tmp/evil.service"),
        Err(NameRefusal::Invalid(_))
    ));
    assert!(matches!(
        set.check_service("--root=/tmp.service"),
        Err(NameRefusal::Invalid(_))
    ));
    assert_eq!(set.check_service("app.service"), Ok(()));
    assert!(matches!(
        set.check_sysctl("net/../kernel/panic"),
        Err(NameRefusal::Invalid(_))
    ));
    assert_eq!(set.check_sysctl("net.core.somaxconn"), Ok(()));
    let errs = parse(&Capabilities {
        kernel_modules: vec!["-C".into()],
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(errs[0].field, "kernelModules[0]");
}

#[test]
fn wildcard_argument_patterns_cannot_be_widened() {
    let caps = Capabilities {
        commands: vec![CommandGrant {
            path: "/usr/bin/tool".into(),
            args: Some(vec!["--level=*".into(), "/var/lib/app/*".into()]),
            read_only: false,
        }],
        ..Default::default()
    };
    let set = parse(&caps).unwrap();
    let tool = "/usr/bin/tool";
    let args = |a: &str, b: &str| vec![a.to_string(), b.to_string()];
    assert!(set.allows_command(tool, &args("--level=3", "/var/lib/app/x.conf")));
    assert!(
        !set.allows_command(tool, &args("--level=3", "/var/lib/app/../../etc/shadow")),
        "'..' widens the pattern"
    );
    assert!(
        !set.allows_command(tool, &args("--level=3", "/var/lib/app/a/b")),
        "'*' does not cross '/'"
    );
    assert!(!set.allows_command(tool, &args("--level=3", "-/var/lib/app/x")));
    let rule = &set.commands[0];
    assert!(
        rule.check_args(&args("--level=3", "--config=/var/lib/app/x"))
            .unwrap_err()
            .contains("argument 1")
    );
    let any = Capabilities {
        commands: vec![CommandGrant {
            path: "/usr/bin/tool".into(),
            args: Some(vec!["*".into()]),
            read_only: false,
        }],
        ..Default::default()
    };
    let set = parse(&any).unwrap();
    assert!(set.allows_command(tool, &["file".to_string()]));
    assert!(
        !set.allows_command(tool, &["--exec=/bin/sh".to_string()]),
        "a leading wildcard does not match an option"
    );
}

#[test]
fn special_modes_need_an_explicit_readwrite_grant() {
    let caps = Capabilities {
        files: vec![
            FileGrant {
                path: "/usr/local/bin".into(),
                access: FileAccess::ReadWrite,
                special_modes: true,
            },
            FileGrant {
                path: "/etc/app".into(),
                access: FileAccess::ReadWrite,
                special_modes: false,
            },
        ],
        ..Default::default()
    };
    let set = parse(&caps).unwrap();
    assert!(set.allows_special_modes(Path::new("/usr/local/bin/tool")));
    assert!(!set.allows_special_modes(Path::new("/etc/app/x")));
    let bad = Capabilities {
        files: vec![FileGrant {
            path: "/x".into(),
            access: FileAccess::Read,
            special_modes: true,
        }],
        ..Default::default()
    };
    assert_eq!(parse(&bad).unwrap_err()[0].field, "files[0].specialModes");
    let (caps, _) = Capabilities::from_flags(&["files=/opt/bin:rw+special"]).unwrap();
    assert!(caps.files[0].special_modes);
}

#[test]
fn unknown_keys_are_rejected() {
    let err = serde_json::from_str::<Capabilities>(r#"{"kernelModule": ["x"]}"#).unwrap_err();
    assert!(
        err.to_string().contains("unknown field `kernelModule`"),
        "{err}"
    );
}

#[test]
fn flags() {
    let (caps, power) = Capabilities::from_flags(&[
        "files=/etc/sysctl.d:rw",
        "files=/etc/os-release",
        "kmod=br_netfilter",
        "sysctl=net.*",
        "service=containerd.service",
        "command=/usr/bin/nvidia-smi:-pm,1",
        "command=payload:driver/install.run:--silent",
        "probe=payload:driver/bin/version",
        "power",
    ])
    .unwrap();
    assert!(power);
    assert_eq!(
        caps.files[0],
        FileGrant {
            path: "/etc/sysctl.d".into(),
            access: FileAccess::ReadWrite,
            special_modes: false
        }
    );
    assert_eq!(caps.files[1].access, FileAccess::Read);
    assert_eq!(
        caps.commands[0].args.as_deref(),
        Some(&["-pm".to_string(), "1".to_string()][..])
    );
    assert_eq!(
        (
            caps.commands[1].path.as_str(),
            caps.commands[1].args.as_deref()
        ),
        (
            "payload:driver/install.run",
            Some(&["--silent".to_string()][..])
        )
    );
    assert_eq!(
        (
            caps.commands[2].path.as_str(),
            caps.commands[2].args.as_deref(),
            caps.commands[2].read_only
        ),
        ("payload:driver/bin/version", None, true)
    );
    let err = Capabilities::from_flags(&["kmods=x"]).unwrap_err();
    assert_eq!(err.field, "--grant[0]");
    assert!(Capabilities::from_flags(&["files=/x:rx"]).is_err());
    assert!(Capabilities::from_flags(&["kmod"]).is_err());
}

#[test]
fn hints_name_the_grant_to_add() {
    let spec = GrantSource::Spec {
        package: "driver".into(),
    };
    assert_eq!(
        spec.hint(Capability::Kmod, "nvidia", false),
        r#"add "nvidia" to spec.packages.driver.capabilities.kernelModules"#
    );
    assert_eq!(
        spec.hint(Capability::Files, "/etc/x", true),
        r#"add {path: "/etc/x", access: readWrite} to spec.packages.driver.capabilities.files"#
    );
    assert_eq!(
        GrantSource::Flags.hint(Capability::Services, "a.service", false),
        "pass --grant service=a.service"
    );
    assert_eq!(
        GrantSource::Flags.hint(Capability::Power, "", false),
        "pass --grant power"
    );
    assert_eq!(
        spec.field(Capability::Sysctl),
        "spec.packages.driver.capabilities.sysctl"
    );
    assert_eq!(
        GrantSource::Flags.field(Capability::Exec),
        "--grant command=..."
    );
}

#[test]
fn a_trailing_slash_makes_a_file_grant_a_directory_grant() {
    let (caps, _) =
        Capabilities::from_flags(&["files=/etc/app/:rw", "files=/etc/app.conf:rw", "files=/"])
            .unwrap();
    let set = parse(&caps).unwrap();
    let kinds: Vec<(&Path, PathKind)> = set
        .files
        .iter()
        .map(|r| (r.path.as_path(), r.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            (Path::new("/"), PathKind::Directory),
            (Path::new("/etc/app"), PathKind::Directory),
            (Path::new("/etc/app.conf"), PathKind::AsFound),
        ]
    );
}

#[test]
fn a_payload_command_is_granted_by_its_one_exact_spelling() {
    let caps = Capabilities {
        commands: vec![CommandGrant {
            path: "payload:driver/bin/install.run".into(),
            args: Some(vec!["--silent".into()]),
            read_only: false,
        }],
        ..Default::default()
    };
    let set = parse(&caps).unwrap();
    let silent = ["--silent".to_string()];
    let target = set
        .check_command("payload:driver/bin/install.run", &silent)
        .unwrap()
        .target;
    assert_eq!(
        target,
        CommandTarget::Payload {
            name: crate::payload::PayloadName::parse("driver").unwrap(),
            path: PathBuf::from("bin/install.run"),
        }
    );
    assert_eq!(target.to_string(), "payload:driver/bin/install.run");
    // Every other spelling of it is malformed, never a second way in.
    for other in [
        "payload:driver/bin/./install.run",
        "payload:driver/bin//install.run",
        "payload:driver/bin/../bin/install.run",
        "payload:driver/./bin/install.run",
        "payload:driver/bin/install.run/",
        "payload:driver//bin/install.run",
        "payload:driver/",
        "payload:driver",
        "payload:/bin/install.run",
        "payload:../driver/bin/install.run",
        "payload:dri ver/bin/install.run",
        "payload:driver/bin/install.run\0",
    ] {
        assert!(
            matches!(
                set.check_command(other, &silent),
                Err(CommandRefusal::Invalid(_))
            ),
            "{other:?} was not refused as malformed"
        );
    }
    // Another payload's file, or a host path of the same name, is not the grant.
    for ungranted in [
        "payload:firmware/bin/install.run",
        "payload:driver/bin/other",
        "/bin/install.run",
    ] {
        assert_eq!(
            set.check_command(ungranted, &silent).unwrap_err(),
            CommandRefusal::NotGranted,
            "{ungranted}"
        );
    }
    assert!(matches!(
        set.check_command("payload:driver/bin/install.run", &[]),
        Err(CommandRefusal::Arguments(_))
    ));
    // A malformed grant names its field.
    for bad in ["payload:driver/../x", "payload:Bad Name/x", "payload:x"] {
        let errs = parse(&Capabilities {
            commands: vec![CommandGrant {
                path: bad.into(),
                args: None,
                read_only: false,
            }],
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(errs[0].field, "commands[0].path", "{bad}");
    }
}

#[test]
fn an_argument_pattern_starting_with_payload_takes_only_files_of_that_payload() {
    let caps = Capabilities {
        commands: vec![CommandGrant {
            path: "/usr/bin/dpkg".into(),
            args: Some(vec!["--install".into(), "payload:debs/*.deb".into()]),
            read_only: false,
        }],
        ..Default::default()
    };
    let set = parse(&caps).unwrap();
    let args = |a: &str| vec!["--install".to_string(), a.to_string()];
    let checked = set
        .check_command("/usr/bin/dpkg", &args("payload:debs/nvidia-560.deb"))
        .unwrap();
    assert_eq!(
        checked.payload_args,
        [(
            1,
            crate::payload::PayloadName::parse("debs").unwrap(),
            PathBuf::from("nvidia-560.deb")
        )]
    );
    for refused in [
        "/var/tmp/evil.deb",
        "payload:other/nvidia.deb",
        "payload:debs/sub/nvidia.deb",
        "payload:debs/../x.deb",
        "payload:debs/nvidia.rpm",
        "--admindir=/tmp",
    ] {
        assert!(
            set.check_command("/usr/bin/dpkg", &args(refused)).is_err(),
            "{refused} was accepted"
        );
    }
    // A malformed payload pattern names its field.
    for bad in [
        "payload:*/x.deb",
        "payload:debs",
        "payload:debs/../*.deb",
        "payload:debs//x",
    ] {
        let errs = parse(&Capabilities {
            commands: vec![CommandGrant {
                path: "/usr/bin/dpkg".into(),
                args: Some(vec!["--install".into(), bad.into()]),
                read_only: false,
            }],
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(errs[0].field, "commands[0].args[1]", "{bad}");
    }
    // Another pattern's argument is passed as written, never opened as a payload file.
    let plain = parse(&Capabilities {
        commands: vec![CommandGrant {
            path: "/usr/bin/echo".into(),
            args: Some(vec!["**".into()]),
            read_only: false,
        }],
        ..Default::default()
    })
    .unwrap();
    let checked = plain
        .check_command("/usr/bin/echo", &["payload:debs/x.deb".into()])
        .unwrap();
    assert!(checked.payload_args.is_empty());
}
