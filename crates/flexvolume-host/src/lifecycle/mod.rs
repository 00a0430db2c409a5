//! The volume lifecycle: what kubelet does with a FlexVolume driver, with Kubernetes' default
//! for every call-out a driver answers `Not supported` to (docs/lifecycle.md#defaults).
//!
//! Node flow, attachable driver: attach → waitforattach → mountdevice onto the device mount
//! dir → mount (default: bind of the device mount dir) into each target; and back: unmount
//! each target → unmountdevice when the last target is gone → detach. A non-attachable
//! driver: mount / unmount only.
//!
//! Every step may be repeated: a target mounted by flexd for the same volume is not mounted
//! again (the driver is not even called), an absent or unmounted target unmounts successfully, directories flexd created are
//! removed on teardown, a failed mount removes the target it created. Operations on one target
//! (and on one device) are serialized by `flock`s, across threads and processes; different
//! volumes proceed in parallel.
//!
//! CSI asks for the same flow in steps, each with its own record (its [`Role`]) written before
//! any effect: controller publish (attach), stage (waitforattach + mountdevice onto the CSI
//! staging path), publish (mount, default a bind of the staging path) and back. Teardown
//! follows the record's role, and [`Lifecycle::reconcile`] squares records with the mount table
//! after a crash.
//!
//! Every target and staging path is resolved by [`flexvolume_os::mount::safe_path`] (no symlink
//! followed anywhere, `..` refused) before anything is created, mounted or removed there, and a
//! path belongs to one volume: a mount flexd did not make is never reported as a volume, a path
//! recorded for one volume refuses another, and a repeat with other settings is refused.
//! Each operation is one `impl Lifecycle` block in its own file.

mod attacher;
mod controller;
mod expander;
mod inventory;
mod mounter;
mod provisioner;
mod reconcile;
mod stager;
mod target;
mod unmounter;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::controller_records::{ControllerRecords, FenceSettings, StateDirStore};

use crate::plugin::Plugin;
use crate::runner::{CallError, RunnerConfig};
use crate::state::{Role, StateDir, StateError};
use flexvolume_os::mount::safe_path::PathError;
use flexvolume_os::mount::MountError;
use flexvolume_protocol::name::DriverName;
use flexvolume_protocol::spec::{PodInfo, VolumeSpec};

pub use expander::{ExpandOutcome, Expansion};
pub use inventory::{KnownVolume, VolumePage};
pub use provisioner::{ProvisionError, ProvisionOutcome, ProvisionRequest, ProvisionedVolume};
pub use reconcile::ReconcileReport;
pub use unmounter::DriverResolver;

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Call(#[from] CallError),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Records(crate::controller_records::RecordsError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("volume name {0:?} cannot be used: it must be non-empty")]
    VolumeName(String),
    #[error("{target} is not an absolute path")]
    RelativeTarget { target: PathBuf },
    #[error("driver {driver} is needed to unmount {target} but is neither installed nor pinned")]
    NoDriver { driver: String, target: PathBuf },
    #[error("the driver does not support this call-out for volume {volume}, and there is no device for the default to work on")]
    NoDevice { volume: String },
    #[error("volume mounted at {target}, but its fsGroup ownership failed (a retry redoes it): {source}")]
    Ownership {
        target: PathBuf,
        #[source]
        source: crate::ownership::OwnershipError,
    },
    #[error("{target} is recorded as a {found:?} volume, not a {expected:?} one")]
    WrongRole {
        target: PathBuf,
        expected: Role,
        found: Role,
    },
    #[error("{staging} is not staged (flexd has no stage record of it)")]
    NotStaged { staging: PathBuf },
    #[error("{target} is not a volume flexd manages (no record in the state dir)")]
    NotManaged { target: PathBuf },
    /// A path that is malformed (relative, NUL, `..`, too long) or that leads through a symlink
    /// or a non-directory.
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("{target} is already a mount point flexd did not make (no record of it): refusing to report someone else's filesystem as volume {volume}")]
    ForeignMount { target: PathBuf, volume: String },
    #[error("{target} holds volume {found}, not {requested}")]
    TargetInUse {
        target: PathBuf,
        found: String,
        requested: String,
    },
    #[error(
        "volume {volume} is already at {target} with another {what}: {found} (asked: {requested})"
    )]
    Incompatible {
        target: PathBuf,
        volume: String,
        what: &'static str,
        found: String,
        requested: String,
    },
    #[error("{path} is {relation} {what} {other}; a volume path may not overlap it")]
    Overlaps {
        path: PathBuf,
        relation: &'static str,
        what: &'static str,
        other: PathBuf,
    },
    #[error("staging path {staging} is still published at {}: unpublish those first", .targets.iter().map(|t| t.display().to_string()).collect::<Vec<_>>().join(", "))]
    StagingInUse {
        staging: PathBuf,
        targets: Vec<PathBuf>,
    },
}

