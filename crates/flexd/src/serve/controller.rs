//! CSI Controller for one FlexVolume driver: ControllerPublish = attach (the device goes to the
//! node in the publish context), ControllerUnpublish = detach, for drivers that attach;
//! CreateVolume = provision, DeleteVolume = delete, for drivers that provision (see
//! [`super::provision`]); ListVolumes = what the records know, with `isattached` for the
//! published nodes (see [`super::list`]). A driver that does neither has no controller side
//! ([`flexvolume_host::Capabilities::has_controller_side`]): its endpoint answers every Controller call
//! `UNIMPLEMENTED`, exactly as an endpoint that does not serve the service, and its Identity
//! does not advertise `CONTROLLER_SERVICE` (docs/csi.md#controller-service).

use std::sync::Arc;

use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

use super::calls::{VolumeCalls, DEVICE_KEY};
use super::driver::{ServedDriver, ServedResolver};
use super::list;
use super::provision;
use super::request;
use flexd::proto::csi::controller_server::Controller;
use flexd::proto::csi::{
    controller_service_capability, validate_volume_capabilities_response,
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerPublishVolumeRequest, ControllerPublishVolumeResponse, ControllerServiceCapability,
    ControllerUnpublishVolumeRequest, ControllerUnpublishVolumeResponse, CreateVolumeRequest,
    CreateVolumeResponse, DeleteVolumeRequest, DeleteVolumeResponse, ListVolumesRequest,
    ListVolumesResponse, ValidateVolumeCapabilitiesRequest, ValidateVolumeCapabilitiesResponse,
};

/// The gate in front of a driver's Controller service: open while the driver's current plugin
/// has a controller side. It asks at every call because an update in place can change the
/// driver's capabilities while its endpoint keeps serving. A driver whose init failed passes
/// the gate, so its calls get the service's own "not ready" answer.
pub fn only_with_controller_side(
    driver: Arc<ServedDriver>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |request| match driver.plugin() {
        Some(plugin) if !plugin.capabilities.has_controller_side() => {
            Err(Status::unimplemented(format!(
                "driver {} has no controller service: it neither attaches nor provisions",
                driver.name
            )))
        }
        _ => Ok(request),
    }
}

pub struct ControllerService {
    pub calls: VolumeCalls,
    /// `--mode both`: this flexd is one node's whole plugin, and the only node it can publish
    /// to is its own (any other node id is NOT_FOUND). In controller mode every node id goes
    /// to the driver, which may answer `NotFound` itself.
    pub own_node_only: bool,
    /// The driver's `isattached` slots for ListVolumes ([`list::CHECKS_AT_ONCE`]), shared by
    /// every listing.
    pub attach_checks: Arc<Semaphore>,
}

impl ControllerService {
    pub fn new(calls: VolumeCalls, own_node_only: bool) -> Self {
        Self {
            calls,
            own_node_only,
            attach_checks: Arc::new(Semaphore::new(list::CHECKS_AT_ONCE)),
        }
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        provision::create_volume(&self.calls, request).await
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        provision::delete_volume(&self.calls, request).await
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let (req, volume_id) = request::one_volume(request)?;
        let node = request::node_id(&req.node_id)?.to_owned();
        request::mount_capability(req.volume_capability.as_ref())?;
        let context =
            provision::volume_context(&self.calls, &volume_id, &req.volume_context).await?;
        if self.own_node_only && node != self.calls.lifecycle.node {
            return Err(Status::not_found(format!(
                "node {node} is not known here: flexd serves both modes for node {} only (run --mode controller to publish to any node)",
                self.calls.lifecycle.node
            )));
        }
        let spec = request::spec(
            &self.calls.driver.name,
            &volume_id,
            req.volume_capability.as_ref(),
            req.readonly,
            &context,
            // attach receives no secrets (FlexVolume gives them to mount only).
            &Default::default(),
        )?;
        let plugin = self
            .calls
            .attaching_plugin(" (PUBLISH_UNPUBLISH_VOLUME is not offered)")?;
        let attach_node = node.clone();
        let outcome = self
            .calls
            .run_locked(&volume_id, move |lifecycle, _| {
                lifecycle.controller_publish(&plugin, &spec, &attach_node)
            })
            .await?;
        tracing::info!(driver = %self.calls.driver.name, volume = %volume_id, node = %node, device = %outcome.device, attached_now = outcome.attached_now, "ControllerPublishVolume");
        let mut publish_context = std::collections::HashMap::new();
        if !outcome.device.is_empty() {
            publish_context.insert(DEVICE_KEY.to_owned(), outcome.device);
        }
        Ok(Response::new(ControllerPublishVolumeResponse {
            publish_context,
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let (req, volume_id) = request::one_volume(request)?;
        let resolver = ServedResolver(self.calls.driver.clone());
        let driver = self.calls.driver.name.clone();
        // CSI: no node id means every node the volume is published to.
        let node = match req.node_id.as_str() {
            "" => None,
            id => Some(request::node_id(id)?.to_owned()),
        };
        let detached = self
            .calls
            .run_locked(&volume_id, move |lifecycle, id| {
                lifecycle.controller_unpublish(&driver, id, node.as_deref(), &resolver)
            })
            .await?;
        tracing::info!(driver = %self.calls.driver.name, volume = %volume_id, node = %req.node_id, detached, "ControllerUnpublishVolume");
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let (req, volume_id) = request::one_volume(request)?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        // A volume exists when flexd provisioned it, or when the request describes it (a static
        // PV's attributes are its FlexVolume options).
        if req.volume_context.is_empty()
            && provision::provisioned(&self.calls.lifecycle, &self.calls.driver.name, &volume_id)
                .await?
                .is_none()
        {
            return Err(Status::not_found(format!(
                "volume {volume_id} does not exist: driver {} has no provisioned volume of that id, and no volume_context describes one",
                self.calls.driver.name
            )));
        }
        // Every mount capability is one a FlexVolume driver can serve; block is not.
        if let Some(refused) = req
            .volume_capabilities
            .iter()
            .find_map(|c| request::mount_capability(Some(c)).err())
        {
            return Ok(Response::new(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: refused.message().to_owned(),
            }));
        }
        Ok(Response::new(ValidateVolumeCapabilitiesResponse {
            confirmed: Some(validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
            }),
            message: String::new(),
        }))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        list::list_volumes(&self.calls, &self.attach_checks, request).await
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        use controller_service_capability::rpc::Type;
        let capability = |kind: Type| ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc {
                    r#type: kind as i32,
                },
            )),
        };
        let mut capabilities = Vec::new();
        if let Some(caps) = self.calls.driver.plugin().map(|p| p.capabilities) {
            if caps.provision {
                capabilities.push(capability(Type::CreateDeleteVolume));
            }
            if caps.attach {
                capabilities.push(capability(Type::PublishUnpublishVolume));
            }
            // What the records know, for every driver with a controller side; with the nodes
            // each volume is attached to (checked by isattached) for one that attaches.
            if caps.has_controller_side() {
                capabilities.push(capability(Type::ListVolumes));
            }
            if caps.attach {
                capabilities.push(capability(Type::ListVolumesPublishedNodes));
            }
        }
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }
}
