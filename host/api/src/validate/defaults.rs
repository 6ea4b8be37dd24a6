//! Defaulting, as the webhook applies it before validation.

use crate::v1alpha1::{BatchParams, DeploymentPolicySpec, NodeWrightSpec, Strategy};

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
