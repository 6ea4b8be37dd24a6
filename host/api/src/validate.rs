//! Validation and defaulting, as pure functions.
//!
//! The admission webhook, `nodewright validate FILE` and the operator all call these.
//! Every error carries the field path at fault, e.g.
//! `spec.packages.driver.capabilities.kernelModules[1]: "nv[idia" is not a valid glob`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::grants::GrantSet;
use crate::units::{parse_duration, parse_quantity};
use crate::v1alpha1::{
    BatchParams, Budget, DeploymentPolicySpec, Interrupt, InterruptType, NodeWrightSpec, Package,
    Strategy,
};

/// A rejected field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path, e.g. `spec.packages.driver.version`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

struct Errors(Vec<FieldError>);

impl Errors {
    fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }
}

/// The compartment name the default compartment uses; reserved.
pub const DEFAULT_COMPARTMENT: &str = "__default__";

/// Maximum NodeWright name length: per-CR annotation keys are `nodewright.io/<what>.<name>`
/// and the name part of an annotation key is at most 63 characters.
pub const MAX_NODEWRIGHT_NAME: usize = 48;

pub(crate) fn is_dns_label(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Package names: `^[a-z][-a-z0-9]{0,41}[a-z]$`, as NodeWright.
pub fn is_package_name(s: &str) -> bool {
    let b = s.as_bytes();
    (2..=43).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// Checks a plugin reference: `registry/repo[:tag]` or `registry/repo@sha256:<64 hex>`.
pub fn check_plugin_reference(r: &str) -> Result<(), String> {
    if r.is_empty() || r.chars().any(char::is_whitespace) {
        return Err("must be an OCI reference like registry.example.com/plugins/name:1.0.0".into());
    }
    let (name, digest) = match r.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (r, None),
    };
    if let Some(d) = digest {
        let ok = d.strip_prefix("sha256:").is_some_and(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if !ok {
            return Err(format!("digest {d:?} must be sha256:<64 lowercase hex>"));
        }
    }
    let Some((registry, path)) = name.split_once('/') else {
        return Err("must name a registry and a repository (registry/repo)".into());
    };
    if !(registry.contains('.') || registry.contains(':') || registry == "localhost") {
        return Err(format!(
            "{registry:?} is not a registry host; references must be fully qualified"
        ));
    }
    let (repo, tag) = match path.rsplit_once(':') {
        Some((repo, tag)) => (repo, Some(tag)),
        None => (path, None),
    };
    if repo.is_empty()
        || !repo.split('/').all(|c| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        })
    {
        return Err(format!(
            "repository {repo:?} must be lowercase path components"
        ));
    }
    if let Some(tag) = tag
        && (tag.is_empty()
            || tag.len() > 128
            || !tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)))
    {
        return Err(format!("tag {tag:?} is not a valid tag"));
    }
    if tag.is_none() && digest.is_none() {
        return Err("must pin a tag or a digest (no implicit :latest)".into());
    }
    Ok(())
}

fn check_selector(errs: &mut Errors, path: &str, sel: &LabelSelector) {
    for (i, expr) in sel.match_expressions.iter().flatten().enumerate() {
        let p = format!("{path}.matchExpressions[{i}]");
        let values = expr.values.as_deref().unwrap_or_default();
        match expr.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => errs.add(
                format!("{p}.values"),
                format!("must be non-empty for {}", expr.operator),
            ),
            "Exists" | "DoesNotExist" if !values.is_empty() => errs.add(
                format!("{p}.values"),
                format!("must be empty for {}", expr.operator),
            ),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errs.add(
                format!("{p}.operator"),
                format!("{other:?} is not In, NotIn, Exists or DoesNotExist"),
            ),
        }
        if expr.key.is_empty() {
            errs.add(format!("{p}.key"), "must not be empty");
        }
    }
    for k in sel.match_labels.iter().flatten().map(|(k, _)| k) {
        if k.is_empty() || k.contains(char::is_whitespace) {
            errs.add(
                format!("{path}.matchLabels"),
                format!("{k:?} is not a label key"),
            );
        }
    }
}

