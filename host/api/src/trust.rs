//! `PluginTrustPolicy`: who may sign plugins, and what a plugin each of them signed may be
//! granted.
//!
//! Cluster-scoped; every policy that is not `off` applies to every NodeWright (a plugin must
//! satisfy each). With none, nothing is verified (a fresh install). A signer is a public key
//! (cosign's `cosign.pub`) — a keyless identity (OIDC issuer and subject, checked against an
//! offline Sigstore trust root) has its place in the type but is refused until it is
//! verified — with `mayGrant`: the most a NodeWright may grant a plugin that signer signed.
//! A grant is within what a plugin's verified signers may be granted when one of them
//! allows it (see `nodewright-trust`).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::grants::FileGrant;

/// Trusted signers and what they may be granted.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "nodewright.io",
    version = "v1alpha1",
    kind = "PluginTrustPolicy",
    plural = "plugintrustpolicies",
    shortname = "ptp"
)]
#[kube(printcolumn = r#"{"name": "Mode", "type": "string", "jsonPath": ".spec.mode"}"#)]
#[kube(
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginTrustPolicySpec {
    /// `enforce` (default): refuse what fails; `warn`: admit with a warning and a
    /// condition; `off`: not checked.
    #[serde(default)]
    pub mode: TrustMode,
    /// The trusted signers.
    pub signers: Vec<Signer>,
    /// Which signatures a plugin needs. Default: at least one of `signers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require: Option<Requirement>,
}

/// What a failed check does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TrustMode {
    /// Refuse at admission; the operator does not roll out.
    #[default]
    Enforce,
    /// Admit with a warning; the operator rolls out and reports the finding.
    Warn,
    /// Not checked.
    Off,
}

/// One trusted signer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Signer {
    /// Its name in findings and status (`platform-team`).
    pub name: String,
    /// A PEM ECDSA P-256 public key (`cosign.pub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// A keyless (Fulcio) identity. Not verified yet: a policy naming one is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyless: Option<KeylessIdentity>,
    /// The most a NodeWright may grant a plugin this signer signed.
    #[serde(default)]
    pub may_grant: Allowance,
}

/// A keyless signing identity.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeylessIdentity {
    /// OIDC issuer URL.
    pub issuer: String,
    /// Certificate subject (an email or a workflow URI).
    pub subject: String,
}

/// What a signer's plugins may be granted, in the shape of `capabilities`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Allowance {
    /// Paths (and below) with the most access a grant may ask there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileGrant>,
    /// Module names or patterns; `nvidia*` allows `nvidia_uvm` and `nvidia*` itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel_modules: Vec<String>,
    /// Unit names or patterns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<String>,
    /// sysctl keys or patterns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sysctl: Vec<String>,
    /// Command paths (exact), or `*` for any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
    /// Reboots (`interrupt.type: reboot`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub power: bool,
}

/// Which verified signers a plugin needs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Requirement {
    /// Every one of these signers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub all_of: Vec<String>,
    /// At least `minimum` of these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub any_of: Option<AnyOf>,
}

/// `minimum` of `signers`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnyOf {
    /// Signer names.
    pub signers: Vec<String>,
    /// How many of them (default 1).
    #[serde(default = "one")]
    pub minimum: u32,
}

fn one() -> u32 {
    1
}

/// Problems with a trust policy, each with its field path.
pub fn validate(spec: &PluginTrustPolicySpec) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    if spec.signers.is_empty() && spec.mode != TrustMode::Off {
        errs.push(("spec.signers".into(), "needs at least one signer".into()));
    }
    for (i, s) in spec.signers.iter().enumerate() {
        let path = format!("spec.signers[{i}]");
        if s.name.is_empty() {
            errs.push((format!("{path}.name"), "must not be empty".into()));
        } else if names.contains(&s.name.as_str()) {
            errs.push((
                format!("{path}.name"),
                format!("{:?} is named twice", s.name),
            ));
        }
        names.push(&s.name);
        match (&s.public_key, &s.keyless) {
            (Some(pem), None) if pem.contains("-----BEGIN PUBLIC KEY-----") => {}
            (Some(_), None) => errs.push((
                format!("{path}.publicKey"),
                "must be a PEM public key (-----BEGIN PUBLIC KEY-----), as in cosign.pub".into(),
            )),
            (None, Some(_)) => errs.push((
                format!("{path}.keyless"),
                "keyless identities are not verified yet: use publicKey".into(),
            )),
            (Some(_), Some(_)) => {
                errs.push((path.clone(), "set publicKey or keyless, not both".into()))
            }
            (None, None) => errs.push((
                format!("{path}.publicKey"),
                "a signer needs a publicKey".into(),
            )),
        }
        for (j, f) in s.may_grant.files.iter().enumerate() {
            if let Err(e) = crate::grants::normalize_abs_path(&f.path) {
                errs.push((format!("{path}.mayGrant.files[{j}].path"), e));
            }
        }
    }
    if let Some(r) = &spec.require {
        for (i, n) in r.all_of.iter().enumerate() {
            if !names.contains(&n.as_str()) {
                errs.push((
                    format!("spec.require.allOf[{i}]"),
                    format!("{n:?} is not one of the signers"),
                ));
            }
        }
        if let Some(any) = &r.any_of {
            for (i, n) in any.signers.iter().enumerate() {
                if !names.contains(&n.as_str()) {
                    errs.push((
                        format!("spec.require.anyOf.signers[{i}]"),
                        format!("{n:?} is not one of the signers"),
                    ));
                }
            }
            if any.minimum == 0 || any.minimum as usize > any.signers.len() {
                errs.push((
                    "spec.require.anyOf.minimum".into(),
                    format!("must be between 1 and {}", any.signers.len()),
                ));
            }
        }
    }
    errs
}

