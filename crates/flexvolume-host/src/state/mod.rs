//! What must survive a crash to undo an operation: one record per mounted target.
//!
//! `<state-dir>/volumes/<id>.json`, written atomically (temporary file in the same directory,
//! fsync, rename, fsync of the directory), so a crash leaves the old record or the new one, never
//! half of one. A *fresh* record (none at its name) is renamed into place first and then fsync-ed
//! with its directory: one journal commit instead of two, which was most of a burst of publishes'
//! time on a journaled disk (bench/csi.sh). Its operation starts only once both syncs returned, so
//! what a crash can leave half-written is a record whose operation never began:
//! [`StateError::Torn`], read as no record. A fresh *publish or stage* record is not synced at
//! all: a killed flexd loses nothing written (the page cache keeps it), and a crash of the kernel,
//! the only thing a sync guards against, also takes away the mount that record is for, so losing
//! it, or finding it torn, loses nothing teardown needs (docs/lifecycle.md#unsynced-publish).
//! Nor is its removal: one that a crash undoes leaves a record of a volume already torn down,
//! which reconcile removes (its target is gone) or the CO's retried teardown finds. Secrets are
//! never written. One such write per
//! operation: the step that only says an operation finished (`Mounting` to `Mounted`, nothing else
//! changed) is an empty marker file `<id>.mounted` beside the record, not synced: a crash that
//! loses it leaves the record at `Mounting`, the state every operation and reconcile already finish
//! or undo. Locks are `flock`s on files under `<state-dir>/locks/`: they serialize operations on
//! one target (or one device) across threads *and* across separate `flexd` processes, and vanish
//! with a crashed process.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use flexvolume_protocol::name::DriverName;

mod cache;
mod entry;
mod lock;
mod pins;
mod query;
mod record;
mod watch;
use cache::{unique_mtime, FileIdentity, Parsed, RecordCache, Watching};
use entry::OpenError;
pub(crate) use entry::{create_fresh, create_private_dir_all, open_dir};
pub use entry::{EntryKind, MAX_RECORD_BYTES};
pub use lock::Lock;
pub use pins::PIN_GRACE;
pub use query::LookupError;
use record::parse;
pub use record::{Progress, Role, VolumeRecord};
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
    /// Empty, zeros or cut short: what a crash leaves of a fresh record before its sync, whose
    /// operation had not begun, or of a fresh publish or stage record, whose mount the crash took
    /// away too (see the module doc). Readers take it for no record; the next save at its name
    /// replaces it.
    #[error("state record {path} was left half-written by a crash")]
    Torn { path: PathBuf },
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
            | StateError::Torn { path }
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

/// FNV-1a: a stable 64-bit hash (std's hasher may change between Rust versions, and these
/// names live on disk across upgrades).
pub(crate) fn stable_hash(bytes: &[u8]) -> u64 {
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
    /// The syncs of `volumes/` this process's saves and removals share.
    volumes_sync: Arc<SharedSync>,
}

/// Directory syncs shared by concurrent changes: a change waits for a sync that began after it
/// was made, its own or another thread's. In a burst every record's rename or removal changes
/// `volumes/`, so each directory sync found the directory changed again and needed a journal
/// commit of its own; the commits were what a burst of 256 publishes spent over tmpfs.
#[derive(Debug, Default)]
struct SharedSync {
    /// Changes made to the directory, counted once made.
    changes: AtomicU64,
    /// Every sync run, of a record or of the directory: what the tests of the sync policy count.
    syncs: AtomicU64,
    state: Mutex<SyncState>,
    finished: Condvar,
}

#[derive(Debug, Default)]
struct SyncState {
    /// Every change up to this count is durable.
    synced: u64,
    running: bool,
}

