//! The main job end to end: `nodewright-demo --teardown` brings the local cluster up, rolls
//! the shipped examples out and exits 0 once every node is complete. Piped, it prints one
//! line per change, which is what this test reads.

use std::process::Command;

#[test]
fn the_demo_rolls_the_examples_out_to_every_node() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let out = Command::new(env!("CARGO_BIN_EXE_nodewright-demo"))
        .args(["--teardown", "--timeout", "300"])
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed\n{stdout}\n{stderr}");
    // The cluster runs the product as installed: its admission webhook refuses what
    // validation refuses.
    assert!(
        stderr.contains("an interruptionBudget of 250%: refused (spec.interruptionBudget.percent)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("a grant path with '..': refused (capabilities.files[0].path)"),
        "{stderr}"
    );
    assert!(
        stdout.contains("Rollout complete") && stdout.contains("6 nodes, 6 reboots"),
        "{stdout}"
    );
    for node in ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"] {
        let row = stdout
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with(node))
            .unwrap_or_else(|| panic!("no final row for {node}\n{stdout}"));
        assert!(
            row.contains("post-interrupt ✓") && row.contains("config ✓"),
            "{row}"
        );
        // Per node, in order: cordoned, rebooted, uncordoned.
        let at = |what: &str| {
            stdout
                .lines()
                .position(|l| l.contains(&format!(" {node}  {what}")))
                .unwrap_or_else(|| panic!("{node} never {what}\n{stdout}"))
        };
        assert!(
            at("cordoned") < at("rebooted") && at("rebooted") < at("uncordoned"),
            "{node}: order\n{stdout}"
        );
    }
}
