//! Where the CSI controller keeps what it must remember between calls: its attachments (what
//! ControllerPublish attached, to which node, with which options, for ControllerUnpublish and
//! ListVolumes) and the volumes it provisioned (for a repeated CreateVolume, for DeleteVolume's
//! `delete`, which receives the volume's options, and for ListVolumes).
//!
//! One flexd keeps them in its state dir ([`StateDirRecords`]). Replicas of a highly
//! available controller keep them where every replica reads them, whichever node is lost: the
//! binary's Kubernetes backend keeps each as an object in the API server. [`MemoryRecords`]
//! is a store for tests of two controllers over one set of records.
//!
//! A backend is called from blocking code (the lifecycle runs on blocking threads), under the
//! volume's lock of the replica that calls; across replicas, a backend refuses a write made
//! from an out-of-date read ([`RecordsError::Conflict`]).

mod memory;
mod state_dir;

use std::fmt;

use crate::lifecycle::ProvisionedVolume;
use crate::state::{StateError, VolumeRecord};
use flexvolume_protocol::name::DriverName;

pub use memory::MemoryRecords;
pub use state_dir::{attachment_path, provisioned_path, StateDirRecords};

#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("volume or node name {0:?} cannot be used: it must be non-empty")]
    Name(String),
    /// Another replica changed the record since this one read it: the call is retried.
    #[error("the record of {what} changed meanwhile (another controller replica wrote it): retry")]
    Conflict { what: String },
    /// The store could not be reached or refused the call (the API server is down, the
    /// controller's token lacks a permission).
    #[error("controller records ({store}): {message}")]
    Unavailable { store: String, message: String },
    /// A stored record that does not parse; it is reported, never used.
    #[error("controller record {what} is corrupt: {message}")]
    Corrupt { what: String, message: String },
}

/// The controller's records of attachments and provisioned volumes (see the module doc).
///
/// An attachment is the [`VolumeRecord`] of role `Attach` that
/// [`crate::lifecycle::Lifecycle::controller_publish`] writes before the driver's `attach` and
/// marks done after it; its key is (driver, volume, node).
pub trait ControllerRecords: Send + Sync + fmt::Debug {
    /// Where the records are, for logs and messages.
    fn describe(&self) -> String;

    fn attachment(
        &self,
        driver: &DriverName,
        volume: &str,
        node: &str,
    ) -> Result<Option<VolumeRecord>, RecordsError>;

    fn save_attachment(&self, record: &VolumeRecord) -> Result<(), RecordsError>;

    fn remove_attachment(
        &self,
        driver: &DriverName,
        volume: &str,
        node: &str,
    ) -> Result<(), RecordsError>;

    /// Every attachment of `driver`; unreadable records are reported, not hidden.
    fn attachments(
        &self,
        driver: &DriverName,
    ) -> Result<Vec<Result<VolumeRecord, RecordsError>>, RecordsError>;

    fn provisioned(
        &self,
        driver: &DriverName,
        name: &str,
    ) -> Result<Option<ProvisionedVolume>, RecordsError>;

    fn save_provisioned(
        &self,
        driver: &DriverName,
        volume: &ProvisionedVolume,
    ) -> Result<(), RecordsError>;

    fn remove_provisioned(&self, driver: &DriverName, name: &str) -> Result<(), RecordsError>;

    /// Every provisioned volume of `driver`, done or not; unreadable records are reported.
    fn all_provisioned(
        &self,
        driver: &DriverName,
    ) -> Result<Vec<Result<ProvisionedVolume, RecordsError>>, RecordsError>;
}

#[cfg(test)]
mod tests;
