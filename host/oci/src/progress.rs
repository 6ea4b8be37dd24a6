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
    /// A payload image's layers applied into its tree.
    Applied {
        /// The image's platform manifest digest.
        digest: String,
        /// What went in and what was left out ([`crate::layers::Applied::summary`]).
        summary: String,
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
