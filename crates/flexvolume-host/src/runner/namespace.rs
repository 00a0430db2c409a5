//! Running call-outs in another mount namespace than flexd's (`--driver-mount-namespace`).
//!
//! Drivers were written for the host, as kubelet ran them: they call the host's tools
//! (`mount.nfs`, `iscsiadm`, vendor CLIs) and their mounts must land where kubelet looks. When
//! flexd runs in a container, its own mount namespace has neither. The driver process therefore
//! enters the namespace named here between fork and exec, after everything flexd prepares in
//! its own namespace (pipes, `/dev/null`, the process group, the cgroup it joins through an fd
//! opened beforehand), so the driver's executable and everything it touches resolve there.
//!
//! Why in the forked child and not in a thread of flexd: `setns(CLONE_NEWNS)` refuses a thread
//! that shares its filesystem context (`fs_struct`) with other threads, which every thread of a
//! multi-threaded process does; a forked child has its own. The child path also works the same
//! whether the child is forked by the runner's thread, by a cgroup v1 spawner thread, or joins
//! its cgroup v2 itself. Only the start-up checks below use a short-lived thread, which first
//! stops sharing its filesystem context (`unshare(CLONE_FS)`).
//!
//! flexd's own work stays in flexd's namespace: state, locks, sockets, the mounts flexd makes
//! itself and its reads of the mount table (see docs/lifecycle.md, "Drivers in the host's mount
//! namespace", for why that is correct only where the paths it shares with drivers are the same
//! directories, with mounts propagating, in both).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::thread::{LinkNameSpaceType, UnshareFlags};

/// `f_type` of nsfs, the filesystem of `/proc/<pid>/ns/*` and of their bind mounts.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// Why a mount namespace cannot be used for drivers.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    #[error("cannot open the driver mount namespace {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path} is not a namespace file: give a mount namespace, such as /proc/1/ns/mnt \
         (with hostPID) or a bind mount of one"
    )]
    NotNamespace { path: PathBuf },
    #[error("{path} is a namespace, but not a mount namespace (give e.g. /proc/1/ns/mnt)")]
    NotMountNamespace { path: PathBuf },
    #[error(
        "cannot enter the driver mount namespace {path}: {source} (flexd needs CAP_SYS_ADMIN \
         and CAP_SYS_CHROOT, and the namespace must belong to a user namespace flexd is \
         privileged in)"
    )]
    Enter {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{dir} is {what} in the driver mount namespace {path}: drivers are executed from it \
         there, so it must be the same directory at the same path in both namespaces (e.g. a \
         hostPath volume mounted at its host path)"
    )]
    NotShared {
        dir: PathBuf,
        path: PathBuf,
        what: String,
    },
    #[error(
        "cannot read a mount table to compare with the driver mount namespace {path}: {source}"
    )]
    MountTable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// An open mount namespace that driver processes enter before they exec. Cheap to clone; the
/// namespace file is opened once (close-on-exec, so no driver inherits it).
#[derive(Clone)]
pub struct MountNamespace {
    path: PathBuf,
    fd: Arc<OwnedFd>,
}

impl std::fmt::Debug for MountNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("MountNamespace").field(&self.path).finish()
    }
}

impl MountNamespace {
    /// Opens the namespace at `path` and makes sure it is a mount namespace flexd can enter, so
    /// that a wrong path fails at start, not at the first call-out.
    pub fn open(path: &Path) -> Result<Self, NamespaceError> {
        let fd = rustix::fs::open(
            path,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| NamespaceError::Open {
            path: path.to_owned(),
            source: e.into(),
        })?;
        let statfs = rustix::fs::fstatfs(&fd).map_err(|e| NamespaceError::Open {
            path: path.to_owned(),
            source: e.into(),
        })?;
        // `f_type`'s integer type differs between architectures.
        #[allow(clippy::unnecessary_cast)]
        if statfs.f_type as i64 != NSFS_MAGIC {
            return Err(NamespaceError::NotNamespace {
                path: path.to_owned(),
            });
        }
        let namespace = Self {
            path: path.to_owned(),
            fd: Arc::new(fd),
        };
        // Entering it for real is the only complete check (type, privileges, user namespace).
        namespace.inside(|| ())?;
        Ok(namespace)
    }

    /// The path it was opened from, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks that each of `dirs` that exists in flexd's namespace is the same directory (same
    /// device and inode) at the same path in this one: drivers and their pinned copies are
    /// executed by the paths flexd knows them by, but from inside this namespace.
    pub fn check_same_dirs(&self, dirs: &[&Path]) -> Result<(), NamespaceError> {
        // Absolute: the namespace's working directory is its root, not flexd's.
        let ours: Vec<(PathBuf, Option<(u64, u64)>)> = dirs
            .iter()
            .map(|d| std::path::absolute(d).unwrap_or_else(|_| d.to_path_buf()))
            .map(|d| {
                let id = identity(&d);
                (d, id)
            })
            .collect();
        let theirs: Vec<Option<(u64, u64)>> = self.inside({
            let dirs: Vec<PathBuf> = ours.iter().map(|(d, _)| d.clone()).collect();
            move || dirs.iter().map(|d| identity(d)).collect()
        })?;
        for ((dir, ours), theirs) in ours.into_iter().zip(theirs) {
            let Some(ours) = ours else { continue };
            let what = match theirs {
                None => "missing",
                Some(theirs) if theirs != ours => "another directory",
                Some(_) => continue,
            };
            return Err(NamespaceError::NotShared {
                dir,
                path: self.path.clone(),
                what: what.to_owned(),
            });
        }
        Ok(())
    }

