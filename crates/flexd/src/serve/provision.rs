//! CSI CreateVolume / DeleteVolume for drivers that provision (`provision: true` in `init`'s
//! capabilities), and what the rest of the controller learns from provisioned volumes: their
//! options when the CO sends none, and whether a volume exists at all.
//!
//! The volume id is the CreateVolume name, so the node side (where the volume id is
//! `kubernetes.io/pvOrVolumeName`) sees the same name the driver provisioned.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use flexvolume_host::lifecycle::{Lifecycle, ProvisionRequest, ProvisionedVolume};
use flexvolume_host::DriverName;
use tonic::{Request, Response, Status};

use super::calls::VolumeCalls;
use super::grpc_code;
use super::request::{self, required};
use flexd::proto::csi::{
    CreateVolumeRequest, CreateVolumeResponse, DeleteVolumeRequest, DeleteVolumeResponse, Volume,
};

fn bytes(value: i64, field: &str) -> Result<u64, Status> {
    u64::try_from(value).map_err(|_| Status::invalid_argument(format!("{field} is negative")))
}

pub async fn create_volume(
    calls: &VolumeCalls,
    request: Request<CreateVolumeRequest>,
) -> Result<Response<CreateVolumeResponse>, Status> {
    let req = request.into_inner();
    required(&req.name, "name")?;
    // The name is the volume id every later call carries: the same rules.
    let name = request::volume_id(&req.name)?.to_owned();
    if req.volume_capabilities.is_empty() {
        return Err(Status::invalid_argument("volume_capabilities is required"));
    }
    let mut fs_type = String::new();
    for capability in &req.volume_capabilities {
        let (_, mount) = request::mount_capability(Some(capability))?;
        if !mount.fs_type.is_empty() {
            if !fs_type.is_empty() && fs_type != mount.fs_type {
                return Err(Status::invalid_argument(format!(
                    "volume_capabilities ask for two filesystems ({fs_type} and {})",
                    mount.fs_type
                )));
            }
            fs_type = mount.fs_type.clone();
        }
    }
    if req.volume_content_source.is_some() {
        return Err(Status::invalid_argument(
            "volume_content_source: FlexVolume drivers cannot create a volume from a snapshot or another volume",
        ));
    }
    let (required_bytes, limit_bytes) = match &req.capacity_range {
        Some(range) => (
            bytes(range.required_bytes, "capacity_range.required_bytes")?,
            bytes(range.limit_bytes, "capacity_range.limit_bytes")?,
        ),
        None => (0, 0),
    };
    if limit_bytes != 0 && required_bytes > limit_bytes {
        return Err(Status::out_of_range(format!(
            "capacity_range: required_bytes {required_bytes} exceeds limit_bytes {limit_bytes}"
        )));
    }
    let plugin = calls.provisioning_plugin()?;
    let parameters: BTreeMap<String, String> = req.parameters.into_iter().collect();
    let secrets = request::secrets(&req.secrets);
    let outcome = calls
        .run_locked(&name, move |lc, id| {
            lc.provision(&ProvisionRequest {
                plugin: &plugin,
                name: id,
                required_bytes,
                limit_bytes,
                fs_type: &fs_type,
                parameters: &parameters,
                secrets: &secrets,
            })
        })
        .await?;
    tracing::info!(driver = %calls.driver.name, volume = %name, bytes = outcome.volume.capacity_bytes, provisioned_now = outcome.provisioned_now, "CreateVolume");
    Ok(Response::new(CreateVolumeResponse {
        volume: Some(Volume {
            capacity_bytes: i64::try_from(outcome.volume.capacity_bytes).unwrap_or(i64::MAX),
            volume_id: outcome.volume.name.clone(),
            volume_context: outcome.volume.options.into_iter().collect(),
        }),
    }))
}

pub async fn delete_volume(
    calls: &VolumeCalls,
    request: Request<DeleteVolumeRequest>,
) -> Result<Response<DeleteVolumeResponse>, Status> {
    let (req, volume_id) = request::one_volume(request)?;
    let plugin = calls.provisioning_plugin()?;
    let secrets = request::secrets(&req.secrets);
    let deleted = calls
        .run_locked(&volume_id, move |lc, id| {
            lc.delete_provisioned(&plugin, id, &secrets)
        })
        .await?;
    tracing::info!(driver = %calls.driver.name, volume = %volume_id, deleted, "DeleteVolume");
    Ok(Response::new(DeleteVolumeResponse {}))
}

/// The record of a volume flexd provisioned for this driver, if any.
pub async fn provisioned(
    lifecycle: &Arc<Lifecycle>,
    driver: &DriverName,
    volume_id: &str,
) -> Result<Option<ProvisionedVolume>, Status> {
    let lc = lifecycle.clone();
    let driver = driver.clone();
    let id = volume_id.to_owned();
    tokio::task::spawn_blocking(move || lc.provisioned(&driver, &id))
        .await
        .map_err(|e| Status::internal(format!("operation did not finish: {e}")))?
        .map_err(|e| grpc_code::from_lifecycle(&e))
}

/// The volume context a controller call works with: the request's, over the options of the
/// provisioned volume (external-attacher sends the PV's attributes, which are those options;
/// csi-sanity and hand-made calls may send none). NOT_FOUND for a volume that cannot exist:
/// no context, nothing provisioned under that id, and a driver that provisions (a static
/// volume of such a driver is described by its context).
pub async fn volume_context(
    calls: &VolumeCalls,
    volume_id: &str,
    context: &HashMap<String, String>,
) -> Result<HashMap<String, String>, Status> {
    let driver = &calls.driver;
    let record = provisioned(&calls.lifecycle, &driver.name, volume_id).await?;
    let provisions = driver.plugin().is_some_and(|p| p.capabilities.provision);
    match record {
        Some(volume) => {
            let mut merged: HashMap<String, String> = volume.options.into_iter().collect();
            merged.extend(context.iter().map(|(k, v)| (k.clone(), v.clone())));
            Ok(merged)
        }
        None if provisions && context.is_empty() => Err(Status::not_found(format!(
            "volume {volume_id} does not exist: driver {} did not provision it and the request describes no static volume (no volume_context)",
            driver.name
        ))),
        None => Ok(context.clone()),
    }
}