impl From<crate::controller_records::RecordsError> for LifecycleError {
    fn from(e: crate::controller_records::RecordsError) -> Self {
        match e {
            crate::controller_records::RecordsError::State(e) => Self::State(e),
            e => Self::Records(e),
        }
    }
}

/// The lifecycle of volumes on one node.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    pub runner: RunnerConfig,
    pub state: StateDir,
    /// This node's name, as attach/detach/isattached receive it.
    pub node: String,
    /// Where the CSI controller's attachments and provisioned volumes are kept, with their
    /// fences: the state dir unless replicas share them ([`crate::controller_records`]).
    pub controller_records: Arc<ControllerRecords>,
}

/// A mount to perform.
pub struct MountRequest<'a> {
    pub plugin: &'a Plugin,
    pub spec: &'a VolumeSpec,
    pub pod: &'a PodInfo,
    /// The group that must own the volume (SetUp(fsGroup)); `None` leaves ownership alone.
    pub fs_group: Option<u32>,
    /// When the ownership pass runs (`fsGroupChangePolicy`).
    pub fs_group_policy: crate::ownership::Policy,
    pub target: &'a Path,
}

/// What a mount did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MountOutcome {
    pub target: PathBuf,
    /// False when the target was already mounted (nothing was done).
    pub mounted_now: bool,
    pub device: Option<String>,
    /// The staging path the device was mounted on (attaching drivers).
    #[serde(rename = "device_mount_dir")]
    pub staging: Option<PathBuf>,
    /// Whether the device was formatted by the default mountdevice.
    pub formatted: bool,
    /// The SetUp(fsGroup) pass, when one ran.
    pub ownership: Option<crate::ownership::OwnershipReport>,
}

/// A CSI NodeStage: the device (from the publish context) made ready and mounted on the
/// staging path.
pub struct StageRequest<'a> {
    pub plugin: &'a Plugin,
    pub spec: &'a VolumeSpec,
    /// What attach returned (may be empty: waitforattach or the driver knows better).
    pub device: &'a str,
    pub staging: &'a Path,
}

/// What a stage did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StageOutcome {
    pub staging: PathBuf,
    /// False when the staging path was already mounted (nothing was done).
    pub staged_now: bool,
    pub device: Option<String>,
    pub formatted: bool,
}

/// What a controller attach did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AttachOutcome {
    /// The device attach returned ("" when the driver does not know it yet).
    pub device: String,
    /// False when the attachment was already recorded (the driver was not called).
    pub attached_now: bool,
}

/// What an unmount did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UnmountOutcome {
    pub target: PathBuf,
    /// False when flexd had no record of it (nothing of ours to undo).
    pub managed: bool,
    pub unmounted_device: bool,
    pub detached: bool,
}

