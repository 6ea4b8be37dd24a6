//! Does a plugin's set of verified signers satisfy a trust policy, and do a package's
//! grants stay within what those signers may be granted? Pure: the signatures are
//! verified first ([`crate::Verifier`]).
//!
//! A requested grant is within a signer's allowance when:
//! - files: the path is at or below an allowed path whose access is at least the one
//!   asked (`specialModes` only where allowed);
//! - modules, units, sysctl keys: the requested name or pattern equals an allowed one, or
//!   an allowed pattern matches the requested *name* (a name without wildcards), or the
//!   allowed pattern is a plain prefix followed by one `*` and the request starts with
//!   that prefix (`nvidia*` covers `nvidia-uvm*`), or the allowed pattern is `*`;
//! - commands: the path is allowed exactly, or `*` is;
//! - power: the package's interrupt is a reboot and a signer may be granted `power`.
//!
//! Patterns are compared this conservatively on purpose: whether one glob's language
//! contains another's is not a question to answer loosely at a security boundary.

use std::path::Path;

use globset::Glob;
use nodewright_api::grants::{FileAccess, normalize_abs_path};
use nodewright_api::pinned::PinnedRef;
use nodewright_api::trust::{Allowance, PluginTrustPolicySpec, Signer};
use nodewright_api::v1alpha1::{InterruptType, Package};

/// Why a package is not trusted by a policy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Finding {
    /// No trusted signer signed the plugin.
    #[error(
        "package {package}: {plugin} is not signed by a trusted signer ({trusted}); sign it with `nodewright plugin sign` or `cosign sign --key`"
    )]
    Unsigned {
        /// Package.
        package: String,
        /// The pinned plugin.
        plugin: String,
        /// The policy's signers.
        trusted: String,
    },
    /// Signed, but not by whom the policy requires.
    #[error(
        "package {package}: {plugin} is signed by {signed}, and the trust policy requires {required}"
    )]
    Requirement {
        /// Package.
        package: String,
        /// The pinned plugin.
        plugin: String,
        /// Its verified signers.
        signed: String,
        /// What the policy asks.
        required: String,
    },
    /// A grant beyond what the verified signers may be granted.
    #[error(
        "package {package}: grant {grant} is beyond what its signers ({signers}) may be granted"
    )]
    Grant {
        /// Package.
        package: String,
        /// The grant, as written (`kernelModules "nvidia*"`).
        grant: String,
        /// Its verified signers.
        signers: String,
    },
}

impl Finding {
    /// The condition reason for it: `SignatureMissing`, `NotTrusted` or `GrantBeyondSigner`.
    pub fn reason(&self) -> &'static str {
        match self {
            Finding::Unsigned { .. } => "SignatureMissing",
            Finding::Requirement { .. } => "NotTrusted",
            Finding::Grant { .. } => "GrantBeyondSigner",
        }
    }
}

fn has_meta(s: &str) -> bool {
    s.contains(['*', '?', '[', ']', '{', '}'])
}

/// Whether the allowed name pattern `allowed` covers the requested name or pattern `asked`.
pub fn covers(allowed: &str, asked: &str) -> bool {
    if allowed == asked || allowed == "*" {
        return true;
    }
    if !has_meta(asked) && Glob::new(allowed).is_ok_and(|g| g.compile_matcher().is_match(asked)) {
        return true;
    }
    match allowed.strip_suffix('*') {
        Some(prefix) if !has_meta(prefix) => asked.starts_with(prefix),
        _ => false,
    }
}

fn file_covered(a: &Allowance, path: &str, access: FileAccess, special: bool) -> bool {
    let Ok(asked) = normalize_abs_path(path) else {
        return false;
    };
    a.files.iter().any(|f| {
        normalize_abs_path(&f.path).is_ok_and(|base| asked.starts_with(Path::new(&base)))
            && f.access >= access
            && (!special || f.special_modes)
    })
}

