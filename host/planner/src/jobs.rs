//! Agent Job requests: deterministic names (creating the same work twice is an
//! `AlreadyExists`, never a second Job), deadlines and tolerations.

use std::time::Duration;

use k8s_openapi::api::core::v1::Toleration;
use nodewright_api::agent::{InterruptAsk, PrestageAsk, RunStage, StageAsk};
use nodewright_api::keys;
use nodewright_api::limits::StageLimits;
use nodewright_api::node_state::PackageStatus;
use nodewright_api::pinned::PinnedRef;
use nodewright_api::units::{duration, parse_duration};
use nodewright_api::v1alpha1::{Interrupt, InterruptType, Package};
use sha2::{Digest, Sha256};

use crate::action::{Ask, JobRequest};
use crate::prestage::PayloadSet;
use crate::snapshot::{Cr, ObservedNode, Work};
use crate::work::Env;

/// `nw-<readable prefix>-<10 hex of the full key>`, at most 63 characters, a DNS label.
/// Package Jobs are keyed by (CR, package, version, stage, node); interrupt Jobs by
/// (CR, stage, type, node) — one merged interrupt per node, whoever owns it; prestage Jobs
/// by (CR, node).
pub fn job_name(cr: &str, node: &str, work: &Work) -> String {
    let key = match work {
        Work::Package {
            package,
            version,
            stage,
        } => format!("{cr}\0{package}\0{version}\0{}\0{node}", stage.as_str()),
        Work::Interrupt { stage, kind, .. } => {
            format!("{cr}\0{}\0{}\0{node}", stage.as_str(), kind.as_str())
        }
        Work::Prestage { .. } => format!("{cr}\0prestage\0{node}"),
    };
    let hash = Sha256::digest(key.as_bytes());
    let hex: String = hash.iter().take(5).map(|b| format!("{b:02x}")).collect();
    let what = match work {
        Work::Package { package, stage, .. } => format!("{package}-{}", stage.as_str()),
        Work::Interrupt { stage, .. } => stage.as_str().to_string(),
        Work::Prestage { .. } => "prestage".into(),
    };
    let readable: String = format!("{cr}-{what}-{node}")
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let prefix: String = readable.chars().take(63 - 3 - 1 - hex.len()).collect();
    format!("nw-{}-{hex}", prefix.trim_end_matches('-'))
}

fn tolerations(cr: &Cr) -> Vec<Toleration> {
    let exists = |key: &str, effect: Option<&str>| Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: effect.map(String::from),
        ..Default::default()
    };
    let mut t = vec![
        exists("node.kubernetes.io/unschedulable", Some("NoSchedule")),
        exists(keys::RUNTIME_REQUIRED_TAINT_KEY, None),
        exists("node.kubernetes.io/not-ready", Some("NoExecute")),
        exists("node.kubernetes.io/unreachable", Some("NoExecute")),
    ];
    t.extend(cr.spec.additional_tolerations.iter().cloned());
    t
}

/// The package's stage timeout, else the operator's (`0s`: none).
fn deadline(env: &Env<'_>, p: Option<&Package>) -> Option<Duration> {
    let seconds = p
        .and_then(|p| p.stage_timeout.as_deref())
        .and_then(|t| parse_duration(t).ok())
        .map(|s| s as u64)
        .unwrap_or(env.settings.stage_timeout);
    (seconds > 0).then(|| Duration::from_secs(seconds))
}

/// Restarts a reboot's Job may have: the reboot restarts its pod in place, and the whole
/// interrupt is bounded by its deadline rather than by a count. Service restarts involve no
/// reboot and are retried like a stage (the operator's `backoffLimit`).
const REBOOT_RESTARTS: i32 = 6;

/// The request for one package stage on one node, running `plugin`.
pub(crate) fn package_job(
    env: &Env<'_>,
    cr: &Cr,
    node: &ObservedNode,
    stage: RunStage,
    p: &Package,
    plugin: &PinnedRef,
    e: &PackageStatus,
) -> JobRequest {
    let name = &e.name;
    let deadline = deadline(env, Some(p));
    let mut call = StageAsk::new(stage, name, &p.version, plugin.clone());
    call.payload_images = env.images.get(name).cloned().unwrap_or_default();
    call.capabilities = p.capabilities.clone();
    call.reboot_allowed = p.grants_power();
    call.config = p.config_map.clone();
    call.changed_keys = e.changed_keys.clone();
    call.previous_version = e.previous_version.clone();
    call.node_order = env.orders[node];
    if let Some(d) = deadline {
        call.timeout = d;
    }
    // Checked against the operator's ceilings before the CR's plugins were ready; a
    // package whose bounds do not parse never gets here.
    call.limits = StageLimits::of(p).unwrap_or_default();
    if let Some(g) = p
        .graceful_shutdown
        .as_deref()
        .and_then(|g| duration(g).ok())
    {
        call.graceful_shutdown = g;
    }
    let ask = Ask::Stage {
        call,
        resources: p.resources.clone(),
    };
    let backoff = env.settings.backoff_limit;
    request(cr, &node.name, e.run, deadline, backoff, ask)
}

