//! CSI's node steps for an attachable driver: NodeStage = waitforattach + mountdevice onto the
//! staging path (which CSI gives, in place of flexd's own device mount dir); NodeUnstage =
//! unmountdevice. Detach is the controller's (ControllerUnpublish), not unstage's.

use std::path::Path;

use super::attacher;
use super::{io_err, Lifecycle, LifecycleError, StageOutcome, StageRequest};
use crate::mount;
use crate::state::{Role, Stage, VolumeRecord};

pub fn stage(lc: &Lifecycle, req: &StageRequest<'_>) -> Result<StageOutcome, LifecycleError> {
    let staging = req.staging;
    if !staging.is_absolute() {
        return Err(LifecycleError::RelativeTarget {
            target: staging.to_owned(),
        });
    }
    let staging_lock = lc.state.lock(staging)?;
    let lc = &lc.holding(&[&staging_lock]);
    let existing = lc.state.load(staging)?;
    if let Some(found) = existing
        .as_ref()
        .map(|r| r.role)
        .filter(|r| *r != Role::Stage)
    {
        return Err(LifecycleError::WrongRole {
            target: staging.to_owned(),
            expected: Role::Stage,
            found,
        });
    }
    if mount::is_mount_point(staging)? {
        tracing::debug!(staging = %staging.display(), "already staged");
        if let Some(record) = existing.as_ref().filter(|r| r.stage != Stage::Mounted) {
            lc.state.save(&VolumeRecord {
                stage: Stage::Mounted,
                ..record.clone()
            })?;
        }
        return Ok(StageOutcome {
            staging: staging.to_owned(),
            staged_now: false,
            device: existing.and_then(|r| r.device),
            formatted: false,
        });
    }
    let plugin = req.plugin;
    let spec = req.spec;
    let created_target = match &existing {
        Some(record) => record.created_target,
        None => !staging.exists(),
    };
    let pinned = lc.state.pin(&spec.driver.dir_name(), &plugin.driver.path)?;
    let mut record = VolumeRecord {
        target: staging.to_owned(),
        driver: spec.driver.clone(),
        volume_name: spec.volume_name.clone(),
        fs_type: spec.fs_type.clone(),
        read_only: spec.read_only,
        options: spec.options.clone(),
        attachable: true,
        node: lc.node.clone(),
        device: Some(req.device.to_owned()).filter(|d| !d.is_empty()),
        device_mount_dir: Some(staging.to_owned()),
        detach_name: spec.volume_name.replace('/', "~"),
        pinned: Some(pinned),
        created_target,
        stage: Stage::Mounting,
        role: Role::Stage,
    };
    // Ahead of the directory and the device mount, so unstage can undo a half-done stage.
    lc.state.save(&record)?;
    let result = (|| {
        std::fs::create_dir_all(staging).map_err(io_err(staging))?;
        let device = attacher::wait_for_attach(lc, plugin, spec, req.device.to_owned())?;
        let device = Some(device).filter(|d| !d.is_empty());
        if device != record.device {
            record.device = device;
            lc.state.save(&record)?;
        }
        let device = record.device.clone().unwrap_or_default();
        attacher::mount_device(lc, plugin, spec, &device, staging)
    })();
    match result {
        Ok(formatted) => {
            record.stage = Stage::Mounted;
            lc.state.save(&record)?;
            Ok(StageOutcome {
                staging: staging.to_owned(),
                staged_now: true,
                device: record.device,
                formatted,
            })
        }
        Err(e) => {
            if !mount::is_mount_point(staging).unwrap_or(true) {
                let _ = lc.state.remove(staging);
                if created_target {
                    let _ = std::fs::remove_dir(staging);
                }
            }
            Err(e)
        }
    }
}

/// Whether `path` is mounted; a path that does not exist is not.
pub(super) fn is_mounted(path: &Path) -> Result<bool, LifecycleError> {
    Ok(path.exists() && mount::is_mount_point(path)?)
}
