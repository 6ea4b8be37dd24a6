//! `NodeWright` specs: packages, their grants, dependencies and sandbox bounds.

use std::collections::{BTreeMap, BTreeSet};

use crate::names::{
    MAX_NODEWRIGHT_NAME, check_plugin_reference, config_key_matches, is_dns_label,
    is_dns_subdomain, is_package_name,
};
use crate::payload::{ImagePayload, PayloadName};
use crate::units::parse_quantity;
use crate::v1alpha1::{NodeWrightSpec, Package};

use super::errors::{Errors, FieldError};
use super::fields::{check_budget, check_duration, check_interrupt, check_selector};

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
    check_payloads(errs, &base, p);
    if let Err(grant_errors) = p.grant_set(name) {
        for e in grant_errors {
            errs.add(format!("{base}.capabilities.{}", e.field), e.message);
        }
    }
    if let Some(i) = &p.interrupt {
        check_interrupt(errs, &format!("{base}.interrupt"), i);
    }
    check_config(errs, &base, p);
    check_resources(errs, &base, p);
    check_limits(errs, &base, p);
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
    check_dependencies(errs, &base, name, p, all);
}

/// `payloads`: names a payload may have, each once; references; paths inside the image.
fn check_payloads(errs: &mut Errors, base: &str, p: &Package) {
    let mut seen = BTreeSet::new();
    for (i, source) in p.payloads.iter().enumerate() {
        let at = format!("{base}.payloads[{i}]");
        if let Err(e) = PayloadName::parse(&source.name) {
            errs.add(format!("{at}.name"), e.to_string());
        } else if !seen.insert(source.name.as_str()) {
            errs.add(
                format!("{at}.name"),
                format!("payload {:?} is named twice", source.name),
            );
        }
        if let Err(e) = check_plugin_reference(&source.image) {
            errs.add(format!("{at}.image"), e);
        }
        if let Some(path) = &source.path
            && ImagePayload::image_path(path).is_none()
        {
            errs.add(
                format!("{at}.path"),
                format!("{path:?} must be an absolute path inside the image, without '..'"),
            );
        }
    }
}

/// `configMap` keys, and the `configInterrupts` globs over them.
fn check_config(errs: &mut Errors, base: &str, p: &Package) {
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
}

/// `resources`: positive quantities, limits at least their requests.
fn check_resources(errs: &mut Errors, base: &str, p: &Package) {
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
}

/// `sandbox` bounds, and a memory limit that leaves the sandbox's own error the first to come.
fn check_limits(errs: &mut Errors, base: &str, p: &Package) {
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
}

/// `dependsOn`: packages of this spec, at their versions, never the package itself.
fn check_dependencies(
    errs: &mut Errors,
    base: &str,
    name: &str,
    p: &Package,
    all: &BTreeMap<String, Package>,
) {
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
// Long on purpose: each top-level field's rule in spec order, so a field's check is found
// where the field is.
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
    if let Some(s) = &spec.image_pull_secret
        && !is_dns_subdomain(s)
    {
        errs.add(
            "spec.imagePullSecret",
            format!("{s:?} is not a valid Secret name"),
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
