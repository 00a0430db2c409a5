//! What the Node and Controller services share for every call on a volume: find the driver's
//! plugin, take the volume's lock, run the blocking call-out, answer a CSI status. It sits below
//! both services so that neither reaches into the other.

use std::sync::Arc;

use flexvolume_host::lifecycle::Lifecycle;
use flexvolume_host::{Capabilities, DriverName, Plugin};
use tonic::Status;

use super::driver::ServedDriver;
use super::grpc_code::ToGrpcStatus;
use super::locks::VolumeLocks;

/// The key of the publish context that carries the device attach returned (set by
/// ControllerPublish, read by NodeStage).
pub const DEVICE_KEY: &str = "device";

/// One served driver's volumes: the driver, the lifecycle that acts on them, and the per-volume
/// locks its Node and Controller services share.
#[derive(Clone)]
pub struct VolumeCalls {
    pub driver: Arc<ServedDriver>,
    pub lifecycle: Arc<Lifecycle>,
    pub locks: VolumeLocks,
}

impl VolumeCalls {
    /// The driver's plugin, or FailedPrecondition while its last init failed.
    pub fn ready_plugin(&self) -> Result<Arc<Plugin>, Status> {
        self.driver.plugin().ok_or_else(|| {
            Status::failed_precondition(format!(
                "driver {} is not ready: its last init failed",
                self.driver.name
            ))
        })
    }

    /// The driver's plugin when it attaches; FailedPrecondition otherwise, the message going on
    /// with `why_needed` (which capability is not offered), or while its last init failed.
    pub fn attaching_plugin(&self, why_needed: &str) -> Result<Arc<Plugin>, Status> {
        self.plugin_offering(
            |c| c.attach,
            |driver| {
                Status::failed_precondition(format!("driver {driver} does not attach{why_needed}"))
            },
        )
    }

    /// The plugin of a driver that provisions, or UNIMPLEMENTED (CREATE_DELETE_VOLUME is not
    /// offered for it).
    pub fn provisioning_plugin(&self) -> Result<Arc<Plugin>, Status> {
        self.plugin_offering(|c| c.provision, |driver| {
            Status::unimplemented(format!(
                "driver {driver} does not provision (no \"provision\": true in its init capabilities): its volumes are static PVs"
            ))
        })
    }

    /// The driver's ready plugin when its capabilities offer what a call needs (`offers`);
    /// `refusal`, given the driver's name, otherwise.
    pub fn plugin_offering(
        &self,
        offers: impl FnOnce(&Capabilities) -> bool,
        refusal: impl FnOnce(&DriverName) -> Status,
    ) -> Result<Arc<Plugin>, Status> {
        let plugin = self.ready_plugin()?;
        if offers(&plugin.capabilities) {
            Ok(plugin)
        } else {
            Err(refusal(&self.driver.name))
        }
    }

    /// Runs a blocking lifecycle operation (given the lifecycle and the volume id) with the
    /// volume's lock held until it ends (even if the caller gives up waiting); ABORTED at once
    /// while another call on the volume runs.
    pub async fn run_locked<T: Send + 'static, E: ToGrpcStatus + Send + 'static>(
        &self,
        volume_id: &str,
        operation: impl FnOnce(&Lifecycle, &str) -> Result<T, E> + Send + 'static,
    ) -> Result<T, Status> {
        let guard = self.locks.try_lock(volume_id).ok_or_else(|| {
            Status::aborted(format!(
                "an operation is pending for volume {volume_id}: retry when it has finished"
            ))
        })?;
        let (lifecycle, id) = (self.lifecycle.clone(), volume_id.to_owned());
        tokio::task::spawn_blocking(move || {
            let result = operation(&lifecycle, &id);
            drop(guard);
            result
        })
        .await
        .map_err(|e| Status::internal(format!("operation did not finish: {e}")))?
        .map_err(|e| e.to_grpc_status())
    }
}
