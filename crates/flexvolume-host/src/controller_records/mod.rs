//! Where the CSI controller keeps what it must remember between calls, and how replicas share
//! it without ever acting on one volume at once (docs/csi.md#controller-records).
//!
//! Everything the controller keeps of one volume is one [`ControllerRecord`]: its attachments
//! (what ControllerPublish attached, to which node, with which options, for ControllerUnpublish
//! and ListVolumes), the volume it provisioned (for a repeated CreateVolume and DeleteVolume's
//! `delete`), and its [`Fence`]: which replica is changing the volume now. One record, so that
//! one conditional write covers the fence and what it guards.
//!
//! Two layers:
//! - a [`RecordStore`] keeps records and versions and does nothing else: a write or a delete
//!   names the version it was decided on and is refused ([`RecordsError::Conflict`]) when the
//!   stored one is another. The state dir ([`StateDirStore`]), memory ([`MemoryStore`], for
//!   tests) and the binary's API-server backend differ only in where the bytes go.
//! - [`ControllerRecords`] holds the rules, once for every store: reads checked against their
//!   key, the fence protocol ([`fence`]), versions carried from each operation's read to its own
//!   write, listings a page at a time.

pub mod fence;
mod memory;
mod state_dir;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::lifecycle::ProvisionedVolume;
use crate::state::{StateError, VolumeRecord};
use flexvolume_protocol::name::DriverName;

pub use fence::{FenceSettings, Fenced};
pub use memory::MemoryStore;
pub use state_dir::{attachment_path, legacy_records, provisioned_path, StateDirStore};

#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("volume or node name {0:?} cannot be used: it must be non-empty")]
    Name(String),
    /// The stored record is not the version this write was decided on: another replica (or an
    /// older call of this one) wrote it since. The call is retried on what is there now.
    #[error("the record of {what} changed meanwhile (another controller replica wrote it): retry")]
    Conflict { what: String },
    /// Another replica holds the volume's fence: its call on the volume is in flight.
    #[error("volume {volume} is being changed by controller replica {holder} ({operation}): retry when it has finished")]
    Busy {
        volume: String,
        holder: String,
        operation: String,
    },
    /// This replica lost the volume's fence while its call ran (it could not renew it in time,
    /// or another replica took it): the call stopped, and what it did is in the record.
    #[error("the fence of volume {volume} was lost while {operation} ran ({why}): retry")]
    FenceLost {
        volume: String,
        operation: String,
        why: String,
    },
    /// A listing's page token the store does not accept: one it forgot (the API server keeps
    /// them a few minutes) or never made.
    #[error("the listing's token is no longer valid (expired, or not one the store made): start the listing again ({message})")]
    Expired { message: String },
    /// The store could not be reached or refused the call (the API server is down, the
    /// controller's token lacks a permission).
    #[error("controller records ({store}): {message}")]
    Unavailable { store: String, message: String },
    /// A stored record that does not parse, or is not the record of the key it is stored
    /// under; it is reported, never used or overwritten.
    #[error("controller record {what} is corrupt: {message}")]
    Corrupt { what: String, message: String },
}

/// Which replica is changing a volume now, and since when it has proved it is alive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fence {
    /// The replica: its host name and a number of this process's own, so that a restarted
    /// replica is another holder.
    pub holder: String,
    /// The fence's number: one more than the last holder's, for each acquisition.
    pub token: u64,
    /// What the holder is doing ("attach to node-1"): for operators, and for the next holder
    /// after a takeover.
    pub operation: String,
    /// How long the fence holds without a renewal, from when another replica first saw it.
    pub lease_seconds: u64,
    /// Renewals so far: every renewal is a write, which another replica sees as a change.
    pub renewals: u64,
}

/// Everything the controller keeps of one volume of one driver (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerRecord {
    pub driver: String,
    pub volume: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<Fence>,
    /// How many fences were ever taken on the volume: the next one's token.
    #[serde(default)]
    pub fences: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<ProvisionedVolume>,
    /// The attach records (role `Attach`), by node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attachments: BTreeMap<String, VolumeRecord>,
}

