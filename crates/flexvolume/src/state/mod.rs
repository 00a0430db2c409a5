//! What must survive a crash to undo an operation: one record per mounted target.
//!
//! `<state-dir>/volumes/<id>.json`, written atomically (temporary file in the same directory,
//! fsync, rename, fsync of the directory), so a crash leaves the old record or the new one,
//! never half of one. Secrets are never written. One such write per operation: the step that only
//! says an operation finished (`Mounting` to `Mounted`, nothing else changed) is an empty marker
//! file `<id>.mounted` beside the record, not synced: a crash that loses it leaves the record
//! at `Mounting`, the state every operation and reconcile already finish or undo. Locks are `flock`s on files under
//! `<state-dir>/locks/`: they serialize operations on one target (or one device) across threads
//! *and* across separate `flexd` processes, and vanish with a crashed process.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::name::DriverName;

mod entry;
mod watch;
use entry::OpenError;
pub(crate) use entry::{create_fresh, open_dir};
pub use entry::{EntryKind, MAX_RECORD_BYTES};
use watch::RecordWatch;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("state record {path} is corrupt: {message}")]
    Corrupt { path: PathBuf, message: String },
    /// Something other than a regular file of a record's size where a state file is named:
    /// skipped, never followed, waited on or read. The path is escaped (`{:?}`): its name is
    /// anything a directory can hold.
    #[error("state entry {path:?} is not a record: it is {kind}")]
    NotARecord { path: PathBuf, kind: EntryKind },
}

impl StateError {
    /// The file the error is about.
    pub fn path(&self) -> Option<&Path> {
        match self {
            StateError::Io { path, .. }
            | StateError::Corrupt { path, .. }
            | StateError::NotARecord { path, .. } => Some(path),
        }
    }

    fn opening(path: &Path, e: OpenError) -> Self {
        match e {
            OpenError::Io(source) => StateError::Io {
                path: path.to_owned(),
                source,
            },
            OpenError::NotRegular(kind) => StateError::NotARecord {
                path: path.to_owned(),
                kind,
            },
        }
    }
}

/// The bytes of the record file at `path`, `None` when there is none: the one way record
/// files are read (see `entry.rs`: never blocks, never follows a link, at most
/// [`MAX_RECORD_BYTES`]).
pub(crate) fn read_record_file(path: &Path) -> Result<Option<Vec<u8>>, StateError> {
    match entry::read_record(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(OpenError::Io(e)) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StateError::opening(path, e)),
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_owned(),
        source,
    }
}

/// How far a volume's setup got.
///
/// The record is written *before* each step with an effect (attach, the target's mount), so a
/// crash at any point leaves a record from which unmount undoes whatever was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Setup is under way (or was, when flexd crashed): the volume may be attached, its device
    /// mounted, the target mounted.
    #[serde(alias = "device-mounted")]
    Mounting,
    /// Mounted on the target.
    Mounted,
}

/// Which operation a record belongs to, and so how it is torn down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// The whole node flow on one target (`flexd volume mount`): attach, device mount, mount.
    #[default]
    Mount,
    /// CSI NodeStage: waitforattach + mountdevice onto the staging path (the record's target).
    Stage,
    /// CSI NodePublish: the driver's mount (or a bind of the staging path) onto the target.
    Publish,
    /// CSI ControllerPublish: an attach of a volume to a node; the target is a name under
    /// `<state-dir>/attachments/`, never a mount point.
    Attach,
}

/// Everything needed to tear a volume down exactly as it was set up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub target: PathBuf,
    /// Written as the plain `vendor/driver` string; a record whose name is not a valid driver
    /// name does not load (it is reported as corrupt rather than used to build paths).
    #[serde(deserialize_with = "driver_name")]
    pub driver: DriverName,
    pub volume_name: String,
    pub fs_type: String,
    pub read_only: bool,
    /// The user's options (never secrets).
    pub options: BTreeMap<String, String>,
    pub attachable: bool,
    pub node: String,
    pub device: Option<String>,
    pub device_mount_dir: Option<PathBuf>,
    /// The name detach receives (getvolumename's answer with `/` as `~`, or the volume name).
    pub detach_name: String,
    /// A copy of the driver executable as it was at mount time, for teardown after removal.
    pub pinned: Option<PathBuf>,
    /// Whether flexd created the target directory (and so removes it on teardown).
    pub created_target: bool,
    pub stage: Stage,
    /// Absent in records written before CSI serving: those are whole-flow mounts.
    #[serde(default)]
    pub role: Role,
}

impl VolumeRecord {
    /// The volume's spec as it was mounted, without secrets (they are never stored).
    pub fn spec(&self) -> Result<crate::spec::VolumeSpec, StateError> {
        let mut spec = crate::spec::VolumeSpec::new(self.volume_name.clone(), self.driver.clone());
        spec.fs_type = self.fs_type.clone();
        spec.read_only = self.read_only;
        spec.options = self.options.clone();
        Ok(spec)
    }
}

/// Reads a record's driver name, validating it as any other name from outside is.
fn driver_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<DriverName, D::Error> {
    let text = String::deserialize(d)?;
    DriverName::parse(&text)
        .map_err(|e| serde::de::Error::custom(format!("driver name {text:?}: {e}")))
}

