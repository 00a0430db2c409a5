//! Locks on targets, devices and names: `flock`s on files under `<state-dir>/locks/`, across
//! threads and processes.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{entry, id_of, io_err, StateDir, StateError};

/// An exclusive lock, released when dropped and every driver process that inherited it (see
/// [`crate::runner::RunnerConfig::held_locks`]) has exited, or when they all die.
///
/// Lock files of volumes that are gone would pile up in `locks/` (one per target, device and
/// provisioned name ever used), so a guard dropped when no record of its name is left removes
/// its file *while still holding the lock*. Whoever opened the file before that and waits in
/// `flock` then holds a lock on an unlinked inode: [`StateDir::lock`] checks after every
/// `flock` that the name still leads to the inode it locked, and starts again otherwise. So two
/// holders never overlap, and nobody needs to know whether anyone else is waiting.
pub struct Lock {
    file: Arc<File>,
    path: PathBuf,
    /// The record whose absence means the lock file can go; `None`: a lock kept for good (the
    /// one of pinned drivers, taken at every pin).
    removable_without: Option<PathBuf>,
}

impl Drop for Lock {
    fn drop(&mut self) {
        let Some(record) = &self.removable_without else {
            return;
        };
        // A driver's configuration still holds the file (see `share`): the lock outlives this
        // guard, so its file must stay the one the name leads to.
        if Arc::strong_count(&self.file) > 1 {
            return;
        }
        let gone =
            matches!(fs::symlink_metadata(record), Err(e) if e.kind() == io::ErrorKind::NotFound);
        if gone {
            // Still locked here: the flock is released when `file` closes, after this.
            let _ = fs::remove_file(&self.path);
        }
    }
}

pub(super) fn same_inode(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

impl Lock {
    /// The locked file, for a driver process to inherit.
    pub fn share(&self) -> Arc<File> {
        self.file.clone()
    }
}

impl StateDir {
    /// Locks a name (a target path, a device mount dir) until the guard is dropped. The lock
    /// file goes with the guard when no record of that name is left (see [`Lock`]).
    pub fn lock(&self, what: &Path) -> Result<Lock, StateError> {
        self.lock_file(what, Some(self.record_path(what)))
    }

    /// Takes the lock of `what`; `removable_without`: see [`Lock`].
    pub(super) fn lock_file(
        &self,
        what: &Path,
        removable_without: Option<PathBuf>,
    ) -> Result<Lock, StateError> {
        let dir = self.root.join("locks");
        entry::create_private_dir_all(&dir).map_err(io_err(&dir))?;
        let path = dir.join(format!("{}.lock", id_of(what)));
        let flock_err = |e: rustix::io::Errno| StateError::Io {
            path: path.clone(),
            source: e.into(),
        };
        let mut said_waiting = false;
        loop {
            // Not followed, not waited on: a FIFO or link at the name fails this lock alone.
            let file = entry::open_for_writing(&path).map_err(|e| StateError::opening(&path, e))?;
            // Tried without blocking first, so a wait behind another operation (a mount stuck
            // in a slow driver, another flexd) is said once instead of looking like a hang.
            match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    if !said_waiting {
                        said_waiting = true;
                        tracing::info!(
                            lock = %path.display(),
                            what = %what.display(),
                            "waiting for {}: another operation holds it",
                            path.display()
                        );
                    }
                    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
                        .map_err(flock_err)?;
                }
                Err(e) => return Err(flock_err(e)),
            }
            // The holder we waited for may have removed the file (its volume gone) after we
            // opened it: a lock on an unlinked inode excludes nobody who opens the name now.
            // Held only when the name still leads to the inode we locked; otherwise again.
            let held = file.metadata().map_err(io_err(&path))?;
            match fs::symlink_metadata(&path) {
                Ok(named) if same_inode(&named, &held) => {
                    return Ok(Lock {
                        file: Arc::new(file),
                        path,
                        removable_without,
                    })
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&path)(e)),
            }
        }
    }
}
