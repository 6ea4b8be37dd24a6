//! What a host operation reports when it fails.

use std::path::Path;

/// A failed host operation.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The path, unit, module or key does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// A file operation failed.
    #[error("{op} {path}")]
    Io {
        /// The operation (`read`, `write`, ...).
        op: &'static str,
        /// The host path.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The request cannot be done on the path as it is: it exists, is not a directory, is
    /// a directory, has a name too long, loops, sits on a read-only or immutable file. The
    /// package chose the request, so the failure is the package's, never retried as the
    /// host's (see [`HostError::io`]).
    #[error("{op} {path}: {source}")]
    Refused {
        /// The operation.
        op: &'static str,
        /// The host path.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A path resolved outside the directory it was confined to (symlink or `..`).
    #[error("{path} resolves outside the granted directory {base}")]
    Escape {
        /// The requested path.
        path: String,
        /// The granted directory.
        base: String,
    },
    /// A symlink on the way that the secure-path rule does not trust: anyone but root (or
    /// this process's user) could have placed it, so following it could take a root-run
    /// operation anywhere.
    #[error(
        "{path}: the symlink {link} is not followed ({why}); nodewright follows only links owned by root in a root-owned directory that group and others cannot write"
    )]
    UntrustedSymlink {
        /// The requested path.
        path: String,
        /// Where the link is.
        link: String,
        /// Which part of the rule it fails.
        why: String,
    },
    /// A write would replace or follow a symlink.
    #[error("{0} is a symlink; nodewright does not write through or over symlinks")]
    Symlink(String),
    /// A host command exited unsuccessfully.
    #[error("`{command}` exited with {status}: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Exit status, as text.
        status: String,
        /// Last part of its stderr.
        stderr: String,
    },
    /// A host command could not be started.
    #[error("cannot run `{command}`")]
    Spawn {
        /// The command line.
        command: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The operation is not supported by this backend.
    #[error("{0}")]
    Unsupported(String),
    /// A module, unit or key that is not well-formed for its kind never reaches a command.
    #[error("invalid {0}")]
    InvalidName(String),
    /// A path below a granted *file* (`/etc/x/y` under the grant `/etc/x`).
    #[error("{path} is below {base}, which is a file, not a directory")]
    NotADirectory {
        /// The requested path.
        path: String,
        /// The granted file.
        base: String,
    },
    /// A unit state change that would change the node's power state (see
    /// `ops::refuse_power_change`).
    #[error(
        "{verb} refused: {why}; only a reboot interrupt (the `power` grant) may change the node's power state"
    )]
    PowerUnit {
        /// The systemctl verb.
        verb: crate::ops::ServiceVerb,
        /// What the unit would do, from its properties on the node.
        why: String,
    },
    /// The grant's own path is missing and would be made a directory, but the grant names
    /// one file (it is written without a trailing `/`; see `PathKind`).
    #[error(
        "{base} is not a directory on this node, so its grant covers one file there; grant `{base}/` (with the trailing slash) to let the package make that directory and write below it"
    )]
    FileGrant {
        /// The requested path.
        path: String,
        /// The granted path.
        base: String,
    },
    /// A metadata change on a file with other hard links: the change would reach every
    /// other name of the inode, which may lie outside the grant (`/etc/shadow`).
    #[error(
        "{path} has {links} hard links; nodewright changes the owner or mode of a file with exactly one"
    )]
    HardLinked {
        /// The requested path.
        path: String,
        /// Its link count.
        links: u64,
    },
    /// Making a path's missing directories would pass the stage's budget of new files (each
    /// directory counts as one) or the depth bound.
    #[error(
        "{path} needs {needed} new directories; the stage may make {allowed} more (at most {depth} levels below a grant)"
    )]
    DirBudget {
        /// The requested path.
        path: String,
        /// Directories it would make (at least).
        needed: u32,
        /// What the budget still allows.
        allowed: u32,
        /// The depth bound, [`crate::rootfs::MAX_DEPTH`].
        depth: usize,
    },
    /// A read larger than the bound.
    #[error("{path} is larger than the {limit}-byte read limit")]
    TooLarge {
        /// The host path.
        path: String,
        /// The bound in bytes.
        limit: u64,
    },
    /// A payload file asked to run cannot be: no exec bit, or neither an ELF binary nor a
    /// `#!` script.
    #[error("{path} cannot run: {why}")]
    NotExecutable {
        /// The file, as the package named it.
        path: String,
        /// What it lacks.
        why: String,
    },
    /// A device, socket or FIFO where a regular file or directory is needed.
    #[error("{path} is {kind}; only regular files and directories can be used")]
    NotRegular {
        /// The host path.
        path: String,
        /// What it is.
        kind: String,
    },
    /// A write would leave the filesystem with less free space than the floor.
    #[error(
        "writing {needed} bytes to {path} would leave less than the {floor}-byte free-space floor ({available} bytes free)"
    )]
    DiskFloor {
        /// The host path.
        path: String,
        /// Free bytes before the write.
        available: u64,
        /// Bytes the write needs.
        needed: u64,
        /// The floor.
        floor: u64,
    },
}

/// Whether a file operation's error describes the request against the path as it is (the
/// package's to answer for) rather than the host's health or resources (`EIO`, `ENOSPC`,
/// `ENOMEM`, `EMFILE`, ..., which a retry may outlive). The one place this split is made.
pub fn caused_by_request(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    let Some(raw) = e.raw_os_error() else {
        // Errors made in this crate name what the request met ("is a directory").
        return e.kind() == std::io::ErrorKind::Other;
    };
    [
        Errno::EXIST,
        Errno::NOTDIR,
        Errno::ISDIR,
        Errno::NAMETOOLONG,
        Errno::NOTEMPTY,
        Errno::LOOP,
        Errno::INVAL,
        Errno::XDEV,
        Errno::MLINK,
        Errno::PERM,
        Errno::ACCESS,
        Errno::ROFS,
        Errno::BUSY,
        Errno::TXTBSY,
        Errno::FBIG,
    ]
    .contains(&Errno::from_raw_os_error(raw))
}

impl HostError {
    /// A failed file operation, blamed by [`caused_by_request`].
    pub(crate) fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        let path = path.display().to_string();
        if source.kind() == std::io::ErrorKind::NotFound {
            HostError::NotFound(path)
        } else if caused_by_request(&source) {
            HostError::Refused { op, path, source }
        } else {
            HostError::Io { op, path, source }
        }
    }
}

/// Result alias for host operations.
pub type Result<T, E = HostError> = std::result::Result<T, E>;
