//! The pool of instance slots: a reused slot starts from the component's image, and more
//! runs than slots wait for one instead of failing.

use std::num::NonZeroU32;
use std::sync::Arc;

use nodewright_engine::{Engine, EngineConfig, LogSource, RunReport, RunStage, SandboxLimits};
use nodewright_engine::{PreparedPlugin, StageContext};

use crate::common::{EVERY_CAPABILITY, grants, sim};

/// An engine with one slot, the hostile guest prepared in it (each capability it imports
/// granted; the `remember` attack uses none).
fn one_slot() -> (PreparedPlugin, Arc<nodewright_api::grants::GrantSet>) {
    let engine = Engine::new(EngineConfig {
        concurrent_runs: NonZeroU32::MIN,
        ..Default::default()
    })
    .unwrap();
    let plugin = engine
        .load(&nodewright_artifacts::read(nodewright_artifacts::HOSTILE))
        .unwrap();
    let grants = grants(&EVERY_CAPABILITY, "hostile");
    (engine.prepare(&plugin, &grants).unwrap(), grants)
}

async fn remember(
    prepared: &PreparedPlugin,
    grants: &Arc<nodewright_api::grants::GrantSet>,
    root: &std::path::Path,
) -> RunReport {
    let ctx = StageContext::new("node-1", "hostile", "1.0.0").with_config("attack", "remember");
    prepared
        .run(
            RunStage::Plan,
            ctx,
            sim(root),
            grants.clone(),
            &SandboxLimits::default(),
        )
        .await
        .unwrap()
}

fn runs_before(report: &RunReport) -> String {
    assert!(report.result.is_ok(), "{:?}", report.result);
    report
        .logs
        .iter()
        .find(|l| l.source == LogSource::Plugin && l.message.starts_with("runs before"))
        .map(|l| l.message.clone())
        .unwrap_or_else(|| panic!("no count in {:?}", report.logs))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reused_slot_holds_nothing_from_the_run_before() {
    let (prepared, grants) = one_slot();
    let tmp = tempfile::tempdir().unwrap();
    // One slot: every run after the first reuses the memory the one before wrote to.
    for run in 0..3 {
        let report = remember(&prepared, &grants, tmp.path()).await;
        assert_eq!(runs_before(&report), "runs before this one: 0", "run {run}");
    }
}

/// Four runs at once in a one-slot engine: without the wait, every instance past the
/// pool's one would fail its run (wasmtime refuses an instance past the pool's count).
#[tokio::test(flavor = "multi_thread")]
async fn more_runs_than_slots_wait_for_one() {
    let (prepared, grants) = one_slot();
    let tmp = tempfile::tempdir().unwrap();
    let mut runs = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (prepared, grants, root) = (prepared.clone(), grants.clone(), tmp.path().to_owned());
        runs.spawn(async move { remember(&prepared, &grants, &root).await });
    }
    let reports = runs.join_all().await;
    assert_eq!(reports.len(), 4);
    for report in &reports {
        assert_eq!(runs_before(report), "runs before this one: 0");
    }
}