impl ControllerRecord {
    pub fn new(driver: &DriverName, volume: &str) -> Self {
        Self {
            driver: driver.to_string(),
            volume: volume.to_owned(),
            fence: None,
            fences: 0,
            provisioned: None,
            attachments: BTreeMap::new(),
        }
    }

    /// Nothing left to keep: no fence, no provisioned volume, no attachment. Such a record is
    /// deleted rather than written, so the records follow the volumes.
    pub fn is_empty(&self) -> bool {
        self.fence.is_none() && self.provisioned.is_none() && self.attachments.is_empty()
    }

    /// Whether this is the record of `driver`'s volume `volume`.
    pub fn is_of(&self, driver: &DriverName, volume: &str) -> bool {
        self.driver == driver.as_str() && self.volume == volume
    }
}

/// A store's version of a stored record: opaque, compared for equality only.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Version(pub String);

/// A record as stored, with the version a write decided on it must name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub version: Version,
    pub record: ControllerRecord,
}

/// One page of a driver's records.
#[derive(Debug, Default)]
pub struct Page {
    /// Unreadable records are reported, not hidden.
    pub records: Vec<Result<Stored, RecordsError>>,
    /// Where the next page starts; `None` on the last.
    pub next: Option<String>,
}

/// Where records are kept (see the module doc): storage and versions only, no rules.
pub trait RecordStore: Send + Sync + fmt::Debug {
    /// Where the records are, for logs and messages.
    fn describe(&self) -> String;

    /// The record of `driver`'s volume `volume`, as stored.
    fn read(&self, driver: &DriverName, volume: &str) -> Result<Option<Stored>, RecordsError>;

    /// Stores `record` under its key where the stored version is `expected` (`None`: where
    /// there is no record), and returns the new version; [`RecordsError::Conflict`] otherwise.
    fn write(
        &self,
        record: &ControllerRecord,
        expected: Option<&Version>,
    ) -> Result<Version, RecordsError>;

    /// Deletes the record where the stored version is `expected`; [`RecordsError::Conflict`]
    /// otherwise, a record already gone included.
    fn delete(
        &self,
        driver: &DriverName,
        volume: &str,
        expected: &Version,
    ) -> Result<(), RecordsError>;

    /// At most `limit` of `driver`'s records, from `from` (an earlier page's `next`; `None`:
    /// the first), in an order of the store's own.
    fn page(
        &self,
        driver: &DriverName,
        from: Option<&str>,
        limit: usize,
    ) -> Result<Page, RecordsError>;
}

/// The records with their rules, over any store (see the module doc).
#[derive(Debug)]
pub struct ControllerRecords {
    store: Arc<dyn RecordStore>,
    settings: FenceSettings,
    /// This replica, as it signs the fences it takes.
    holder: String,
    /// The fences of other replicas seen in the way of a call, with the version they were seen
    /// at and when: one unchanged for its lease is taken over.
    observed: Mutex<HashMap<(String, String), (Version, Instant)>>,
    /// The volumes this replica holds the fence of now.
    held: Arc<Mutex<HashSet<(String, String)>>>,
}

/// How many fences of other replicas are remembered before old sightings are forgotten.
const OBSERVED_KEPT: usize = 4096;

fn key(driver: &DriverName, volume: &str) -> (String, String) {
    (driver.to_string(), volume.to_owned())
}

/// Whether a record stored at the numbered version `stored` (`None`: no record) is the one a
/// write or delete decided on `expected` may change: the stores that number their versions.
pub(crate) fn is_expected(stored: Option<u64>, expected: Option<&Version>) -> bool {
    stored.map(|v| v.to_string()).as_deref() == expected.map(|e| e.0.as_str())
}

/// A volume or node name a record can be kept under: not empty.
pub fn check_name(name: &str) -> Result<(), RecordsError> {
    if name.is_empty() {
        Err(RecordsError::Name(name.to_owned()))
    } else {
        Ok(())
    }
}

