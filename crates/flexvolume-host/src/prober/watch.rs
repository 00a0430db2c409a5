//! The inotify side of the prober: which directories are watched, and what an event means.
//!
//! Every watch belongs to one top-level entry of the plugin dir (a driver directory, the *key*),
//! so an event anywhere below `vendor~drv/` marks exactly that driver as changed. The watches of
//! a key are re-synced each time the key is probed: a driver directory renamed or swapped in
//! (atomic directory installs) then never keeps watches attributed to the wrong name.
//!
//! Names starting with `.` are never watched and their events are ignored, anywhere. Symlinks
//! are never followed for watching: a driver directory that is a symlink (allowed only with
//! `--allow-symlinks`) is seen as a whole, changes inside its target are not
//! (docs/discovery.md#symlinks).
//!
//! When the kernel's watch limit (`fs.inotify.max_user_watches`) is reached, the directory that
//! could not be watched is reported once and *degraded*: the prober fingerprints it every probe
//! interval instead, so no change is missed, only seen later.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

use crate::layout::is_hidden;

/// What a batch of inotify events asks the prober to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// Something changed in (or of) this top-level entry.
    Key(String),
    /// Events were lost (queue overflow): compare everything.
    Rescan,
    /// The plugin dir itself was removed or moved away.
    RootGone,
}

/// Writes are seen at CLOSE_WRITE, when the content is complete, not at each MODIFY: a third of
/// the events of a storm, and never a probe of a half-written file.
fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::CLOSE_WRITE
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::DONT_FOLLOW
        | WatchMask::ONLYDIR
}

/// Why a watch could not be added.
enum AddError {
    /// The watch limit is reached: degrade.
    Limit,
    /// The directory vanished meanwhile, or cannot be watched: nothing to do.
    Other,
}

pub(crate) struct WatchSet {
    inotify: Inotify,
    root: PathBuf,
    root_wd: Option<WatchDescriptor>,
    by_wd: HashMap<WatchDescriptor, (String, PathBuf)>,
    by_key: HashMap<String, Vec<WatchDescriptor>>,
    /// An artificial watch limit, to exercise degradation in tests without touching the
    /// machine-wide sysctl.
    limit: Option<usize>,
    /// Keys not fully watched; the prober fingerprints them every interval.
    pub degraded: HashSet<String>,
    /// The plugin dir itself could not be watched: every entry is degraded.
    pub root_degraded: bool,
    limit_reported: bool,
}