fn check_budget(errs: &mut Errors, path: &str, b: &Budget, min: i32) {
    match (b.percent, b.count) {
        (Some(_), Some(_)) => errs.add(path, "set exactly one of percent and count"),
        (None, None) => errs.add(path, "set one of percent and count"),
        (Some(p), None) if !(min..=100).contains(&p) => errs.add(
            format!("{path}.percent"),
            format!("{p} is outside {min}-100"),
        ),
        (None, Some(c)) if c < min => errs.add(
            format!("{path}.count"),
            format!("{c} must be at least {min}"),
        ),
        _ => {}
    }
}

fn check_interrupt(errs: &mut Errors, path: &str, i: &Interrupt) {
    match i.kind {
        InterruptType::Service if i.services.is_empty() => errs.add(
            format!("{path}.services"),
            "type service needs at least one unit",
        ),
        InterruptType::Service => {
            for (i, unit) in i.services.iter().enumerate() {
                if let Err(reason) = crate::hostargs::unit_name(unit) {
                    errs.add(format!("{path}.services[{i}]"), reason);
                }
            }
        }
        InterruptType::Noop | InterruptType::RestartAllServices | InterruptType::Reboot
            if !i.services.is_empty() =>
        {
            errs.add(format!("{path}.services"), "only allowed with type service")
        }
        InterruptType::Noop | InterruptType::RestartAllServices | InterruptType::Reboot => {}
    }
}

fn check_duration(errs: &mut Errors, path: &str, d: Option<&String>) {
    if let Some(d) = d
        && let Err(e) = parse_duration(d)
    {
        errs.add(path, e);
    }
}

/// Whether a `configInterrupts` key pattern (an exact key, or one `*` glob) matches a
/// config key. Shared by validation and the planner so both read patterns the same way.
pub fn config_key_matches(pattern: &str, key: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == key,
        Some((pre, post)) => {
            key.len() >= pre.len() + post.len()
                && key.starts_with(pre)
                && key.ends_with(post)
                && !post.contains('*')
        }
    }
}

fn check_package(errs: &mut Errors, name: &str, p: &Package, all: &BTreeMap<String, Package>) {
    let base = format!("spec.packages.{name}");
    if !is_package_name(name) {
        errs.add(&base, "package names are 2-43 lowercase letters, digits and dashes, starting and ending with a letter");
    }
    if semver::Version::parse(&p.version).is_err() {
        errs.add(
            format!("{base}.version"),
            format!(
                "{:?} is not a semantic version (MAJOR.MINOR.PATCH)",
                p.version
            ),
        );
    }
    if let Err(e) = check_plugin_reference(&p.plugin) {
        errs.add(format!("{base}.plugin"), e);
    }
    if let Err(grant_errors) = GrantSet::of_package(name, p) {
        for e in grant_errors {
            errs.add(format!("{base}.capabilities.{}", e.field), e.message);
        }
    }
    if let Some(i) = &p.interrupt {
        check_interrupt(errs, &format!("{base}.interrupt"), i);
    }
    for key in p.config_map.keys() {
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            errs.add(
                format!("{base}.configMap"),
                format!("key {key:?} must be letters, digits, '-', '_' or '.'"),
            );
        }
    }
    for (pattern, i) in &p.config_interrupts {
        let path = format!("{base}.configInterrupts.{pattern}");
        if pattern.matches('*').count() > 1 {
            errs.add(&path, "only one '*' is supported in a key glob");
        } else if !p.config_map.keys().any(|k| config_key_matches(pattern, k)) {
            errs.add(&path, "matches no configMap key");
        }
        check_interrupt(errs, &path, i);
    }
    if let Some(r) = &p.resources {
        let path = format!("{base}.resources");
        let cpu = (parse_quantity(&r.cpu_request), parse_quantity(&r.cpu_limit));
        let mem = (
            parse_quantity(&r.memory_request),
            parse_quantity(&r.memory_limit),
        );
        for (field, v) in [
            ("cpuRequest", &cpu.0),
            ("cpuLimit", &cpu.1),
            ("memoryRequest", &mem.0),
            ("memoryLimit", &mem.1),
        ] {
            match v {
                Err(e) => errs.add(format!("{path}.{field}"), e.clone()),
                Ok(q) if *q <= 0.0 => errs.add(format!("{path}.{field}"), "must be positive"),
                Ok(_) => {}
            }
        }
        if let (Ok(req), Ok(lim)) = cpu
            && lim < req
        {
            errs.add(format!("{path}.cpuLimit"), "must be at least cpuRequest");
        }
        if let (Ok(req), Ok(lim)) = mem
            && lim < req
        {
            errs.add(
                format!("{path}.memoryLimit"),
                "must be at least memoryRequest",
            );
        }
    }
    match crate::limits::StageLimits::of(p) {
        Err(errors) => {
            for (field, message) in errors {
                errs.add(format!("{base}.{field}"), message);
            }
        }
        Ok(limits) => {
            if let Some(Ok(lim)) = p
                .resources
                .as_ref()
                .map(|r| parse_quantity(&r.memory_limit))
                && lim > 0.0
                && lim < (limits.memory + crate::limits::AGENT_HEADROOM) as f64
            {
                let need = (limits.memory + crate::limits::AGENT_HEADROOM) >> 20;
                errs.add(
                    format!("{base}.resources.memoryLimit"),
                    format!(
                        "must be at least {need}Mi: the sandbox's memory ({}Mi, sandbox.memory) plus {}Mi for the agent, so the sandbox's memory error comes before the OOM killer",
                        limits.memory >> 20,
                        crate::limits::AGENT_HEADROOM >> 20
                    ),
                );
            }
        }
    }
    check_duration(
        errs,
        &format!("{base}.stageTimeout"),
        p.stage_timeout.as_ref(),
    );
    check_duration(
        errs,
        &format!("{base}.gracefulShutdown"),
        p.graceful_shutdown.as_ref(),
    );
    if let Some(u) = &p.uninstall
        && u.apply
        && !u.enabled
    {
        errs.add(
            format!("{base}.uninstall.apply"),
            "requires uninstall.enabled",
        );
    }
    for (dep, version) in &p.depends_on {
        let path = format!("{base}.dependsOn.{dep}");
        match all.get(dep) {
            _ if dep == name => errs.add(&path, "a package cannot depend on itself"),
            None => errs.add(&path, format!("no package {dep:?} in spec.packages")),
            Some(_) if version.is_empty() => errs.add(&path, "version must not be empty"),
            Some(other) if other.version != *version => errs.add(
                &path,
                format!(
                    "version {version:?} does not match spec.packages.{dep}.version {:?}",
                    other.version
                ),
            ),
            Some(_) => {}
        }
    }
}