impl SharedSync {
    /// Counts a change just made to the directory; its number is for [`SharedSync::sync`].
    fn changed(&self) -> u64 {
        self.changes.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Returns once change `n` of `dir` is durable: a sync that began after it succeeded.
    fn sync(&self, dir: &Path, n: u64) -> io::Result<()> {
        let mut state = locked(&self.state);
        loop {
            if state.synced >= n {
                return Ok(());
            }
            if !state.running {
                state.running = true;
                let covers = self.changes.load(Ordering::SeqCst);
                drop(state);
                self.syncs.fetch_add(1, Ordering::Relaxed);
                let result = entry::open_dir(dir).and_then(|d| d.sync_all());
                let mut state = locked(&self.state);
                state.running = false;
                if result.is_ok() {
                    state.synced = state.synced.max(covers);
                }
                // Waiters whose change is not covered (or after a failure) sync themselves.
                self.finished.notify_all();
                return result;
            }
            state = self.finished.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl StateDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            parsed: Arc::default(),
            volumes_sync: Arc::default(),
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

    /// Makes the state dir owner-only (0700): created so when missing, and narrowed when an
    /// older flexd (or a umask) left it readable by others, which then could read every
    /// volume's options. Returns the mode it had when it was narrowed.
    pub fn restrict(&self) -> Result<Option<u32>, StateError> {
        use std::os::unix::fs::PermissionsExt as _;
        create_private_dir_all(&self.root).map_err(io_err(&self.root))?;
        let dir = open_dir(&self.root).map_err(io_err(&self.root))?;
        let mode = dir
            .metadata()
            .map_err(io_err(&self.root))?
            .permissions()
            .mode()
            & 0o7777;
        if mode & 0o077 == 0 {
            return Ok(None);
        }
        dir.set_permissions(fs::Permissions::from_mode(mode & 0o700))
            .map_err(io_err(&self.root))?;
        Ok(Some(mode))
    }

    /// How many syncs this state dir ran.
    #[cfg(test)]
    fn syncs(&self) -> u64 {
        self.volumes_sync.syncs.load(Ordering::Relaxed)
    }

    fn volumes(&self) -> PathBuf {
        self.root.join("volumes")
    }

    pub(crate) fn record_path(&self, target: &Path) -> PathBuf {
        self.volumes().join(format!("{}.json", id_of(target)))
    }

    /// The marker that a record's operation finished (see the module doc).
    fn marker_path(&self, target: &Path) -> PathBuf {
        self.volumes().join(format!("{}.mounted", id_of(target)))
    }

    pub(crate) fn save(&self, record: &VolumeRecord) -> Result<(), StateError> {
        if record.progress == Progress::Mounted {
            // Only the stage changed: the marker says it, the record stays as written.
            let on_disk = self.load_record(&record.target).ok().flatten();
            if on_disk.is_some_and(|r| {
                r.progress == Progress::Mounting
                    && VolumeRecord {
                        progress: Progress::Mounted,
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
        entry::create_private_dir_all(&dir).map_err(io_err(&dir))?;
        // The record written now says its own stage: an older marker must not override it. The
        // directory's sync below makes this removal durable with the new record.
        let marker = self.marker_path(&record.target);
        match fs::remove_file(&marker) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&marker)(e)),
        }
        let path = self.record_path(&record.target);
        // Nothing to lose at the name: renamed first, then synced (see the module doc).
        let fresh =
            matches!(fs::symlink_metadata(&path), Err(e) if e.kind() == io::ErrorKind::NotFound);
        // A fresh publish or stage record is not synced at all (see the module doc).
        let sync = !(fresh && record.role.is_node_mount_only());
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
                if !fresh {
                    self.volumes_sync.syncs.fetch_add(1, Ordering::Relaxed);
                    file.sync_all()?;
                }
                Ok(file)
            })
            .map_err(io_err(&temp))
            .and_then(|file| {
                fs::rename(&temp, &path).map_err(io_err(&path))?;
                Ok((file, self.volumes_sync.changed()))
            });
        let (file, change) = match written {
            Ok(written) => written,
            Err(e) => {
                // A full disk or a failing device: the old record stays as it was, and no
                // half-written temp file is left to fill the disk further.
                let _ = fs::remove_file(&temp);
                return Err(e);
            }
        };
        if sync {
            if fresh {
                // A failure leaves the record in place, at `Mounting`: undone as any other.
                self.volumes_sync.syncs.fetch_add(1, Ordering::Relaxed);
                file.sync_all().map_err(io_err(&path))?;
            }
            self.volumes_sync.sync(&dir, change).map_err(io_err(&dir))?;
        }
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
        if record.progress == Progress::Mounting && self.marker_path(target).exists() {
            record.progress = Progress::Mounted;
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
        match read_record_file(&path)?.map(|bytes| parse(&path, &bytes)) {
            Some(Err(StateError::Torn { .. })) => Ok(None),
            other => other.transpose(),
        }
    }

    pub fn remove(&self, target: &Path) -> Result<(), StateError> {
        let path = self.record_path(target);
        // The removal of a publish or stage record (its role as last read or written here) is
        // not synced either (see the module doc).
        let sync = !locked(&self.parsed)
            .records
            .get(&id_of(target))
            .is_some_and(|p| p.record.role.is_node_mount_only());
        let removed = fs::remove_file(&path);
        // After the record: a marker left alone by a crash is removed by the next save.
        let _ = fs::remove_file(self.marker_path(target));
        match removed {
            Ok(()) => {
                let dir = self.volumes();
                let change = self.volumes_sync.changed();
                if sync {
                    self.volumes_sync.sync(&dir, change).map_err(io_err(&dir))?;
                }
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
                        // No record: not seen, so not kept in the cache either.
                        Err(StateError::Torn { .. }) => continue,
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
            Err(StateError::Torn { .. }) => {
                records.remove(id);
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
}

#[cfg(test)]
mod tests;