/// A record parsed, or why it cannot be.
fn parse(path: &Path, bytes: &[u8]) -> Result<VolumeRecord, StateError> {
    serde_json::from_slice(bytes).map_err(|e| StateError::Corrupt {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// The stable hash of an executable's content, read again only when the file changed.
fn content_hash(executable: &Path) -> Result<u64, StateError> {
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

/// FNV-1a: a stable 64-bit hash (std's hasher may change between Rust versions, and these
/// names live on disk across upgrades).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    stable_hash_update(STABLE_HASH_START, bytes)
}

const STABLE_HASH_START: u64 = 0xcbf2_9ce4_8422_2325;

fn stable_hash_update(mut hash: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// [`stable_hash`] of a file's content, read in small pieces: a driver executable can be large
/// (a multi-call binary of 150 MB), and every publish pins one, many at once under load.
/// Reading each whole into memory got flexd OOM-killed under its 256 MiB limit by Kubernetes'
/// storage e2e suite.
fn hash_file(path: &Path) -> io::Result<u64> {
    use std::io::Read as _;
    let mut file = File::open(path)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut hash = STABLE_HASH_START;
    loop {
        match file.read(&mut buf) {
            Ok(0) => return Ok(hash),
            Ok(n) => hash = stable_hash_update(hash, &buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn id_of(target: &Path) -> String {
    format!(
        "{:016x}",
        stable_hash(target.as_os_str().as_encoded_bytes())
    )
}

/// How long a pinned driver version nobody references is kept after it was last pinned.
pub const PIN_GRACE: std::time::Duration = std::time::Duration::from_secs(10 * 60);
/// The lock name that serializes pinning and collecting pins.
const PINS_LOCK: &str = "pinned drivers";
/// Taken before [`PINS_LOCK`] within this process (see [`StateDir::pin`]).
static PINNING: Mutex<()> = Mutex::new(());

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    pub root: PathBuf,
    /// Records parsed before, by file, with the identity of the file they came from: every save
    /// renames a new file into place (a new inode), so an unchanged identity is an unchanged
    /// record. Listing then costs a directory read and a stat per record, not a parse: publish
    /// lists every record to refuse overlaps, and did so with a parse each (quadratic under a
    /// burst of publishes).
    parsed: Arc<Mutex<RecordCache>>,
}

/// Parsed records keyed by id (the file name without `.json`).
#[derive(Debug, Default)]
struct RecordCache {
    records: HashMap<String, Parsed>,
    watching: Watching,
    /// The record files found unreadable and logged: each is logged once while it stays so,
    /// not at every listing (every publish lists).
    logged_unreadable: HashSet<PathBuf>,
}

impl RecordCache {
    /// Logs the entries newly found unreadable, and forgets those no longer in `errors`.
    fn log_unreadable(&mut self, errors: &[StateError]) {
        let now: HashSet<&Path> = errors.iter().filter_map(StateError::path).collect();
        self.logged_unreadable.retain(|p| now.contains(p.as_path()));
        for e in errors {
            let Some(path) = e.path() else { continue };
            if self.logged_unreadable.insert(path.to_owned()) {
                // `?`: the name is escaped, whatever it holds.
                tracing::warn!(entry = ?path, error = %e, "skipping an unreadable entry of the state dir's volumes");
            }
        }
    }
}

/// Whether listings learn what changed from inotify (see [`StateDir::watch_records`]).
#[derive(Debug, Default)]
enum Watching {
    /// Every listing reads the directory and stats every record (a short-lived command).
    #[default]
    No,
    /// Wanted, not (or no longer) in place: the next listing reads everything and watches.
    Wanted,
    /// `records` holds every readable record of the directory as of the last drain, with its
    /// marker; `unreadable` names the others, read again (and reported) at every listing.
    Complete {
        watch: RecordWatch,
        unreadable: HashSet<String>,
    },
}

impl Watching {
    /// The watch and what it knows when complete, leaving `Wanted` in its place.
    fn take_complete(&mut self) -> Option<(RecordWatch, HashSet<String>)> {
        match std::mem::replace(self, Watching::Wanted) {
            Watching::Complete { watch, unreadable } => Some((watch, unreadable)),
            other => {
                *self = other;
                None
            }
        }
    }
}

/// A cached record and the identity of the file it is.
#[derive(Debug, Clone)]
struct Parsed {
    identity: FileIdentity,
    record: VolumeRecord,
    /// Saved by this process, its identity taken from the open file after the rename: trusted
    /// at once, not only once settled. Each save stamps its file with an mtime of its own (see
    /// [`unique_mtime`]), so another save that reused the inode within the same tick, at the
    /// same size, still differs. In a burst of publishes every record is fresh; without this
    /// each publish parsed all of them again.
    saved_here: bool,
    /// Whether the record's `.mounted` marker was there when last looked at; kept up to date
    /// only while watching (otherwise each listing sees markers in the directory).
    marked: bool,
}

impl Parsed {
    /// The record file at `path` read and parsed, as it is on disk now.
    fn read(path: &Path, identity: FileIdentity, marked: bool) -> Result<Self, StateError> {
        let bytes = entry::read_record(path).map_err(|e| StateError::opening(path, e))?;
        Ok(Self {
            identity,
            record: parse(path, &bytes)?,
            saved_here: false,
            marked,
        })
    }

    /// The record with its marker applied.
    fn marked_record(&self) -> std::borrow::Cow<'_, VolumeRecord> {
        if self.marked && self.record.stage == Stage::Mounting {
            let mut record = self.record.clone();
            record.stage = Stage::Mounted;
            std::borrow::Cow::Owned(record)
        } else {
            std::borrow::Cow::Borrowed(&self.record)
        }
    }

    fn trusted(&self, identity: Option<FileIdentity>) -> bool {
        Some(self.identity) == identity && (self.saved_here || self.identity.settled())
    }
}

/// An mtime for a record file that no other save has: now, with nanoseconds that count per
/// save and differ per process.
fn unique_mtime() -> std::time::SystemTime {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SAVES: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now();
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let n = SAVES.fetch_add(1, Ordering::Relaxed);
    let nanos =
        (u64::from(std::process::id()).wrapping_mul(0x9e37_79b9) + n * 7919) % 1_000_000_000;
    std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos as u32)
}

/// What tells one version of a file from another without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
struct FileIdentity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileIdentity {
    /// Whether a cache may trust this identity: the file was last changed at least a second
    /// ago. Timestamps are coarse (a kernel tick), so a file rewritten within the tick it was
    /// read in, at the same size and inode (an in-place write; on ext4 a freed inode is reused
    /// at once), has the same identity with other content ("racy clean", as git calls it). A
    /// change after this identity was cached moves its ctime past it, so a settled identity
    /// that still matches is the same content.
    fn settled(&self) -> bool {
        let changed = self.mtime.max(self.ctime);
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .is_ok_and(|now| {
                let now = (now.as_secs() as i64, i64::from(now.subsec_nanos()));
                (now.0 - changed.0) * 1_000_000_000 + (now.1 - changed.1) >= 1_000_000_000
            })
    }

    fn of(meta: &fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// Content hashes of driver executables by path and file identity: pinning at every mount
/// read and hashed the whole executable (megabytes for a compiled driver). Any change to the
/// file (a write changes its ctime, a replacement its inode) is a miss, so the hash is always
/// that of the file as it is.
static PIN_HASHES: Mutex<Option<HashMap<PathBuf, (FileIdentity, u64)>>> = Mutex::new(None);

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

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

fn same_inode(a: &fs::Metadata, b: &fs::Metadata) -> bool {
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
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            parsed: Arc::default(),
        }
    }

    /// Listings from now on learn which records changed from inotify instead of stat'ing every
    /// record (see `watch.rs`): for a long-running flexd, whose every publish lists the records
    /// to refuse overlaps. Without inotify (no instance left) listings work as before.
    pub fn watch_records(&self) {
        let mut cache = locked(&self.parsed);
        if matches!(cache.watching, Watching::No) {
            cache.watching = Watching::Wanted;
        }
    }

    fn volumes(&self) -> PathBuf {
        self.root.join("volumes")
    }

    pub fn record_path(&self, target: &Path) -> PathBuf {
        self.volumes().join(format!("{}.json", id_of(target)))
    }

    /// The marker that a record's operation finished (see the module doc).
    fn marker_path(&self, target: &Path) -> PathBuf {
        self.volumes().join(format!("{}.mounted", id_of(target)))
    }

    /// Locks a name (a target path, a device mount dir) until the guard is dropped. The lock
    /// file goes with the guard when no record of that name is left (see [`Lock`]).
    pub fn lock(&self, what: &Path) -> Result<Lock, StateError> {
        self.lock_file(what, Some(self.record_path(what)))
    }

    /// Takes the lock of `what`; `removable_without`: see [`Lock`].
    fn lock_file(
        &self,
        what: &Path,
        removable_without: Option<PathBuf>,
    ) -> Result<Lock, StateError> {
        let dir = self.root.join("locks");
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
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

    pub fn save(&self, record: &VolumeRecord) -> Result<(), StateError> {
        if record.stage == Stage::Mounted {
            // Only the stage changed: the marker says it, the record stays as written.
            let on_disk = self.load_record(&record.target).ok().flatten();
            if on_disk.is_some_and(|r| {
                r.stage == Stage::Mounting
                    && VolumeRecord {
                        stage: Stage::Mounted,
                        ..r
                    } == *record
            }) {
                let marker = self.marker_path(&record.target);
                // Not followed, not waited on: a FIFO or link here fails this save alone.
                return entry::open_for_writing(&marker)
                    .map(drop)
                    .map_err(|e| StateError::opening(&marker, e));
            }
        }
        let dir = self.volumes();
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        // The record written now says its own stage: an older marker must not override it. The
        // directory's sync below makes this removal durable with the new record.
        let marker = self.marker_path(&record.target);
        match fs::remove_file(&marker) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&marker)(e)),
        }
        let path = self.record_path(&record.target);
        let temp = dir.join(format!(
            ".{}.{}.tmp",
            id_of(&record.target),
            std::process::id()
        ));
        let json = serde_json::to_vec_pretty(record).map_err(|e| StateError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let written = entry::create_fresh(&temp)
            .and_then(|mut file| {
                file.write_all(&json)?;
                file.set_modified(unique_mtime())?;
                file.sync_all()?;
                Ok(file)
            })
            .map_err(io_err(&temp))
            .and_then(|file| {
                fs::rename(&temp, &path).map_err(io_err(&path))?;
                Ok(file)
            });
        let file = match written {
            Ok(file) => file,
            Err(e) => {
                // A full disk or a failing device: the old record stays as it was, and no
                // half-written temp file is left to fill the disk further.
                let _ = fs::remove_file(&temp);
                return Err(e);
            }
        };
        entry::open_dir(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&dir))?;
        // The identity of what we wrote, after the rename changed its ctime: whatever replaces
        // it later is another inode, or the same inode with another mtime.
        if let Ok(meta) = file.metadata() {
            locked(&self.parsed).records.insert(
                id_of(&record.target),
                Parsed {
                    identity: FileIdentity::of(&meta),
                    record: record.clone(),
                    saved_here: true,
                    marked: false,
                },
            );
        }
        Ok(())
    }

    pub fn load(&self, target: &Path) -> Result<Option<VolumeRecord>, StateError> {
        let Some(mut record) = self.load_record(target)? else {
            return Ok(None);
        };
        if record.stage == Stage::Mounting && self.marker_path(target).exists() {
            record.stage = Stage::Mounted;
        }
        Ok(Some(record))
    }

    /// The record file as written, without its marker.
    fn load_record(&self, target: &Path) -> Result<Option<VolumeRecord>, StateError> {
        let path = self.record_path(target);
        // A cached record the listing would trust (this process saved it, or it settled) with
        // the file's identity unchanged: no read and parse. Every publish's last step, which
        // turns the record into a marker, asks.
        if let Ok(meta) = fs::symlink_metadata(&path) {
            let identity = FileIdentity::of(&meta);
            let cache = locked(&self.parsed);
            if let Some(known) = cache
                .records
                .get(&id_of(target))
                .filter(|known| known.trusted(Some(identity)))
            {
                return Ok(Some(known.record.clone()));
            }
        }
        read_record_file(&path)?
            .map(|bytes| parse(&path, &bytes))
            .transpose()
    }

    pub fn remove(&self, target: &Path) -> Result<(), StateError> {
        let path = self.record_path(target);
        let removed = fs::remove_file(&path);
        // After the record: a marker left alone by a crash is removed by the next save.
        let _ = fs::remove_file(self.marker_path(target));
        match removed {
            Ok(()) => {
                let dir = self.volumes();
                entry::open_dir(&dir)
                    .and_then(|d| d.sync_all())
                    .map_err(io_err(&dir))?;
                // The volume may have been the last user of a pinned driver version.
                if let Err(e) = self.collect_pins(PIN_GRACE) {
                    tracing::warn!(error = %e, "cannot collect unused pinned drivers");
                }
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    /// Removes pinned driver copies that no record references and that nobody pinned in the
    /// last `grace` (a mount pins, then writes its record). Returns how many went. Does nothing
    /// while any record is unreadable: what it references is unknown.
    pub fn collect_pins(&self, grace: std::time::Duration) -> Result<usize, StateError> {
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

    /// Every record; unreadable ones are reported, not hidden. Sorted by target.
    pub fn list(&self) -> Result<Vec<Result<VolumeRecord, StateError>>, StateError> {
        let mut records = Vec::new();
        self.visit(|record| records.push(record.cloned()))?;
        // By the target's bytes: the order is for people and stable output, and comparing
        // paths component by component was a visible share of a burst's CPU.
        records.sort_by(|a, b| match (a, b) {
            (Ok(a), Ok(b)) => a.target.as_os_str().cmp(b.target.as_os_str()),
            _ => std::cmp::Ordering::Equal,
        });
        Ok(records)
    }

    /// The target and role of every readable record: what overlap checks need, without a copy
    /// of each whole record (every publish of a burst asks, for every record).
    pub fn targets(&self) -> Result<Vec<(PathBuf, Role)>, StateError> {
        let mut targets = Vec::new();
        self.visit(|record| {
            if let Ok(record) = record {
                targets.push((record.target.clone(), record.role));
            }
        })?;
        Ok(targets)
    }

    /// Calls `f` with every record (its marker applied), in no particular order.
    fn visit(
        &self,
        mut f: impl FnMut(Result<&VolumeRecord, StateError>),
    ) -> Result<(), StateError> {
        let dir = self.volumes();
        // Held from before the directory is read: a listing forgets the records it did not find,
        // and one saved (cached) between its read of the directory and that clean-up was lost,
        // then read and parsed by every later listing until it settled (a second into a burst).
        let mut guard = locked(&self.parsed);
        let cache = &mut *guard;
        if let Some((mut watch, mut unreadable)) = cache.watching.take_complete() {
            let changed = watch.drain();
            if !changed.everything {
                let mut errors = Vec::new();
                let recheck: Vec<String> =
                    changed.ids.into_iter().chain(unreadable.drain()).collect();
                for id in recheck {
                    if let Err(e) = self.reread(&mut cache.records, &id) {
                        unreadable.insert(id);
                        errors.push(e);
                    }
                }
                for known in cache.records.values() {
                    f(Ok(&known.marked_record()));
                }
                cache.log_unreadable(&errors);
                errors.into_iter().for_each(|e| f(Err(e)));
                cache.watching = Watching::Complete { watch, unreadable };
                return Ok(());
            }
            // Left as Wanted: read everything, and watch afresh.
        }
        // Watched from before the directory is read: a change made while it is read is
        // queued for the next listing.
        let watch = match cache.watching {
            Watching::No => None,
            _ => RecordWatch::new(&dir).ok(),
        };
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err(&dir)(e)),
        };
        // By file name (a short id), not by path: without a watch a burst of publishes lists
        // every record once per publish, so hashing and comparing here is per record, per
        // publish.
        let mut files = Vec::new();
        let mut markers = HashSet::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            if crate::layout::is_hidden(&name) {
                continue;
            }
            let Some(name) = name.to_str() else { continue };
            if let Some(id) = name.strip_suffix(".json") {
                files.push((id.to_owned(), entry));
            } else if let Some(id) = name.strip_suffix(".mounted") {
                markers.insert(id.to_owned());
            }
        }
        let parsed = &mut cache.records;
        let mut seen = HashSet::new();
        let mut unreadable = HashSet::new();
        let mut errors = Vec::new();
        for (id, entry) in files {
            // The directory's own word on the type (no system call on most filesystems): a
            // FIFO, link or device is not even opened. The reader checks again after its open.
            let not_a_record = entry.file_type().ok().and_then(EntryKind::of);
            if let Some(kind) = not_a_record {
                parsed.remove(&id);
                unreadable.insert(id);
                errors.push(StateError::NotARecord {
                    path: entry.path(),
                    kind,
                });
                continue;
            }
            let identity = entry.metadata().ok().map(|m| FileIdentity::of(&m));
            let marked = markers.contains(&id);
            match parsed.get_mut(&id).filter(|known| known.trusted(identity)) {
                Some(known) => {
                    known.marked = marked;
                    f(Ok(&known.marked_record()));
                }
                None => {
                    let read = Parsed::read(&entry.path(), identity.unwrap_or_default(), marked);
                    match read {
                        Ok(parsed_now) => {
                            f(Ok(&parsed_now.marked_record()));
                            // Cached when it cannot be changed unseen: watched since before it
                            // was read, or settled.
                            if watch.is_some() || identity.is_some_and(|i| i.settled()) {
                                parsed.insert(id.clone(), parsed_now);
                            }
                        }
                        Err(e) => {
                            unreadable.insert(id.clone());
                            errors.push(e);
                        }
                    }
                }
            }
            seen.insert(id);
        }
        parsed.retain(|id, _| seen.contains(id));
        cache.log_unreadable(&errors);
        errors.into_iter().for_each(|e| f(Err(e)));
        if let Some(watch) = watch {
            cache.watching = Watching::Complete { watch, unreadable };
        }
        Ok(())
    }

    /// Brings one cached record up to date with its files (a watch said they changed).
    fn reread(&self, records: &mut HashMap<String, Parsed>, id: &str) -> Result<(), StateError> {
        let dir = self.volumes();
        let path = dir.join(format!("{id}.json"));
        let marked = dir.join(format!("{id}.mounted")).exists();
        let identity = match fs::symlink_metadata(&path) {
            Ok(meta) => FileIdentity::of(&meta),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                records.remove(id);
                return Ok(());
            }
            Err(e) => {
                records.remove(id);
                return Err(io_err(&path)(e));
            }
        };
        // This process's own save, as it left it: no need to read it back.
        if let Some(known) = records
            .get_mut(id)
            .filter(|known| known.saved_here && known.identity == identity)
        {
            known.marked = marked;
            return Ok(());
        }
        match Parsed::read(&path, identity, marked) {
            Ok(parsed) => {
                records.insert(id.to_owned(), parsed);
                Ok(())
            }
            Err(e) => {
                records.remove(id);
                Err(e)
            }
        }
    }

    /// How many recorded volumes depend on a driver (docs/discovery.md#in-use). Unreadable
    /// records cannot be attributed and are not counted; `list` reports them.
    pub fn volumes_using(&self, driver: &DriverName) -> Result<usize, StateError> {
        Ok(self
            .list()?
            .iter()
            .filter(|r| r.as_ref().is_ok_and(|r| r.driver == *driver))
            .count())
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
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(target: &str) -> VolumeRecord {
        VolumeRecord {
            target: target.into(),
            driver: DriverName::parse("acme/drv").unwrap(),
            volume_name: "pv-1".into(),
            fs_type: "ext4".into(),
            read_only: false,
            options: BTreeMap::new(),
            attachable: true,
            node: "n1".into(),
            device: Some("/dev/loop0".into()),
            device_mount_dir: Some("/s/devices/acme~drv/pv-1".into()),
            detach_name: "pv-1".into(),
            pinned: None,
            created_target: true,
            stage: Stage::Mounted,
            role: Role::Mount,
        }
    }

    #[test]
    fn records_round_trip_and_list_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        assert!(state.load(Path::new("/t/a")).unwrap().is_none());
        state.save(&record("/t/b")).unwrap();
        state.save(&record("/t/a")).unwrap();
        assert_eq!(state.load(Path::new("/t/a")).unwrap(), Some(record("/t/a")));
        let listed: Vec<PathBuf> = state
            .list()
            .unwrap()
            .into_iter()
            .map(|r| r.unwrap().target)
            .collect();
        assert_eq!(listed, vec![PathBuf::from("/t/a"), PathBuf::from("/t/b")]);
        state.remove(Path::new("/t/a")).unwrap();
        state.remove(Path::new("/t/a")).unwrap();
        assert_eq!(state.list().unwrap().len(), 1);
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(state.volumes())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1);
    }

    /// Every change made by anyone is in a watched listing, though no record file is stat'ed
    /// unless an event names it.
    #[test]
    fn a_watched_listing_sees_every_change_made_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let here = StateDir::new(dir.path());
        here.watch_records();
        let elsewhere = StateDir::new(dir.path());
        let listed = |state: &StateDir| -> Vec<(PathBuf, Stage, Option<String>)> {
            state
                .list()
                .unwrap()
                .into_iter()
                .map(|r| r.map(|r| (r.target, r.stage, r.device)).unwrap())
                .collect()
        };
        let watching =
            |state: &StateDir| matches!(locked(&state.parsed).watching, Watching::Complete { .. });
        // No directory yet: nothing to watch, nothing listed, and no error.
        assert!(listed(&here).is_empty());
        assert!(!watching(&here));
        here.save(&record("/t/a")).unwrap();
        assert_eq!(listed(&here).len(), 1);
        assert!(watching(&here), "watched once the directory exists");
        // A new record, and a rewrite at the same size within the same tick.
        elsewhere.save(&record("/t/b")).unwrap();
        let with_device = |device: &str| VolumeRecord {
            device: Some(device.into()),
            stage: Stage::Mounting,
            ..record("/t/a")
        };
        elsewhere.save(&with_device("/dev/loop1")).unwrap();
        assert_eq!(
            listed(&here),
            [
                ("/t/a".into(), Stage::Mounting, Some("/dev/loop1".into())),
                ("/t/b".into(), Stage::Mounted, Some("/dev/loop0".into())),
            ]
        );
        // Written in place by hand, at the same size: seen, though no rename happened.
        let path = here.record_path(Path::new("/t/a"));
        let text = fs::read_to_string(&path).unwrap().replace("loop1", "loop7");
        fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        assert_eq!(listed(&here)[0].2.as_deref(), Some("/dev/loop7"));
        // A marker that finishes the operation, made elsewhere.
        elsewhere
            .save(&VolumeRecord {
                stage: Stage::Mounted,
                ..with_device("/dev/loop7")
            })
            .unwrap();
        assert!(elsewhere.marker_path(Path::new("/t/a")).exists());
        assert_eq!(listed(&here)[0].1, Stage::Mounted);
        // Broken, reported at every listing, and listed again once mended.
        fs::write(&path, "{not json").unwrap();
        for _ in 0..2 {
            let records = here.list().unwrap();
            assert_eq!(records.iter().filter(|r| r.is_err()).count(), 1);
            assert_eq!(records.iter().filter(|r| r.is_ok()).count(), 1);
        }
        elsewhere.save(&record("/t/a")).unwrap();
        assert_eq!(listed(&here).len(), 2);
        // Removed elsewhere.
        elsewhere.remove(Path::new("/t/b")).unwrap();
        assert_eq!(
            listed(&here),
            [("/t/a".into(), Stage::Mounted, Some("/dev/loop0".into()))]
        );
        // The whole directory swapped for another: listed afresh, and watched again.
        let volumes = here.volumes();
        fs::rename(&volumes, dir.path().join("old-volumes")).unwrap();
        elsewhere.save(&record("/t/c")).unwrap();
        assert_eq!(
            listed(&here),
            [("/t/c".into(), Stage::Mounted, Some("/dev/loop0".into()))]
        );
        assert!(watching(&here));
        elsewhere.save(&record("/t/d")).unwrap();
        assert_eq!(listed(&here).len(), 2);
    }

    /// A listing forgets the records it did not find, but not one saved while it read the
    /// directory: in a burst of publishes such a record was read and parsed again by every
    /// listing for a second (until settled).
    #[test]
    fn records_saved_during_a_listing_stay_cached() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        let savers: Vec<_> = (0..4)
            .map(|t| {
                let state = state.clone();
                std::thread::spawn(move || {
                    for i in 0..50 {
                        state.save(&record(&format!("/t/{t}/{i}"))).unwrap();
                        state.targets().unwrap();
                    }
                })
            })
            .collect();
        savers.into_iter().for_each(|s| s.join().unwrap());
        let cached = locked(&state.parsed).records.len();
        assert_eq!(cached, 200, "every record this process saved is cached");
    }

    #[test]
    fn a_corrupt_record_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        fs::create_dir_all(state.volumes()).unwrap();
        fs::write(state.record_path(Path::new("/t/x")), "{not json").unwrap();
        assert!(matches!(
            state.load(Path::new("/t/x")),
            Err(StateError::Corrupt { .. })
        ));
        assert!(state.list().unwrap()[0].is_err());
    }

    fn mkfifo(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
    }

    fn not_a_record(result: &Result<VolumeRecord, StateError>) -> Option<EntryKind> {
        match result {
            Err(StateError::NotARecord { kind, .. }) => Some(*kind),
            _ => None,
        }
    }

    /// A FIFO named like a record blocked the reader in open(2); a link to /dev/zero was read
    /// until memory ran out. Both are reported at every listing, by load too, and skipped:
    /// the rest of the state works around them. A hang here is the bug.
    #[test]
    fn entries_that_are_not_record_files_are_reported_and_never_waited_on_or_followed() {
        for watched in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let state = StateDir::new(dir.path());
            if watched {
                state.watch_records();
            }
            state.save(&record("/t/a")).unwrap();
            assert_eq!(state.list().unwrap().len(), 1);
            mkfifo(&state.record_path(Path::new("/t/fifo")));
            std::os::unix::fs::symlink("/dev/zero", state.record_path(Path::new("/t/zero")))
                .unwrap();
            fs::create_dir(state.record_path(Path::new("/t/dir"))).unwrap();
            File::create(state.record_path(Path::new("/t/big")))
                .unwrap()
                .set_len(MAX_RECORD_BYTES + 1)
                .unwrap();
            for _ in 0..2 {
                let listed = state.list().unwrap();
                let mut kinds: Vec<&str> = listed
                    .iter()
                    .filter_map(not_a_record)
                    .map(|k| k.as_str())
                    .collect();
                kinds.sort();
                assert_eq!(kinds, ["directory", "fifo", "oversized", "symlink"]);
                assert_eq!(listed.iter().filter(|r| r.is_ok()).count(), 1);
                assert_eq!(state.targets().unwrap(), [("/t/a".into(), Role::Mount)]);
            }
            for (target, kind) in [
                ("/t/fifo", EntryKind::Fifo),
                ("/t/zero", EntryKind::Symlink),
            ] {
                assert_eq!(
                    not_a_record(&state.load(Path::new(target)).map(|r| r.unwrap())),
                    Some(kind)
                );
            }
            // Saving the volume puts a record in the FIFO's place; a FIFO as a marker fails
            // that save alone, at once.
            state.save(&record("/t/fifo")).unwrap();
            assert_eq!(
                state.load(Path::new("/t/fifo")).unwrap(),
                Some(record("/t/fifo"))
            );
            let mounting = VolumeRecord {
                stage: Stage::Mounting,
                ..record("/t/b")
            };
            state.save(&mounting).unwrap();
            mkfifo(&state.marker_path(Path::new("/t/b")));
            assert!(matches!(
                state.save(&record("/t/b")),
                Err(StateError::NotARecord {
                    kind: EntryKind::Fifo,
                    ..
                })
            ));
            // The name is escaped in what is said about it.
            let odd = state.volumes().join("line\nbreak.json");
            mkfifo(&odd);
            let said = state
                .list()
                .unwrap()
                .into_iter()
                .filter_map(Result::err)
                .map(|e| e.to_string())
                .find(|e| e.contains("break"))
                .unwrap();
            assert!(said.contains("line\\nbreak.json"), "{said}");
        }
    }

    /// A lock file goes with the last guard once its volume's record is gone, and lockers
    /// racing with that removal never hold the lock at the same time: one that locked the
    /// unlinked file notices and locks the new one.
    #[test]
    fn lock_files_of_removed_volumes_go_and_concurrent_lockers_never_overlap() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        let locks = || fs::read_dir(dir.path().join("locks")).unwrap().count();
        let target = Path::new("/t/a");
        // Recorded: the lock file stays; removed: it goes with the guard held over the removal.
        let guard = state.lock(target).unwrap();
        state.save(&record("/t/a")).unwrap();
        drop(guard);
        assert_eq!(locks(), 1);
        let guard = state.lock(target).unwrap();
        state.remove(target).unwrap();
        drop(guard);
        assert_eq!(locks(), 0, "the removed volume's lock file is gone");
        // A guard whose file a driver still shares keeps it.
        let guard = state.lock(target).unwrap();
        let shared = guard.share();
        drop(guard);
        assert_eq!(locks(), 1);
        drop(shared);

        // Each locker its own StateDir and open file, as separate processes would have.
        let inside = Arc::new(AtomicBool::new(false));
        let entered = Arc::new(AtomicUsize::new(0));
        let lockers: Vec<_> = (0..4)
            .map(|_| {
                let (inside, entered) = (inside.clone(), entered.clone());
                let state = StateDir::new(dir.path());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let _guard = state.lock(target).unwrap();
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                        std::thread::yield_now();
                        inside.store(false, Ordering::SeqCst);
                        entered.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        lockers.into_iter().for_each(|l| l.join().unwrap());
        assert_eq!(entered.load(Ordering::SeqCst), 800);
        assert_eq!(locks(), 0);
    }

    #[test]
    fn the_driver_name_is_stored_as_its_string_and_an_invalid_one_is_corrupt() {
        let json = serde_json::to_value(record("/t/a")).unwrap();
        assert_eq!(json["driver"], "acme/drv");
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        let mut bad = json.clone();
        bad["driver"] = "../../etc".into();
        fs::create_dir_all(state.volumes()).unwrap();
        fs::write(
            state.record_path(Path::new("/t/a")),
            serde_json::to_vec(&bad).unwrap(),
        )
        .unwrap();
        match state.load(Path::new("/t/a")) {
            Err(e @ StateError::Corrupt { .. }) => {
                assert!(e.to_string().contains("driver name \"../../etc\""), "{e}")
            }
            other => panic!("expected a corrupt record, got {other:?}"),
        }
    }

    #[test]
    fn records_written_before_roles_are_whole_flow_mounts() {
        let mut json = serde_json::to_value(record("/t/old")).unwrap();
        json.as_object_mut().unwrap().remove("role");
        let old: VolumeRecord = serde_json::from_value(json).unwrap();
        assert_eq!(old.role, Role::Mount);
    }

    #[test]
    fn a_record_saved_here_is_listed_from_the_cache_and_a_rewrite_elsewhere_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let here = StateDir::new(dir.path());
        let elsewhere = StateDir::new(dir.path()); // another flexd: its own cache
        let with_device = |device: &str| VolumeRecord {
            device: Some(device.into()),
            ..record("/t/a")
        };
        here.save(&with_device("/dev/loop0")).unwrap();
        let listed = |state: &StateDir| -> Vec<Option<String>> {
            state
                .list()
                .unwrap()
                .into_iter()
                .map(|r| r.unwrap().device)
                .collect()
        };
        // Trusted at once, though just written: this process wrote it.
        let cached = locked(&here.parsed).records.values().all(|p| p.saved_here);
        assert!(cached);
        assert_eq!(listed(&here), [Some("/dev/loop0".into())]);
        // Rewritten by another process, at the same size, maybe within the same tick and with
        // an inode reused: the cache must not answer the old record.
        let mtime = || {
            fs::metadata(here.record_path(Path::new("/t/a")))
                .unwrap()
                .modified()
                .unwrap()
        };
        let mut mtimes = vec![mtime()];
        for device in ["/dev/loop1", "/dev/loop0", "/dev/loop2"] {
            elsewhere.save(&with_device(device)).unwrap();
            mtimes.push(mtime());
        }
        assert_eq!(listed(&here), [Some("/dev/loop2".into())]);
        // Loading it agrees: the cached copy answers only for the file this process wrote.
        let loaded = here.load(Path::new("/t/a")).unwrap().unwrap();
        assert_eq!(loaded.device.as_deref(), Some("/dev/loop2"));
        // What makes that hold when all else matches: each save has an mtime of its own.
        mtimes.sort();
        mtimes.dedup();
        assert_eq!(mtimes.len(), 4);
    }

    #[test]
    fn only_identities_of_files_unchanged_for_a_second_are_trusted_by_the_caches() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, "v1").unwrap();
        let fresh = FileIdentity::of(&fs::metadata(&file).unwrap());
        // Just written: a same-size rewrite within the same tick would look identical.
        assert!(!fresh.settled());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let aged = |secs: i64| FileIdentity {
            mtime: (now - secs, 0),
            ctime: (now - secs, 0),
            ..fresh
        };
        assert!(aged(2).settled());
        assert!(
            !FileIdentity {
                ctime: (now + 1, 0),
                ..aged(2)
            }
            .settled(),
            "a recent ctime (a write, chmod or rename) is not settled"
        );
    }

    #[test]
    fn pinned_versions_go_once_no_record_uses_them_and_the_grace_passed() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path().join("state"));
        let exe = dir.path().join("drv");
        let pin = |content: &str| {
            fs::write(&exe, content).unwrap();
            state.pin("acme~drv", &exe).unwrap()
        };
        let (v1, v2, v3) = (pin("v1"), pin("v2"), pin("v3"));
        let mut used = record("/t/a");
        used.pinned = Some(v2.clone());
        state.save(&used).unwrap();

        let zero = std::time::Duration::ZERO;
        let hour = std::time::Duration::from_secs(3600);
        assert_eq!(state.collect_pins(hour).unwrap(), 0, "all pinned lately");
        // v3 is pinned again just now: it is kept even with no grace left for the others.
        let old = std::time::SystemTime::now() - hour;
        for v in [&v1, &v2, &v3] {
            File::open(v.parent().unwrap())
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        fs::write(&exe, "v3").unwrap();
        state.pin("acme~drv", &exe).unwrap();
        assert_eq!(
            state
                .collect_pins(std::time::Duration::from_secs(60))
                .unwrap(),
            1
        );
        assert!(!v1.exists() && v2.exists() && v3.exists());

        // A corrupt record could reference anything: nothing is collected.
        fs::write(state.record_path(Path::new("/t/bad")), "{").unwrap();
        assert_eq!(state.collect_pins(zero).unwrap(), 0);
        fs::remove_file(state.record_path(Path::new("/t/bad"))).unwrap();

        // The last user goes: its version (pinned an hour ago) is collected with the record.
        state.remove(Path::new("/t/a")).unwrap();
        assert!(!v2.exists() && v3.exists());
        assert_eq!(state.collect_pins(zero).unwrap(), 1);
        assert!(!dir.path().join("state/pinned/acme~drv").exists());
    }

    #[test]
    fn finishing_an_operation_is_a_marker_and_the_record_stays_as_synced() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        let target = Path::new("/t/a");
        let mut rec = record("/t/a");
        rec.stage = Stage::Mounting;
        state.save(&rec).unwrap();
        assert_eq!(
            state.list().unwrap()[0].as_ref().unwrap().stage,
            Stage::Mounting
        );
        rec.stage = Stage::Mounted;
        state.save(&rec).unwrap();
        assert!(state.marker_path(target).exists());
        assert_eq!(
            state.load_record(target).unwrap().unwrap().stage,
            Stage::Mounting
        );
        assert_eq!(state.load(target).unwrap(), Some(rec.clone()));
        assert_eq!(state.list().unwrap()[0].as_ref().unwrap(), &rec);
        // Anything else changed: a full write, which says its own stage; the marker goes.
        rec.device = Some("/dev/loop9".into());
        state.save(&rec).unwrap();
        assert!(!state.marker_path(target).exists());
        assert_eq!(state.load_record(target).unwrap(), Some(rec.clone()));
        assert_eq!(state.list().unwrap()[0].as_ref().unwrap(), &rec);
        // A new operation's Mounting record is not overridden by an older marker.
        rec.stage = Stage::Mounting;
        state.save(&rec).unwrap();
        rec.stage = Stage::Mounted;
        state.save(&rec).unwrap();
        rec.stage = Stage::Mounting;
        state.save(&rec).unwrap();
        assert_eq!(state.load(target).unwrap().unwrap().stage, Stage::Mounting);
        state.remove(target).unwrap();
        assert_eq!(fs::read_dir(state.volumes()).unwrap().count(), 0);
    }

    #[test]
    fn a_changed_executable_is_hashed_again_when_pinned() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path().join("state"));
        let exe = dir.path().join("drv");
        fs::write(&exe, "v1").unwrap();
        let v1 = state.pin("acme~drv", &exe).unwrap();
        assert_eq!(state.pin("acme~drv", &exe).unwrap(), v1);
        // Rewritten in place with the same size: another version all the same.
        std::thread::sleep(std::time::Duration::from_millis(10));
        fs::write(&exe, "v2").unwrap();
        let v2 = state.pin("acme~drv", &exe).unwrap();
        assert_ne!(v1, v2);
        assert_eq!(fs::read(&v2).unwrap(), b"v2");
    }

    #[test]
    fn stable_hash_is_fnv1a() {
        assert_eq!(stable_hash(b""), 0xcbf2_9ce4_8422_2325);
        // A file hashes as its content in one piece, across read boundaries.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exe");
        let content: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(&path, &content).unwrap();
        assert_eq!(hash_file(&path).unwrap(), stable_hash(&content));
        assert_eq!(stable_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