/// Finds a dependency cycle, returned as the package names along it.
fn find_cycle(packages: &BTreeMap<String, Package>) -> Option<Vec<String>> {
    fn visit<'a>(
        n: &'a str,
        pk: &'a BTreeMap<String, Package>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(pos) = stack.iter().position(|s| *s == n) {
            let mut cycle: Vec<String> = stack[pos..].iter().map(|s| s.to_string()).collect();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n);
        if let Some(p) = pk.get(n) {
            for dep in p
                .depends_on
                .keys()
                .filter(|d| pk.contains_key(*d) && d.as_str() != n)
            {
                if let Some(c) = visit(dep, pk, stack, done) {
                    return Some(c);
                }
            }
        }
        stack.pop();
        done.insert(n);
        None
    }
    let mut done = BTreeSet::new();
    packages
        .keys()
        .find_map(|k| visit(k, packages, &mut Vec::new(), &mut done))
}

/// Validates a NodeWright named `name`. Empty means valid.
pub fn validate_nodewright(name: &str, spec: &NodeWrightSpec) -> Vec<FieldError> {
    let mut errs = Errors(Vec::new());
    if !is_dns_label(name, MAX_NODEWRIGHT_NAME) {
        errs.add("metadata.name", format!("must be a DNS label of at most {MAX_NODEWRIGHT_NAME} characters (it is part of node annotation keys)"));
    }
    if spec.deployment_policy.is_some() && spec.interruption_budget.is_some() {
        errs.add(
            "spec.deploymentPolicy",
            "set either deploymentPolicy or interruptionBudget, not both",
        );
    }
    if let Some(w) = &spec.maintenance_windows {
        for (field, message) in w.validate() {
            errs.add(format!("spec.maintenanceWindows.{field}"), message);
        }
    }
    if let Some(g) = &spec.health_gates {
        for (field, message) in g.validate() {
            errs.add(format!("spec.healthGates.{field}"), message);
        }
    }
    if spec.cordon_after_barrier
        && spec.pod_non_interrupt_labels.as_ref().is_none_or(|s| {
            s.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
                && s.match_expressions.as_ref().is_none_or(Vec::is_empty)
        })
    {
        errs.add(
            "spec.cordonAfterBarrier",
            "needs podNonInterruptLabels (the pods to wait for)",
        );
    }
    if let Some(p) = &spec.deployment_policy
        && !is_dns_label(p, 253)
    {
        errs.add(
            "spec.deploymentPolicy",
            format!("{p:?} is not a valid object name"),
        );
    }
    if let Some(b) = &spec.interruption_budget {
        check_budget(&mut errs, "spec.interruptionBudget", b, 0);
    }
    if let Some(p) = spec.priority
        && p < 1
    {
        errs.add("spec.priority", "must be at least 1");
    }
    if let Some(s) = &spec.node_selectors {
        check_selector(&mut errs, "spec.nodeSelectors", s);
    }
    if let Some(s) = &spec.pod_non_interrupt_labels {
        check_selector(&mut errs, "spec.podNonInterruptLabels", s);
    }
    if let Some(d) = &spec.drain_config {
        check_duration(&mut errs, "spec.drainConfig.timeout", d.timeout.as_ref());
        check_duration(
            &mut errs,
            "spec.drainConfig.gracePeriod",
            d.grace_period.as_ref(),
        );
    }
    if spec.runtime_required_cordon_after && !spec.runtime_required {
        errs.add(
            "spec.runtimeRequiredCordonAfter",
            "only meaningful with runtimeRequired: true",
        );
    }
    if spec.auto_taint_new_nodes && !spec.runtime_required {
        errs.add(
            "spec.autoTaintNewNodes",
            "only meaningful with runtimeRequired: true",
        );
    }
    for (name, p) in &spec.packages {
        check_package(&mut errs, name, p, &spec.packages);
    }
    if let Some(cycle) = find_cycle(&spec.packages) {
        errs.add(
            format!("spec.packages.{}.dependsOn", cycle[0]),
            format!("dependency cycle: {}", cycle.join(" -> ")),
        );
    }
    errs.0
}

