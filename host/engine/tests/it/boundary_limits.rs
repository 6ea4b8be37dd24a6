//! The hostile suite, resource and verdict level: a plugin cannot exhaust the node's memory,
//! disk or time through the host, cannot make the host compile or load more than its
//! bounds, and cannot choose whom a failure is blamed on.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{Attack, EVERY_CAPABILITY, Run, denial, engine, sim};
use nodewright_engine::{Error, MAX_DENIALS_KEPT, RunError, RunStage, StepFailure};

const FILES: &[&str] = &["files=/etc/app:rw"];

#[tokio::test(flavor = "multi_thread")]
async fn a_denial_flood_is_counted_not_stored() {
    let (result, _tmp) = Attack::new("denial-flood", FILES).run(|_| {}).await;
    let report = result.unwrap();
    assert_eq!(report.denials_total, 200_000);
    assert_eq!(report.denials.len(), MAX_DENIALS_KEPT);
    assert!(
        report
            .denials
            .iter()
            .all(|d| d.target.len() < 300 && d.message.len() < 1500),
        "denials are clipped"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_larger_than_half_the_memory_limit_is_refused_before_reading() {
    let (result, _tmp) = Attack::new("read-huge", FILES)
        .run(|root| {
            // Sparse: 3 GiB on paper, nothing on disk.
            std::fs::File::create(root.join("etc/app/huge"))
                .unwrap()
                .set_len(3 << 30)
                .unwrap();
        })
        .await;
    let d = denial("read-huge", &result);
    assert!(
        d.message.contains("reads are capped at 16777216 bytes"),
        "{}",
        d.message
    );
    assert!(
        d.message.contains("spec.packages.hostile.sandbox.memory"),
        "{}",
        d.message
    );
}

fn mkfifo(root: &Path) {
    assert!(
        std::process::Command::new("mkfifo")
            .arg(root.join("etc/app/pipe"))
            .status()
            .unwrap()
            .success()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reading_a_fifo_is_refused_without_blocking() {
    let mut attack = Attack::new("read-fifo", FILES);
    attack.limits.timeout = Duration::from_secs(60);
    let (result, _tmp) = attack.run(mkfifo).await;
    assert!(denial("read-fifo", &result).message.contains("FIFO"));
}

#[tokio::test(flavor = "multi_thread")]
async fn chmod_of_a_fifo_is_refused_without_blocking() {
    let mut attack = Attack::new("chmod-fifo", FILES);
    attack.limits.timeout = Duration::from_secs(60);
    let (result, _tmp) = attack.run(mkfifo).await;
    assert!(denial("chmod-fifo", &result).message.contains("FIFO"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_deadline_ends_a_stage_blocked_in_a_host_call() {
    let mut attack = Attack::new("slow-command", &["command=/usr/bin/slow"]);
    attack.limits.timeout = Duration::from_millis(500);
    attack.limits.exec_timeout = Duration::from_secs(60);
    let (result, tmp) = attack
        .run(|root| {
            std::fs::create_dir_all(root.join("usr/bin")).unwrap();
            let script = root.join("usr/bin/slow");
            std::fs::write(
                &script,
                // Its PID as the host sees it: inside its own PID namespace `$$` is 1.
                "#!/bin/sh\nread -r pid rest < /proc/self/stat\necho $pid > \"$NODEWRIGHT_SIM_ROOT/started\"\nexec sleep 30\n",
            )
            .unwrap();
            std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        })
        .await;
    let err = result.unwrap_err();
    assert!(matches!(err, RunError::Timeout { .. }), "{err}");
    // The command was started, and the stage's end killed it rather than leaving it to
    // its own 60 s timeout.
    let pid = std::fs::read_to_string(tmp.path().join("started"))
        .expect("the command ran")
        .trim()
        .to_string();
    let gone = (0..250).any(|_| {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        });
        if alive {
            std::thread::sleep(Duration::from_millis(20));
        }
        !alive
    });
    assert!(gone, "the command {pid} outlived its stage");
}

/// Runs `stage` of a crafted variant of the hostile guest (every capability granted) with a
/// `memory` limit, and returns how the sandbox stopped it.
async fn crafted_stage(bytes: &[u8], stage: RunStage, memory: u64) -> RunError {
    let plugin = engine().load(bytes).expect("the crafted component loads");
    let tmp = tempfile::tempdir().unwrap();
    let host = sim(tmp.path());
    let mut run = Run::new(&plugin, "hostile", &EVERY_CAPABILITY).config(&[("attack", "traverse")]);
    run.limits.memory = memory;
    run.stage(&host, stage).await.unwrap_err()
}

#[tokio::test(flavor = "multi_thread")]
async fn memories_count_together_against_one_limit() {
    // Four extra memories of 40 MiB: each under the 128 MiB limit, 160 MiB together.
    let bytes = nodewright_artifacts::crafted::with_extra_memories(
        &nodewright_artifacts::read(nodewright_artifacts::HOSTILE),
        4,
        640,
    );
    let err = crafted_stage(&bytes, RunStage::Apply, 128 << 20).await;
    assert!(
        matches!(err, RunError::MemoryLimit { limit_mib: 128, .. }),
        "{err}"
    );
    assert!(
        err.is_package_fault(),
        "a component failing in its own instantiation is the package's fault"
    );
}

/// More core instances and memories than a store allows: the pool's slots are sized to
/// the store's limits and wasmtime checks a component against them when it is loaded, so
/// the component is refused at load, naming the count and the bound, by an engine of any
/// size (the operator's one-slot engine refuses it before any node would run it), and
/// loads neither from the code cache.
#[test]
fn counts_past_the_store_s_limits_are_refused_at_load() {
    let bytes = nodewright_artifacts::crafted::with_extra_memories(
        &nodewright_artifacts::read(nodewright_artifacts::HOSTILE),
        40,
        1,
    );
    let cache = tempfile::tempdir().unwrap();
    for runs in [1, 4] {
        let engine = nodewright_engine::Engine::new(nodewright_engine::EngineConfig {
            cache_dir: Some(cache.path().to_path_buf()),
            concurrent_runs: std::num::NonZeroU32::new(runs).unwrap(),
            ..Default::default()
        })
        .unwrap();
        for attempt in ["compiled", "again, with a cache"] {
            let err = engine.load(&bytes).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(err, Error::Compile(_))
                    && text.contains("core module instances")
                    && text.contains("maximum of 32"),
                "{runs} slot(s), {attempt}: {text}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_write_budget_stops_a_disk_fill() {
    let mut attack = Attack::new("disk-fill", FILES);
    attack.limits.write_bytes = 8 << 20;
    let (result, tmp) = attack.run(|_| {}).await;
    let d = denial("disk-fill", &result);
    assert!(d.message.contains("write budget of 8388608 bytes is used up; raise spec.packages.hostile.sandbox.writeBytes"), "{}", d.message);
    let written = std::fs::read_dir(tmp.path().join("etc/app"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("fill-")
        })
        .count();
    assert_eq!(written, 8);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_file_budget_stops_a_file_flood() {
    let mut attack = Attack::new("file-flood", FILES);
    attack.limits.write_files = 100;
    let (result, tmp) = attack.run(|_| {}).await;
    let d = denial("file-flood", &result);
    assert!(
        d.message
            .contains("raise spec.packages.hostile.sandbox.writeFiles"),
        "{}",
        d.message
    );
    assert_eq!(
        std::fs::read_dir(tmp.path().join("etc/app"))
            .unwrap()
            .count(),
        101,
        "a.conf and 100 written"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn directories_count_toward_the_file_budget() {
    let mut attack = Attack::new("dir-flood", FILES);
    attack.limits.write_files = 20;
    let (result, tmp) = attack.run(|_| {}).await;
    let d = denial("dir-flood", &result);
    assert!(
        d.message.contains("directories count")
            && d.message
                .contains("raise spec.packages.hostile.sandbox.writeFiles"),
        "{}",
        d.message
    );
    let made = walkdir_count(&tmp.path().join("etc/app"));
    assert!(made <= 20, "{made} directories made under a budget of 20");
}

/// Directories below `dir`, at any depth.
fn walkdir_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| 1 + walkdir_count(&e.path()))
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_below_the_free_space_floor_is_refused() {
    let mut attack = Attack::new("disk-fill", FILES);
    attack.limits.min_free_bytes = u64::MAX / 4;
    let (result, tmp) = attack.run(|_| {}).await;
    let report = result.unwrap();
    assert!(
        matches!(&report.result, Err(StepFailure::HostFailed(m)) if m.contains("free-space floor")),
        "{:?}",
        report.result
    );
    assert!(!tmp.path().join("etc/app/fill-0").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compile_bomb_is_refused_before_compiling() {
    let err = engine()
        .load(&nodewright_artifacts::crafted::many_functions(200_000))
        .unwrap_err();
    assert!(
        matches!(&err, Error::TooLarge(m) if m.contains("more than 60000 functions")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn another_version_of_our_own_interface_is_not_linked() {
    let hostile = nodewright_artifacts::read(nodewright_artifacts::HOSTILE);
    let bytes = nodewright_artifacts::crafted::renamed(
        &hostile,
        "nodewright:plugin/files@0.1.0",
        "nodewright:plugin/files@0.1.1",
    );
    let err = engine().load(&bytes).unwrap_err();
    assert!(
        matches!(&err, Error::WrongWorld(m) if m.contains("nodewright:plugin/files@0.1.1")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_denial_is_the_packages_failure() {
    let (result, _tmp) = Attack::new("forge-denied", FILES).run(|_| {}).await;
    let report = result.unwrap();
    assert!(
        matches!(&report.result, Err(StepFailure::Failed(m)) if m.contains("denied capability error the host never raised")),
        "{:?}",
        report.result
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_host_failure_is_the_packages_failure() {
    let (result, _tmp) = Attack::new("forge-host-failure", FILES).run(|_| {}).await;
    let report = result.unwrap();
    assert!(
        matches!(&report.result, Err(StepFailure::Failed(m)) if m.contains("failed capability error the host never raised")),
        "{:?}",
        report.result
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_denial_passed_on_stays_the_grants() {
    let (result, _tmp) = Attack::new("pass-on-denial", FILES).run(|_| {}).await;
    assert!(
        denial("pass-on-denial", &result)
            .message
            .contains("add \"evil\" to spec.packages.hostile.capabilities.kernelModules")
    );
}
