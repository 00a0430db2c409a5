//! CSI's controller side for an attaching driver: ControllerPublish = attach, recorded (with
//! the name detach will need, since ControllerUnpublish carries no volume context) under
//! `<state-dir>/attachments/`; ControllerUnpublish = detach, by the unmounter's teardown of
//! that record.

use super::attacher;
use super::{Lifecycle, LifecycleError};
use crate::state::{Progress, Role, VolumeRecord};

impl Lifecycle {
    /// Where the attach record of a volume on a node is kept (a name, never a mount point).
    pub(super) fn attachment_key(
        &self,
        driver: &flexvolume_protocol::name::DriverName,
        volume_id: &str,
        node: &str,
    ) -> Result<std::path::PathBuf, LifecycleError> {
        Ok(self
            .state
            .root
            .join("attachments")
            .join(driver.dir_name())
            .join(super::path_component(volume_id)?)
            .join(super::path_component(node)?))
    }

    /// CSI ControllerPublish: attach, recorded (with the name detach will need: ControllerUnpublish
    /// carries no volume context) before the driver runs, so that
    /// [`Lifecycle::controller_unpublish`] detaches it under the same name. A recorded attachment
    /// is not redone.
    pub fn controller_publish(
        &self,
        plugin: &crate::plugin::Plugin,
        spec: &flexvolume_protocol::spec::VolumeSpec,
        node: &str,
    ) -> Result<super::AttachOutcome, LifecycleError> {
        let key = self.attachment_key(&spec.driver, &spec.volume_name, node)?;
        let key_lock = self.state.lock(&key)?;
        let lc = &self.holding(&[&key_lock]);
        if let Some(record) = lc
            .state
            .load(&key)?
            .filter(|r| r.progress == Progress::Mounted)
        {
            return Ok(super::AttachOutcome {
                device: record.device.unwrap_or_default(),
                attached_now: false,
            });
        }
        attacher::get_volume_name(lc, plugin, spec)?;
        let mut record = VolumeRecord {
            attachable: true,
            node: node.to_owned(),
            ..super::target::new_record(lc, plugin, spec, &key, Role::Attach, false)?
        };
        // A failed or interrupted attach keeps this record: ControllerUnpublish then detaches.
        lc.state.save(&record)?;
        let device = match lc.attach(plugin, spec, node) {
            Ok(device) => device,
            // The driver named the volume or the node unknown: nothing is attached, so there
            // is nothing for a detach to undo.
            Err(LifecycleError::Call(e))
                if e.code() == Some(flexvolume_protocol::ErrorCode::NotFound) =>
            {
                lc.state.remove(&key)?;
                return Err(e.into());
            }
            Err(e) => return Err(e),
        };
        record.device = Some(device.clone()).filter(|d| !d.is_empty());
        record.progress = Progress::Mounted;
        lc.state.save(&record)?;
        Ok(super::AttachOutcome {
            device,
            attached_now: true,
        })
    }
}
