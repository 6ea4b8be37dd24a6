//! A preview on a server-side dry run: `kubectl apply --dry-run=server -f nodewright.yaml`
//! (`nodewright preview --quick`) is answered, when the NodeWright is admissible, with what
//! its rollout would do — as admission warnings, which kubectl prints.
//!
//! The forecast ([`nodewright_planner::forecast`]) runs on the operator's caches with the
//! proposed NodeWright in place of the one of that name (or beside the others, when new):
//! every other NodeWright as its status recorded it, every Job succeeding, each package's
//! plan reporting a change (the planner holds it to the package's own interrupt), the
//! evictions a PodDisruptionBudget refuses now refused. What it cannot see, it says:
//! plugins not resolved by the caches (a changed reference is resolved only when the
//! NodeWright is applied) and the host changes each plan stage would report — a
//! NodeWrightPreview ([`crate::previews`]) runs those plans and shares [`proposed`] and
//! [`succeeds`] with this.

use std::time::{Duration, Instant};

use nodewright_api::agent::RunStage;
use nodewright_api::node_state::Stage;
use nodewright_api::pinned::PinnedRef;
use nodewright_api::result::StageResult;
use nodewright_api::v1alpha1::NodeWrightSpec;
use nodewright_api::v1alpha1::PreviewReport;
use nodewright_planner::forecast::{Assume, forecast, report};
use nodewright_planner::{
    AgentPods, Cr, JobPhase, ObservedJob, PluginCheck, Resolved, Settings, Snapshot, Work,
};

use crate::world::World;

/// Wall time a preview may take inside an admission review (the chart gives the webhook
/// 15 s, which the other checks share).
const BUDGET: Duration = Duration::from_secs(5);

/// Lines of the report as warnings: the summary, then at most this many groups.
const GROUPS: usize = 8;

/// The preview of NodeWright `name` with `spec` (defaulted), as warning lines.
pub fn warnings(
    world: &World,
    settings: &Settings,
    name: &str,
    spec: &NodeWrightSpec,
) -> Vec<String> {
    let (snapshot, unresolved) = proposed(world, settings, name, spec, None);
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let started = Instant::now();
    let enough = || started.elapsed() > BUDGET;
    let outcome = |job: &ObservedJob| succeeds(job, true);
    let assume = Assume {
        outcome: &outcome,
        runs_for: None,
        evicts_for: None,
        pdb_blocked: world.budget_blocked(),
        step_seconds: 2,
        max_passes: 5_000,
        enough: Some(&enough),
    };
    let report = report(&forecast(&snapshot, now, &assume), name, &|_| true);
    lines(name, &report, &unresolved)
}

/// The world's snapshot with NodeWright `name` as `spec` proposes it: in place of the one
/// of that name (a new generation when the spec changed), or beside the others; every
/// other NodeWright as its status recorded it. `resolved`: the proposed plugins as checked
/// (a preview object's); `None`: references pinned as written, a tag stood in for (its
/// package named in the second value).
pub fn proposed(
    world: &World,
    settings: &Settings,
    name: &str,
    spec: &NodeWrightSpec,
    resolved: Option<&Resolved>,
) -> (Snapshot, Vec<String>) {
    let mut snapshot =
        world.snapshot_with(settings, AgentPods::Unknown, crate::convert::cr_as_recorded);
    let (mut proposed, unresolved) = match snapshot.nodewrights.iter().find(|c| c.name == name) {
        Some(current) => edited(current, spec),
        None => created(name, spec),
    };
    if let Some(r) = resolved {
        proposed.plugins = PluginCheck::Ready(r.clone());
    }
    let unresolved = if resolved.is_some() {
        Vec::new()
    } else {
        unresolved
    };
    snapshot.nodewrights.retain(|c| c.name != name);
    snapshot.nodewrights.push(proposed);
    (snapshot, unresolved)
}

/// Longest warning line: the API server keeps 120 characters whole (longer ones may be cut).
const WIDTH: usize = 120;

/// The report as short ASCII lines, kubectl printing each as a warning.
fn lines(name: &str, report: &PreviewReport, unresolved: &[String]) -> Vec<String> {
    let s = &report.summary;
    let mut out = vec![
        format!(
            "nodewright preview of {name}: {} nodes: {}, {} converged, {} blocked",
            s.nodes,
            s.change_text(),
            s.converged,
            s.blocked
        ),
        format!(
            "  {} pods evicted, {} batches{}",
            s.evicted,
            s.batches,
            if report.settled {
                ""
            } else {
                "; stopped before the end (something holds the rollout)"
            }
        ),
    ];
    for g in report.groups.iter().take(GROUPS) {
        let o = &g.outcome;
        let what = if o.stages.is_empty() {
            match o.ends {
                Some(nodewright_api::v1alpha1::Status::Complete) => "converged".to_string(),
                other => format!(
                    "nothing runs ({})",
                    other.map_or("no status", |s| s.as_str())
                ),
            }
        } else {
            let mut parts = Vec::new();
            if o.cordoned {
                parts.push("cordon+drain".to_string());
            }
            parts.extend(o.interrupts.iter().map(|k| k.as_str().to_string()));
            parts.push(format!("{} stages", o.stages.len()));
            let ends = o.ends.map_or("no status", |s| s.as_str());
            format!("{} -> {ends}", parts.join(", "))
        };
        let head = format!("  {} node(s), {what}: ", g.nodes.len());
        out.push(fitted(head, &g.nodes));
    }
    if report.groups.len() > GROUPS {
        out.push(format!(
            "  ... {} more outcomes",
            report.groups.len() - GROUPS
        ));
    }
    if !unresolved.is_empty() {
        out.push(fitted(
            "  plugins resolved only when applied: ".into(),
            unresolved,
        ));
    }
    out.push(
        "  assumed: every package changes, every stage succeeds; host diffs: `nodewright preview -f` (a NodeWrightPreview)"
            .into(),
    );
    out
}

