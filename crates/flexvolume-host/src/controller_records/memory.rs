//! Controller records in memory, shared by every clone: two controllers over one `MemoryStore`
//! behave as two replicas over one API server, versions included. For tests; nothing survives
//! the process.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{
    check_name, is_expected, ControllerRecord, Page, RecordStore, RecordsError, Stored, Version,
};
use flexvolume_protocol::name::DriverName;

#[derive(Debug, Default)]
struct Records {
    /// By (driver, volume): the record and its version.
    records: BTreeMap<(String, String), (ControllerRecord, u64)>,
    last_version: u64,
}

#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    records: Arc<Mutex<Records>>,
}

impl MemoryStore {
    fn with<T>(&self, f: impl FnOnce(&mut Records) -> T) -> T {
        f(&mut self.records.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

fn conflict(driver: &str, volume: &str) -> RecordsError {
    RecordsError::Conflict {
        what: format!("volume {volume} of driver {driver}"),
    }
}

impl RecordStore for MemoryStore {
    fn describe(&self) -> String {
        "memory".to_owned()
    }

    fn read(&self, driver: &DriverName, volume: &str) -> Result<Option<Stored>, RecordsError> {
        Ok(self.with(|r| {
            r.records
                .get(&(driver.to_string(), volume.to_owned()))
                .map(|(record, version)| Stored {
                    version: Version(version.to_string()),
                    record: record.clone(),
                })
        }))
    }

    fn write(
        &self,
        record: &ControllerRecord,
        expected: Option<&Version>,
    ) -> Result<Version, RecordsError> {
        check_name(&record.volume)?;
        self.with(|r| {
            let key = (record.driver.clone(), record.volume.clone());
            if !is_expected(r.records.get(&key).map(|(_, v)| *v), expected) {
                return Err(conflict(&record.driver, &record.volume));
            }
            r.last_version += 1;
            let version = r.last_version;
            r.records.insert(key, (record.clone(), version));
            Ok(Version(version.to_string()))
        })
    }

    fn delete(
        &self,
        driver: &DriverName,
        volume: &str,
        expected: &Version,
    ) -> Result<(), RecordsError> {
        self.with(|r| {
            let key = (driver.to_string(), volume.to_owned());
            if !is_expected(r.records.get(&key).map(|(_, v)| *v), Some(expected)) {
                return Err(conflict(driver.as_str(), volume));
            }
            r.records.remove(&key);
            Ok(())
        })
    }

    fn page(
        &self,
        driver: &DriverName,
        from: Option<&str>,
        limit: usize,
    ) -> Result<Page, RecordsError> {
        Ok(self.with(|r| {
            let mut of_driver = r
                .records
                .iter()
                .filter(|((d, _), _)| d == driver.as_str())
                .filter(|((_, v), _)| from.is_none_or(|from| v.as_str() > from))
                .map(|(_, (record, version))| Stored {
                    version: Version(version.to_string()),
                    record: record.clone(),
                });
            let records: Vec<Stored> = of_driver.by_ref().take(limit).collect();
            let next = match (of_driver.next(), records.last()) {
                (Some(_), Some(last)) => Some(last.record.volume.clone()),
                _ => None,
            };
            Page {
                records: records.into_iter().map(Ok).collect(),
                next,
            }
        }))
    }
}