impl WatchSet {
    pub fn new(root: &Path, limit: Option<usize>) -> io::Result<Self> {
        Ok(Self {
            inotify: Inotify::init()?,
            root: root.to_owned(),
            root_wd: None,
            by_wd: HashMap::new(),
            by_key: HashMap::new(),
            limit,
            degraded: HashSet::new(),
            root_degraded: false,
            limit_reported: false,
        })
    }

    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.inotify)
    }

    /// How many directories are watched.
    pub fn len(&self) -> usize {
        self.by_wd.len() + usize::from(self.root_wd.is_some())
    }

    fn add(&mut self, path: &Path) -> Result<WatchDescriptor, AddError> {
        if self.limit.is_some_and(|limit| self.len() >= limit) {
            return Err(AddError::Limit);
        }
        match self.inotify.watches().add(path, mask()) {
            Ok(wd) => Ok(wd),
            Err(e) if e.raw_os_error() == Some(libc_enospc()) => Err(AddError::Limit),
            Err(_) => Err(AddError::Other),
        }
    }

    fn report_limit(&mut self, path: &Path) {
        if !self.limit_reported {
            self.limit_reported = true;
            tracing::error!(
                path = %path.display(),
                watched = self.len(),
                "inotify watch limit reached (raise fs.inotify.max_user_watches); \
                 directories that cannot be watched are rescanned every probe interval instead"
            );
        }
    }

    /// Creates the plugin dir if needed (docs/discovery.md#plugin-dir) and watches it. Created
    /// 0755 whatever the umask: discovery refuses a plugin dir others may write
    /// (docs/discovery.md#trust).
    pub(crate) fn watch_root(&mut self) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&self.root)?;
        match self.add(&self.root.clone()) {
            Ok(wd) => {
                self.root_wd = Some(wd);
                self.root_degraded = false;
            }
            Err(AddError::Limit) => {
                self.report_limit(&self.root.clone());
                self.root_degraded = true;
            }
            Err(AddError::Other) => return Err(io::Error::other("cannot watch the plugin dir")),
        }
        Ok(())
    }

    /// The visible top-level entries of the plugin dir.
    pub(crate) fn present_keys(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        entries
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| !is_hidden(n))
            .map(|n| n.to_string_lossy().into_owned())
            .collect()
    }

    /// Stops watching below one key (the plugin dir's own watch still sees the entry come and
    /// go). Used while the key's next probe is already scheduled: its events would say nothing
    /// new, and a storm of them would cost CPU for nothing.
    pub(crate) fn unwatch_key(&mut self, key: &str) {
        for wd in self.by_key.remove(key).unwrap_or_default() {
            if self.by_wd.get(&wd).is_some_and(|(owner, _)| owner == key) {
                self.by_wd.remove(&wd);
                let _ = self.inotify.watches().remove(wd);
            }
        }
    }

    /// Re-creates the watches of one key from what is on disk now.
    pub(crate) fn sync_key(&mut self, key: &str) {
        self.unwatch_key(key);
        self.degraded.remove(key);
        let top = self.root.join(key);
        self.add_tree(key, &top);
    }

    /// Watches `dir` and every visible directory below it for `key` (no symlink followed).
    fn add_tree(&mut self, key: &str, dir: &Path) {
        let is_real_dir = std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
        if !is_real_dir {
            return;
        }
        let mut stack = vec![dir.to_owned()];
        while let Some(dir) = stack.pop() {
            match self.add(&dir) {
                Ok(wd) => {
                    self.by_wd.insert(wd.clone(), (key.to_owned(), dir.clone()));
                    self.by_key.entry(key.to_owned()).or_default().push(wd);
                }
                Err(AddError::Limit) => {
                    self.report_limit(&dir);
                    self.degraded.insert(key.to_owned());
                    return;
                }
                Err(AddError::Other) => continue,
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let hidden = is_hidden(&entry.file_name());
                if !hidden && entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
    }

    /// Reads every pending event (never blocks) and appends what they mean; returns how many
    /// events were read.
    pub fn read(&mut self, out: &mut Vec<Change>) -> io::Result<usize> {
        let mut count = 0;
        let mut buffer = [0u8; 64 * 1024];
        loop {
            let events = match self.inotify.read_events(&mut buffer) {
                Ok(events) => events,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(count),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let mut new_dirs: Vec<(String, PathBuf)> = Vec::new();
            let mut any = false;
            for event in events {
                any = true;
                count += 1;
                if event.mask.contains(EventMask::Q_OVERFLOW) {
                    out.push(Change::Rescan);
                    continue;
                }
                if Some(&event.wd) == self.root_wd.as_ref() {
                    if event.mask.intersects(
                        EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED,
                    ) {
                        self.root_wd = None;
                        out.push(Change::RootGone);
                    } else if let Some(name) = event.name.filter(|n| !is_hidden(n)) {
                        out.push(Change::Key(name.to_string_lossy().into_owned()));
                    }
                    continue;
                }
                let Some((key, path)) = self.by_wd.get(&event.wd).cloned() else {
                    continue;
                };
                if event.mask.contains(EventMask::IGNORED) {
                    self.by_wd.remove(&event.wd);
                    out.push(Change::Key(key));
                    continue;
                }
                match event.name {
                    Some(name) if is_hidden(name) => continue,
                    Some(name) => {
                        let created = event
                            .mask
                            .intersects(EventMask::CREATE | EventMask::MOVED_TO);
                        if created && event.mask.contains(EventMask::ISDIR) {
                            new_dirs.push((key.clone(), path.join(name)));
                        }
                    }
                    None => {}
                }
                out.push(Change::Key(key));
            }
            // A directory created below a driver dir is watched at once; files that appeared in
            // it before the watch existed are covered by the re-probe its creation causes.
            for (key, dir) in new_dirs {
                self.add_tree(&key, &dir);
            }
            if !any {
                return Ok(count);
            }
        }
    }

    pub(crate) fn fingerprint(&self, key: &str) -> u64 {
        fingerprint(&self.root, key)
    }
}

/// A fingerprint of a key's directory tree (names, inodes, sizes, modes, mtimes): compared by
/// degraded keys that cannot be watched, and to tell whether a change seen during a probe was
/// already seen by it.
pub(crate) fn fingerprint(root: &Path, key: &str) -> u64 {
    {
        let mut hasher = DefaultHasher::new();
        let top = root.join(key);
        let mut stack = vec![top];
        let mut seen = Vec::new();
        while let Some(path) = stack.pop() {
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            seen.push((
                path.clone(),
                meta.ino(),
                meta.size(),
                meta.mode(),
                meta.mtime(),
                meta.mtime_nsec(),
            ));
            if meta.is_dir() {
                if let Ok(entries) = std::fs::read_dir(&path) {
                    for entry in entries.flatten() {
                        if !is_hidden(&entry.file_name()) {
                            stack.push(entry.path());
                        }
                    }
                }
            }
        }
        seen.sort();
        seen.hash(&mut hasher);
        hasher.finish()
    }
}

/// ENOSPC: what inotify_add_watch returns when the watch limit is reached.
fn libc_enospc() -> i32 {
    rustix::io::Errno::NOSPC.raw_os_error()
}
