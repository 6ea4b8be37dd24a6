//! Capability grants: what a package may touch on the host.
//!
//! [`Capabilities`] is the shape admins write under `spec.packages.<name>.capabilities`
//! (and what `nodewright plugin run --grant` builds). [`GrantSet::parse`] turns it, once,
//! into typed allowlists; everything not in them is denied. Parsing rejects unknown keys
//! (via serde), bad globs, relative paths and paths that try to escape with `..`, each
//! with the field path at fault.
//!
//! Deny by default:
//! - no `files` entry: no file can be read or written;
//! - no `kernelModules` / `services` / `sysctl` entry: the interface is not linked at all;
//! - no `commands` entry: no host command runs;
//! - `power` (reboot) is only granted when the package's interrupt is `reboot`, and only
//!   honoured in the `interrupt` stage.
//!
//! [`spec`] holds the written form, [`patterns`] the allowlist entries, [`set`] the parsed
//! [`GrantSet`] and `flags` the CLI's `--grant` syntax.

mod flags;
mod patterns;
mod set;
mod spec;

pub use patterns::{
    CommandRule, CommandTarget, GrantedPath, NamePattern, PAYLOAD_COMMAND, PathKind, PathRule,
    normalize_abs_path,
};
pub use set::{CheckedCommand, CommandRefusal, GrantSet, NameRefusal, PathRefusal};
pub use spec::{
    Capabilities, Capability, CommandGrant, FileAccess, FileGrant, GrantError, GrantSource,
};

#[cfg(test)]
mod tests;