/// The RBAC resource a user needs verb [`GRANT_VERB`] on to grant a capability:
/// `capabilities.nodewright.io`, with the capability's name as the resource name.
pub const GRANT_RESOURCE: &str = "capabilities";
/// The verb.
pub const GRANT_VERB: &str = "grant";

/// The capabilities package `p` grants, by their RBAC names (`files`, `kmod`, `services`,
/// `sysctl`, `exec`, `power`), each with the field that grants it. A service-restart
/// interrupt counts as `services`, a reboot as `power`: the package's own interrupt and
/// every `configInterrupts` entry alike.
pub fn granted_capabilities(p: &crate::v1alpha1::Package) -> Vec<(&'static str, &'static str)> {
    use crate::v1alpha1::InterruptType;
    let caps = &p.capabilities;
    let interrupt = p.interrupt.as_ref().map(|i| i.kind);
    // A config interrupt ends in the same restart or reboot as the package's own: it needs
    // the same capability, from the user and from the signer.
    let config = |kind: InterruptType| p.config_interrupts.values().any(|i| i.kind == kind);
    let mut out = Vec::new();
    let mut add = |on: bool, name, field| {
        if on {
            out.push((name, field));
        }
    };
    add(!caps.files.is_empty(), "files", "capabilities.files");
    add(
        !caps.kernel_modules.is_empty(),
        "kmod",
        "capabilities.kernelModules",
    );
    add(
        !caps.services.is_empty(),
        "services",
        "capabilities.services",
    );
    add(
        matches!(
            interrupt,
            Some(InterruptType::Service | InterruptType::RestartAllServices)
        ) && caps.services.is_empty(),
        "services",
        "interrupt.type",
    );
    add(
        (config(InterruptType::Service) || config(InterruptType::RestartAllServices))
            && caps.services.is_empty()
            && !matches!(
                interrupt,
                Some(InterruptType::Service | InterruptType::RestartAllServices)
            ),
        "services",
        "configInterrupts",
    );
    add(!caps.sysctl.is_empty(), "sysctl", "capabilities.sysctl");
    add(!caps.commands.is_empty(), "exec", "capabilities.commands");
    add(p.grants_power(), "power", "interrupt.type: reboot");
    add(
        config(InterruptType::Reboot) && !p.grants_power(),
        "power",
        "configInterrupts: reboot",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1alpha1::{Interrupt, InterruptType, Package};

    fn with(interrupt: Option<InterruptType>, config: &[InterruptType]) -> Package {
        let i = |kind| Interrupt {
            kind,
            services: vec![],
        };
        Package {
            interrupt: interrupt.map(i),
            config_interrupts: config
                .iter()
                .enumerate()
                .map(|(n, k)| (format!("k{n}"), i(*k)))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_config_interrupt_asks_for_what_it_reaches() {
        assert_eq!(
            granted_capabilities(&with(None, &[InterruptType::Reboot])),
            [("power", "configInterrupts: reboot")]
        );
        assert_eq!(
            granted_capabilities(&with(None, &[InterruptType::Service])),
            [("services", "configInterrupts")]
        );
        // Asked once, whichever field asks first.
        assert_eq!(
            granted_capabilities(&with(
                Some(InterruptType::Reboot),
                &[InterruptType::Reboot, InterruptType::Noop]
            )),
            [("power", "interrupt.type: reboot")]
        );
        assert_eq!(
            granted_capabilities(&with(None, &[InterruptType::Noop])),
            []
        );
    }
}
