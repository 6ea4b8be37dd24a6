//! Trust in plugins: who signed one, and what that lets it be granted.
//!
//! Signatures are cosign's, key-based ([`keys`]: ECDSA P-256 key pairs in cosign's
//! encrypted and public PEM formats; [`signatures`]: the simple-signing payloads stored
//! under `repo:sha256-<hex>.sig`), so `cosign sign --key` and `cosign verify --key` interoperate
//! both ways. [`policy`] decides whether a package's verified signers satisfy a
//! `PluginTrustPolicy` and whether its grants stay within what those signers may be
//! granted. [`Verifier`] ties them to a registry, remembering what each key verified (per pinned
//! reference, so a rollout verifies once, not per node) within a bound.
//!
//! ```no_run
//! # async fn demo(registry: nodewright_oci::Registry) -> Result<(), nodewright_trust::Error> {
//! use nodewright_trust::keys::{KeyPair, PublicKey};
//! use nodewright_trust::{signatures, Verifier};
//! let pair = KeyPair::generate();
//! let pinned = registry.pinned("registry.example.com/plugins/sysctl:1.0.0").await?;
//! signatures::attach(&registry, &pinned, &pair).await?;
//! let verifier = Verifier::new(256);
//! let keys = vec![("platform-team".to_string(), PublicKey::from_pem(&pair.public().to_pem())?)];
//! assert_eq!(verifier.signers(&registry, &pinned, &keys).await?, ["platform-team"]);
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod error;
pub mod keys;
pub mod policy;
pub mod signatures;

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use nodewright_api::pinned::PinnedRef;
use nodewright_oci::Registry;
use sha2::{Digest, Sha256};

use crate::keys::PublicKey;

pub use crate::error::Error;

/// Verifies plugins' signatures against trusted keys, remembering for the most recent
/// `capacity` (pinned reference, key) pairs that the key's signature verified. Only positive
/// answers are remembered — what a key verified over a digest stays true, while a plugin
/// signed a moment later must be seen at once — so a check whose keys all verified before
/// reads nothing from the registry.
pub struct Verifier {
    capacity: usize,
    cache: Mutex<(HashSet<String>, VecDeque<String>)>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// A verifier remembering `capacity` answers.
    pub fn new(capacity: usize) -> Self {
        Verifier {
            capacity,
            cache: Mutex::default(),
        }
    }

    fn key(pinned: &PinnedRef, key: &PublicKey) -> String {
        format!("{pinned}/{}", hex(&Sha256::digest(key.to_pem().as_bytes())))
    }

    /// The names of `keys` (in their order) whose signatures of `pinned` verify.
    pub async fn signers(
        &self,
        registry: &Registry,
        pinned: &PinnedRef,
        keys: &[(String, PublicKey)],
    ) -> Result<Vec<String>, Error> {
        let digest = pinned.digest();
        let known: Vec<bool> = {
            let cache = self.cache.lock().expect("verifier lock");
            keys.iter()
                .map(|(_, k)| cache.0.contains(&Self::key(pinned, k)))
                .collect()
        };
        if known.iter().all(|k| *k) {
            return Ok(keys.iter().map(|(n, _)| n.clone()).collect());
        }
        let found = signatures::signatures(registry, pinned).await?;
        let unknown: Vec<(String, PublicKey)> = keys
            .iter()
            .zip(&known)
            .filter(|(_, k)| !**k)
            .map(|(p, _)| p.clone())
            .collect();
        let verified = signatures::verified_by(&found, digest, &unknown);
        let mut cache = self.cache.lock().expect("verifier lock");
        let (set, order) = &mut *cache;
        for (name, key) in &unknown {
            if verified.contains(name) && set.insert(Self::key(pinned, key)) {
                order.push_back(Self::key(pinned, key));
            }
        }
        while order.len() > self.capacity {
            if let Some(old) = order.pop_front() {
                set.remove(&old);
            }
        }
        Ok(keys
            .iter()
            .zip(&known)
            .filter(|((n, _), k)| **k || verified.contains(n))
            .map(|((n, _), _)| n.clone())
            .collect())
    }

    /// How many answers are remembered.
    pub fn remembered(&self) -> usize {
        self.cache.lock().expect("verifier lock").1.len()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
