//! Which records changed since the last look, from inotify on the volumes directory.
//!
//! A long-running flexd (serve) lists records on every publish, to refuse overlaps; without a
//! watch each listing stats every record file to know it is unchanged, and a burst of publishes
//! costs records × publishes stats. inotify queues an event for every change to a directory
//! entry *before* the system call that made it returns, so once the queue is drained, every
//! change made before that is known: the records not named by an event are as they were, at
//! the cost of one `read` per listing. Whoever made the change (this process, a `flexd volume`
//! command, another flexd, a person) does not matter.

use std::collections::HashSet;
use std::io;
use std::path::Path;

use inotify::{EventMask, Inotify, WatchMask};

use crate::layout::is_hidden;

/// What the events read since the last drain say.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Changed {
    /// Records (by id) whose file or marker was created, written, renamed or removed.
    pub ids: HashSet<String>,
    /// Events were lost, or the directory itself went away: nothing is known, list it all.
    pub everything: bool,
}

/// An inotify watch on one volumes directory.
#[derive(Debug)]
pub(super) struct RecordWatch {
    inotify: Inotify,
}

impl RecordWatch {
    /// Watches `dir`; fails when it does not exist (yet) or inotify is out of instances.
    pub fn new(dir: &Path) -> io::Result<Self> {
        let inotify = Inotify::init()?;
        inotify.watches().add(
            dir,
            WatchMask::CREATE
                | WatchMask::DELETE
                | WatchMask::MOVED_FROM
                | WatchMask::MOVED_TO
                | WatchMask::MODIFY
                | WatchMask::CLOSE_WRITE
                | WatchMask::ATTRIB
                | WatchMask::DELETE_SELF
                | WatchMask::MOVE_SELF
                | WatchMask::DONT_FOLLOW
                | WatchMask::ONLYDIR,
        )?;
        Ok(Self { inotify })
    }

    /// Everything queued so far. A read error other than "nothing queued" counts as lost
    /// events: the caller lists everything, and a watch whose directory went away is dropped.
    pub fn drain(&mut self) -> Changed {
        let mut changed = Changed::default();
        let mut buffer = [0u8; 16 * 1024];
        loop {
            let events = match self.inotify.read_events(&mut buffer) {
                Ok(events) => events,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return changed,
                Err(_) => {
                    changed.everything = true;
                    return changed;
                }
            };
            for event in events {
                if event.mask.intersects(
                    EventMask::Q_OVERFLOW
                        | EventMask::DELETE_SELF
                        | EventMask::MOVE_SELF
                        | EventMask::IGNORED
                        | EventMask::UNMOUNT,
                ) {
                    changed.everything = true;
                }
                let Some(name) = event.name.filter(|n| !is_hidden(n)) else {
                    continue;
                };
                let Some(name) = name.to_str() else { continue };
                if let Some(id) = name
                    .strip_suffix(".json")
                    .or_else(|| name.strip_suffix(".mounted"))
                {
                    changed.ids.insert(id.to_owned());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_records_changed_by_anyone_and_ignores_hidden_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut watch = RecordWatch::new(dir.path()).unwrap();
        assert_eq!(watch.drain(), Changed::default());
        std::fs::write(dir.path().join(".a.1.tmp"), b"{}").unwrap();
        std::fs::rename(dir.path().join(".a.1.tmp"), dir.path().join("a.json")).unwrap();
        std::fs::write(dir.path().join("b.mounted"), b"").unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"").unwrap();
        let changed = watch.drain();
        assert!(!changed.everything);
        assert_eq!(changed.ids, HashSet::from(["a".into(), "b".into()]));
        // Drained: nothing again until the next change, which may be a removal.
        assert_eq!(watch.drain(), Changed::default());
        std::fs::remove_file(dir.path().join("a.json")).unwrap();
        assert_eq!(watch.drain().ids, HashSet::from(["a".into()]));
    }

    #[test]
    fn a_directory_gone_means_everything_changed() {
        let dir = tempfile::tempdir().unwrap();
        let volumes = dir.path().join("volumes");
        std::fs::create_dir(&volumes).unwrap();
        let mut watch = RecordWatch::new(&volumes).unwrap();
        std::fs::rename(&volumes, dir.path().join("elsewhere")).unwrap();
        assert!(watch.drain().everything);
        assert!(RecordWatch::new(&volumes).is_err(), "nothing to watch");
    }
}
