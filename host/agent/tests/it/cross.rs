//! The images' other architecture (arm64 on an x86-64 machine): the agent binary its image
//! holds, from the build `publish` pushes, run under qemu-user. It answers `--version` and
//! carries a real plugin's `plan` through its wasm sandbox (cranelift compiling for that
//! architecture) against a simulated node, with the result the native agent gives.

use std::process::Command;

use nodewright_images::Arch;
use nodewright_testregistry::TestRegistry;

use crate::agent::{CAPS, node, pushed, run_agent, run_args};

#[tokio::test(flavor = "multi_thread")]
async fn the_other_architecture_s_agent_runs_a_plan_under_qemu() {
    nodewright_testregistry::require!(Registry, Cross);
    let (qemu, dir) = nodewright_testregistry::setup::cross().expect("checked by require!");
    let agent = dir.join("nodewright-agent");
    let arch = Arch::of_elf(&std::fs::read(&agent).unwrap());
    assert!(
        arch.is_ok_and(|a| a != Arch::host()),
        "{} is built for the other architecture: {arch:?}",
        agent.display()
    );

    let version = Command::new(&qemu)
        .arg(&agent)
        .arg("--version")
        .output()
        .unwrap();
    assert!(version.status.success(), "{version:?}");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("nodewright-agent {}", env!("CARGO_PKG_VERSION"))
    );

    let reg = TestRegistry::start();
    let pinned = pushed(&reg).await;
    let plan = |cmd: Command| {
        let tmp = tempfile::tempdir().unwrap();
        node(tmp.path());
        let (out, result) = run_agent(
            cmd,
            tmp.path(),
            &run_args(&pinned, reg.host(), CAPS, "plan"),
            &[],
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // A plan changes nothing.
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("proc/sys/vm/swappiness")).unwrap(),
            "60"
        );
        result
    };
    let mut emulated = Command::new(&qemu);
    emulated.arg(&agent);
    let foreign = plan(emulated);
    assert_eq!(foreign["blame"], "none", "{foreign}");
    assert_eq!(foreign["plugin"], pinned.as_str());
    assert!(
        foreign["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "sysctl vm.swappiness: 60 -> 10"),
        "{foreign}"
    );
    let native = plan(Command::new(env!("CARGO_BIN_EXE_nodewright-agent")));
    for field in ["blame", "interrupt", "changes", "plugin"] {
        assert_eq!(
            foreign[field], native[field],
            "{field}: {foreign} / {native}"
        );
    }
}