fn check_strategy(errs: &mut Errors, path: &str, s: &Strategy) {
    let set: Vec<(&str, &BatchParams)> = [
        ("fixed", &s.fixed),
        ("linear", &s.linear),
        ("exponential", &s.exponential),
    ]
    .into_iter()
    .filter_map(|(n, p)| p.as_ref().map(|p| (n, p)))
    .collect();
    let [(kind, p)] = set.as_slice() else {
        errs.add(path, "set exactly one of fixed, linear and exponential");
        return;
    };
    let path = format!("{path}.{kind}");
    let mut range = |field: &str, v: Option<i32>, lo: i32, hi: i32| {
        if let Some(v) = v
            && !(lo..=hi).contains(&v)
        {
            errs.add(
                format!("{path}.{field}"),
                if hi == i32::MAX {
                    format!("{v} must be at least {lo}")
                } else {
                    format!("{v} is outside {lo}-{hi}")
                },
            );
        }
    };
    range("initialBatch", p.initial_batch, 1, i32::MAX);
    range("batchThreshold", p.batch_threshold, 1, 100);
    range("failureThreshold", p.failure_threshold, 1, i32::MAX);
    range("safetyLimit", p.safety_limit, 1, 100);
    range("delta", p.delta, 1, i32::MAX);
    range("growthFactor", p.growth_factor, 2, i32::MAX);
    if *kind != "linear" && p.delta.is_some() {
        errs.add(format!("{path}.delta"), "only for linear");
    }
    if *kind != "exponential" && p.growth_factor.is_some() {
        errs.add(format!("{path}.growthFactor"), "only for exponential");
    }
}