impl ControllerRecords {
    pub fn new(store: Arc<dyn RecordStore>, settings: FenceSettings) -> Self {
        Self {
            store,
            settings,
            holder: fence::holder_identity(),
            observed: Mutex::default(),
            held: Arc::default(),
        }
    }

    /// The same records, signing fences as `holder` (tests: two replicas in one process).
    pub fn with_holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = holder.into();
        self
    }

    pub fn describe(&self) -> String {
        self.store.describe()
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The record of `driver`'s volume `volume` as stored now, checked to be that volume's:
    /// a record stored under another key is corrupt, never used.
    pub fn read(&self, driver: &DriverName, volume: &str) -> Result<Option<Stored>, RecordsError> {
        check_name(volume)?;
        let Some(stored) = self.store.read(driver, volume)? else {
            return Ok(None);
        };
        if !stored.record.is_of(driver, volume) {
            return Err(RecordsError::Corrupt {
                what: format!("of volume {volume} of driver {driver}"),
                message: format!(
                    "it holds volume {:?} of driver {:?}",
                    stored.record.volume, stored.record.driver
                ),
            });
        }
        Ok(Some(stored))
    }

    /// The attach record of `volume` on `node`, as stored now.
    pub fn attachment(
        &self,
        driver: &DriverName,
        volume: &str,
        node: &str,
    ) -> Result<Option<VolumeRecord>, RecordsError> {
        Ok(self
            .read(driver, volume)?
            .and_then(|s| s.record.attachments.get(node).cloned()))
    }

    /// The provisioned volume `name`, as stored now (done or not).
    pub fn provisioned(
        &self,
        driver: &DriverName,
        name: &str,
    ) -> Result<Option<ProvisionedVolume>, RecordsError> {
        Ok(self.read(driver, name)?.and_then(|s| s.record.provisioned))
    }

    /// Takes the fence of `driver`'s volume `volume` for `operation` (see [`fence`]), or says
    /// who holds it ([`RecordsError::Busy`]).
    pub fn fence(
        &self,
        driver: &DriverName,
        volume: &str,
        operation: &str,
    ) -> Result<Fenced, RecordsError> {
        fence::acquire(self, driver, volume, operation, &|_| {})
    }

    /// [`ControllerRecords::fence`], with `prepare` applied to the record in the same write
    /// (an operation's first record, written with its fence: one write fewer).
    pub fn fence_with(
        &self,
        driver: &DriverName,
        volume: &str,
        operation: &str,
        prepare: &dyn Fn(&mut ControllerRecord),
    ) -> Result<Fenced, RecordsError> {
        fence::acquire(self, driver, volume, operation, prepare)
    }

    /// One page of `driver`'s records. Records of another driver (a store that selects by a
    /// hash of the name may return them) are left out.
    pub fn page(
        &self,
        driver: &DriverName,
        from: Option<&str>,
        limit: usize,
    ) -> Result<Page, RecordsError> {
        let mut page = self.store.page(driver, from, limit.max(1))?;
        page.records.retain(|r| {
            r.as_ref()
                .map_or(true, |s| s.record.driver == driver.as_str())
        });
        Ok(page)
    }

    /// Records that the attachments of `seen` (as a listing read it, at its version) to
    /// `nodes` were found detached: they go back to `Mounting`, the state of an attach that did
    /// not finish, so the next ControllerPublish attaches again. One conditional write from the
    /// listing's version: a record that changed since (a call took its fence, an attachment
    /// changed) is left to whoever changed it. Returns whether the record was changed.
    pub fn mark_detached(&self, seen: &Stored, nodes: &[String]) -> Result<bool, RecordsError> {
        if seen.record.fence.is_some() {
            return Ok(false);
        }
        let mut record = seen.record.clone();
        let mut changed = false;
        for node in nodes {
            if let Some(a) = record.attachments.get_mut(node) {
                if a.progress == crate::state::Progress::Mounted {
                    a.progress = crate::state::Progress::Mounting;
                    changed = true;
                }
            }
        }
        if !changed {
            return Ok(false);
        }
        match self.store.write(&record, Some(&seen.version)) {
            Ok(_) => Ok(true),
            Err(RecordsError::Conflict { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests;
