//! Which interrupt a package needs, and how a node's interrupts coalesce into one.

use std::collections::BTreeMap;

use nodewright_api::v1alpha1::{Interrupt, InterruptType, Package};
use nodewright_api::validate::config_key_matches;

/// Rank for coalescing: reboot > restartAllServices > service > noop.
pub fn rank(kind: InterruptType) -> u8 {
    match kind {
        InterruptType::Reboot => 3,
        InterruptType::RestartAllServices => 2,
        InterruptType::Service => 1,
        InterruptType::Noop => 0,
    }
}

/// The interrupts in scope for `package`. When config keys changed, only the
/// `configInterrupts` matching a changed key count (a config-only edit of a key without one
/// does not interrupt, even if the package declares an interrupt); otherwise the package's
/// own interrupt. Deduplicated, in a stable order.
pub fn in_scope(package: &Package, changed_keys: &[String]) -> Vec<Interrupt> {
    let mut found: Vec<Interrupt> = Vec::new();
    if changed_keys.is_empty() {
        found.extend(package.interrupt.clone());
    } else {
        for (pattern, interrupt) in &package.config_interrupts {
            if changed_keys.iter().any(|k| config_key_matches(pattern, k))
                && !found.contains(interrupt)
            {
                found.push(interrupt.clone());
            }
        }
    }
    found
}

/// The node's merged interrupt and the package that owns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Merged {
    /// The interrupt to perform.
    pub interrupt: Interrupt,
    /// The first package by name with the top rank; the others are `skipped`, then promoted
    /// to complete when the owner's interrupt completes.
    pub owner: String,
}

/// Coalesces the interrupts of the runnable packages on a node (keyed by package name).
/// Service lists merge (sorted, deduplicated); the strongest kind wins.
pub fn coalesce(candidates: &BTreeMap<String, Vec<Interrupt>>) -> Option<Merged> {
    let mut best: Option<Merged> = None;
    for (package, interrupts) in candidates {
        for i in interrupts {
            match &mut best {
                None => {
                    best = Some(Merged {
                        interrupt: i.clone(),
                        owner: package.clone(),
                    })
                }
                Some(m) if rank(i.kind) > rank(m.interrupt.kind) => {
                    *m = Merged {
                        interrupt: i.clone(),
                        owner: package.clone(),
                    };
                }
                Some(m)
                    if i.kind == InterruptType::Service
                        && m.interrupt.kind == InterruptType::Service =>
                {
                    m.interrupt.services.extend(i.services.iter().cloned());
                }
                Some(_) => {}
            }
        }
    }
    if let Some(m) = &mut best {
        m.interrupt.services.sort();
        m.interrupt.services.dedup();
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i(kind: InterruptType, services: &[&str]) -> Interrupt {
        Interrupt {
            kind,
            services: services.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn node(entries: &[(&str, Interrupt)]) -> BTreeMap<String, Vec<Interrupt>> {
        entries
            .iter()
            .map(|(n, i)| (n.to_string(), vec![i.clone()]))
            .collect()
    }

    #[test]
    fn reboot_wins_and_is_owned_by_the_first_rebooting_package_by_name() {
        let m = coalesce(&node(&[
            ("alpha", i(InterruptType::Service, &["a.service"])),
            ("driver", i(InterruptType::Reboot, &[])),
            ("zeta", i(InterruptType::Reboot, &[])),
        ]))
        .unwrap();
        assert_eq!(
            m,
            Merged {
                interrupt: i(InterruptType::Reboot, &[]),
                owner: "driver".into()
            }
        );
    }

    #[test]
    fn services_merge_sorted_under_the_first_package() {
        let m = coalesce(&node(&[
            (
                "b-pkg",
                i(InterruptType::Service, &["z.service", "a.service"]),
            ),
            (
                "c-pkg",
                i(InterruptType::Service, &["a.service", "m.service"]),
            ),
        ]))
        .unwrap();
        assert_eq!(m.owner, "b-pkg");
        assert_eq!(
            m.interrupt.services,
            ["a.service", "m.service", "z.service"]
        );
    }

    #[test]
    fn restart_all_beats_services_and_noop_loses_to_everything() {
        let m = coalesce(&node(&[
            ("a", i(InterruptType::Noop, &[])),
            ("b", i(InterruptType::Service, &["x.service"])),
            ("c", i(InterruptType::RestartAllServices, &[])),
        ]))
        .unwrap();
        assert_eq!(
            (m.interrupt.kind, m.owner.as_str()),
            (InterruptType::RestartAllServices, "c")
        );
        assert_eq!(coalesce(&BTreeMap::new()), None);
    }

    #[test]
    fn config_changes_interrupt_only_through_matching_config_interrupts() {
        let package: Package = serde_json::from_value(serde_json::json!({
            "version": "1.0.0", "plugin": "r.example/p:1",
            "interrupt": {"type": "reboot"},
            "configMap": {"mode": "a", "limits.cpu": "1", "motd": "x"},
            "configInterrupts": {"mode": {"type": "reboot"}, "limits.*": {"type": "service", "services": ["containerd.service"]}}
        }))
        .unwrap();
        assert_eq!(
            in_scope(&package, &[]),
            [i(InterruptType::Reboot, &[])],
            "install: the package interrupt"
        );
        assert_eq!(
            in_scope(&package, &["motd".into()]),
            Vec::<Interrupt>::new(),
            "an unmatched key does not interrupt"
        );
        assert_eq!(
            in_scope(&package, &["limits.cpu".into()]),
            [i(InterruptType::Service, &["containerd.service"])]
        );
        assert_eq!(
            in_scope(&package, &["limits.cpu".into(), "mode".into()]).len(),
            2
        );
    }
}
