//! CSI's node steps for an attachable driver: NodeStage = waitforattach + mountdevice onto the
//! staging path (which CSI gives, in place of flexd's own device mount dir); NodeUnstage =
//! unmountdevice (in the unmounter). Detach is the controller's (ControllerUnpublish), not
//! unstage's.

use super::attacher;
use super::target::{self, AtPath};
use super::{Lifecycle, LifecycleError, StageOutcome, StageRequest};
use crate::mount::safe_path;
use crate::state::{Role, Stage, VolumeRecord};

impl Lifecycle {
    /// CSI NodeStage: waitforattach, then mountdevice onto the staging path.
    pub fn stage(&self, req: &StageRequest<'_>) -> Result<StageOutcome, LifecycleError> {
        let staging = &safe_path::check(req.staging)?;
        self.refuse_overlaps(staging, &[], &[Role::Publish, Role::Mount])?;
        let staging_lock = self.state.lock(staging)?;
        let lc = &self.holding(&[&staging_lock]);
        let existing = lc.state.load(staging)?;
        if let Some(record) = &existing {
            target::same_volume(record, Role::Stage, req.spec, None)?;
        }
        let at = target::inspect(staging)?;
        if at == AtPath::Mounted {
            let Some(record) = existing else {
                return Err(LifecycleError::ForeignMount {
                    target: staging.clone(),
                    volume: req.spec.volume_name.clone(),
                });
            };
            tracing::debug!(staging = %staging.display(), "already staged");
            if record.stage != Stage::Mounted {
                lc.state.save(&VolumeRecord {
                    stage: Stage::Mounted,
                    ..record.clone()
                })?;
            }
            return Ok(StageOutcome {
                staging: staging.clone(),
                staged_now: false,
                device: record.device,
                formatted: false,
            });
        }
        let plugin = req.plugin;
        let spec = req.spec;
        let created_target = match &existing {
            Some(record) => record.created_target,
            None => at == AtPath::Absent,
        };
        let pinned = lc.state.pin(&spec.driver.dir_name(), &plugin.driver.path)?;
        let mut record = VolumeRecord {
            target: staging.clone(),
            driver: spec.driver.clone(),
            volume_name: spec.volume_name.clone(),
            fs_type: spec.fs_type.clone(),
            read_only: spec.read_only,
            options: spec.options.clone(),
            attachable: true,
            node: lc.node.clone(),
            device: Some(req.device.to_owned()).filter(|d| !d.is_empty()),
            device_mount_dir: Some(staging.clone()),
            detach_name: spec.volume_name.replace('/', "~"),
            pinned: Some(pinned),
            created_target,
            stage: Stage::Mounting,
            role: Role::Stage,
        };
        // Ahead of the directory and the device mount, so unstage can undo a half-done stage.
        lc.state.save(&record)?;
        let result = (|| {
            target::create(staging)?;
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
                    staging: staging.clone(),
                    staged_now: true,
                    device: record.device,
                    formatted,
                })
            }
            Err(e) => {
                if !target::still_mounted(staging) {
                    let _ = lc.state.remove(staging);
                    target::remove_created(&record);
                }
                Err(e)
            }
        }
    }
}
