//! Paths flexd mounts on, creates, removes or walks, resolved without ever following a symlink.
//!
//! A target path comes from a client (a CSI CO, `flexd volume mount --target`) and is used as
//! root. Checking it with `stat` and then using it by name lets a symlink planted in between (or
//! already there: `T/letc -> /etc`) send a mount over a host directory. So every path is walked
//! one component at a time, each opened relative to the directory before it with `openat2`
//! (`RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH`, `O_NOFOLLOW` before Linux 5.6): the descriptor at
//! the end is the directory the name meant when it was proven free of symlinks, and flexd mounts
//! on that descriptor (`/proc/self/fd/N`), creates with `mkdirat` and removes with `unlinkat`
//! relative to descriptors from the same walk. `..` is refused outright: a path that climbs is
//! never what a CO means.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// The longest path flexd accepts, in bytes: the kernel's `PATH_MAX` (with its NUL).
pub const PATH_MAX: usize = 4095;

/// Why a path cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("{path} is not an absolute path")]
    NotAbsolute { path: String },
    #[error("path {path} contains a NUL byte")]
    Nul { path: String },
    #[error("path {path}… is {len} bytes long; the limit is {limit} (PATH_MAX)")]
    TooLong {
        path: String,
        len: usize,
        limit: usize,
    },
    #[error("path {path} contains a `..` component")]
    DotDot { path: String },
    #[error(
        "{path}: {component} is a symbolic link (flexd never follows symlinks in volume paths)"
    )]
    Symlink { path: PathBuf, component: PathBuf },
    #[error("{path}: {component} exists and is not a directory")]
    NotDirectory { path: PathBuf, component: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl PathError {
    /// Whether the path itself is malformed (as opposed to what the filesystem holds there).
    pub fn is_malformed(&self) -> bool {
        matches!(
            self,
            Self::NotAbsolute { .. }
                | Self::Nul { .. }
                | Self::TooLong { .. }
                | Self::DotDot { .. }
        )
    }
}

/// At most this much of a hostile path goes into an error message.
fn shown(path: &Path) -> String {
    let text = path.to_string_lossy();
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.into_owned(),
    }
}

/// The path, lexically checked (absolute, no NUL, no `..`, at most [`PATH_MAX`] bytes) and
/// normalized (no `.` components, no repeated or trailing `/`).
pub fn check(path: &Path) -> Result<PathBuf, PathError> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    if bytes.contains(&0) {
        return Err(PathError::Nul {
            path: shown(path).replace('\0', "\\0"),
        });
    }
    if bytes.len() > PATH_MAX {
        return Err(PathError::TooLong {
            path: shown(path),
            len: bytes.len(),
            limit: PATH_MAX,
        });
    }
    if !path.is_absolute() {
        return Err(PathError::NotAbsolute { path: shown(path) });
    }
    let mut normal = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(name) => normal.push(name),
            Component::ParentDir => return Err(PathError::DotDot { path: shown(path) }),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(normal)
}

/// The names after `/` of a checked path.
fn names(path: &Path) -> impl Iterator<Item = &OsStr> {
    path.components().filter_map(|c| match c {
        Component::Normal(name) => Some(name),
        _ => None,
    })
}

fn open_root() -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens one name in `dir` as an `O_PATH` descriptor, never following a symlink.
fn open_step(dir: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | ResolveFlags::BENEATH;
    match rustix::fs::openat2(dir, name, flags, Mode::empty(), resolve) {
        Err(Errno::NOSYS) => rustix::fs::openat(dir, name, flags, Mode::empty()),
        other => other,
    }
}

/// `path` (checked) opened in one `openat2` from `/`, with what it is; `None` when that fails
/// for any reason (a symlink, a missing component, a kernel before 5.6). The kernel refuses a
/// symlink as any component but the last, which `O_PATH | O_NOFOLLOW` opens itself: refused
/// here. The same guarantee as the walk, in one lookup instead of three system calls per
/// component (a publish walks its target three times); when it fails, the walk says why.
fn open_whole(path: &Path) -> Option<(OwnedFd, FileType)> {
    let root = open_root().ok()?;
    let relative: PathBuf = names(path).collect();
    let fd = if relative.as_os_str().is_empty() {
        root
    } else {
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let resolve =
            ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | ResolveFlags::BENEATH;
        rustix::fs::openat2(&root, &relative, flags, Mode::empty(), resolve).ok()?
    };
    let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd).ok()?.st_mode);
    (kind != FileType::Symlink).then_some((fd, kind))
}

