//! The system's CA certificates, and what to do without them.
//!
//! The registry client's TLS stack reads the system's roots when it is built, and panics
//! when there are none — even for a plain-HTTP registry, which needs no CA at all. A
//! minimal image may well have none. So a process calls [`prepare_roots`] first: when the
//! system has roots nothing changes; when it has none, the stack is pointed at a root that
//! signs nothing (plain-HTTP registries then work), and every HTTPS registry without a CA
//! bundle of its own is refused with an error that says what is missing.

use std::path::Path;
use std::sync::OnceLock;

/// The root given to the TLS stack when the system has none: it signs nothing.
pub(crate) const UNUSED_ROOT: &[u8] = include_bytes!("unused-root.pem");

static SYSTEM_ROOTS: OnceLock<usize> = OnceLock::new();

/// How many CA certificates the system has (read once).
pub fn system_roots() -> usize {
    *SYSTEM_ROOTS.get_or_init(|| rustls_native_certs::load_native_certs().certs.len())
}

/// Makes registry clients buildable on a system without CA certificates (see the module
/// docs), writing the placeholder root under `dir`. Returns how many system roots there
/// are. Call it at process start, before any thread exists: it may set `SSL_CERT_FILE`.
pub fn prepare_roots(dir: &Path) -> std::io::Result<usize> {
    let found = system_roots();
    if found == 0 {
        std::fs::create_dir_all(dir)?;
        let file = dir.join("no-system-roots.pem");
        std::fs::write(&file, UNUSED_ROOT)?;
        // SAFETY: called at process start, before the runtime or any other thread exists,
        // so nothing reads the environment concurrently.
        #[allow(
            unsafe_code,
            reason = "setting the environment before any thread starts"
        )]
        unsafe {
            std::env::set_var("SSL_CERT_FILE", &file);
        }
    }
    Ok(found)
}

/// The error for an HTTPS registry on a system without CA certificates.
pub(crate) fn missing_roots(registry: &str) -> crate::error::Error {
    crate::error::Error::Config {
        path: registry.to_string(),
        reason: "no CA certificates were found on this system (/etc/ssl/certs, SSL_CERT_FILE, SSL_CERT_DIR): add the registry's CA bundle, ship CA certificates in the image, or list the registry as insecure if it is plain HTTP".into(),
    }
}
