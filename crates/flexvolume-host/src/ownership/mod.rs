//! SetUp(fsGroup): make a volume group-owned by the pod's fsGroup, fast and without races.
//!
//! Kubernetes walks a volume with one thread, resolving every full path again and calling
//! lchown and chmod on every entry; on volumes with millions of files that takes minutes to
//! hours (k8s#69699). This pass:
//! - walks directories in parallel on every core;
//! - works relative to open directory descriptors (`*at` calls), so no path is resolved twice
//!   and a symlink swapped into the tree mid-walk cannot redirect a change outside the volume
//!   (modes are set with `fchmodat2(AT_SYMLINK_NOFOLLOW)` or through the entry's own fd);
//! - makes no chown/chmod call for an entry that is already right, so a pass over a volume
//!   that is already right only reads;
//! - does the root last, so `OnRootMismatch` redoes a pass that was interrupted.
//!
//! Errors on single entries are collected, not fatal; an entry that vanishes is not an error.

mod progress;
mod rules;
mod walk;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use rules::{plan, root_is_right, wanted_mode, Plan, Policy};

/// At most this many entry errors are kept (all are counted).
pub(crate) const MAX_REPORTED_ERRORS: usize = 100;

/// One ownership pass to run.
#[derive(Debug, Clone)]
pub struct OwnershipRequest<'a> {
    /// The volume's root (a mounted target).
    pub root: &'a Path,
    pub gid: u32,
    pub policy: Policy,
    /// A read-only volume gets `g+r` instead of `g+rw`.
    pub read_only: bool,
    /// Walker threads; 0 means one per core. More than [`max_walkers`] are clamped to it.
    pub threads: usize,
}

/// (uid_t)-1 and (gid_t)-1: `chown` reads this id as "leave unchanged", so a pass "to" it
/// would report changes it never made. It can never be an owner.
pub const UNSET_ID: u32 = u32::MAX;

/// No more walker threads than this, whatever the cores. The walk is bound by metadata calls
/// on one filesystem (getdents, fstatat, fchownat contend on the same inodes and journal);
/// past a few threads per core more walkers only cost stacks and scheduling. 64 walkers
/// reserve at most 128 MiB of stack address space, never the machine.
pub const MAX_WALKERS: usize = 64;

/// Walker threads per core at most: more than one per core still helps when the filesystem
/// waits on a network or a slow disk (NFS, cold caches); four is enough to keep those busy.
pub(crate) const WALKERS_PER_CORE: usize = 4;

/// The most walkers any pass gets on this machine: `min(WALKERS_PER_CORE × cores, MAX_WALKERS)`.
pub(crate) fn max_walkers() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores * WALKERS_PER_CORE).clamp(1, MAX_WALKERS)
}

/// The walkers a pass asking for `requested` threads gets: 0 means one per core, and no
/// request gets more than [`max_walkers`]. Clamped here, in the library, so that every caller
/// (the CLI, SetUp, a future one) is bounded, not only those that validate their input.
pub(crate) fn walkers_for(requested: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match requested {
        0 => cores.min(MAX_WALKERS),
        n => n.min(max_walkers()),
    }
}

/// Refuses the one group id that can never own anything ([`UNSET_ID`]).
pub fn check_gid(gid: u32) -> Result<u32, OwnershipError> {
    if gid == UNSET_ID {
        return Err(OwnershipError::UnsetId { id: gid });
    }
    Ok(gid)
}

/// Live counts of a pass, readable while it runs (progress bars, logs).
#[derive(Debug, Default)]
pub struct Counters {
    entries: AtomicU64,
    chowned: AtomicU64,
    chmodded: AtomicU64,
    vanished: AtomicU64,
    errors: AtomicU64,
}

impl Counters {
    /// Entries examined so far.
    pub fn entries(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }
    pub fn changed(&self) -> u64 {
        self.chowned.load(Ordering::Relaxed) + self.chmodded.load(Ordering::Relaxed)
    }
}

/// A change that failed on one entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EntryError {
    pub path: PathBuf,
    /// The call that failed: `stat`, `open`, `read dir`, `chown` or `chmod`.
    pub operation: &'static str,
    pub error: String,
}

/// What a pass did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OwnershipReport {
    pub root: PathBuf,
    pub gid: u32,
    /// `OnRootMismatch` found the root right and walked nothing.
    pub skipped: bool,
    /// Entries examined, the root included.
    pub entries: u64,
    /// Entries whose group was changed.
    pub chowned: u64,
    /// Entries whose mode was changed.
    pub chmodded: u64,
    /// Entries that disappeared while the pass ran (not errors).
    pub vanished: u64,
    /// Walker threads the pass ran with (0 when nothing was walked): the request, clamped.
    pub walkers: usize,
    /// All entry errors counted; the first [`MAX_REPORTED_ERRORS`] are in `errors`.
    pub error_count: u64,
    pub errors: Vec<EntryError>,
    pub seconds: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    #[error("{path}: cannot open the volume root: {source}")]
    OpenRoot {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot give the volume root its group and mode: {source}")]
    ChangeRoot {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the walker threads: {0}")]
    Threads(String),
    #[error("group id {id} is (gid_t)-1, which chown reads as \"leave the group unchanged\"; it cannot own a volume")]
    UnsetId { id: u32 },
}

/// Runs one pass, logging progress for a long one (first after 30 s, then every 60 s).
pub fn apply(
    request: &OwnershipRequest<'_>,
    counters: &Counters,
) -> Result<OwnershipReport, OwnershipError> {
    apply_observed(request, counters, &|_, _| {})
}

/// [`apply`] with a hook called before each entry is examined: tests use it to make entries
/// vanish or change at an exact point of the walk.
pub(crate) fn apply_observed(
    request: &OwnershipRequest<'_>,
    counters: &Counters,
    before_entry: &walk::EntryHook,
) -> Result<OwnershipReport, OwnershipError> {
    check_gid(request.gid)?;
    let started = std::time::Instant::now();
    let mut report = progress::while_running(
        request.root,
        counters,
        Duration::from_secs(30),
        Duration::from_secs(60),
        || walk::run(request, counters, before_entry),
    )?;
    report.seconds = started.elapsed().as_secs_f64();
    if report.error_count > 0 {
        tracing::warn!(
            root = %request.root.display(),
            errors = report.error_count,
            first = ?report.errors.first(),
            "ownership pass could not change some entries"
        );
    }
    tracing::info!(
        root = %request.root.display(),
        gid = request.gid,
        skipped = report.skipped,
        entries = report.entries,
        chowned = report.chowned,
        chmodded = report.chmodded,
        walkers = report.walkers,
        seconds = report.seconds,
        "ownership pass done"
    );
    Ok(report)
}

/// A rough count of the entries under `root` when it is a whole filesystem of its own (a
/// mounted volume): the filesystem's used inodes. Only for progress display.
pub fn estimate_entries(root: &Path) -> Option<u64> {
    let stat = rustix::fs::statvfs(root).ok()?;
    let used = stat.f_files.checked_sub(stat.f_ffree)?;
    (used > 0).then_some(used)
}