/// What a name in `dir` is, not following it.
fn kind_of(dir: BorrowedFd<'_>, name: &OsStr) -> Result<Option<FileType>, Errno> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(FileType::from_raw_mode(stat.st_mode))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// One component of a walk: `name` in `dir`, opened without following it, and what it is; or
/// `None` when nothing is there. A symlink is refused, as is anything but a directory before
/// the last component (`last`). A directory missing at our open and there at our look was made
/// by someone else in between (concurrent publishes under one pods dir): it is opened now.
fn step(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    last: bool,
    path: &Path,
    walked: &Path,
) -> Result<Option<OwnedFd>, PathError> {
    let io = |errno: Errno| PathError::Io {
        path: path.to_owned(),
        source: errno.into(),
    };
    let symlink = || PathError::Symlink {
        path: path.to_owned(),
        component: walked.to_owned(),
    };
    let not_directory = || PathError::NotDirectory {
        path: path.to_owned(),
        component: walked.to_owned(),
    };
    let fd = match open_step(dir, name) {
        Ok(fd) => fd,
        Err(errno) => match kind_of(dir, name) {
            Ok(None) => return Ok(None),
            Ok(Some(FileType::Symlink)) => return Err(symlink()),
            Ok(Some(FileType::Directory)) if errno == Errno::NOENT => {
                open_step(dir, name).map_err(io)?
            }
            Ok(Some(FileType::Directory)) | Err(_) => return Err(io(errno)),
            Ok(Some(_)) if last => return Err(io(errno)),
            Ok(Some(_)) => return Err(not_directory()),
        },
    };
    let kind = rustix::fs::fstat(&fd)
        .map(|s| FileType::from_raw_mode(s.st_mode))
        .map_err(io)?;
    match kind {
        // O_PATH | O_NOFOLLOW opens a symlink itself rather than failing.
        FileType::Symlink => Err(symlink()),
        FileType::Directory => Ok(Some(fd)),
        _ if last => Ok(Some(fd)),
        _ => Err(not_directory()),
    }
}

/// What a path names, found without following symlinks.
#[derive(Debug)]
pub enum Found {
    /// Something (of any type but a symlink) is there; an `O_PATH` descriptor of it.
    Present(OwnedFd),
    /// A component does not exist; every one before it is a real directory.
    Absent,
}

/// Opens `path` (checked with [`check`]) without following a symlink anywhere in it. A symlink
/// as any component is an error; so is a non-directory before the last component.
pub fn open(path: &Path) -> Result<Found, PathError> {
    let path = check(path)?;
    if let Some((fd, _)) = open_whole(&path) {
        return Ok(Found::Present(fd));
    }
    let mut dir = open_root().map_err(|source| PathError::Io {
        path: path.clone(),
        source,
    })?;
    let mut walked = PathBuf::from("/");
    let all: Vec<&OsStr> = names(&path).collect();
    for (i, name) in all.iter().enumerate() {
        walked.push(name);
        let last = i + 1 == all.len();
        match step(dir.as_fd(), name, last, &path, &walked)? {
            None => return Ok(Found::Absent),
            Some(fd) if last => return Ok(Found::Present(fd)),
            Some(fd) => dir = fd,
        }
    }
    // The path is `/` itself.
    open_root()
        .map(Found::Present)
        .map_err(|source| PathError::Io { path, source })
}

/// Opens `path` as a directory, or `None` when it does not exist. Anything but a directory
/// there is [`PathError::NotDirectory`].
pub fn open_dir(path: &Path) -> Result<Option<OwnedFd>, PathError> {
    match open(path)? {
        Found::Absent => Ok(None),
        Found::Present(fd) => {
            require_dir(&fd, path)?;
            Ok(Some(fd))
        }
    }
}

fn require_dir(fd: &OwnedFd, path: &Path) -> Result<(), PathError> {
    let stat = rustix::fs::fstat(fd).map_err(|e| PathError::Io {
        path: path.to_owned(),
        source: e.into(),
    })?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return Err(PathError::NotDirectory {
            path: path.to_owned(),
            component: path.to_owned(),
        });
    }
    Ok(())
}

