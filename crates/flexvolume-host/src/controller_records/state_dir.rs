//! The controller's records in one flexd's state dir: one file per volume,
//! `<state-dir>/controller/<vendor~driver>/<volume>.json` (the volume's name escaped as one path
//! component, hashed when over-long), holding the record and its version, a number. A write
//! compares and replaces under the file's lock, atomically (temporary file, fsync, rename,
//! fsync of the directory).
//!
//! Older flexds kept attachments as volume records (role `Attach`, target
//! `<state-dir>/attachments/<vendor~driver>/<volume>/<node>`) and provisioned volumes as files
//! under `<state-dir>/provisioned/<vendor~driver>/`. [`legacy_records`] reads those;
//! [`StateDirStore::adopt_legacy`] moves them into records at start, and `flexd records import`
//! copies them from an older controller's state dir.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{
    check_name, is_expected, ControllerRecord, Page, RecordStore, RecordsError, Stored, Version,
};
use crate::lifecycle::{path_component, ProvisionedVolume};
use crate::state::{Role, StateDir, StateError};
use flexvolume_protocol::name::DriverName;

/// Longest record file name built from a volume name; longer names are hashed.
const MAX_FILE_NAME: usize = 200;

#[derive(Debug, Clone)]
pub struct StateDirStore {
    pub state: StateDir,
}

/// A record file: the record and its version.
#[derive(Debug, Serialize, Deserialize)]
struct RecordFile {
    version: u64,
    record: ControllerRecord,
}

/// Where older flexds kept the attach record of a volume on a node (a name, never a mount
/// point); still the name such an attachment's lock is taken under.
pub fn attachment_path(
    root: &Path,
    driver: &DriverName,
    volume: &str,
    node: &str,
) -> Result<PathBuf, RecordsError> {
    Ok(root
        .join("attachments")
        .join(driver.dir_name())
        .join(component(volume)?)
        .join(component(node)?))
}

/// The file name of a volume: its name as one path component, hashed when over-long. `%h`
/// never starts an escaped name (escapes are upper-case hex), so the two forms cannot collide.
fn file_name(name: &str) -> Result<String, RecordsError> {
    let component = component(name)?;
    Ok(if component.len() <= MAX_FILE_NAME {
        format!("{component}.json")
    } else {
        format!("%h{:016x}.json", crate::state::stable_hash(name.as_bytes()))
    })
}

/// Where older flexds kept the record of a provisioned volume; still the name its lock is
/// taken under.
pub fn provisioned_path(
    root: &Path,
    driver: &DriverName,
    name: &str,
) -> Result<PathBuf, RecordsError> {
    Ok(root
        .join("provisioned")
        .join(driver.dir_name())
        .join(file_name(name)?))
}

