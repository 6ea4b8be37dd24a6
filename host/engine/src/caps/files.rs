//! `files`: reads and writes inside granted paths.

use nodewright_api::grants::Capability;
use nodewright_hostops::WriteOptions;

use crate::bindings::nodewright::plugin::{files, types};
use crate::state::CapState;

use types::CapError;

impl files::Host for CapState {
    async fn read(&mut self, path: String) -> Result<Vec<u8>, CapError> {
        let max = self.budget.max_read;
        self.file_op("read", path, false, move |h, base, p| {
            h.fs().read(base, p, max)
        })
    }

    async fn write(
        &mut self,
        path: String,
        contents: Vec<u8>,
        mode: Option<u32>,
    ) -> Result<(), CapError> {
        let (rule, normalized) = self.file_scope("write", &path, true)?;
        let special_modes = self.check_mode("write", &normalized, mode)?;
        self.spend("write", &path, contents.len() as u64, 1)?;
        let options = WriteOptions {
            mode,
            special_modes,
            min_free_bytes: self.budget.min_free,
            max_new_dirs: Some(self.budget.files_left),
        };
        // On the blocking pool, unlike the other file ops: a write of up to the stage's
        // byte budget ends in an fsync, which waits on the disk for as long as it takes,
        // and the stage's deadline must still end the stage meanwhile.
        let made = self
            .host(Capability::Files, "write", &path, move |h| {
                h.fs()
                    .write(rule.granted(), &normalized, &contents, &options)
            })
            .await?;
        self.budget.files_left = self.budget.files_left.saturating_sub(made);
        Ok(())
    }

    async fn stat(&mut self, path: String) -> Result<Option<files::FileStat>, CapError> {
        let stat = self.file_op("stat", path, false, |h, base, p| h.fs().stat(base, p))?;
        Ok(stat.map(|s| files::FileStat {
            kind: match s.kind {
                nodewright_hostops::FileKind::File => files::FileKind::File,
                nodewright_hostops::FileKind::Directory => files::FileKind::Directory,
                nodewright_hostops::FileKind::Symlink => files::FileKind::Symlink,
                nodewright_hostops::FileKind::Other => files::FileKind::Other,
            },
            size: s.size,
            mode: s.mode,
            uid: s.uid,
            gid: s.gid,
        }))
    }

    async fn list_dir(&mut self, path: String) -> Result<Vec<String>, CapError> {
        self.file_op("list-dir", path, false, |h, base, p| {
            h.fs().list_dir(base, p)
        })
    }

    async fn create_dir(&mut self, path: String) -> Result<(), CapError> {
        let (rule, normalized) = self.file_scope("create-dir", &path, true)?;
        // Each directory made counts as a written file, however many one call makes.
        let left = self.budget.files_left;
        let made = self.host_in_place(Capability::Files, "create-dir", &path, |h| {
            h.fs().create_dir(rule.granted(), &normalized, Some(left))
        })?;
        self.budget.files_left = self.budget.files_left.saturating_sub(made);
        Ok(())
    }

    async fn remove(&mut self, path: String) -> Result<(), CapError> {
        self.file_op("remove", path, true, |h, base, p| h.fs().remove(base, p))
    }

    async fn set_owner(&mut self, path: String, uid: u32, gid: u32) -> Result<(), CapError> {
        self.file_op("set-owner", path, true, move |h, base, p| {
            h.fs().set_owner(base, p, uid, gid)
        })
    }

    async fn install(
        &mut self,
        source: String,
        path: String,
        mode: Option<u32>,
    ) -> Result<(), CapError> {
        let (tree, rel) = self.payload_file("install", &source)?;
        let (rule, normalized) = self.file_scope("install", &path, true)?;
        let special_modes = self.check_mode("install", &normalized, mode)?;
        // The budget is spent on the payload file's size as it is now; the host checks the
        // bytes it copies against it.
        let size = std::fs::symlink_metadata(tree.join(&rel)).map_or(0, |m| m.len());
        self.spend("install", &path, size, 1)?;
        let options = WriteOptions {
            mode,
            special_modes,
            min_free_bytes: self.budget.min_free,
            max_new_dirs: Some(self.budget.files_left),
        };
        let (made, copied) = self
            .host(Capability::Files, "install", &path, move |h| {
                h.fs()
                    .install(rule.granted(), &normalized, &tree, &rel, &options)
            })
            .await?;
        if copied > size {
            // The payload is read-only; a file that grew under us is still within bounds
            // of what was copied, but the budget counts what was written.
            self.budget.bytes_left = self.budget.bytes_left.saturating_sub(copied - size);
        }
        self.budget.files_left = self.budget.files_left.saturating_sub(made);
        Ok(())
    }

    async fn set_mode(&mut self, path: String, mode: u32) -> Result<(), CapError> {
        let (rule, normalized) = self.file_scope("set-mode", &path, true)?;
        self.check_mode("set-mode", &normalized, Some(mode))?;
        self.host_in_place(Capability::Files, "set-mode", &path, |h| {
            h.fs().set_mode(rule.granted(), &normalized, mode)
        })
    }
}
