//! Plugins as OCI artifacts.
//!
//! Authors push a component in the CNCF wasm layout; the operator resolves a tag to a
//! digest once; node agents pull only `repo@sha256:…` and never trust a file on disk
//! without re-hashing it.
//!
//! - [`artifact`]: media types and the manifest/config shapes (CNCF `application/wasm`
//!   layout on write; Kubewarden's legacy media types accepted on read only).
//! - [`Registry`]: resolve, pull by digest (manifest and layer digests checked), push
//!   (feature `push`). Credentials from a docker `config.json` or explicit; a CA bundle per
//!   registry; plain HTTP only for registries listed as insecure — never a silent downgrade.
//! - [`NodeCache`]: the node's content-addressed store (`blobs/sha256/…`,
//!   `manifests/sha256/…`), atomic writes, re-hash on every load, garbage collection by an
//!   explicit keep-set, safe for concurrent processes. The engine's precompiled-code cache
//!   lives beside it in `code/`.
//! - [`Puller`]: the agent's path: cache first, registry on a miss, everything verified.
//! - [`payload`]: the files a package carries beside its component — more layers of the
//!   same manifest, streamed to the node's disk and unpacked into read-only trees.
//!
//! ```no_run
//! # async fn demo() -> Result<(), nodewright_oci::Error> {
//! use nodewright_oci::{NodeCache, Puller, Registry, RegistryConfig};
//! let registry = Registry::new(RegistryConfig::default());
//! let pinned = registry.pinned("registry.example.com/plugins/sysctl:1.0.0").await?;
//! let puller = Puller::new(registry, NodeCache::open("/var/lib/nodewright/plugins".as_ref())?);
//! let pulled = puller.pull_pinned(&pinned, &|_| {}).await?;
//! assert_eq!(pulled.manifest_digest, pinned.digest());
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

pub mod artifact;
mod auth;
mod bounded;
mod cache;
mod digest;
mod error;
mod gc;
mod image;
pub mod layers;
mod oci_errors;
pub mod payload;
mod progress;
mod pull;
mod registry;
mod resume;
mod stream;
mod tls;

pub use auth::Credentials;
pub use bounded::{MAX_MANIFEST_BYTES, MAX_TOKEN_BYTES};
pub use cache::{Keeps, NodeCache};
pub use digest::{parse_digest, sha256_digest};
pub use error::{Error, Result};
pub use gc::{GcReport, Keep};
pub use image::this_architecture;
pub use progress::Progress;
pub use pull::{Pulled, PulledPayload, Puller};
#[cfg(feature = "push")]
pub use registry::{Blob, PayloadFile, Pushed};
pub use registry::{DEFAULT_MAX_PAYLOAD_BYTES, Pem, PullLimits, Registry, RegistryConfig, pin};
pub use tls::{prepare_roots, system_roots};