fn component(name: &str) -> Result<String, RecordsError> {
    path_component(name).map_err(|_| RecordsError::Name(name.to_owned()))
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `bytes` to `path` atomically: a temp file, fsync, rename, fsync of the directory.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    crate::state::create_private_dir_all(dir).map_err(io_err(dir))?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = crate::state::create_fresh(&temp)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        })
        .map_err(io_err(&temp))
        .and_then(|()| fs::rename(&temp, path).map_err(io_err(path)));
    if let Err(e) = written {
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<(), StateError> {
    crate::state::open_dir(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

fn conflict(driver: &DriverName, volume: &str) -> RecordsError {
    RecordsError::Conflict {
        what: format!("volume {volume} of driver {driver}"),
    }
}

impl StateDirStore {
    pub fn new(state: StateDir) -> Self {
        Self { state }
    }

    fn driver_dir(&self, driver: &DriverName) -> PathBuf {
        self.state.root.join("controller").join(driver.dir_name())
    }

    pub(super) fn path(&self, driver: &DriverName, volume: &str) -> Result<PathBuf, RecordsError> {
        Ok(self.driver_dir(driver).join(file_name(volume)?))
    }

    /// The record file at `path`, as written (never follows a link or waits on a FIFO).
    fn load(path: &Path) -> Result<Option<RecordFile>, RecordsError> {
        let Some(bytes) = crate::state::read_record_file(path)? else {
            return Ok(None);
        };
        let file = serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Ok(Some(file))
    }

    /// Every driver this state dir holds controller records of, legacy ones included, sorted.
    pub fn drivers(&self) -> Result<Vec<DriverName>, RecordsError> {
        let mut drivers = std::collections::BTreeSet::new();
        for record in legacy_records(&self.state)?.into_iter().flatten() {
            if let Ok(driver) = DriverName::parse(&record.driver) {
                drivers.insert(driver);
            }
        }
        let dir = self.state.root.join("controller");
        match fs::read_dir(&dir) {
            Ok(entries) => {
                for entry in entries.flatten() {
                    if let Ok(driver) =
                        DriverName::from_dir_name(&entry.file_name().to_string_lossy())
                    {
                        drivers.insert(driver);
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&dir)(e).into()),
        }
        Ok(drivers.into_iter().collect())
    }

    /// Moves the records an older flexd kept in this state dir (see the module doc) into
    /// records, then removes them. A volume that has a record already keeps what it holds.
    /// Returns how many volumes were adopted.
    pub fn adopt_legacy(&self) -> Result<usize, RecordsError> {
        let mut adopted = 0;
        for legacy in legacy_records(&self.state)? {
            let legacy = match legacy {
                Ok(legacy) => legacy,
                Err(e) => {
                    tracing::warn!(error = %e, "an older controller record cannot be read: it is left where it is");
                    continue;
                }
            };
            let Ok(driver) = DriverName::parse(&legacy.driver) else {
                continue;
            };
            let stored = self.read(&driver, &legacy.volume)?;
            let (mut record, version) = match stored {
                Some(s) => (s.record, Some(s.version)),
                None => (ControllerRecord::new(&driver, &legacy.volume), None),
            };
            if record.provisioned.is_none() {
                record.provisioned = legacy.provisioned.clone();
            }
            for (node, attachment) in &legacy.attachments {
                record
                    .attachments
                    .entry(node.clone())
                    .or_insert_with(|| attachment.clone());
            }
            self.write(&record, version.as_ref())?;
            for attachment in legacy.attachments.values() {
                self.state.remove(&attachment.target)?;
            }
            if legacy.provisioned.is_some() {
                let path = provisioned_path(&self.state.root, &driver, &legacy.volume)?;
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err(&path)(e).into()),
                }
            }
            adopted += 1;
        }
        Ok(adopted)
    }
}

impl RecordStore for StateDirStore {
    fn describe(&self) -> String {
        format!("state dir {}", self.state.root.display())
    }

    fn read(&self, driver: &DriverName, volume: &str) -> Result<Option<Stored>, RecordsError> {
        let path = self.path(driver, volume)?;
        Ok(Self::load(&path)?.map(|file| Stored {
            version: Version(file.version.to_string()),
            record: file.record,
        }))
    }

    fn write(
        &self,
        record: &ControllerRecord,
        expected: Option<&Version>,
    ) -> Result<Version, RecordsError> {
        check_name(&record.volume)?;
        let driver = DriverName::parse(&record.driver).map_err(|e| RecordsError::Corrupt {
            what: format!("of volume {}", record.volume),
            message: format!("driver name {:?}: {e}", record.driver),
        })?;
        let path = self.path(&driver, &record.volume)?;
        let _lock = self.state.lock(&path)?;
        let stored = Self::load(&path)?.map(|f| f.version);
        if !is_expected(stored, expected) {
            return Err(conflict(&driver, &record.volume));
        }
        let version = stored.unwrap_or(0) + 1;
        let file = RecordFile {
            version,
            record: record.clone(),
        };
        let json = serde_json::to_vec_pretty(&file).map_err(|e| StateError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        write_atomic(&path, &json)?;
        Ok(Version(version.to_string()))
    }

    fn delete(
        &self,
        driver: &DriverName,
        volume: &str,
        expected: &Version,
    ) -> Result<(), RecordsError> {
        let path = self.path(driver, volume)?;
        let _lock = self.state.lock(&path)?;
        if !is_expected(Self::load(&path)?.map(|f| f.version), Some(expected)) {
            return Err(conflict(driver, volume));
        }
        fs::remove_file(&path).map_err(io_err(&path))?;
        let dir = path.parent().unwrap_or(Path::new("/"));
        Ok(sync_dir(dir)?)
    }

    fn page(
        &self,
        driver: &DriverName,
        from: Option<&str>,
        limit: usize,
    ) -> Result<Page, RecordsError> {
        let dir = self.driver_dir(driver);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Page::default()),
            Err(e) => return Err(io_err(&dir)(e).into()),
        };
        // Temporary files of a write in progress are hidden.
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.') && n.ends_with(".json"))
            .filter(|n| from.is_none_or(|from| n.as_str() > from))
            .collect();
        names.sort_unstable();
        let more = names.len() > limit;
        names.truncate(limit);
        let mut records = Vec::with_capacity(names.len());
        for name in &names {
            let path = dir.join(name);
            match Self::load(&path) {
                // Deleted since the directory was read.
                Ok(None) => {}
                // A record must be at the path its own key gives.
                Ok(Some(file))
                    if file.record.driver != driver.as_str()
                        || self.path(driver, &file.record.volume).ok() != Some(path.clone()) =>
                {
                    records.push(Err(StateError::Corrupt {
                        message: format!(
                            "it records volume {:?} of driver {:?}, whose record is not this file",
                            file.record.volume, file.record.driver
                        ),
                        path,
                    }
                    .into()));
                }
                Ok(Some(file)) => records.push(Ok(Stored {
                    version: Version(file.version.to_string()),
                    record: file.record,
                })),
                Err(e) => records.push(Err(e)),
            }
        }
        let next = if more { names.last().cloned() } else { None };
        Ok(Page { records, next })
    }
}

/// The records an older flexd kept in the state dir (see the module doc), one per volume.
pub fn legacy_records(
    state: &StateDir,
) -> Result<Vec<Result<ControllerRecord, RecordsError>>, RecordsError> {
    let mut records: BTreeMap<(String, String), ControllerRecord> = BTreeMap::new();
    let mut unreadable = Vec::new();
    for record in state.list()? {
        match record {
            Ok(record) if record.role == Role::Attach => {
                let key = (record.driver.to_string(), record.volume_name.clone());
                let entry = records
                    .entry(key)
                    .or_insert_with(|| ControllerRecord::new(&record.driver, &record.volume_name));
                entry.attachments.insert(record.node.clone(), record);
            }
            Ok(_) => {}
            // A record that cannot be read may be a node's as well as an attachment: the node
            // side reports those.
            Err(_) => {}
        }
    }
    let dir = state.root.join("provisioned");
    let drivers = match fs::read_dir(&dir) {
        Ok(entries) => entries.flatten().collect::<Vec<_>>(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_err(&dir)(e).into()),
    };
    for entry in drivers {
        let Ok(driver) = DriverName::from_dir_name(&entry.file_name().to_string_lossy()) else {
            continue;
        };
        let files = match fs::read_dir(entry.path()) {
            Ok(files) => files.flatten().collect::<Vec<_>>(),
            Err(e) => {
                unreadable.push(Err(io_err(&entry.path())(e).into()));
                continue;
            }
        };
        for file in files {
            let name = file.file_name();
            if crate::layout::is_hidden(&name) || !name.to_string_lossy().ends_with(".json") {
                continue;
            }
            let path = file.path();
            let volume: ProvisionedVolume = match crate::state::read_record_file(&path) {
                Ok(Some(bytes)) => match serde_json::from_slice(&bytes) {
                    Ok(volume) => volume,
                    Err(e) => {
                        unreadable.push(Err(StateError::Corrupt {
                            path,
                            message: e.to_string(),
                        }
                        .into()));
                        continue;
                    }
                },
                Ok(None) => continue,
                Err(e) => {
                    unreadable.push(Err(e.into()));
                    continue;
                }
            };
            if volume.driver != driver.as_str()
                || provisioned_path(&state.root, &driver, &volume.name).ok() != Some(path.clone())
            {
                unreadable.push(Err(StateError::Corrupt {
                    message: format!(
                        "it records volume {:?} of driver {:?}, whose record is not this file",
                        volume.name, volume.driver
                    ),
                    path,
                }
                .into()));
                continue;
            }
            let key = (driver.to_string(), volume.name.clone());
            let name = volume.name.clone();
            records
                .entry(key)
                .or_insert_with(|| ControllerRecord::new(&driver, &name))
                .provisioned = Some(volume);
        }
    }
    Ok(records.into_values().map(Ok).chain(unreadable).collect())
}
