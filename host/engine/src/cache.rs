//! On-disk cache of precompiled native code.
//!
//! Layout: `<dir>/<engine-hash>/<layer-hex>.cwasm` plus `<layer-hex>.cwasm.blake3`, where
//! `engine-hash` is a SHA-256 of wasmtime's precompile compatibility hash (so a wasmtime
//! upgrade or a config change lands in a new directory) and `layer-hex` the SHA-256 of the
//! component bytes. The sidecar holds the BLAKE3 of the `.cwasm` as written; it is
//! verified before the file is mapped, because deserialising native code is trusting it.
//! BLAKE3 rather than SHA-256 because this check runs on every stage and an interpreter's
//! code is tens of megabytes (Python's ~55 MB): it hashes several times faster here.
//! Any mismatch or load error recompiles and overwrites. Writes are temp file + rename, so
//! two processes sharing the directory never see a half-written file.
//!
//! The check guards against a damaged file (torn, truncated, bit-rotted), not against
//! whoever can write the 0700 directory: that writer could rewrite the sidecar as well.
//! So wasmtime mapping the file again by its path after the check opens no gap a copy
//! would close, and the mapping comes straight from the page cache: handing wasmtime the
//! checked bytes instead (a copy into its own mapping) measured 0.37 -> 0.57 ms per cached
//! load of the sysctl plugin.

use std::hash::Hasher;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;

use crate::error::{Error, Result};

/// `sha256:<hex>` of bytes.
pub(crate) fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Feeds `Hash` output into SHA-256 so the key is stable across processes.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

#[derive(Debug)]
pub(crate) struct CodeCache {
    dir: PathBuf,
}

fn cache_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Cache {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

impl CodeCache {
    pub(crate) fn open(root: PathBuf, engine: &wasmtime::Engine) -> Result<Self> {
        let mut hasher = Sha256Hasher(Sha256::new());
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
        let engine_hash = hex::encode(&hasher.0.finalize()[..16]);
        let dir = root.join(format!("wasmtime-{engine_hash}"));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| cache_err(&dir, e))?;
        // The cache holds native code: keep it private even if the parent existed already.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| cache_err(&root, e))?;
        Ok(CodeCache { dir })
    }

    fn paths(&self, digest: &str) -> (PathBuf, PathBuf) {
        let hexpart = digest.trim_start_matches("sha256:");
        (
            self.dir.join(format!("{hexpart}.cwasm")),
            self.dir.join(format!("{hexpart}.cwasm.blake3")),
        )
    }

    /// Returns the component and whether it came from the cache.
    pub(crate) fn load_or_compile(
        &self,
        engine: &wasmtime::Engine,
        digest: &str,
        compile: impl FnOnce() -> Result<Component>,
    ) -> Result<(Component, bool)> {
        let (code, sidecar) = self.paths(digest);
        if let Some(component) = self.try_load(engine, &code, &sidecar) {
            return Ok((component, true));
        }
        let component = compile()?;
        let serialized = component.serialize().map_err(Error::compile)?;
        write_atomic(&code, &serialized)?;
        write_atomic(&sidecar, blake3::hash(&serialized).to_hex().as_bytes())?;
        Ok((component, false))
    }

    fn try_load(
        &self,
        engine: &wasmtime::Engine,
        code: &Path,
        sidecar: &Path,
    ) -> Option<Component> {
        let expected = std::fs::read_to_string(sidecar).ok()?;
        let actual = blake3::hash(&std::fs::read(code).ok()?).to_hex();
        if expected.trim() != actual.as_str() {
            tracing::warn!(path = %code.display(), "precompiled code does not match its recorded hash; recompiling");
            return None;
        }
        // SAFETY: the file was produced by `Component::serialize` of this engine
        // configuration (the directory is keyed by the compatibility hash), lives in a
        // 0700 directory, and its BLAKE3 was just checked against the sidecar written with
        // it. wasmtime additionally validates the header and engine settings.
        #[allow(
            unsafe_code,
            reason = "loading our own precompiled code, verified above"
        )]
        let loaded = unsafe { Component::deserialize_file(engine, code) };
        match loaded {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(path = %code.display(), error = %e, "cannot load precompiled code; recompiling");
                None
            }
        }
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    nodewright_api::atomic::write(path, bytes).map_err(|e| cache_err(path, e))
}