/// Validates a DeploymentPolicy named `name`. Empty means valid.
pub fn validate_deployment_policy(name: &str, spec: &DeploymentPolicySpec) -> Vec<FieldError> {
    let mut errs = Errors(Vec::new());
    if !is_dns_label(name, 253) {
        errs.add("metadata.name", "must be a DNS label");
    }
    check_budget(&mut errs, "spec.default.budget", &spec.default.budget, 1);
    if let Some(w) = &spec.maintenance_windows {
        for (field, message) in w.validate() {
            errs.add(format!("spec.maintenanceWindows.{field}"), message);
        }
    }
    match &spec.default.strategy {
        Some(s) => check_strategy(&mut errs, "spec.default.strategy", s),
        None => errs.add("spec.default.strategy", "required"),
    }
    let mut names = BTreeSet::new();
    for (i, c) in spec.compartments.iter().enumerate() {
        let path = format!("spec.compartments[{i}]");
        if c.name == DEFAULT_COMPARTMENT {
            errs.add(
                format!("{path}.name"),
                format!("{DEFAULT_COMPARTMENT} is reserved"),
            );
        } else if !is_dns_label(&c.name, 63) {
            errs.add(
                format!("{path}.name"),
                format!("{:?} must be a DNS label", c.name),
            );
        }
        if !names.insert(c.name.as_str()) {
            errs.add(
                format!("{path}.name"),
                format!("duplicate compartment {:?}", c.name),
            );
        }
        check_selector(&mut errs, &format!("{path}.selector"), &c.selector);
        if c.selector == LabelSelector::default() {
            errs.add(
                format!("{path}.selector"),
                "an empty selector would match every node; use spec.default for that",
            );
        }
        if let Some(j) = spec.compartments[..i]
            .iter()
            .position(|o| o.selector == c.selector)
        {
            errs.add(
                format!("{path}.selector"),
                format!("same selector as spec.compartments[{j}]"),
            );
        }
        check_budget(&mut errs, &format!("{path}.budget"), &c.budget, 1);
        if let Some(s) = &c.strategy {
            check_strategy(&mut errs, &format!("{path}.strategy"), s);
        }
    }
    errs.0
}

/// Applies NodeWright's defaults.
pub fn default_nodewright(spec: &mut NodeWrightSpec) {
    spec.priority
        .get_or_insert(crate::v1alpha1::DEFAULT_PRIORITY);
    spec.sequencing.get_or_insert_default();
}

/// Applies DeploymentPolicy defaults: reset on completion, and each strategy's
/// initialBatch 1, delta 1 (linear), growthFactor 2 (exponential), batchThreshold 100,
/// safetyLimit 50. failureThreshold stays unset (never stop) unless given.
pub fn default_deployment_policy(spec: &mut DeploymentPolicySpec) {
    spec.reset_batch_state_on_completion.get_or_insert(true);
    let fill = |s: &mut Strategy| {
        if let Some(p) = &mut s.fixed {
            fill_common(p);
        }
        if let Some(p) = &mut s.linear {
            fill_common(p);
            p.delta.get_or_insert(1);
        }
        if let Some(p) = &mut s.exponential {
            fill_common(p);
            p.growth_factor.get_or_insert(2);
        }
    };
    if let Some(s) = &mut spec.default.strategy {
        fill(s);
    }
    for c in &mut spec.compartments {
        if let Some(s) = &mut c.strategy {
            fill(s);
        }
    }
}

fn fill_common(p: &mut BatchParams) {
    p.initial_batch.get_or_insert(1);
    p.batch_threshold.get_or_insert(100);
    p.safety_limit.get_or_insert(50);
}

/// Validates one manifest (as JSON): a `NodeWright` or a `DeploymentPolicy` of
/// `nodewright.io/v1alpha1`. Returns `(kind, name)` when valid.
pub fn validate_manifest(doc: &serde_json::Value) -> Result<(String, String), Vec<FieldError>> {
    let err = |path: &str, message: String| {
        vec![FieldError {
            path: path.into(),
            message,
        }]
    };
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default().to_string();
    let name = doc["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if api_version != "nodewright.io/v1alpha1" {
        return Err(err(
            "apiVersion",
            format!("{api_version:?} is not nodewright.io/v1alpha1"),
        ));
    }
    let spec = doc.get("spec").cloned().unwrap_or(serde_json::Value::Null);
    let errors = match kind.as_str() {
        "NodeWright" => match serde_json::from_value::<NodeWrightSpec>(spec) {
            Ok(mut s) => {
                default_nodewright(&mut s);
                validate_nodewright(&name, &s)
            }
            Err(e) => err("spec", e.to_string()),
        },
        "DeploymentPolicy" => match serde_json::from_value::<DeploymentPolicySpec>(spec) {
            Ok(mut s) => {
                default_deployment_policy(&mut s);
                validate_deployment_policy(&name, &s)
            }
            Err(e) => err("spec", e.to_string()),
        },
        "PluginTrustPolicy" => {
            match serde_json::from_value::<crate::trust::PluginTrustPolicySpec>(spec) {
                Ok(s) => crate::trust::validate(&s)
                    .into_iter()
                    .map(|(path, message)| FieldError { path, message })
                    .collect(),
                Err(e) => err("spec", e.to_string()),
            }
        }
        other => err(
            "kind",
            format!("{other:?} is not NodeWright, DeploymentPolicy or PluginTrustPolicy"),
        ),
    };
    if errors.is_empty() {
        Ok((kind, name))
    } else {
        Err(errors)
    }
}