/// The request for a node's merged (or a package's uninstall) interrupt, owned by `owner`.
pub(crate) fn interrupt_job(
    env: &Env<'_>,
    cr: &Cr,
    node: &str,
    uninstall: bool,
    owner: &str,
    interrupt: &Interrupt,
    run: i64,
) -> JobRequest {
    let services = match interrupt.kind {
        InterruptType::RestartAllServices => env.settings.restart_all_services.clone(),
        _ => interrupt.services.clone(),
    };
    let call = InterruptAsk {
        kind: interrupt.kind,
        package: owner.into(),
        services,
    };
    let ask = Ask::Interrupt { uninstall, call };
    let deadline = deadline(env, cr.spec.packages.get(owner));
    let backoff = match interrupt.kind {
        InterruptType::Reboot => REBOOT_RESTARTS,
        _ => env.settings.backoff_limit,
    };
    request(cr, node, run, deadline, backoff, ask)
}

/// The request for staging the payload set `set` on `node`, under the operator's stage
/// timeout and retry budget.
pub(crate) fn prestage_job(
    env: &Env<'_>,
    cr: &Cr,
    node: &ObservedNode,
    set: &PayloadSet,
) -> JobRequest {
    let (keep, keep_images) = crate::prestage::kept_beside(env, set, node);
    let ask = Ask::Prestage {
        set: set.fingerprint.clone(),
        call: PrestageAsk {
            plugins: set.plugins.clone(),
            images: set.images.clone(),
            keep,
            keep_images,
        },
    };
    let deadline = deadline(env, None);
    request(cr, &node.name, 0, deadline, env.settings.backoff_limit, ask)
}

/// The request for `ask` on `node`, named after the work it is.
fn request(
    cr: &Cr,
    node: &str,
    run: i64,
    deadline: Option<Duration>,
    backoff_limit: i32,
    ask: Ask,
) -> JobRequest {
    let mut req = JobRequest {
        name: String::new(),
        cr: cr.name.clone(),
        cr_uid: cr.uid.clone(),
        generation: cr.generation,
        run,
        node: node.into(),
        deadline,
        backoff_limit,
        tolerations: tolerations(cr),
        image_pull_secret: cr.spec.image_pull_secret.clone(),
        ask,
    };
    req.name = job_name(&cr.name, node, &req.work());
    req
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_works_share_a_job_name_exactly_when_they_are_the_same_job() {
        let pkg = |p: &str, v: &str, s| Work::Package {
            package: p.into(),
            version: v.into(),
            stage: s,
        };
        let int = |s, k, o: &str| Work::Interrupt {
            stage: s,
            kind: k,
            owner: o.into(),
        };
        use nodewright_api::v1alpha1::InterruptType::{Reboot, Service};
        let works = [
            pkg("a", "1.0.0", Stage::Apply),
            pkg("a", "1.0.0", Stage::Config),
            pkg("a", "1.0.1", Stage::Apply),
            pkg("b", "1.0.0", Stage::Apply),
            int(Stage::Interrupt, Reboot, "a"),
            int(Stage::Interrupt, Reboot, "b"),
            int(Stage::Interrupt, Service, "a"),
            int(Stage::UninstallInterrupt, Reboot, "a"),
            Work::Prestage { set: "1".into() },
            Work::Prestage { set: "2".into() },
        ];
        for x in &works {
            for y in &works {
                assert_eq!(
                    job_name("cr", "n1", x) == job_name("cr", "n1", y),
                    x.same_job(y),
                    "{x:?} vs {y:?}"
                );
            }
        }
    }
    use nodewright_api::node_state::Stage;

    #[test]
    fn names_are_deterministic_bounded_dns_labels() {
        let w = Work::Package {
            package: "driver".into(),
            version: "1.0.0".into(),
            stage: Stage::Apply,
        };
        let a = job_name("gpu", "node-1", &w);
        assert_eq!(a, job_name("gpu", "node-1", &w));
        assert!(a.starts_with("nw-gpu-driver-apply-node-1-"), "{a}");
        let long = job_name(&"c".repeat(60), &"n".repeat(250), &w);
        assert!(
            long.len() <= 63
                && long
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{long}"
        );
        let other_node = job_name(&"c".repeat(60), &format!("{}x", "n".repeat(249)), &w);
        assert_ne!(long, other_node, "truncated names still differ by the hash");
        let i1 = job_name(
            "gpu",
            "n",
            &Work::Interrupt {
                stage: Stage::Interrupt,
                kind: InterruptType::Reboot,
                owner: "a".into(),
            },
        );
        let i2 = job_name(
            "gpu",
            "n",
            &Work::Interrupt {
                stage: Stage::Interrupt,
                kind: InterruptType::Reboot,
                owner: "b".into(),
            },
        );
        assert_eq!(i1, i2, "one merged interrupt per node, whoever owns it");
    }
}
