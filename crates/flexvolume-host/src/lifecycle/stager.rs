//! CSI's node steps for an attachable driver: NodeStage = waitforattach + mountdevice onto the
//! staging path (which CSI gives, in place of flexd's own device mount dir); NodeUnstage =
//! unmountdevice (in the unmounter). Detach is the controller's (ControllerUnpublish), not
//! unstage's.

use super::attacher;
use super::target::{self, Found};
use super::{Lifecycle, LifecycleError, StageOutcome, StageRequest};
use crate::state::{Role, VolumeRecord};
use flexvolume_os::mount::safe_path;

impl Lifecycle {
    /// CSI NodeStage: waitforattach, then mountdevice onto the staging path.
    pub fn stage(&self, req: &StageRequest<'_>) -> Result<StageOutcome, LifecycleError> {
        let staging = &safe_path::check(req.staging)?;
        self.refuse_overlaps(staging, &[], &[Role::Publish, Role::Mount])?;
        let staging_lock = self.state.lock(staging)?;
        let lc = &self.holding(&[&staging_lock]);
        let created_target = match target::find(lc, staging, Role::Stage, req.spec, None)? {
            Found::Mounted(record) => {
                tracing::debug!(staging = %staging.display(), "already staged");
                target::mark_mounted(lc, &record)?;
                return Ok(StageOutcome {
                    staging: staging.clone(),
                    staged_now: false,
                    device: record.device,
                    formatted: false,
                });
            }
            Found::Unmounted { created_target } => created_target,
        };
        let plugin = req.plugin;
        let spec = req.spec;
        let mut record = VolumeRecord {
            attachable: true,
            device: Some(req.device.to_owned()).filter(|d| !d.is_empty()),
            staging: Some(staging.clone()),
            ..target::new_record(lc, plugin, spec, staging, Role::Stage, created_target)?
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
        let formatted = target::finish(lc, &mut record, result, false)?;
        Ok(StageOutcome {
            staging: staging.clone(),
            staged_now: true,
            device: record.device,
            formatted,
        })
    }
}