/// The cross-object rule on a NodeWright: `spec.deploymentPolicy` must name a policy that
/// exists (`exists` answers for a name).
pub fn validate_policy_reference(
    spec: &NodeWrightSpec,
    exists: impl Fn(&str) -> bool,
) -> Option<FieldError> {
    let name = spec.deployment_policy.as_deref()?;
    (!exists(name)).then(|| FieldError {
        path: "spec.deploymentPolicy".into(),
        message: format!("DeploymentPolicy {name:?} does not exist; create it first"),
    })
}

/// The rule on deleting a DeploymentPolicy: refused while NodeWrights (`users`) reference it.
pub fn validate_policy_delete(policy: &str, users: &[String]) -> Option<FieldError> {
    (!users.is_empty()).then(|| FieldError {
        path: "metadata.name".into(),
        message: format!(
            "DeploymentPolicy {policy:?} is in use by NodeWright {}; point their spec.deploymentPolicy elsewhere first",
            users.join(", ")
        ),
    })
}

/// What an update may not do, given the package states recorded on nodes
/// (`node name → NodeState`, from the `nodewright.io/state.<cr>` annotations).
///
/// Rules (NodeWright's update-only checks):
/// - removing a package with `uninstall.enabled` is rejected while any node still records
///   it (uninstall it first with `uninstall.apply: true`);
/// - downgrading a package with `uninstall.enabled` is rejected unless the old spec already
///   had `uninstall.apply: true` and no node records it any more;
/// - turning `uninstall.apply` from true to false is allowed with a warning.
///
/// Returns `(errors, warnings)`.
pub fn validate_nodewright_update(
    old: &NodeWrightSpec,
    new: &NodeWrightSpec,
    node_states: &BTreeMap<String, crate::node_state::NodeState>,
) -> (Vec<FieldError>, Vec<String>) {
    let mut errs = Errors(Vec::new());
    let mut warnings = Vec::new();
    let nodes_with = |pkg: &str| -> Vec<&str> {
        node_states
            .iter()
            .filter(|(_, s)| s.values().any(|p| p.name == pkg))
            .map(|(n, _)| n.as_str())
            .collect()
    };
    for (name, before) in &old.packages {
        let enabled = before.uninstall.as_ref().is_some_and(|u| u.enabled);
        let applied = before.uninstall.as_ref().is_some_and(|u| u.apply);
        let path = format!("spec.packages.{name}");
        match new.packages.get(name) {
            None if enabled => {
                let nodes = nodes_with(name);
                if !nodes.is_empty() {
                    errs.add(&path, format!("cannot remove a package with uninstall.enabled while nodes still have it ({}); set uninstall.apply: true first", nodes.join(", ")));
                }
            }
            None => {}
            Some(after) => {
                if let (Ok(a), Ok(b)) = (
                    semver::Version::parse(&before.version),
                    semver::Version::parse(&after.version),
                ) && b < a
                    && enabled
                    && !(applied && nodes_with(name).is_empty())
                {
                    errs.add(format!("{path}.version"), format!("downgrade {a} -> {b} of a package with uninstall.enabled needs it uninstalled everywhere first"));
                }
                if applied && !after.uninstall.as_ref().is_some_and(|u| u.apply) {
                    warnings.push(format!("{path}.uninstall.apply turned off: nodes already uninstalled will install the package again"));
                }
            }
        }
    }
    (errs.0, warnings)
}
