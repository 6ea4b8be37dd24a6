//! The rollout benchmark's `preview` scenario: a NodeWrightPreview of three packages on a
//! fresh fleet — one that reboots (its plan decides) and `--packages`-many sysctl ones
//! (their plans are reported only) — from its creation to its report.

use std::time::{Duration, Instant};

use kube::api::{Api, ListParams, PostParams};
use nodewright_api::v1alpha1::{NodeWrightPreview, PreviewPhase};
use nodewright_localcluster::Binaries;
use serde_json::json;

use super::{fleet, packages, rss_kib, scrape};

/// `preview`: prints the wall time to the report, the plan Jobs run, the operator's peak
/// RSS over the preview, the API writes it made (its metric) and the status versions seen, how long the report takes to render
/// as text, and whether anything of the rollout's was written (NodeWrights, node marks).
pub(super) async fn preview(bins: &Binaries, nodes: usize, count: usize) -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let (cluster, op, port) = fleet(bins, work.path(), nodes).await?;
    let mut all = packages(&cluster, true, 1);
    for (name, p) in packages(&cluster, false, count)
        .as_object()
        .expect("packages are an object")
    {
        all[name] = p.clone();
    }
    let api: Api<NodeWrightPreview> = Api::all(cluster.client.clone());
    let preview: NodeWrightPreview = serde_json::from_value(json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWrightPreview",
        "metadata": {"name": "bench"},
        "spec": {"nodewright": "fleet", "spec": {"interruptionBudget": {"percent": 10}, "packages": all}}
    }))?;
    let rss0 = rss_kib(op.pid());
    let writes0 = scrape(port, "nodewright_preview_writes_total").await;
    let started = Instant::now();
    api.create(&PostParams::default(), &preview).await?;
    let (mut peak, mut writes, mut last) = (rss0, 0u32, None);
    let status = loop {
        peak = peak.max(rss_kib(op.pid()));
        let p = api.get("bench").await?;
        let version = p.metadata.resource_version.clone();
        if version != last {
            writes += 1;
            last = version;
        }
        let status = p.status.unwrap_or_default();
        if status.phase == Some(PreviewPhase::Failed) {
            anyhow::bail!("the preview failed: {}", status.message);
        }
        if status.phase == Some(PreviewPhase::Ready) {
            break status;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(7200),
            "no report after 2 h: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let wall = started.elapsed().as_secs_f64();
    let api_writes = scrape(port, "nodewright_preview_writes_total").await - writes0;
    let report = status.report.expect("a ready preview has its report");
    let render = Instant::now();
    let text = report.to_string();
    let render = render.elapsed();
    let written = Api::<nodewright_api::v1alpha1::NodeWright>::all(cluster.client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .len();
    println!(
        "preview {nodes:>5} nodes x {} pkg: report after {wall:.1} s ({} plan Jobs, {} failed; {} groups, {} batches), operator RSS {} -> peak {} MiB, {api_writes} API writes (~{writes} status versions seen), report rendered in {:.3} ms ({} lines); NodeWrights written: {written}",
        count + 1,
        status.plans.wanted,
        status.plans.failed,
        report.groups.len(),
        report.summary.batches,
        rss0 / 1024,
        peak / 1024,
        render.as_secs_f64() * 1e3,
        text.lines().count(),
    );
    drop(op);
    Ok(())
}
