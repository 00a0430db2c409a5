//! A volume record and what it says: the operation it belongs to ([`Role`]) and how far that
//! got ([`Progress`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::StateError;
use flexvolume_protocol::name::DriverName;

/// How far a volume's setup got (the record's `stage` on disk; not CSI's NodeStage, which is
/// [`Role::Stage`]).
///
/// The record is written *before* each step with an effect (attach, the target's mount), so a
/// crash at any point leaves a record from which unmount undoes whatever was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Progress {
    /// Setup is under way (or was, when flexd crashed): the volume may be attached, its device
    /// mounted, the target mounted.
    #[serde(alias = "device-mounted")]
    Mounting,
    /// Mounted on the target.
    Mounted,
}

/// Which operation a record belongs to, and so how it is torn down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// The whole node flow on one target (`flexd volume mount`): attach, device mount, mount.
    #[default]
    Mount,
    /// CSI NodeStage: waitforattach + mountdevice onto the staging path (the record's target).
    Stage,
    /// CSI NodePublish: the driver's mount (or a bind of the staging path) onto the target.
    Publish,
    /// CSI ControllerPublish: an attach of a volume to a node; the target is a name under
    /// `<state-dir>/attachments/`, never a mount point.
    Attach,
}

impl Role {
    /// A CSI stage or publish: a mount on this node and nothing else, which a kernel crash takes
    /// away with its record. Its fresh records and their removals are not synced
    /// (docs/lifecycle.md#unsynced-publish).
    pub fn is_node_mount_only(self) -> bool {
        matches!(self, Role::Stage | Role::Publish)
    }
}

/// Everything needed to tear a volume down exactly as it was set up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub target: PathBuf,
    /// Written as the plain `vendor/driver` string; a record whose name is not a valid driver
    /// name does not load (it is reported as corrupt rather than used to build paths).
    #[serde(deserialize_with = "driver_name")]
    pub driver: DriverName,
    pub volume_name: String,
    pub fs_type: String,
    pub read_only: bool,
    /// The user's options (never secrets).
    pub options: BTreeMap<String, String>,
    pub attachable: bool,
    pub node: String,
    pub device: Option<String>,
    /// The staging path: where the device is mounted before the target gets it (FlexVolume's
    /// device mount dir; CSI's staging_target_path). A stage record's own path is its `target`.
    #[serde(rename = "device_mount_dir")]
    pub staging: Option<PathBuf>,
    /// The name detach receives: the volume's own name, as kubelet gives it (records made by
    /// an older flexd hold getvolumename's answer with `/` as `~`).
    pub detach_name: String,
    /// A copy of the driver executable as it was at mount time, for teardown after removal.
    pub pinned: Option<PathBuf>,
    /// Whether flexd created the target directory (and so removes it on teardown).
    pub created_target: bool,
    #[serde(rename = "stage")]
    pub progress: Progress,
    /// Absent in records written before CSI serving: those are whole-flow mounts.
    #[serde(default)]
    pub role: Role,
}

impl VolumeRecord {
    /// The volume's spec as it was mounted, without secrets (they are never stored).
    pub fn spec(&self) -> Result<flexvolume_protocol::spec::VolumeSpec, StateError> {
        let mut spec = flexvolume_protocol::spec::VolumeSpec::new(
            self.volume_name.clone(),
            self.driver.clone(),
        );
        spec.fs_type = self.fs_type.clone();
        spec.read_only = self.read_only;
        spec.options = self.options.clone();
        Ok(spec)
    }
}

/// Reads a record's driver name, validating it as any other name from outside is.
pub(super) fn driver_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<DriverName, D::Error> {
    let text = String::deserialize(d)?;
    DriverName::parse(&text)
        .map_err(|e| serde::de::Error::custom(format!("driver name {text:?}: {e}")))
}

/// A record parsed, or why it cannot be: [`StateError::Torn`] for what a crash leaves of a
/// fresh record before its sync (nothing, zeros where the data had not reached the disk, or
/// the JSON cut short), [`StateError::Corrupt`] for anything else.
pub(super) fn parse(path: &Path, bytes: &[u8]) -> Result<VolumeRecord, StateError> {
    serde_json::from_slice(bytes).map_err(|e| {
        if e.is_eof() || bytes.iter().all(|b| *b == 0) {
            StateError::Torn {
                path: path.to_owned(),
            }
        } else {
            StateError::Corrupt {
                path: path.to_owned(),
                message: e.to_string(),
            }
        }
    })
}