/// Makes `path` a directory: each missing component is created with `mkdirat` in the
/// directory descriptor before it (mode 0755), none followed if it is a symlink. Returns the
/// directory's descriptor and whether its last component was created here.
pub fn create_dir(path: &Path) -> Result<(OwnedFd, bool), PathError> {
    let path = check(path)?;
    let io = |source: io::Error| PathError::Io {
        path: path.clone(),
        source,
    };
    if let Some(done) = create_dir_at_once(&path) {
        return done;
    }
    let mut dir = open_root().map_err(io)?;
    let mut walked = PathBuf::from("/");
    let mut created_last = false;
    for name in names(&path) {
        walked.push(name);
        created_last = false;
        dir = match step(dir.as_fd(), name, false, &path, &walked)? {
            Some(fd) => fd,
            None => {
                match rustix::fs::mkdirat(dir.as_fd(), name, Mode::from_raw_mode(0o755)) {
                    Ok(()) => created_last = true,
                    // Created by someone else in between: opened (and checked) below.
                    Err(Errno::EXIST) => {}
                    Err(e) => return Err(io(e.into())),
                }
                // Removed again between our mkdir and our open (a symlink put there instead
                // is refused by the step).
                step(dir.as_fd(), name, false, &path, &walked)?
                    .ok_or_else(|| io(io::ErrorKind::NotFound.into()))?
            }
        };
    }
    Ok((dir, created_last))
}

/// [`create_dir`] for what a publish meets, without the walk: the directory is there, or only
/// its last component is missing. `None` for anything else: the walk then says which component
/// is wrong.
fn create_dir_at_once(path: &Path) -> Option<Result<(OwnedFd, bool), PathError>> {
    match open_whole(path) {
        Some((fd, FileType::Directory)) => return Some(Ok((fd, false))),
        Some(_) => return None,
        None => {}
    }
    let (parent, name) = (path.parent()?, path.file_name()?);
    let (parent, FileType::Directory) = open_whole(parent)? else {
        return None;
    };
    match rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)) {
        Ok(()) => {}
        Err(Errno::EXIST) => return None, // made meanwhile, or not a directory
        Err(e) => {
            return Some(Err(PathError::Io {
                path: path.to_owned(),
                source: e.into(),
            }))
        }
    }
    // Ours: opened as the walk would (a symlink swapped in is refused).
    let opened = open_step(parent.as_fd(), name)
        .map_err(|_| PathError::Symlink {
            path: path.to_owned(),
            component: path.to_owned(),
        })
        .and_then(|fd| require_dir(&fd, path).map(|()| (fd, true)));
    Some(opened)
}

/// Removes the empty directory `path` with `unlinkat` in its parent's descriptor (found without
/// following symlinks). Absent is success.
pub fn remove_dir(path: &Path) -> Result<(), PathError> {
    let path = check(path)?;
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Ok(());
    };
    let Some(parent_fd) = open_dir(parent)? else {
        return Ok(());
    };
    match rustix::fs::unlinkat(&parent_fd, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(PathError::Io {
            path,
            source: e.into(),
        }),
    }
}

/// The name through which the kernel reaches what `fd` opened (for syscalls that take a path).
pub fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Whether `path` is a mount point in the mount table: the answer for kernels without
/// `STATX_ATTR_MOUNT_ROOT`.
fn in_mount_table(path: &Path) -> io::Result<bool> {
    let normal = check(path).map_err(io::Error::other)?;
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(super::parse_mountinfo(&text)
        .iter()
        .any(|m| m.mount_point == normal))
}

