//! What a pull reports while it works, part by part.

/// Transfer progress, for output on long transfers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Served from the node cache.
    Cached {
        /// Which part.
        what: &'static str,
        /// Digest.
        digest: String,
    },
    /// Downloading.
    Downloading {
        /// Which part.
        what: &'static str,
        /// Digest.
        digest: String,
        /// Expected size.
        bytes: u64,
    },
    /// Uploading.
    Uploading {
        /// Which part.
        what: &'static str,
        /// Digest.
        digest: String,
        /// Size.
        bytes: u64,
    },
}