/// A volume name made safe as one path component: `/` becomes `~` (as kubelet does), anything
/// but `[A-Za-z0-9._~-]` is %-escaped, and a leading `.` is escaped so `..` never appears.
pub(crate) fn path_component(volume_name: &str) -> Result<String, LifecycleError> {
    if volume_name.is_empty() {
        return Err(LifecycleError::VolumeName(volume_name.to_owned()));
    }
    let mut out = String::new();
    for (i, b) in volume_name.bytes().enumerate() {
        match b {
            b'/' => out.push('~'),
            b'.' if i == 0 => out.push_str("%2E"),
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'~' | b'-' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    Ok(out)
}

impl Lifecycle {
    /// A lifecycle whose controller records are kept in its state dir.
    pub fn new(runner: RunnerConfig, state: StateDir, node: String) -> Self {
        Self {
            controller_records: Arc::new(ControllerRecords::new(
                Arc::new(StateDirStore::new(state.clone())),
                FenceSettings::default(),
            )),
            runner,
            state,
            node,
        }
    }

    /// This lifecycle with its drivers also holding `locks`: a driver orphaned by a crash of
    /// flexd keeps them until it exits, so the next operation on the volume waits for it.
    fn holding(&self, locks: &[&crate::state::Lock]) -> Lifecycle {
        let shared: Vec<_> = locks.iter().map(|l| l.share()).collect();
        Lifecycle {
            runner: self.runner.holding(&shared),
            ..self.clone()
        }
    }

    /// The staging path of the whole node flow (`flexd volume mount`), where the device of a
    /// volume is mounted: `<state-dir>/devices/<vendor~driver>/<volume>`.
    pub(crate) fn device_staging(
        &self,
        driver: &DriverName,
        volume_name: &str,
    ) -> Result<PathBuf, LifecycleError> {
        Ok(self
            .state
            .root
            .join("devices")
            .join(driver.dir_name())
            .join(path_component(volume_name)?))
    }

    /// Runs `f` on the recorded volume at `target` and its plugin, under the target's lock.
    fn with_managed<T>(
        &self,
        target: &Path,
        resolve: &dyn DriverResolver,
        f: impl FnOnce(&Lifecycle, &Plugin, &crate::state::VolumeRecord) -> Result<T, LifecycleError>,
    ) -> Result<T, LifecycleError> {
        // Records are keyed by the checked, normalized path (as every operation saves them).
        let target = &flexvolume_os::mount::safe_path::check(target)?;
        let target_lock = self.state.lock(target)?;
        let lc = self.holding(&[&target_lock]);
        let record = self
            .state
            .load(target)?
            .ok_or_else(|| LifecycleError::NotManaged {
                target: target.to_owned(),
            })?;
        let plugin = unmounter::plugin_of(resolve, &record)?;
        f(&lc, &plugin, &record)
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LifecycleError + '_ {
    move |source| LifecycleError::Io {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_names_become_safe_path_components() {
        assert_eq!(path_component("pv-1").unwrap(), "pv-1");
        assert_eq!(path_component("ns/vol").unwrap(), "ns~vol");
        assert_eq!(path_component("..").unwrap(), "%2E.");
        assert_eq!(path_component("../etc").unwrap(), "%2E.~etc");
        assert_eq!(path_component("a b\n").unwrap(), "a%20b%0A");
        assert!(path_component("").is_err());
        for hostile in ["..", "../../x", "/abs", ".hidden", "a/../b"] {
            let c = path_component(hostile).unwrap();
            assert!(!c.contains('/') && !c.starts_with('.'), "{hostile} -> {c}");
        }
    }

    /// `flexd volume mount --output json` prints the staging path under its old name.
    #[test]
    fn a_mount_outcome_keeps_its_json_names() {
        let outcome = MountOutcome {
            target: "/t".into(),
            mounted_now: true,
            device: None,
            staging: Some("/s".into()),
            formatted: false,
            ownership: None,
        };
        let json = serde_json::to_value(outcome).unwrap();
        assert_eq!(json["device_mount_dir"], "/s");
        assert!(json.get("staging").is_none());
    }
}
