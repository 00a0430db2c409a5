//! The parsed-record cache: records listed again cost a stat each (or nothing while inotify
//! watches), not a parse.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use super::watch::RecordWatch;
use super::{entry, parse, Progress, StateError, VolumeRecord};

/// Parsed records keyed by id (the file name without `.json`).
#[derive(Debug, Default)]
pub(super) struct RecordCache {
    pub(super) records: HashMap<String, Parsed>,
    pub(super) watching: Watching,
    /// The record files found unreadable and logged: each is logged once while it stays so,
    /// not at every listing (every publish lists).
    pub(super) logged_unreadable: HashSet<PathBuf>,
}

impl RecordCache {
    /// Logs the entries newly found unreadable, and forgets those no longer in `errors`.
    pub(super) fn log_unreadable(&mut self, errors: &[StateError]) {
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
pub(super) enum Watching {
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
    pub(super) fn take_complete(&mut self) -> Option<(RecordWatch, HashSet<String>)> {
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
pub(super) struct Parsed {
    pub(super) identity: FileIdentity,
    pub(super) record: VolumeRecord,
    /// Saved by this process, its identity taken from the open file after the rename: trusted
    /// at once, not only once settled. Each save stamps its file with an mtime of its own (see
    /// [`unique_mtime`]), so another save that reused the inode within the same tick, at the
    /// same size, still differs. In a burst of publishes every record is fresh; without this
    /// each publish parsed all of them again.
    pub(super) saved_here: bool,
    /// Whether the record's `.mounted` marker was there when last looked at; kept up to date
    /// only while watching (otherwise each listing sees markers in the directory).
    pub(super) marked: bool,
}

impl Parsed {
    /// The record file at `path` read and parsed, as it is on disk now.
    pub(super) fn read(
        path: &Path,
        identity: FileIdentity,
        marked: bool,
    ) -> Result<Self, StateError> {
        let bytes = entry::read_record(path).map_err(|e| StateError::opening(path, e))?;
        Ok(Self {
            identity,
            record: parse(path, &bytes)?,
            saved_here: false,
            marked,
        })
    }

    /// The record with its marker applied.
    pub(super) fn marked_record(&self) -> std::borrow::Cow<'_, VolumeRecord> {
        if self.marked && self.record.progress == Progress::Mounting {
            let mut record = self.record.clone();
            record.progress = Progress::Mounted;
            std::borrow::Cow::Owned(record)
        } else {
            std::borrow::Cow::Borrowed(&self.record)
        }
    }

    pub(super) fn trusted(&self, identity: Option<FileIdentity>) -> bool {
        Some(self.identity) == identity && (self.saved_here || self.identity.settled())
    }
}

/// An mtime for a record file that no other save has: now, with nanoseconds that count per
/// save and differ per process.
pub(super) fn unique_mtime() -> std::time::SystemTime {
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
pub(super) struct FileIdentity {
    pub(super) dev: u64,
    pub(super) ino: u64,
    pub(super) size: u64,
    pub(super) mtime: (i64, i64),
    pub(super) ctime: (i64, i64),
}

impl FileIdentity {
    /// Whether a cache may trust this identity: the file was last changed at least a second
    /// ago. Timestamps are coarse (a kernel tick), so a file rewritten within the tick it was
    /// read in, at the same size and inode (an in-place write; on ext4 a freed inode is reused
    /// at once), has the same identity with other content ("racy clean", as git calls it). A
    /// change after this identity was cached moves its ctime past it, so a settled identity
    /// that still matches is the same content.
    pub(super) fn settled(&self) -> bool {
        let changed = self.mtime.max(self.ctime);
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .is_ok_and(|now| {
                let now = (now.as_secs() as i64, i64::from(now.subsec_nanos()));
                (now.0 - changed.0) * 1_000_000_000 + (now.1 - changed.1) >= 1_000_000_000
            })
    }

    pub(super) fn of(meta: &fs::Metadata) -> Self {
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
