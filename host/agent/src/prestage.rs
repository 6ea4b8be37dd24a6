//! Staging a node's payloads before its cordon: each pinned plugin pulled through the node
//! cache and its payloads fetched and unpacked there, and each image payload's layers
//! applied into its tree, so the stages that run once the node
//! is out of service find them local. Nothing runs; nothing on the host is touched but the
//! cache.

use std::time::Duration;

use nodewright_api::agent::PrestageCall;
use nodewright_api::result::{Blame, StageResult};
use nodewright_api::units::format_bytes;
use nodewright_oci::{Keep, Puller};

use crate::stage::{Refused, pull_fault, puller};

/// What the result names as its package: the node's payloads, not one package's.
const SUBJECT: &str = "payloads";

/// Stages every plugin's payloads; the result says how many bytes are staged and how many
/// of them came from the cache, or what failed (a registry or a full disk: the host's,
/// retried; content that is not what the spec pins: the spec's).
pub async fn prestage(call: &PrestageCall) -> StageResult {
    match staged(call).await {
        Ok(message) => StageResult::failed(None, SUBJECT, Blame::None, message),
        Err((blame, message)) => StageResult::failed(None, SUBJECT, blame, message),
    }
}

async fn staged(call: &PrestageCall) -> Result<String, Refused> {
    let puller = puller(&call.common, &call.pulling)?;
    // First, so what no package refers to any more makes room (and fits a quota).
    let collected = collect(&puller, call);
    let progress = |p| eprintln!("{p:?}");
    let (mut payloads, mut bytes, mut cached) = (0usize, 0u64, 0u64);
    let mut staged = Vec::new();
    for plugin in &call.ask.plugins {
        let pulled = puller
            .pull_pinned(plugin, &progress)
            .await
            .map_err(pull_fault)?;
        for p in puller
            .stage_payloads(plugin, &pulled.payloads, &progress)
            .await
            .map_err(pull_fault)?
        {
            staged.push((plugin.as_str(), p));
        }
    }
    for image in &call.ask.images {
        let p = puller
            .stage_image(image, &progress)
            .await
            .map_err(pull_fault)?;
        staged.push((image.image.as_str(), p));
    }
    for (source, p) in &staged {
        eprintln!(
            "staged {source} payload {} ({}, {}){}",
            p.name,
            p.digest,
            format_bytes(p.size),
            if p.from_cache { " from the cache" } else { "" }
        );
        payloads += 1;
        bytes += p.size;
        if p.from_cache {
            cached += p.size;
        }
    }
    Ok(format!(
        "staged {payloads} payload(s) of {} plugin(s) and {} image(s): {} ({} already in the cache){collected}",
        call.ask.plugins.len(),
        call.ask.images.len(),
        format_bytes(bytes),
        format_bytes(cached)
    ))
}

/// How long what a pull or an unpack just touched is safe from garbage collection, whoever
/// refers to it: another Job on the node may be pulling what this call was not told to keep.
pub const GC_GRACE: Duration = Duration::from_secs(3600);

/// Collects what no package on the node refers to any more — what this call stages and
/// what it was told to keep stay — and says what it freed. A failure is logged, not the
/// prestage's: the payloads are staged either way.
fn collect(puller: &Puller, call: &PrestageCall) -> String {
    let ask = &call.ask;
    let keep = Keep {
        manifests: ask
            .plugins
            .iter()
            .chain(&ask.keep)
            .chain(ask.images.iter().chain(&ask.keep_images).map(|i| &i.image))
            .map(|p| p.digest().to_string())
            .collect(),
        images: ask.images.iter().chain(&ask.keep_images).cloned().collect(),
        grace: GC_GRACE,
    };
    match puller.cache().gc(&keep) {
        Ok(r) if r.removed.is_empty() && r.trees_removed == 0 => String::new(),
        Ok(r) => {
            eprintln!(
                "collected {} blob(s) and manifest(s) and {} payload tree(s) no package on the node refers to: {}",
                r.removed.len(),
                r.trees_removed,
                format_bytes(r.freed)
            );
            format!("; {} freed", format_bytes(r.freed))
        }
        Err(e) => {
            eprintln!("garbage collection of the node cache failed: {e}");
            String::new()
        }
    }
}
