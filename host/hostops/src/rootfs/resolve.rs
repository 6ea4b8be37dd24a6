//! Resolving a path under a grant from the host root, one component at a time.
//!
//! Every operation resolves its path afresh from the root directory handle, opening each
//! directory with `openat(O_NOFOLLOW)`, so what a path means is decided by the filesystem as
//! it is during that operation and by nothing cached. A symlink on the way is followed only
//! under the secure-path rule (the rule sudo and OpenSSH apply to the files they trust): the
//! link and the directory holding it are owned by root (or this process's own user) and
//! that directory is writable by neither group nor others. So a service account that owns
//! `/var/lib/svc` cannot redirect a root-run write with a link it places there, while a
//! merged-/usr system's `/lib -> usr/lib` is followed as before. Where the walk ends must lie
//! within the grant's own resolved location; only then is the operation done, on the
//! directory handle the walk holds (so a later swap of a name above it changes nothing).
//! The grant's own path is made a directory only when the grant says it names one (a
//! trailing `/`, [`PathKind::Directory`]): a file grant never grows a tree below it.
//!
//! Most paths have no link and no `..` on the way, and every directory exists: for those the
//! kernel does the walk in one `openat2` beneath the root that refuses any symlink
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`), which ends where the
//! walk would; anything else — or any error — goes the component walk. A test holds the two
//! to the same answer over every short path of a tree with each kind of entry.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use cap_std::fs::Dir;
use nodewright_api::grants::{GrantedPath, PathKind};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

use super::{MAX_DEPTH, RootFs, Scoped, Seen};
use crate::error::{HostError, Result};

/// Most symlinks one resolution follows (the kernel's own bound, `ELOOP`).
const MAX_LINKS: u32 = 40;

/// What the resolution does with the path's last component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Last {
    /// Leave it unresolved: the operation acts on the name itself (`lstat`, remove, write).
    Entry,
    /// Follow it when it is a trusted symlink (reads and listings).
    Follow,
    /// It is a directory, made when missing (`mkdir -p`).
    Dir,
}

/// How a path is resolved.
#[derive(Clone, Copy, Debug)]
pub(super) struct Resolve {
    /// What becomes of the last component.
    pub last: Last,
    /// Make missing directories on the way, at most this many (`None`: make none).
    pub create: Option<u32>,
}

impl Resolve {
    /// Resolve to the name itself, making nothing.
    pub const LOOK: Resolve = Resolve {
        last: Last::Entry,
        create: None,
    };
    /// Resolve through a trusted final link, making nothing.
    pub const FOLLOW: Resolve = Resolve {
        last: Last::Follow,
        create: None,
    };
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    /// A component of the grant's own path (or of a link met while resolving it).
    Base,
    /// A component below the grant.
    Below,
}

/// The walk so far: the directories opened below the root, with their names.
struct Walk<'a> {
    fs: &'a RootFs,
    stack: Vec<(Dir, OsString)>,
    /// The grant's resolved location, once its path has been walked.
    floor: Option<Vec<OsString>>,
    links: u32,
    made: u32,
    base: &'a Path,
    path: &'a Path,
}

fn names(p: &Path, part: Part) -> impl Iterator<Item = (OsString, Part)> + '_ {
    p.components().filter_map(move |c| match c {
        Component::Normal(n) => Some((n.to_os_string(), part)),
        Component::ParentDir => Some(("..".into(), part)),
        Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
    })
}

fn io(e: rustix::io::Errno) -> std::io::Error {
    e.into()
}

impl<'a> Walk<'a> {
    fn here(&self) -> &Dir {
        self.stack.last().map_or(&self.fs.root, |(d, _)| d)
    }

    /// The host path of `name` in the current directory.
    fn display(&self, name: &OsStr) -> String {
        let mut s = String::new();
        for (_, n) in &self.stack {
            s.push('/');
            s.push_str(&n.to_string_lossy());
        }
        s.push('/');
        s.push_str(&name.to_string_lossy());
        s
    }

    fn within_grant(&self) -> bool {
        self.floor.as_ref().is_none_or(|floor| {
            self.stack.len() >= floor.len()
                && self.stack.iter().zip(floor).all(|((_, n), f)| n == f)
        })
    }

    fn escape(&self) -> HostError {
        HostError::Escape {
            path: self.path.display().to_string(),
            base: self.base.display().to_string(),
        }
    }

    fn fail(&self, op: &'static str, e: std::io::Error) -> HostError {
        HostError::io(op, self.path, e)
    }

    fn lstat(&self, name: &OsStr) -> Result<Option<rustix::fs::Stat>> {
        match rustix::fs::statat(self.here(), name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(self.fail("resolve", io(e))),
        }
    }

    fn enter(&mut self, name: OsString) -> Result<()> {
        let fd = rustix::fs::openat(self.here(), name.as_os_str(), dir_flags(), Mode::empty())
            .map_err(|e| self.fail("resolve", io(e)))?;
        let dir = Dir::from_std_file(std::fs::File::from(fd));
        self.stack.push((dir, name));
        Ok(())
    }

    /// The current directory's handle, ending the walk.
    fn take_here(mut self) -> Result<Dir> {
        match self.stack.pop() {
            Some((dir, _)) => Ok(dir),
            None => self
                .fs
                .root
                .try_clone()
                .map_err(|e| self.fail("resolve", e)),
        }
    }

    fn leave(&mut self) {
        self.stack.pop();
    }

    /// Follows the symlink `name` in the current directory if the secure-path rule allows:
    /// returns its target's components to resolve next.
    fn follow(&mut self, name: &OsStr, link: &rustix::fs::Stat) -> Result<Vec<OsString>> {
        let dir = rustix::fs::fstat(self.here()).map_err(|e| self.fail("resolve", io(e)))?;
        let trusted = |uid: u32| uid == 0 || uid == rustix::process::geteuid().as_raw();
        let refusal = if !trusted(link.st_uid) {
            Some(format!("the link is owned by uid {}", link.st_uid))
        } else if !trusted(dir.st_uid) {
            Some(format!("its directory is owned by uid {}", dir.st_uid))
        } else if dir.st_mode & 0o022 != 0 {
            Some(format!(
                "its directory is writable by group or others (mode {:o})",
                dir.st_mode & 0o7777
            ))
        } else {
            None
        };
        if let Some(why) = refusal {
            return Err(HostError::UntrustedSymlink {
                path: self.path.display().to_string(),
                link: self.display(name),
                why,
            });
        }
        self.links += 1;
        if self.links > MAX_LINKS {
            return Err(self.fail(
                "resolve",
                std::io::Error::from_raw_os_error(rustix::io::Errno::LOOP.raw_os_error()),
            ));
        }
        let target = rustix::fs::readlinkat(self.here(), name, Vec::new())
            .map_err(|e| self.fail("resolve", io(e)))?;
        let target = Path::new(OsStr::from_bytes(target.as_bytes()));
        if target.is_absolute() {
            self.stack.clear();
        }
        Ok(names(target, Part::Base).map(|(n, _)| n).collect())
    }

    /// Makes the missing directory `name` here (with `needed` more to come below it).
    fn make(&mut self, name: &OsStr, needed: u32, budget: u32) -> Result<()> {
        let depth = self
            .floor
            .as_ref()
            .map_or(0, |f| self.stack.len().saturating_sub(f.len()));
        if !self.within_grant() {
            return Err(self.escape());
        }
        if needed > budget.saturating_sub(self.made) || depth + needed as usize > MAX_DEPTH {
            return Err(HostError::DirBudget {
                path: self.path.display().to_string(),
                needed,
                allowed: budget.saturating_sub(self.made),
                depth: MAX_DEPTH,
            });
        }
        match rustix::fs::mkdirat(self.here(), name, Mode::from_raw_mode(0o755)) {
            Ok(()) => self.made += 1,
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(self.fail("create", io(e))),
        }
        Ok(())
    }
}

/// How every directory on the way is opened: for reading (never `O_PATH`), not following a
/// link, never becoming a controlling terminal, never blocking.
fn dir_flags() -> OFlags {
    OFlags::RDONLY
        | OFlags::DIRECTORY
        | OFlags::NOFOLLOW
        | OFlags::CLOEXEC
        | OFlags::NOCTTY
        | OFlags::NONBLOCK
}

impl RootFs {
    /// Resolves `path` (at or below the grant `base`) from the root; see the module docs.
    pub(super) fn resolve(
        &self,
        grant: GrantedPath<'_>,
        path: &Path,
        how: Resolve,
    ) -> Result<Scoped> {
        match self.resolve_plain(grant, path, how) {
            Some(scoped) => Ok(scoped),
            None => self.walk(grant, path, how),
        }
    }

    /// The common case in one system call: a path of plain names (no `..`) whose every
    /// directory exists and is no link, resolved by the kernel in one `openat2` beneath the
    /// root that refuses any symlink on the way — where the walk would have opened each
    /// directory in turn, found no link, and ended in the same directory. Its last name is
    /// looked at as the walk looks at it. `None` for every other path (a link anywhere, a
    /// `..`, a missing or non-directory component, a name at the root, a kernel without
    /// `openat2`, or any error): the walk decides those, with its typed errors.
    fn resolve_plain(&self, grant: GrantedPath<'_>, path: &Path, how: Resolve) -> Option<Scoped> {
        if how.last == Last::Dir {
            return None;
        }
        let rest = path.strip_prefix(grant.path).ok()?;
        let mut dirs = Vec::new();
        for c in grant.path.components().chain(rest.components()) {
            match c {
                Component::Normal(n) => dirs.push(n.as_bytes()),
                Component::ParentDir => return None,
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
        let last = OsStr::from_bytes(dirs.pop()?);
        if dirs.is_empty() {
            return None;
        }
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let fd = rustix::fs::openat2(
            &self.root,
            dirs.join(&b'/'),
            dir_flags(),
            Mode::empty(),
            resolve,
        )
        .ok()?;
        let dir = Dir::from_std_file(std::fs::File::from(fd));
        let seen = match rustix::fs::statat(&dir, last, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => return None,
            Ok(st) => Seen::Entry(st),
            Err(rustix::io::Errno::NOENT) => Seen::Missing,
            Err(_) => return None,
        };
        Some(Scoped {
            dir,
            rel: last.into(),
            is_base: !rest.components().any(|c| matches!(c, Component::Normal(_))),
            made: 0,
            seen,
        })
    }

    /// [`RootFs::resolve`] one component at a time, as the module docs say.
    // Long on purpose: one loop over a queue of components, where a followed link pushes its
    // target's components in front; the cases of one component belong together.
    pub(super) fn walk(&self, grant: GrantedPath<'_>, path: &Path, how: Resolve) -> Result<Scoped> {
        let base = grant.path;
        let rest = path.strip_prefix(base).map_err(|_| HostError::Escape {
            path: path.display().to_string(),
            base: base.display().to_string(),
        })?;
        let mut queue: VecDeque<(OsString, Part)> = names(base, Part::Base)
            .chain(names(rest, Part::Below))
            .collect();
        let mut walk = Walk {
            fs: self,
            stack: Vec::new(),
            floor: None,
            links: 0,
            made: 0,
            base,
            path,
        };
        let budget = how.create;
        let mut through_base_link = false;
        while let Some((name, part)) = queue.pop_front() {
            if part == Part::Below && walk.floor.is_none() {
                walk.floor = Some(walk.stack.iter().map(|(_, n)| n.clone()).collect());
            }
            if name == ".." {
                walk.leave();
                continue;
            }
            let last = queue.is_empty();
            if last && how.last != Last::Dir {
                let stat = walk.lstat(&name)?;
                let kind = stat.as_ref().map(|s| FileType::from_raw_mode(s.st_mode));
                // A link the grant itself names is followed only to a directory (a grant of
                // a file covers that file, never a link's target); below the grant, reads
                // and listings follow trusted links.
                if kind == Some(FileType::Symlink)
                    && (part == Part::Base || how.last == Last::Follow)
                {
                    through_base_link |= part == Part::Base;
                    let stat = stat.expect("a kind was read");
                    for n in walk.follow(&name, &stat)?.into_iter().rev() {
                        queue.push_front((n, part));
                    }
                    continue;
                }
                if part == Part::Base && through_base_link && kind != Some(FileType::Directory) {
                    return Err(walk.escape());
                }
                if !walk.within_grant() {
                    return Err(walk.escape());
                }
                let made = walk.made;
                return Ok(Scoped {
                    dir: walk.take_here()?,
                    rel: name.into(),
                    is_base: part == Part::Base,
                    made,
                    seen: stat.map_or(Seen::Missing, Seen::Entry),
                });
            }
            // A directory on the way (or the last one of a `mkdir -p`).
            match walk.lstat(&name)? {
                None => match budget {
                    // The grant's own path, missing, to be made a directory: only a grant
                    // written with a trailing `/` names one (see `PathKind`).
                    Some(_)
                        if part == Part::Base
                            && grant.kind == PathKind::AsFound
                            && queue.front().is_none_or(|(_, p)| *p == Part::Below) =>
                    {
                        return Err(HostError::FileGrant {
                            path: path.display().to_string(),
                            base: base.display().to_string(),
                        });
                    }
                    Some(budget) => {
                        // This one and every directory still to come (a freshly made
                        // directory holds nothing to follow); not the last name of a
                        // write, which is a file.
                        let below = queue.iter().filter(|(n, _)| n != "..").count();
                        let files = usize::from(how.last != Last::Dir);
                        let needed = (1 + below - files.min(below)) as u32;
                        walk.make(&name, needed, budget)?;
                        walk.enter(name)?;
                    }
                    None => return Err(HostError::NotFound(path.display().to_string())),
                },
                Some(st) => match FileType::from_raw_mode(st.st_mode) {
                    FileType::Symlink => {
                        for n in walk.follow(&name, &st)?.into_iter().rev() {
                            queue.push_front((n, part));
                        }
                    }
                    FileType::Directory => walk.enter(name)?,
                    _ if part == Part::Base
                        && queue.front().is_some_and(|(_, p)| *p == Part::Below) =>
                    {
                        // A path below a granted file (`/etc/x/y` under the grant `/etc/x`).
                        return Err(HostError::NotADirectory {
                            path: path.display().to_string(),
                            base: base.display().to_string(),
                        });
                    }
                    _ => {
                        return Err(walk.fail(
                            "resolve",
                            std::io::Error::from_raw_os_error(
                                rustix::io::Errno::NOTDIR.raw_os_error(),
                            ),
                        ));
                    }
                },
            }
        }
        // The path named a directory (`mkdir -p`, or the root itself).
        if walk.floor.is_none() {
            walk.floor = Some(walk.stack.iter().map(|(_, n)| n.clone()).collect());
        }
        if !walk.within_grant() {
            return Err(walk.escape());
        }
        let made = walk.made;
        Ok(Scoped {
            dir: walk.take_here()?,
            rel: Default::default(),
            is_base: rest.as_os_str().is_empty(),
            made,
            seen: Seen::Held,
        })
    }
}

#[cfg(test)]
mod tests;