/// `head` and as many of `names` as fit in [`WIDTH`], with a count of the rest.
fn fitted(head: String, names: &[String]) -> String {
    let mut line = head;
    for (i, n) in names.iter().enumerate() {
        let rest = names.len() - i;
        let tail = format!(" (+{rest})");
        if line.len() + n.len() + 2 + tail.len() > WIDTH {
            line.push_str(&tail);
            return line;
        }
        if i > 0 {
            line.push_str(", ");
        }
        line.push_str(n);
    }
    line
}

/// The running NodeWright `current` edited to `spec`: a new generation when the spec
/// changed; a package whose plugin reference is unchanged keeps its pin, others get a
/// stand-in (named in the second value).
fn edited(current: &Cr, spec: &NodeWrightSpec) -> (Cr, Vec<String>) {
    let mut cr = current.clone();
    if cr.spec != *spec {
        cr.generation += 1;
    }
    let pinned = match &current.plugins {
        PluginCheck::Ready(r) => r.pinned.clone(),
        _ => Default::default(),
    };
    let mut unresolved = Vec::new();
    let mut pins = std::collections::BTreeMap::new();
    for (package, p) in &spec.packages {
        let same = current
            .spec
            .packages
            .get(package)
            .is_some_and(|old| old.plugin == p.plugin);
        match pinned.get(package).filter(|_| same) {
            Some(pin) => {
                pins.insert(package.clone(), pin.clone());
            }
            None => {
                pins.insert(
                    package.clone(),
                    stand_in(&p.plugin, package, &mut unresolved),
                );
            }
        }
    }
    cr.plugins = PluginCheck::Ready(pins.into());
    cr.spec = spec.clone();
    (cr, unresolved)
}

/// A NodeWright not created yet.
fn created(name: &str, spec: &NodeWrightSpec) -> (Cr, Vec<String>) {
    let mut unresolved = Vec::new();
    let pins = spec
        .packages
        .iter()
        .map(|(package, p)| {
            (
                package.clone(),
                stand_in(&p.plugin, package, &mut unresolved),
            )
        })
        .collect::<std::collections::BTreeMap<_, _>>();
    let cr = Cr {
        name: name.into(),
        uid: "preview".into(),
        generation: 1,
        spec: spec.clone(),
        plugins: PluginCheck::Ready(pins.into()),
        has_finalizer: true,
        ..Default::default()
    };
    (cr, unresolved)
}

/// `plugin` pinned as written, or — for a tag — a stand-in digest (no Job of a forecast
/// runs), with the package named in `unresolved`.
fn stand_in(plugin: &str, package: &str, unresolved: &mut Vec<String>) -> PinnedRef {
    if let Ok(pin) = plugin.parse::<PinnedRef>() {
        return pin;
    }
    unresolved.push(package.to_string());
    let repo = match plugin.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => plugin,
    };
    format!("{repo}@sha256:{}", "0".repeat(64))
        .parse()
        .unwrap_or_else(|_| {
            format!("preview.invalid/{package}@sha256:{}", "0".repeat(64))
                .parse()
                .expect("a well-formed stand-in")
        })
}

/// The Job succeeds; a plan stage (when `plan_changes`) reports a change needing a reboot,
/// which the planner holds to what the package's spec allows.
pub fn succeeds(job: &ObservedJob, plan_changes: bool) -> JobPhase {
    let plan = plan_changes
        && matches!(
            &job.work,
            Work::Package {
                stage: Stage::Plan,
                ..
            }
        );
    let interrupt = if plan { "reboot" } else { "none" };
    JobPhase::Succeeded(Some(Box::new(StageResult {
        interrupt: interrupt.parse().ok(),
        change_count: 1,
        ..StageResult::passed(RunStage::Plan, "preview", "")
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group's line keeps to the width the API server keeps whole, naming as many nodes
    /// as fit and counting the rest.
    #[test]
    fn a_line_names_what_fits_and_counts_the_rest() {
        let names: Vec<String> = (0..40).map(|i| format!("gpu-node-{i:03}")).collect();
        let line = fitted(
            "  40 node(s), cordon+drain, reboot, 6 stages -> complete: ".into(),
            &names,
        );
        assert!(line.len() <= WIDTH, "{} > {WIDTH}: {line}", line.len());
        assert!(
            line.contains("gpu-node-000, gpu-node-001") && line.ends_with(')'),
            "{line}"
        );
        let shown = line.matches("gpu-node-").count();
        assert!(line.ends_with(&format!(" (+{})", 40 - shown)), "{line}");
        let two = fitted("  2 node(s), converged: ".into(), &names[..2]);
        assert_eq!(two, "  2 node(s), converged: gpu-node-000, gpu-node-001");
    }
}