/// The grants of `p` that none of `signers` may be granted, as human lines.
pub fn excess_grants(p: &Package, signers: &[&Signer]) -> Vec<String> {
    let allowances: Vec<&Allowance> = signers.iter().map(|s| &s.may_grant).collect();
    let any = |f: &dyn Fn(&Allowance) -> bool| allowances.iter().any(|a| f(a));
    let mut out = Vec::new();
    let caps = &p.capabilities;
    for f in &caps.files {
        if !any(&|a| file_covered(a, &f.path, f.access, f.special_modes)) {
            let access = if f.access == FileAccess::ReadWrite {
                "readWrite"
            } else {
                "read"
            };
            out.push(format!("files {{path: {:?}, access: {access}}}", f.path));
        }
    }
    for (field, asked, pick) in [
        (
            "kernelModules",
            &caps.kernel_modules,
            (|a: &Allowance| &a.kernel_modules) as fn(&Allowance) -> &Vec<String>,
        ),
        ("services", &caps.services, |a| &a.services),
        ("sysctl", &caps.sysctl, |a| &a.sysctl),
    ] {
        for name in asked {
            if !any(&|a| pick(a).iter().any(|allowed| covers(allowed, name))) {
                out.push(format!("{field} {name:?}"));
            }
        }
    }
    for c in &caps.commands {
        if !any(&|a| {
            a.commands
                .iter()
                .any(|allowed| allowed == "*" || *allowed == c.path)
        }) {
            out.push(format!("commands {:?}", c.path));
        }
    }
    // The package's interrupt and its config interrupts are one set of restarts and
    // reboots: each needs what the signer may grant, like a capability.
    // Each with the field a refusal names for its units and for its reboot.
    let interrupts = p
        .interrupt
        .iter()
        .map(|i| ("interrupt", "interrupt.type", i))
        .chain(
            p.config_interrupts
                .values()
                .map(|i| ("configInterrupts", "configInterrupts", i)),
        );
    let mut power = None;
    for (field, reboot_field, i) in interrupts {
        match i.kind {
            InterruptType::Reboot => power = power.or(Some(reboot_field)),
            InterruptType::Service => {
                for unit in &i.services {
                    if !any(&|a| a.services.iter().any(|allowed| covers(allowed, unit))) {
                        out.push(format!("services {unit:?} ({field})"));
                    }
                }
            }
            InterruptType::Noop | InterruptType::RestartAllServices => {}
        }
    }
    if let Some(field) = power
        && !any(&|a| a.power)
    {
        out.push(format!("power ({field}: reboot)"));
    }
    out
}

/// The policy's public keys that do not parse as ECDSA P-256 PEM keys, by field path (the
/// API's own validation only sees their shape).
pub fn key_errors(policy: &PluginTrustPolicySpec) -> Vec<(String, String)> {
    policy
        .signers
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let pem = s.public_key.as_deref()?;
            crate::keys::PublicKey::from_pem(pem)
                .err()
                .map(|e| (format!("spec.signers[{i}].publicKey"), e.to_string()))
        })
        .collect()
}