/// A path's last component as seen from its parent directory, which is held open.
#[derive(Debug)]
pub struct Entry {
    parent: OwnedFd,
    name: OsString,
    path: PathBuf,
    kind: FileType,
    /// `STATX_ATTR_MOUNT_ROOT`, where the kernel has it (5.8+).
    mount_root: Option<bool>,
}

impl Entry {
    /// It, if it is a directory; anything else is [`PathError::NotDirectory`].
    pub fn require_dir(self) -> Result<Self, PathError> {
        if self.kind != FileType::Directory {
            return Err(PathError::NotDirectory {
                component: self.path.clone(),
                path: self.path,
            });
        }
        Ok(self)
    }

    /// The name through which the kernel reaches it from the parent that was walked (for
    /// syscalls that take a path): no new walk of the path, only of the last component.
    pub fn via_parent(&self) -> PathBuf {
        fd_path(&self.parent).join(&self.name)
    }

    /// Whether it is the root of a mount.
    pub fn is_mount_root(&self) -> io::Result<bool> {
        match self.mount_root {
            Some(root) => Ok(root),
            None => in_mount_table(&self.path),
        }
    }
}

/// What `path` names, found as [`open`] finds it (a symlink anywhere in it is an error) but
/// never opened itself: its parent is, and it is looked at by name. A descriptor of the root of
/// a mount holds that mount busy, and so does the copy that any process forked meanwhile (by
/// any thread) holds until its exec: an unmount then fails with `EBUSY`. `None` when absent.
pub fn look(path: &Path) -> Result<Option<Entry>, PathError> {
    let path = check(path)?;
    let io = |source: io::Error| PathError::Io {
        path: path.clone(),
        source,
    };
    let (parent, name) = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => match open_dir(parent)? {
            Some(fd) => (fd, name.to_owned()),
            None => return Ok(None),
        },
        // `/` itself: looked at from itself.
        _ => (open_root().map_err(io)?, OsString::from(".")),
    };
    use rustix::fs::{StatxAttributes, StatxFlags};
    let flags = AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT;
    let (kind, mount_root) = match rustix::fs::statx(&parent, &name, flags, StatxFlags::BASIC_STATS)
    {
        Ok(stx) => (
            FileType::from_raw_mode(stx.stx_mode.into()),
            stx.stx_attributes_mask
                .contains(StatxAttributes::MOUNT_ROOT)
                .then(|| stx.stx_attributes.contains(StatxAttributes::MOUNT_ROOT)),
        ),
        Err(Errno::NOSYS) => match rustix::fs::statat(&parent, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => (FileType::from_raw_mode(stat.st_mode), None),
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(io(e.into())),
        },
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(io(e.into())),
    };
    if kind == FileType::Symlink {
        return Err(PathError::Symlink {
            component: path.clone(),
            path,
        });
    }
    Ok(Some(Entry {
        parent,
        name,
        path,
        kind,
        mount_root,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads making overlapping deep paths at once (eight publishes under one pod dir) all
    /// succeed: a component another thread made between this one's open and its look is
    /// entered, not refused as unreadable. Failed under load before that case was handled.
    #[test]
    fn concurrent_creates_of_overlapping_paths_all_succeed() {
        let root = tempfile::tempdir().unwrap();
        for round in 0..50 {
            let base = root.path().join(format!("r{round}"));
            let threads: Vec<_> = (0..8)
                .map(|i| {
                    let path = base.join("pods/uid/volumes").join(format!("v{i}"));
                    std::thread::spawn(move || create_dir(&path).map(|_| ()))
                })
                .collect();
            for t in threads {
                t.join().unwrap().unwrap();
            }
        }
    }

    /// The same with each thread looking first, as a publish does (its target inspected, then
    /// created): a component missing at the look's open and there at its check was made
    /// meanwhile, and is entered. It was an I/O error (NOT_FOUND to kubelet) under load.
    #[test]
    fn looks_racing_creates_of_overlapping_paths_never_fail() {
        let root = tempfile::tempdir().unwrap();
        for round in 0..300 {
            let base = root.path().join(format!("r{round}"));
            let threads: Vec<_> = (0..8)
                .map(|i| {
                    let path = base.join("pods/uid/volumes").join(format!("v{i}"));
                    std::thread::spawn(move || {
                        open_dir(&path)?;
                        create_dir(&path)?;
                        open_dir(&path).map(|found| assert!(found.is_some()))
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap().unwrap();
            }
        }
    }

    #[test]
    fn malformed_paths_are_refused_before_any_lookup() {
        type Expected = fn(&PathError) -> bool;
        let cases: [(&str, Expected); 4] = [
            ("relative/x", |e| matches!(e, PathError::NotAbsolute { .. })),
            ("/a/\0/b", |e| matches!(e, PathError::Nul { .. })),
            ("/a/../etc", |e| matches!(e, PathError::DotDot { .. })),
            ("/a/..", |e| matches!(e, PathError::DotDot { .. })),
        ];
        for (path, expected) in cases {
            let err = check(Path::new(path)).unwrap_err();
            assert!(expected(&err) && err.is_malformed(), "{path}: {err}");
        }
        let long = format!("/{}", "x".repeat(PATH_MAX));
        let err = check(Path::new(&long)).unwrap_err();
        assert!(matches!(err, PathError::TooLong { .. }));
        assert!(
            err.to_string().len() < 400,
            "a hostile path is not echoed whole"
        );
        assert_eq!(
            check(Path::new("//a/./b//c/")).unwrap(),
            PathBuf::from("/a/b/c")
        );
    }

    #[test]
    fn symlinks_anywhere_are_refused_and_nothing_is_created_through_them() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::os::unix::fs::symlink(outside.path(), root.join("link")).unwrap();
        std::fs::create_dir(root.join("real")).unwrap();
        std::fs::write(root.join("file"), "x").unwrap();

        for path in [
            root.join("link"),
            root.join("link/vol"),
            root.join("link/a/b"),
        ] {
            let err = create_dir(&path).unwrap_err();
            assert!(matches!(err, PathError::Symlink { .. }), "{err}");
            let err = open(&path).unwrap_err();
            assert!(matches!(err, PathError::Symlink { .. }), "{err}");
            assert!(!err.is_malformed());
        }
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        assert!(matches!(
            create_dir(&root.join("file/x")).unwrap_err(),
            PathError::NotDirectory { .. }
        ));
        assert!(matches!(
            open_dir(&root.join("file")).unwrap_err(),
            PathError::NotDirectory { .. }
        ));

        assert!(matches!(
            create_dir(&root.join("file")).unwrap_err(),
            PathError::NotDirectory { .. }
        ));
        // Only the last component missing (a publish's target): made in its parent.
        let (_, created) = create_dir(&root.join("real/c")).unwrap();
        assert!(created && root.join("real/c").is_dir());
        let (_, created) = create_dir(&root.join("real/a/b")).unwrap();
        assert!(created && root.join("real/a/b").is_dir());
        let entry = look(&root.join("real/a/b")).unwrap().unwrap();
        assert!(!entry.is_mount_root().unwrap());
        let (_, created) = create_dir(&root.join("real/a/b")).unwrap();
        assert!(!created, "an existing directory is not created again");
        assert!(matches!(
            open(&root.join("real/none")).unwrap(),
            Found::Absent
        ));
        assert!(matches!(open(&root.join("none/x")).unwrap(), Found::Absent));

        remove_dir(&root.join("real/a/b")).unwrap();
        assert!(!root.join("real/a/b").exists());
        remove_dir(&root.join("real/a/b")).unwrap();
        // Removal through a symlinked parent is refused, the link's target untouched.
        std::fs::create_dir(outside.path().join("keep")).unwrap();
        assert!(matches!(
            remove_dir(&root.join("link/keep")).unwrap_err(),
            PathError::Symlink { .. }
        ));
        assert!(outside.path().join("keep").is_dir());
    }

    #[test]
    fn the_root_of_a_mount_is_one() {
        let entry = look(Path::new("/proc")).unwrap().expect("/proc is there");
        assert!(entry.is_mount_root().unwrap());
    }
}
