//! The parallel walk: one rayon task per directory, every call relative to an open directory
//! descriptor. A directory's own group and mode are set through its descriptor (it is open
//! anyway, to be read); other entries through `*at` calls with `AT_SYMLINK_NOFOLLOW`.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rustix::fs::{self, AtFlags, FileType, Gid, Mode, OFlags, RawDir};
use rustix::io::Errno;

use super::rules::{self, Policy};
use super::{
    Counters, EntryError, OwnershipError, OwnershipReport, OwnershipRequest, MAX_REPORTED_ERRORS,
};

/// Called with (directory, entry name) before an entry is examined.
pub(crate) type EntryHook = dyn Fn(BorrowedFd<'_>, &CStr) + Sync;

/// `fchmodat2`'s number: new syscalls share one number on every architecture.
const SYS_FCHMODAT2: libc::c_long = 452;
/// Set once `fchmodat2` is known to be missing (kernels before 6.6).
static FCHMODAT2_MISSING: AtomicBool = AtomicBool::new(false);

struct Walk<'a> {
    root: &'a Path,
    gid: u32,
    read_only: bool,
    counters: &'a Counters,
    errors: Mutex<Vec<EntryError>>,
    before_entry: &'a EntryHook,
}

pub fn run(
    request: &OwnershipRequest<'_>,
    counters: &Counters,
    before_entry: &EntryHook,
) -> Result<OwnershipReport, OwnershipError> {
    let open_error = |source: Errno| OwnershipError::OpenRoot {
        path: request.root.to_owned(),
        source: source.into(),
    };
    // NONBLOCK: a root that is a fifo must not hang the open.
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let root = fs::open(request.root, flags, Mode::empty()).map_err(open_error)?;
    let stat = fs::fstat(&root).map_err(open_error)?;
    let walk = Walk {
        root: request.root,
        gid: request.gid,
        read_only: request.read_only,
        counters,
        errors: Mutex::new(Vec::new()),
        before_entry,
    };
    let mut walkers = 0;
    let skipped = request.policy == Policy::OnRootMismatch
        && rules::root_is_right(stat.st_mode, stat.st_gid, request.gid, request.read_only);
    if !skipped {
        if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
            walkers = super::walkers_for(request.threads);
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(walkers)
                .thread_name(|i| format!("flexd-ownership-{i}"))
                .build()
                .map_err(|e| OwnershipError::Threads(e.to_string()))?;
            let root = Arc::new(root.try_clone().map_err(|e| OwnershipError::OpenRoot {
                path: request.root.to_owned(),
                source: e,
            })?);
            let walk = &walk;
            pool.scope(move |scope| walk.read_dir(scope, root, PathBuf::new()));
        }
        // Last, so that a pass cut short leaves the root wrong and OnRootMismatch redoes it.
        walk.fix_by_fd(&root)
            .map_err(|(_, source)| OwnershipError::ChangeRoot {
                path: request.root.to_owned(),
                source: source.into(),
            })?;
    } else {
        counters.entries.fetch_add(1, Ordering::Relaxed);
    }
    let errors = walk.errors.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(OwnershipReport {
        root: request.root.to_owned(),
        gid: request.gid,
        skipped,
        entries: counters.entries.load(Ordering::Relaxed),
        chowned: counters.chowned.load(Ordering::Relaxed),
        chmodded: counters.chmodded.load(Ordering::Relaxed),
        vanished: counters.vanished.load(Ordering::Relaxed),
        walkers,
        error_count: counters.errors.load(Ordering::Relaxed),
        errors,
        seconds: 0.0,
    })
}

