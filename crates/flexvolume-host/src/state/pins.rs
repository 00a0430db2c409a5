//! Pinned copies of driver executables: taken at setup so a volume can be torn down after its
//! driver is removed, collected once nothing references them.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::cache::FileIdentity;
use super::{entry, hash_file, io_err, locked, StateDir, StateError};

/// The stable hash of an executable's content, read again only when the file changed.
pub(super) fn content_hash(executable: &Path) -> Result<u64, StateError> {
    let identity = |path: &Path| fs::metadata(path).map(|m| FileIdentity::of(&m));
    let before = identity(executable).map_err(io_err(executable))?;
    if let Some((_, hash)) = locked(&PIN_HASHES)
        .as_ref()
        .and_then(|m| m.get(executable))
        .filter(|(known, _)| *known == before)
    {
        return Ok(*hash);
    }
    let hash = hash_file(executable).map_err(io_err(executable))?;
    // Remembered only when the file did not change while it was read, and had settled.
    if before.settled() && identity(executable).is_ok_and(|after| after == before) {
        locked(&PIN_HASHES)
            .get_or_insert_with(HashMap::new)
            .insert(executable.to_owned(), (before, hash));
    }
    Ok(hash)
}

/// How long a pinned driver version nobody references is kept after it was last pinned.
pub const PIN_GRACE: std::time::Duration = std::time::Duration::from_secs(10 * 60);
/// The lock name that serializes pinning and collecting pins.
pub(super) const PINS_LOCK: &str = "pinned drivers";
/// Taken before [`PINS_LOCK`] within this process (see [`StateDir::pin`]).
pub(super) static PINNING: Mutex<()> = Mutex::new(());

/// Content hashes of driver executables by path and file identity: pinning at every mount
/// read and hashed the whole executable (megabytes for a compiled driver). Any change to the
/// file (a write changes its ctime, a replacement its inode) is a miss, so the hash is always
/// that of the file as it is.
pub(super) static PIN_HASHES: Mutex<Option<HashMap<PathBuf, (FileIdentity, u64)>>> =
    Mutex::new(None);

impl StateDir {
    /// Removes pinned driver copies that no record references and that nobody pinned in the
    /// last `grace` (a mount pins, then writes its record). Returns how many went. Does nothing
    /// while any record is unreadable: what it references is unknown.
    pub(crate) fn collect_pins(&self, grace: std::time::Duration) -> Result<usize, StateError> {
        let pins = self.root.join("pinned");
        let now = std::time::SystemTime::now();
        let pinned_lately = |version: &Path| {
            fs::symlink_metadata(version)
                .and_then(|m| m.modified())
                .map(|t| now.duration_since(t).unwrap_or_default() < grace)
                .unwrap_or(true)
        };
        let versions = || {
            fs::read_dir(&pins)
                .into_iter()
                .flatten()
                .flatten()
                .flat_map(|driver| fs::read_dir(driver.path()).into_iter().flatten().flatten())
                .map(|version| version.path())
        };
        // Every unmount asks; reading every record to answer is wasted while no version is past
        // its grace (the usual case: a handful of versions, pinned lately), and a burst of
        // unpublishes did it once each.
        if !versions().any(|version| !pinned_lately(&version)) {
            return Ok(0);
        }
        let _queued = locked(&PINNING);
        let _lock = self.lock_file(Path::new(PINS_LOCK), None)?;
        let mut referenced = HashSet::new();
        for record in self.list()? {
            let Ok(record) = record else { return Ok(0) };
            if let Some(dir) = record.pinned.as_deref().and_then(Path::parent) {
                referenced.insert(dir.to_owned());
            }
        }
        let mut removed = 0;
        for version in versions().collect::<Vec<_>>() {
            if referenced.contains(&version) || pinned_lately(&version) {
                continue;
            }
            fs::remove_dir_all(&version).map_err(io_err(&version))?;
            removed += 1;
        }
        for driver_dir in fs::read_dir(&pins).into_iter().flatten().flatten() {
            let _ = fs::remove_dir(driver_dir.path()); // only when empty
        }
        Ok(removed)
    }

    /// Keeps a copy of a driver executable as it is now, so a volume mounted through it can be
    /// torn down after the driver is removed. Hard link when possible (no copy), else a copy.
    pub fn pin(&self, dir_name: &str, executable: &Path) -> Result<PathBuf, StateError> {
        let hash = content_hash(executable)?;
        // Against collect_pins removing this version between our look and our record. This
        // process's pins queue on a mutex first: a burst of publishes all blocked in flock(2) is
        // woken all at once at every release, and only one of them gets it.
        let _queued = locked(&PINNING);
        let _lock = self.lock_file(Path::new(PINS_LOCK), None)?;
        let name = executable.file_name().unwrap_or_default();
        let dir = self
            .root
            .join("pinned")
            .join(dir_name)
            .join(format!("{hash:016x}"));
        let pinned = dir.join(name);
        if pinned.exists() {
            // Pinned again: collect_pins keeps it for the grace period from now.
            entry::open_dir(&dir)
                .and_then(|d| d.set_modified(std::time::SystemTime::now()))
                .map_err(io_err(&dir))?;
            return Ok(pinned);
        }
        entry::create_private_dir_all(&dir).map_err(io_err(&dir))?;
        if fs::hard_link(executable, &pinned).is_err() {
            let temp = dir.join(format!(".copy.{}", std::process::id()));
            // Created afresh: whatever a crash (or anyone) left at the name is not written through.
            let copied = entry::create_fresh(&temp)
                .and_then(|mut copy| {
                    let mut source = File::open(executable)?;
                    io::copy(&mut source, &mut copy)?;
                    copy.set_permissions(source.metadata()?.permissions())
                })
                .map_err(io_err(&temp))
                .and_then(|_| fs::rename(&temp, &pinned).map_err(io_err(&pinned)));
            if let Err(e) = copied {
                let _ = fs::remove_file(&temp);
                return Err(e);
            }
        }
        Ok(pinned)
    }
}
