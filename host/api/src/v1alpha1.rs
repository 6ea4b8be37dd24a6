//! `nodewright.io/v1alpha1`: the `NodeWright`, `DeploymentPolicy` and `NodeWrightPreview`
//! kinds.
//!
//! Field names follow NVIDIA NodeWright where the concept is the same; a package names a
//! `plugin` (OCI reference) and its `capabilities` instead of an `image`.
//!
//! [`nodewright`] holds the `NodeWright` kind and its status, [`package`] one package of
//! it, [`policy`] the `DeploymentPolicy` kind, [`preview`] the `NodeWrightPreview` kind.

mod nodewright;
mod package;
mod policy;
mod preview;

pub use nodewright::*;
pub use package::*;
pub use policy::*;
pub use preview::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interrupt_types_parse_what_they_print() {
        for k in InterruptType::ALL {
            assert_eq!(k.as_str().parse::<InterruptType>(), Ok(k));
            // The spelling is the spec's (serde's), so labels and specs agree.
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
        assert!(
            "reboots"
                .parse::<InterruptType>()
                .unwrap_err()
                .contains("\"reboots\"")
        );
    }
}
