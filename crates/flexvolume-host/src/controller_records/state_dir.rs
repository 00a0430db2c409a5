//! The controller's records in one flexd's state dir, as flexd has always kept them:
//! attachments are volume records (role `Attach`) whose target is a name under
//! `<state-dir>/attachments/<vendor~driver>/<volume>/<node>`; provisioned volumes are JSON
//! files under `<state-dir>/provisioned/<vendor~driver>/`, written atomically and fsync-ed.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use super::{ControllerRecords, RecordsError};
use crate::lifecycle::{path_component, ProvisionedVolume};
use crate::state::{Role, StateDir, StateError, VolumeRecord};
use flexvolume_protocol::name::DriverName;

/// Longest record file name built from a volume name; longer names are hashed.
const MAX_FILE_NAME: usize = 200;

#[derive(Debug, Clone)]
pub struct StateDirRecords {
    pub state: StateDir,
}

/// Where the attach record of a volume on a node is kept (a name, never a mount point).
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

/// Where the record of a provisioned volume lives.
pub fn provisioned_path(
    root: &Path,
    driver: &DriverName,
    name: &str,
) -> Result<PathBuf, RecordsError> {
    let component = component(name)?;
    // `%h` never starts an escaped name (escapes are upper-case hex), so the two forms
    // cannot collide.
    let file = if component.len() <= MAX_FILE_NAME {
        component
    } else {
        format!("%h{:016x}", crate::state::stable_hash(name.as_bytes()))
    };
    Ok(root
        .join("provisioned")
        .join(driver.dir_name())
        .join(format!("{file}.json")))
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
    crate::state::open_dir(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

impl StateDirRecords {
    pub fn new(state: StateDir) -> Self {
        Self { state }
    }

    /// Every driver this state dir holds controller records of (attachments or provisioned
    /// volumes), sorted: what an import reads.
    pub fn drivers(&self) -> Result<Vec<DriverName>, RecordsError> {
        let mut drivers = std::collections::BTreeSet::new();
        for record in self.state.list()?.into_iter().flatten() {
            if record.role == Role::Attach {
                drivers.insert(record.driver);
            }
        }
        let dir = self.state.root.join("provisioned");
        match fs::read_dir(&dir) {
            Ok(entries) => {
                for entry in entries.flatten() {
                    let name = entry.file_name();
                    if let Ok(driver) = DriverName::from_dir_name(&name.to_string_lossy()) {
                        drivers.insert(driver);
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&dir)(e).into()),
        }
        Ok(drivers.into_iter().collect())
    }

    /// The provisioned record in the file at `path`, as written.
    fn read_provisioned(path: &Path) -> Result<Option<ProvisionedVolume>, RecordsError> {
        // The state dir's one reader of record files: never waits on a FIFO nor reads a link.
        let Some(bytes) = crate::state::read_record_file(path)? else {
            return Ok(None);
        };
        let volume = serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Ok(Some(volume))
    }
}

impl ControllerRecords for StateDirRecords {
    fn describe(&self) -> String {
        format!("state dir {}", self.state.root.display())
    }

    fn attachment(
        &self,
        driver: &DriverName,
        volume: &str,
        node: &str,
    ) -> Result<Option<VolumeRecord>, RecordsError> {
        let key = attachment_path(&self.state.root, driver, volume, node)?;
        Ok(self.state.load(&key)?)
    }

    fn save_attachment(&self, record: &VolumeRecord) -> Result<(), RecordsError> {
        Ok(self.state.save(record)?)
    }

    fn remove_attachment(
        &self,
        driver: &DriverName,
        volume: &str,
        node: &str,
    ) -> Result<(), RecordsError> {
        let key = attachment_path(&self.state.root, driver, volume, node)?;
        Ok(self.state.remove(&key)?)
    }

    fn attachments(
        &self,
        driver: &DriverName,
    ) -> Result<Vec<Result<VolumeRecord, RecordsError>>, RecordsError> {
        Ok(self
            .state
            .list()?
            .into_iter()
            .filter(|r| {
                r.as_ref()
                    .map_or(true, |r| r.role == Role::Attach && r.driver == *driver)
            })
            .map(|r| r.map_err(RecordsError::from))
            .collect())
    }

    fn provisioned(
        &self,
        driver: &DriverName,
        name: &str,
    ) -> Result<Option<ProvisionedVolume>, RecordsError> {
        let path = provisioned_path(&self.state.root, driver, name)?;
        // A hashed file name of another (over-long) name is not this volume.
        Ok(
            Self::read_provisioned(&path)?
                .filter(|v| v.name == name && v.driver == driver.as_str()),
        )
    }

    fn save_provisioned(
        &self,
        driver: &DriverName,
        volume: &ProvisionedVolume,
    ) -> Result<(), RecordsError> {
        let path = provisioned_path(&self.state.root, driver, &volume.name)?;
        let json = serde_json::to_vec_pretty(volume).map_err(|e| StateError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        Ok(write_atomic(&path, &json)?)
    }

    fn remove_provisioned(&self, driver: &DriverName, name: &str) -> Result<(), RecordsError> {
        let path = provisioned_path(&self.state.root, driver, name)?;
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(&path)(e).into()),
        }
    }

    fn all_provisioned(
        &self,
        driver: &DriverName,
    ) -> Result<Vec<Result<ProvisionedVolume, RecordsError>>, RecordsError> {
        let dir = self.state.root.join("provisioned").join(driver.dir_name());
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(&dir)(e).into()),
        };
        let mut volumes = Vec::new();
        let mut seen = HashSet::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            // Temporary files of a write in progress are hidden.
            if crate::layout::is_hidden(&name) || !name.to_string_lossy().ends_with(".json") {
                continue;
            }
            let path = entry.path();
            match Self::read_provisioned(&path) {
                // Deleted since the directory was read.
                Ok(None) => {}
                // A record must be at the path its own name gives: a copy under another name
                // is not that volume's record.
                Ok(Some(volume))
                    if volume.driver != driver.as_str()
                        || provisioned_path(&self.state.root, driver, &volume.name).ok()
                            != Some(path.clone()) =>
                {
                    volumes.push(Err(StateError::Corrupt {
                        message: format!(
                            "it records volume {:?} of driver {:?}, whose record is not this file",
                            volume.name, volume.driver
                        ),
                        path,
                    }
                    .into()));
                }
                // One file per name: a second is impossible, but never two entries for one id.
                Ok(Some(volume)) => {
                    if seen.insert(volume.name.clone()) {
                        volumes.push(Ok(volume));
                    }
                }
                Err(e) => volumes.push(Err(e)),
            }
        }
        Ok(volumes)
    }
}