    /// How mounts made below `dir` travel between flexd's namespace and this one, from the
    /// peer groups of the mount holding `dir` in each (mountinfo's `shared:N` / `master:N`;
    /// the numbers are the kernel's, the same in every namespace).
    pub fn propagation(&self, dir: &Path) -> Result<Propagation, NamespaceError> {
        let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
        let read_err = |source| NamespaceError::MountTable {
            path: self.path.clone(),
            source,
        };
        let ours = std::fs::read_to_string("/proc/self/mountinfo").map_err(read_err)?;
        // Through flexd's /proc, opened before entering: the namespace's own /proc (if any)
        // may belong to another pid namespace, where this thread has another id or none.
        let proc = rustix::fs::open(
            "/proc",
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| read_err(e.into()))?;
        let theirs = self
            .inside(move || -> io::Result<String> {
                let fd = rustix::fs::openat(
                    &proc,
                    "thread-self/mountinfo",
                    rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )?;
                io::read_to_string(std::fs::File::from(fd))
            })?
            .map_err(read_err)?;
        let (Some(ours), Some(theirs)) = (peers_of(&ours, &dir), peers_of(&theirs, &dir)) else {
            return Ok(Propagation::Neither);
        };
        Ok(match (ours, theirs) {
            ((Some(a), _), (Some(b), _)) if a == b => Propagation::BothWays,
            ((_, Some(master)), (Some(b), _)) if master == b => Propagation::IntoFlexdOnly,
            _ => Propagation::Neither,
        })
    }

    /// Runs `f` in a short-lived thread that has entered the namespace. The thread stops
    /// sharing its filesystem context first, so flexd's other threads stay where they are.
    fn inside<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, NamespaceError> {
        let fd = self.fd.as_fd();
        let entered = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("flexd-mntns".into())
                .spawn_scoped(scope, move || -> io::Result<T> {
                    // SAFETY: CLONE_FS only: this thread gets its own root, working directory
                    // and umask; file descriptors stay shared, so no fd is hidden from anyone.
                    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::FS)? };
                    enter(fd)?;
                    Ok(f())
                })
                .map(|thread| thread.join())
        });
        let enter_err = |source| NamespaceError::Enter {
            path: self.path.clone(),
            source,
        };
        match entered {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(e))) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                Err(NamespaceError::NotMountNamespace {
                    path: self.path.clone(),
                })
            }
            Ok(Ok(Err(source))) | Err(source) => Err(enter_err(source)),
            Ok(Err(_)) => Err(enter_err(io::Error::other(
                "the thread entering it panicked",
            ))),
        }
    }

    /// The descriptor a starting driver enters (see `runner/spawn.rs`).
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Whether a mount made below a directory in one namespace appears in the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// Peers (`mountPropagation: Bidirectional`): drivers' mounts reach flexd, flexd's reach
    /// the driver's namespace.
    BothWays,
    /// flexd's side is a slave of the other (`HostToContainer`): drivers' mounts reach flexd,
    /// the mounts flexd makes itself stay in its namespace.
    IntoFlexdOnly,
    /// Neither way.
    Neither,
}

/// A mount's peer group (`shared:N`) and the group it is a slave of (`master:N`), if any.
type Peers = (Option<u64>, Option<u64>);

/// The [`Peers`] of the mount that holds `dir` in a mount table: the last mount listed at the
/// longest mount point above `dir` (later mounts cover earlier ones). `None` when no mount
/// holds it.
fn peers_of(mountinfo: &str, dir: &Path) -> Option<Peers> {
    flexvolume_os::mount::mount_holding(mountinfo, dir).map(|m| (m.shared, m.master))
}

/// Device and inode of `dir`, or `None` when it cannot be looked at.
fn identity(dir: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
}

fn enter(fd: BorrowedFd<'_>) -> io::Result<()> {
    rustix::thread::move_into_link_name_space(fd, Some(LinkNameSpaceType::Mount))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 0:21 / / rw - overlay overlay rw
30 22 0:30 / /var/lib/kubelet rw shared:7 - ext4 /dev/sda1 rw
31 22 0:31 / /var/lib/flexd rw master:9 - ext4 /dev/sda1 rw
32 30 0:32 / /var/lib/kubelet/pods/x rw - tmpfs tmpfs rw
33 22 0:33 / /var/lib/kubelet rw shared:8 master:7 - ext4 /dev/sda1 rw
";

    #[test]
    fn the_mount_holding_a_dir_gives_its_peer_groups() {
        let peers = |dir: &str| peers_of(TABLE, Path::new(dir));
        // The later mount on /var/lib/kubelet covers the first.
        assert_eq!(peers("/var/lib/kubelet/plugins"), Some((Some(8), Some(7))));
        assert_eq!(peers("/var/lib/kubelet/pods/x/v"), Some((None, None)));
        assert_eq!(peers("/var/lib/flexd/devices"), Some((None, Some(9))));
        assert_eq!(peers("/etc"), Some((None, None)));
        assert_eq!(peers_of("", Path::new("/etc")), None);
    }
}