/// Checks package `name` (plugin `pinned`, verified by `verified`) against `policy`.
pub fn check(
    policy: &PluginTrustPolicySpec,
    name: &str,
    pinned: &PinnedRef,
    p: &Package,
    verified: &[String],
) -> Vec<Finding> {
    let trusted = policy
        .signers
        .iter()
        .map(|s| s.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let signed: Vec<&Signer> = policy
        .signers
        .iter()
        .filter(|s| verified.contains(&s.name))
        .collect();
    if signed.is_empty() {
        return vec![Finding::Unsigned {
            package: name.into(),
            plugin: pinned.to_string(),
            trusted,
        }];
    }
    let names = signed
        .iter()
        .map(|s| s.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    if let Some(r) = &policy.require {
        let missing: Vec<&String> = r.all_of.iter().filter(|n| !verified.contains(n)).collect();
        let any_short = r.any_of.as_ref().filter(|a| {
            (a.signers.iter().filter(|n| verified.contains(n)).count() as u32) < a.minimum
        });
        if !missing.is_empty() || any_short.is_some() {
            let mut required = Vec::new();
            if !r.all_of.is_empty() {
                required.push(format!("all of {}", r.all_of.join(", ")));
            }
            if let Some(a) = &r.any_of {
                required.push(format!("{} of {}", a.minimum, a.signers.join(", ")));
            }
            return vec![Finding::Requirement {
                package: name.into(),
                plugin: pinned.to_string(),
                signed: names,
                required: required.join(" and "),
            }];
        }
    }
    excess_grants(p, &signed)
        .into_iter()
        .map(|grant| Finding::Grant {
            package: name.into(),
            grant,
            signers: names.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin() -> PinnedRef {
        format!("r.example/p@sha256:{}", "d".repeat(64))
            .parse()
            .unwrap()
    }
    use nodewright_api::grants::{Capabilities, CommandGrant, FileGrant};
    use nodewright_api::trust::{AnyOf, Requirement};
    use nodewright_api::v1alpha1::Interrupt;

    fn signer(name: &str, may: Allowance) -> Signer {
        Signer {
            name: name.into(),
            public_key: Some("pem".into()),
            keyless: None,
            may_grant: may,
        }
    }

    fn file(path: &str, rw: bool) -> FileGrant {
        FileGrant {
            path: path.into(),
            access: if rw {
                FileAccess::ReadWrite
            } else {
                FileAccess::Read
            },
            special_modes: false,
        }
    }

    fn policy() -> PluginTrustPolicySpec {
        PluginTrustPolicySpec {
            signers: vec![
                signer(
                    "platform",
                    Allowance {
                        files: vec![file("/etc", true)],
                        kernel_modules: vec!["*".into()],
                        power: true,
                        ..Default::default()
                    },
                ),
                signer(
                    "app",
                    Allowance {
                        files: vec![file("/etc/app", true)],
                        services: vec!["app-*".into()],
                        ..Default::default()
                    },
                ),
            ],
            ..Default::default()
        }
    }

    fn package(caps: Capabilities, reboot: bool) -> Package {
        Package {
            version: "1.0.0".into(),
            plugin: "r/p:1".into(),
            capabilities: caps,
            interrupt: reboot.then(|| Interrupt {
                kind: InterruptType::Reboot,
                services: vec![],
            }),
            ..Default::default()
        }
    }

    #[test]
    fn every_interrupt_needs_what_it_reaches_from_the_signer() {
        let app = policy().signers.remove(1);
        let service = |units: &[&str]| Interrupt {
            kind: InterruptType::Service,
            services: units.iter().map(|u| u.to_string()).collect(),
        };
        let reboot = Interrupt {
            kind: InterruptType::Reboot,
            services: vec![],
        };
        // A config interrupt that reboots needs power, like the package's own.
        let mut p = package(Capabilities::default(), false);
        p.config_interrupts.insert("kernel.*".into(), reboot);
        assert_eq!(
            excess_grants(&p, &[&app]),
            ["power (configInterrupts: reboot)"]
        );
        // Units restarted by an interrupt need the signer's services allowance.
        let mut p = package(Capabilities::default(), false);
        p.interrupt = Some(service(&["app-worker.service", "sshd.service"]));
        p.config_interrupts
            .insert("x".into(), service(&["kubelet.service"]));
        assert_eq!(
            excess_grants(&p, &[&app]),
            [
                "services \"sshd.service\" (interrupt)",
                "services \"kubelet.service\" (configInterrupts)"
            ]
        );
    }

    #[test]
    fn patterns_are_covered_conservatively() {
        assert!(covers("nvidia*", "nvidia_uvm"));
        assert!(covers("nvidia*", "nvidia*"));
        assert!(covers("nvidia*", "nvidia-uvm*"));
        assert!(covers("*", "anything*"));
        assert!(!covers("nvidia*", "*"));
        assert!(
            !covers("a?c", "a*c"),
            "a glob matching the pattern's text is not containment"
        );
        assert!(!covers("app-*", "kubelet.service"));
    }

    #[test]
    fn grants_stay_within_the_signers_allowances() {
        let p = policy();
        let app_only = vec!["app".to_string()];
        let ok = package(
            Capabilities {
                files: vec![file("/etc/app/x.conf", true)],
                services: vec!["app-web.service".into()],
                ..Default::default()
            },
            false,
        );
        assert_eq!(check(&p, "web", &pin(), &ok, &app_only), vec![]);
        let wide = package(
            Capabilities {
                files: vec![file("/etc/shadow", false)],
                kernel_modules: vec!["evil".into()],
                ..Default::default()
            },
            true,
        );
        let grants: Vec<String> = check(&p, "web", &pin(), &wide, &app_only)
            .iter()
            .map(|f| f.to_string())
            .collect();
        assert_eq!(grants.len(), 3, "{grants:?}");
        assert!(
            grants[0].contains("files {path: \"/etc/shadow\", access: read}")
                && grants[0].contains("its signers (app)"),
            "{grants:?}"
        );
        assert!(grants[1].contains("kernelModules \"evil\""));
        assert!(grants[2].contains("power"));
        // The same package, also signed by platform: within.
        assert_eq!(
            check(&p, "web", &pin(), &wide, &["app".into(), "platform".into()]),
            vec![]
        );
        let cmd = package(
            Capabilities {
                commands: vec![CommandGrant {
                    path: "/bin/sh".into(),
                    args: None,
                    read_only: false,
                }],
                ..Default::default()
            },
            false,
        );
        assert!(
            matches!(&check(&p, "x", &pin(), &cmd, &["platform".into()])[0], Finding::Grant { grant, .. } if grant.contains("/bin/sh"))
        );
    }

    #[test]
    fn unsigned_and_requirements() {
        let mut p = policy();
        let pkg = package(Capabilities::default(), false);
        assert!(
            matches!(&check(&p, "x", &pin(), &pkg, &[])[0], Finding::Unsigned { trusted, .. } if trusted == "platform, app")
        );
        p.require = Some(Requirement {
            all_of: vec![],
            any_of: Some(AnyOf {
                signers: vec!["platform".into(), "app".into()],
                minimum: 2,
            }),
        });
        assert!(
            matches!(&check(&p, "x", &pin(), &pkg, &["app".into()])[0], Finding::Requirement { required, .. } if required == "2 of platform, app")
        );
        assert_eq!(
            check(&p, "x", &pin(), &pkg, &["app".into(), "platform".into()]),
            vec![]
        );
        p.require = Some(Requirement {
            all_of: vec!["platform".into()],
            any_of: None,
        });
        assert!(matches!(
            &check(&p, "x", &pin(), &pkg, &["app".into()])[0],
            Finding::Requirement { .. }
        ));
    }
}