impl<'a> Walk<'a> {
    /// Examines every entry of an open directory; subdirectories become tasks of their own.
    fn read_dir<'s>(&'s self, scope: &rayon::Scope<'s>, dir: Arc<OwnedFd>, rel: PathBuf) {
        let mut buffer = Vec::with_capacity(32 * 1024);
        let mut entries = RawDir::new(dir.as_fd(), buffer.spare_capacity_mut());
        while let Some(entry) = entries.next() {
            let entry = match entry {
                Ok(entry) => entry,
                Err(errno) => {
                    self.record(&rel, None, "read dir", errno);
                    return;
                }
            };
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            (self.before_entry)(dir.as_fd(), name);
            let is_dir = match entry.file_type() {
                FileType::Directory => true,
                _ => self.fix_entry(dir.as_fd(), name, &rel) == Examined::Directory,
            };
            if is_dir {
                let parent = Arc::clone(&dir);
                let name = name.to_owned();
                let rel = rel.join(OsStr::from_bytes(name.to_bytes()));
                scope.spawn(move |scope| self.visit_dir(scope, parent, name, rel));
            }
        }
    }

    /// Opens a subdirectory (never through a symlink), fixes it through its descriptor, and
    /// reads it.
    fn visit_dir<'s>(
        &'s self,
        scope: &rayon::Scope<'s>,
        parent: Arc<OwnedFd>,
        name: CString,
        rel: PathBuf,
    ) {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let dir = match fs::openat(parent.as_fd(), &name, flags, Mode::empty()) {
            Ok(dir) => dir,
            Err(Errno::NOENT) => {
                self.counters.vanished.fetch_add(1, Ordering::Relaxed);
                return;
            }
            // Replaced by a file or a symlink since it was listed: an entry like any other.
            Err(Errno::NOTDIR) | Err(Errno::LOOP) => {
                let parent_rel = rel.parent().unwrap_or(Path::new(""));
                self.fix_entry(parent.as_fd(), &name, parent_rel);
                return;
            }
            Err(errno) => {
                self.record(&rel, None, "open", errno);
                return;
            }
        };
        drop(parent);
        if let Err((operation, errno)) = self.fix_by_fd(&dir) {
            self.record(&rel, None, operation, errno);
        }
        self.read_dir(scope, Arc::new(dir), rel);
    }

    /// Gives an entry that is not a directory its group and mode. A directory (known only
    /// after the stat when the listing did not say) is left to its own task.
    fn fix_entry(&self, dir: BorrowedFd<'_>, name: &CStr, rel: &Path) -> Examined {
        let stat = match fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(errno) => {
                self.failed(rel, name, "stat", errno);
                return Examined::Gone;
            }
        };
        if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
            return Examined::Directory;
        }
        self.counters.entries.fetch_add(1, Ordering::Relaxed);
        let plan = rules::plan(stat.st_mode, stat.st_gid, self.gid, self.read_only);
        if plan.chown {
            let group = Some(Gid::from_raw(self.gid));
            match fs::chownat(dir, name, None, group, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(()) => {
                    self.counters.chowned.fetch_add(1, Ordering::Relaxed);
                }
                Err(errno) => {
                    self.failed(rel, name, "chown", errno);
                    return Examined::Gone;
                }
            }
        }
        if let Some(mode) = plan.chmod {
            match chmod_no_follow(dir, name, mode) {
                Ok(()) => {
                    self.counters.chmodded.fetch_add(1, Ordering::Relaxed);
                }
                // Swapped for a symlink since the stat: symlinks are not chmod-ed.
                Err(Errno::OPNOTSUPP) => {}
                Err(errno) => self.failed(rel, name, "chmod", errno),
            }
        }
        Examined::Fixed
    }

    /// Gives an open entry (a directory, or the root) its group and mode.
    fn fix_by_fd(&self, fd: &OwnedFd) -> Result<(), (&'static str, Errno)> {
        let stat = fs::fstat(fd).map_err(|e| ("stat", e))?;
        self.counters.entries.fetch_add(1, Ordering::Relaxed);
        let plan = rules::plan(stat.st_mode, stat.st_gid, self.gid, self.read_only);
        if plan.chown {
            fs::fchown(fd, None, Some(Gid::from_raw(self.gid))).map_err(|e| ("chown", e))?;
            self.counters.chowned.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(mode) = plan.chmod {
            fs::fchmod(fd, Mode::from_raw_mode(mode)).map_err(|e| ("chmod", e))?;
            self.counters.chmodded.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// A failed call on one entry: vanished entries are counted, anything else recorded.
    fn failed(&self, rel: &Path, name: &CStr, operation: &'static str, errno: Errno) {
        match errno {
            Errno::NOENT => {
                self.counters.vanished.fetch_add(1, Ordering::Relaxed);
            }
            _ => self.record(rel, Some(name), operation, errno),
        }
    }

    fn record(&self, rel: &Path, name: Option<&CStr>, operation: &'static str, errno: Errno) {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        let Ok(mut errors) = self.errors.lock() else {
            return;
        };
        if errors.len() < MAX_REPORTED_ERRORS {
            let mut path = self.root.join(rel);
            if let Some(name) = name {
                path.push(OsStr::from_bytes(name.to_bytes()));
            }
            errors.push(EntryError {
                path,
                operation,
                error: std::io::Error::from(errno).to_string(),
            });
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Examined {
    Fixed,
    Directory,
    Gone,
}

/// chmod of `name` in `dir` that never follows a symlink, even one swapped in after the stat:
/// a pod sharing the volume could otherwise point a name at /etc/shadow at the right moment.
fn chmod_no_follow(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> Result<(), Errno> {
    if !FCHMODAT2_MISSING.load(Ordering::Relaxed) {
        // SAFETY: fchmodat2(int dirfd, const char *path, mode_t mode, unsigned flags); the fd
        // and the NUL-terminated name outlive the call.
        let result = unsafe {
            libc::syscall(
                SYS_FCHMODAT2,
                dir.as_raw_fd(),
                name.as_ptr(),
                mode as libc::c_uint,
                libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
            )
        };
        if result == 0 {
            return Ok(());
        }
        let errno = Errno::from_raw_os_error(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        );
        if errno != Errno::NOSYS {
            return Err(errno);
        }
        FCHMODAT2_MISSING.store(true, Ordering::Relaxed);
    }
    // Older kernels: pin the inode with an O_PATH descriptor, refuse a symlink, and chmod the
    // pinned inode through /proc (what glibc does for fchmodat with AT_SYMLINK_NOFOLLOW).
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let pinned = fs::openat(dir, name, flags, Mode::empty())?;
    if FileType::from_raw_mode(fs::fstat(&pinned)?.st_mode) == FileType::Symlink {
        return Err(Errno::OPNOTSUPP);
    }
    fs::chmod(
        format!("/proc/self/fd/{}", pinned.as_raw_fd()),
        Mode::from_raw_mode(mode),
    )
}

#[cfg(test)]
mod tests {
    //! The walk on real trees (any user can run these: the group is one the user belongs to
    //! only when root; as a non-root user, the tests use the user's own group).
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn own_gid() -> u32 {
        rustix::process::getegid().as_raw()
    }

    /// The gid a pass should change entries to: another group as root, our own otherwise.
    fn target_gid() -> u32 {
        if rustix::process::geteuid().is_root() {
            4321
        } else {
            own_gid()
        }
    }

    fn request(root: &Path, gid: u32) -> OwnershipRequest<'_> {
        OwnershipRequest {
            root,
            gid,
            policy: Policy::Always,
            read_only: false,
            threads: 2,
        }
    }

    #[test]
    fn a_file_that_vanishes_mid_walk_is_counted_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..20 {
            std::fs::write(dir.path().join(format!("f{i}")), b"x").unwrap();
        }
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/victim"), b"x").unwrap();
        let gid = target_gid();
        // Just before "victim" is examined, it is removed: the listing named it, the stat
        // finds nothing.
        let hook = |dir: BorrowedFd<'_>, name: &CStr| {
            if name == c"victim" {
                fs::unlinkat(dir, name, AtFlags::empty()).unwrap();
            }
        };
        let counters = Counters::default();
        let report = super::super::apply_observed(&request(dir.path(), gid), &counters, &hook)
            .expect("pass");
        assert_eq!(report.vanished, 1);
        assert_eq!(report.error_count, 0, "{:?}", report.errors);
        // root + 20 files + sub
        assert_eq!(report.entries, 22);
        let mode = std::fs::metadata(dir.path().join("f3")).unwrap().mode();
        assert_eq!(mode & 0o070, 0o060);
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_mid_walk_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        std::fs::write(&secret, b"x").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let outside_path = outside.path().to_owned();
        // After "d" is listed as a directory, it becomes a symlink to a directory outside.
        let hook = move |parent: BorrowedFd<'_>, name: &CStr| {
            if name == c"d" {
                fs::unlinkat(parent, name, AtFlags::REMOVEDIR).unwrap();
                fs::symlinkat(&outside_path, parent, name).unwrap();
            }
        };
        let counters = Counters::default();
        let report =
            super::super::apply_observed(&request(dir.path(), target_gid()), &counters, &hook)
                .expect("pass");
        assert_eq!(report.error_count, 0, "{:?}", report.errors);
        let mode = std::fs::metadata(&secret).unwrap().mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "the walk followed the swapped-in symlink"
        );
        let outside_mode = std::fs::metadata(outside.path()).unwrap().mode();
        assert_eq!(outside_mode & 0o2000, 0, "the outside dir got setgid");
    }

    #[test]
    fn walkers_are_clamped_to_a_small_multiple_of_the_cores() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let most = super::super::max_walkers();
        assert!(most <= super::super::MAX_WALKERS);
        assert!(most <= cores * super::super::WALKERS_PER_CORE);
        assert_eq!(super::super::walkers_for(100_000), most);
        assert_eq!(super::super::walkers_for(usize::MAX), most);
        assert_eq!(super::super::walkers_for(1), 1);
        assert_eq!(super::super::walkers_for(0), cores.min(most));
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut huge = request(dir.path(), target_gid());
        huge.threads = 100_000;
        let report = super::super::apply(&huge, &Counters::default()).expect("pass");
        assert_eq!(report.walkers, most);
    }

    #[test]
    fn the_unset_gid_is_refused_before_anything_changes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let before = std::fs::metadata(&file).unwrap();
        let counters = Counters::default();
        let error = super::super::apply(&request(dir.path(), u32::MAX), &counters).unwrap_err();
        assert!(
            matches!(error, OwnershipError::UnsetId { id: u32::MAX }),
            "{error}"
        );
        assert_eq!(counters.entries(), 0);
        let after = std::fs::metadata(&file).unwrap();
        assert_eq!((after.mode(), after.gid()), (before.mode(), before.gid()));
        assert!(super::super::check_gid(u32::MAX - 1).is_ok());
    }

    #[test]
    fn an_unreadable_root_is_an_error_naming_it() {
        let counters = Counters::default();
        let missing = Path::new("/nonexistent/flexd-ownership-root");
        let error = super::super::apply(&request(missing, own_gid()), &counters).unwrap_err();
        assert!(
            error.to_string().contains("flexd-ownership-root"),
            "{error}"
        );
    }
}
