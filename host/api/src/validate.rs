//! Validation and defaulting, as pure functions.
//!
//! The admission webhook, `nodewright validate FILE` and the operator all call these.
//! Every error carries the field path at fault, e.g.
//! `spec.packages.driver.capabilities.kernelModules[1]: "nv[idia" is not a valid glob`.
//!
//! [`nodewright`] and [`policy`] check one spec each, [`defaults`] fills in what a spec may
//! leave out, [`objects`] checks whole manifests and the rules that span objects.

mod defaults;
mod errors;
mod fields;
mod nodewright;
mod objects;
mod policy;

pub use crate::names::{
    DEFAULT_COMPARTMENT, MAX_NODEWRIGHT_NAME, check_plugin_reference, config_key_matches,
    is_package_name,
};
pub use defaults::{default_deployment_policy, default_nodewright};
pub use errors::FieldError;
pub use nodewright::validate_nodewright;
pub use objects::{
    validate_manifest, validate_nodewright_update, validate_policy_delete,
    validate_policy_reference,
};
pub use policy::validate_deployment_policy;
