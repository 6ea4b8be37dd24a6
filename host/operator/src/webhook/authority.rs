//! Who may grant what: a NodeWright that grants a capability needs its author to be allowed
//! verb `grant` on `capabilities.nodewright.io` with the capability's name, asked of the
//! apiserver with a SubjectAccessReview for the request's user.
//!
//! What is asked: every capability of every package that is new or changed (its plugin,
//! version, config, grants, anything) — a changed plugin or config under an old grant is a
//! new use of it. When anything else in the spec changes (which nodes, which policy), every
//! package's capabilities are asked, since the grants then reach other nodes. An update
//! that only removes packages, or touches only metadata, asks nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use nodewright_api::keys;
use nodewright_api::trust::{GRANT_RESOURCE, GRANT_VERB, granted_capabilities};
use nodewright_api::v1alpha1::NodeWrightSpec;
use nodewright_api::validate::FieldError;

/// `capability → [(package, field)]` the author of `new` (replacing `old`) must be allowed
/// to grant.
pub fn to_authorize(
    old: Option<&NodeWrightSpec>,
    new: &NodeWrightSpec,
) -> BTreeMap<&'static str, Vec<(String, &'static str)>> {
    let outside_changed = old.is_none_or(|old| {
        let strip = |s: &NodeWrightSpec| NodeWrightSpec {
            packages: BTreeMap::new(),
            ..s.clone()
        };
        strip(old) != strip(new)
    });
    let mut out: BTreeMap<&'static str, Vec<(String, &'static str)>> = BTreeMap::new();
    for (name, p) in &new.packages {
        let unchanged = !outside_changed && old.and_then(|o| o.packages.get(name)) == Some(p);
        if unchanged {
            continue;
        }
        for (capability, field) in granted_capabilities(p) {
            out.entry(capability)
                .or_default()
                .push((name.clone(), field));
        }
    }
    out
}

/// Asks the apiserver whether `user` may grant each capability `needed`; a refusal per
/// capability names the packages and the RBAC rule to add.
pub async fn check(
    client: &Client,
    user: &UserInfo,
    needed: &BTreeMap<&'static str, Vec<(String, &'static str)>>,
) -> Result<Vec<FieldError>, String> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let who = user.username.as_deref().unwrap_or("(unknown user)");
    let mut errors = Vec::new();
    for (capability, uses) in needed {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(keys::GROUP.into()),
                    resource: Some(GRANT_RESOURCE.into()),
                    verb: Some(GRANT_VERB.into()),
                    name: Some((*capability).into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("asking whether {who} may grant {capability}: {e}"))?;
        let status = answer.status.unwrap_or_default();
        if status.allowed {
            continue;
        }
        let (first, field) = &uses[0];
        let packages = uses
            .iter()
            .map(|(p, f)| format!("{p} ({f})"))
            .collect::<Vec<_>>()
            .join(", ");
        errors.push(FieldError {
            path: format!("spec.packages.{first}.{field}"),
            message: format!(
                "user {who:?} may not grant {capability:?} (asked by {packages}): it needs RBAC verb {GRANT_VERB:?} on resource {GRANT_RESOURCE:?} in group {:?} with resourceName {capability:?} (the chart's ClusterRole nodewright-grant-all allows every capability)",
                keys::GROUP
            ),
        });
    }
    Ok(errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use nodewright_api::grants::{Capabilities, FileAccess, FileGrant};
    use nodewright_api::v1alpha1::{Interrupt, InterruptType, Package};

    fn package(files: bool, reboot: bool) -> Package {
        Package {
            version: "1.0.0".into(),
            plugin: "r/p:1".into(),
            capabilities: Capabilities {
                files: if files {
                    vec![FileGrant {
                        path: "/etc/x".into(),
                        access: FileAccess::Read,
                        special_modes: false,
                    }]
                } else {
                    vec![]
                },
                ..Default::default()
            },
            interrupt: reboot.then(|| Interrupt {
                kind: InterruptType::Reboot,
                services: vec![],
            }),
            ..Default::default()
        }
    }

    fn spec(packages: &[(&str, Package)]) -> NodeWrightSpec {
        NodeWrightSpec {
            packages: packages
                .iter()
                .map(|(n, p)| (n.to_string(), p.clone()))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn new_and_changed_packages_are_asked_unchanged_ones_not() {
        let old = spec(&[("a", package(true, true)), ("b", package(true, false))]);
        let created = to_authorize(None, &old);
        assert_eq!(
            created.keys().copied().collect::<Vec<_>>(),
            ["files", "power"]
        );
        assert_eq!(
            created["files"]
                .iter()
                .map(|(p, _)| p.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(
            to_authorize(Some(&old), &old).is_empty(),
            "nothing changed: nothing to ask"
        );

        let mut bumped = old.clone();
        bumped.packages.get_mut("b").unwrap().version = "1.0.1".into();
        assert_eq!(
            to_authorize(Some(&old), &bumped),
            BTreeMap::from([("files", vec![("b".to_string(), "capabilities.files")])]),
            "only b changed"
        );

        let mut removed = old.clone();
        removed.packages.remove("a");
        assert!(
            to_authorize(Some(&old), &removed).is_empty(),
            "removing a package grants nothing"
        );

        let mut wider = old.clone();
        wider.node_selectors = Some(LabelSelector {
            match_labels: Some([("pool".to_string(), "all".to_string())].into()),
            ..Default::default()
        });
        assert_eq!(
            to_authorize(Some(&old), &wider)
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            ["files", "power"],
            "other nodes: every grant again"
        );
    }
}
