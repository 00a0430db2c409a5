//! Controller records in memory, shared by every clone: two controller services over one
//! `MemoryRecords` behave as two replicas over one API server. For tests; nothing survives the
//! process.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{ControllerRecords, RecordsError};
use crate::lifecycle::ProvisionedVolume;
use crate::state::VolumeRecord;
use flexvolume_protocol::name::DriverName;

type AttachmentKey = (String, String, String);

#[derive(Debug, Default)]
struct Records {
    attachments: BTreeMap<AttachmentKey, VolumeRecord>,
    provisioned: BTreeMap<(String, String), ProvisionedVolume>,
}

#[derive(Debug, Clone, Default)]
pub struct MemoryRecords {
    records: Arc<Mutex<Records>>,
}

impl MemoryRecords {
    fn with<T>(&self, f: impl FnOnce(&mut Records) -> T) -> T {
        f(&mut self.records.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

fn key(driver: &DriverName, volume: &str, node: &str) -> AttachmentKey {
    (driver.to_string(), volume.to_owned(), node.to_owned())
}

impl ControllerRecords for MemoryRecords {
    fn describe(&self) -> String {
        "memory".to_owned()
    }

    fn attachment(
        &self,
        driver: &DriverName,
        volume: &str,
        node: &str,
    ) -> Result<Option<VolumeRecord>, RecordsError> {
        Ok(self.with(|r| r.attachments.get(&key(driver, volume, node)).cloned()))
    }

    fn save_attachment(&self, record: &VolumeRecord) -> Result<(), RecordsError> {
        let k = key(&record.driver, &record.volume_name, &record.node);
        self.with(|r| r.attachments.insert(k, record.clone()));
        Ok(())
    }

    fn remove_attachment(
        &self,
        driver: &DriverName,
        volume: &str,
        node: &str,
    ) -> Result<(), RecordsError> {
        self.with(|r| r.attachments.remove(&key(driver, volume, node)));
        Ok(())
    }

    fn attachments(
        &self,
        driver: &DriverName,
    ) -> Result<Vec<Result<VolumeRecord, RecordsError>>, RecordsError> {
        Ok(self.with(|r| {
            r.attachments
                .values()
                .filter(|a| a.driver == *driver)
                .cloned()
                .map(Ok)
                .collect()
        }))
    }

    fn provisioned(
        &self,
        driver: &DriverName,
        name: &str,
    ) -> Result<Option<ProvisionedVolume>, RecordsError> {
        Ok(self.with(|r| {
            r.provisioned
                .get(&(driver.to_string(), name.to_owned()))
                .cloned()
        }))
    }

    fn save_provisioned(
        &self,
        driver: &DriverName,
        volume: &ProvisionedVolume,
    ) -> Result<(), RecordsError> {
        let k = (driver.to_string(), volume.name.clone());
        self.with(|r| r.provisioned.insert(k, volume.clone()));
        Ok(())
    }

    fn remove_provisioned(&self, driver: &DriverName, name: &str) -> Result<(), RecordsError> {
        self.with(|r| r.provisioned.remove(&(driver.to_string(), name.to_owned())));
        Ok(())
    }

    fn all_provisioned(
        &self,
        driver: &DriverName,
    ) -> Result<Vec<Result<ProvisionedVolume, RecordsError>>, RecordsError> {
        Ok(self.with(|r| {
            r.provisioned
                .iter()
                .filter(|((d, _), _)| d == driver.as_str())
                .map(|(_, v)| Ok(v.clone()))
                .collect()
        }))
    }
}
