//! CSI Node for one FlexVolume driver: stage = waitforattach + mountdevice on the staging path,
//! publish = mount (or a bind of the staging path), and back; stats, expansion, node info.
//!
//! Call-outs block, so every operation runs on the blocking pool, holding its volume's lock.

use std::path::Path;

use flexvolume_host::lifecycle::{Expansion, MountRequest, StageRequest};
use flexvolume_host::state::Role;
use tonic::{Request, Response, Status};

use super::calls::{VolumeCalls, DEVICE_KEY};
use super::driver::ServedResolver;
use super::grpc_code;
use super::request;
use flexd::proto::csi::node_server::Node;
use flexd::proto::csi::{
    node_service_capability, volume_usage, NodeExpandVolumeRequest, NodeExpandVolumeResponse,
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest,
    NodeGetInfoResponse, NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse,
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeServiceCapability,
    NodeStageVolumeRequest, NodeStageVolumeResponse, NodeUnpublishVolumeRequest,
    NodeUnpublishVolumeResponse, NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, VolumeUsage,
};

pub struct NodeService {
    pub calls: VolumeCalls,
}

impl NodeService {
    /// The path `volume_id` is recorded at, when `volume_path` names it (NOT_FOUND otherwise):
    /// stats and expansion act only on a volume where the request says it is.
    async fn recorded_path(
        &self,
        volume_id: &str,
        volume_path: &str,
    ) -> Result<std::path::PathBuf, Status> {
        let lifecycle = self.calls.lifecycle.clone();
        let driver = self.calls.driver.name.clone();
        let (id, path) = (volume_id.to_owned(), std::path::PathBuf::from(volume_path));
        let record =
            tokio::task::spawn_blocking(move || lifecycle.state.volume_at(&driver, &id, &path))
                .await
                .map_err(|e| Status::internal(format!("state lookup did not finish: {e}")))?
                .map_err(|e| grpc_code::from_lookup(&e))?;
        Ok(record.target)
    }

    /// NodeUnstage and NodeUnpublish are the same call with another record role: the teardown
    /// of what `role` recorded at `path` for `volume_id`, under the volume's lock, with this
    /// driver's resolver.
    async fn tear_down(
        &self,
        volume_id: String,
        path: String,
        role: Role,
        call: &'static str,
    ) -> Result<(), Status> {
        let resolver = ServedResolver(self.calls.driver.clone());
        let outcome = self
            .calls
            .run_locked(&volume_id, move |lifecycle, id| {
                lifecycle.unmount_role(role, id, Path::new(&path), &resolver)
            })
            .await?;
        tracing::info!(driver = %self.calls.driver.name, volume = %volume_id, path = %outcome.target.display(), managed = outcome.managed, "{call}");
        Ok(())
    }
}

fn capability(kind: node_service_capability::rpc::Type) -> NodeServiceCapability {
    NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc {
                r#type: kind as i32,
            },
        )),
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let (req, volume_id) = request::one_volume(request)?;
        let staging = request::path(&req.staging_target_path, "staging_target_path")?.to_owned();
        let spec = request::spec(
            &self.calls.driver.name,
            &volume_id,
            req.volume_capability.as_ref(),
            false,
            &req.volume_context,
            // mountdevice receives no secrets (FlexVolume gives them to mount only).
            &Default::default(),
        )?;
        let plugin = self
            .calls
            .attaching_plugin(": it has no stage step (STAGE_UNSTAGE_VOLUME is not offered)")?;
        let device = req
            .publish_context
            .get(DEVICE_KEY)
            .cloned()
            .unwrap_or_default();
        let outcome = self
            .calls
            .run_locked(&volume_id, move |lifecycle, _| {
                lifecycle.stage(&StageRequest {
                    plugin: &plugin,
                    spec: &spec,
                    device: &device,
                    staging: Path::new(&staging),
                })
            })
            .await?;
        tracing::info!(driver = %self.calls.driver.name, volume = %volume_id, staging = %outcome.staging.display(), staged_now = outcome.staged_now, "NodeStageVolume");
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let (req, volume_id) = request::one_volume(request)?;
        let staging = request::path(&req.staging_target_path, "staging_target_path")?.to_owned();
        self.tear_down(volume_id, staging, Role::Stage, "NodeUnstageVolume")
            .await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let (req, volume_id) = request::one_volume(request)?;
        let target = request::path(&req.target_path, "target_path")?.to_owned();
        let spec = request::spec(
            &self.calls.driver.name,
            &volume_id,
            req.volume_capability.as_ref(),
            req.readonly,
            &req.volume_context,
            &req.secrets,
        )?;
        let pod = request::pod_info(&req.volume_context);
        let fs_group = request::fs_group(req.volume_capability.as_ref())?;
        let ephemeral = request::is_ephemeral(&req.volume_context)?;
        let plugin = self.calls.ready_plugin()?;
        if ephemeral && plugin.capabilities.attach {
            // Nothing would attach it (no ControllerPublish) or stage it; its CSIDriver object
            // lists only Persistent, so kubelet should not have asked.
            return Err(Status::invalid_argument(format!(
                "driver {} attaches (its volumes are attached and staged before they are \
                 published), so it cannot serve an inline ephemeral volume: use a \
                 PersistentVolume, or a driver that does not attach",
                self.calls.driver.name
            )));
        }
        // An inline ephemeral volume of a driver that does not attach is a plain publish: the
        // driver's mount with the context as its options, torn down by unpublish.
        let staging = if plugin.capabilities.attach {
            // CSI: with STAGE_UNSTAGE_VOLUME offered, a missing staging path is a precondition.
            if req.staging_target_path.is_empty() {
                return Err(Status::failed_precondition(
                    "staging_target_path is required: this driver attaches, so its volumes are staged first",
                ));
            }
            Some(request::path(&req.staging_target_path, "staging_target_path")?.to_owned())
        } else {
            None
        };
        let outcome = self
            .calls
            .run_locked(&volume_id, move |lifecycle, _| {
                lifecycle.publish(
                    &MountRequest {
                        plugin: &plugin,
                        spec: &spec,
                        pod: &pod,
                        fs_group,
                        fs_group_policy: Default::default(),
                        target: Path::new(&target),
                    },
                    staging.as_deref().map(Path::new),
                )
            })
            .await?;
        tracing::info!(driver = %self.calls.driver.name, volume = %volume_id, target = %outcome.target.display(), mounted_now = outcome.mounted_now, "NodePublishVolume");
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let (req, volume_id) = request::one_volume(request)?;
        let target = request::path(&req.target_path, "target_path")?.to_owned();
        self.tear_down(volume_id, target, Role::Publish, "NodeUnpublishVolume")
            .await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let (req, volume_id) = request::one_volume(request)?;
        request::required(&req.volume_path, "volume_path")?;
        self.calls.plugin_offering(
            |c| c.supports_metrics,
            |driver| {
                Status::unimplemented(format!(
                    "driver {driver} does not support metrics (supportsMetrics: false)"
                ))
            },
        )?;
        // Only a path the volume is recorded at is measured.
        let path = self.recorded_path(&volume_id, &req.volume_path).await?;
        let stat = tokio::task::spawn_blocking(move || rustix::fs::statvfs(&path))
            .await
            .map_err(|e| Status::internal(format!("statvfs did not finish: {e}")))?
            .map_err(|e| match e {
                rustix::io::Errno::NOENT => {
                    Status::not_found(format!("volume_path {}: {e}", req.volume_path))
                }
                _ => Status::internal(format!("statvfs {}: {e}", req.volume_path)),
            })?;
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let block = stat.f_frsize;
        let usage = |unit: volume_usage::Unit, total: u64, free: u64, available: u64| VolumeUsage {
            total: clamp(total),
            available: clamp(available),
            used: clamp(total.saturating_sub(free)),
            unit: unit as i32,
        };
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage: vec![
                usage(
                    volume_usage::Unit::Bytes,
                    stat.f_blocks.saturating_mul(block),
                    stat.f_bfree.saturating_mul(block),
                    stat.f_bavail.saturating_mul(block),
                ),
                usage(
                    volume_usage::Unit::Inodes,
                    stat.f_files,
                    stat.f_ffree,
                    stat.f_favail,
                ),
            ],
        }))
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let (req, volume_id) = request::one_volume(request)?;
        request::required(&req.volume_path, "volume_path")?;
        // The volume must be where the request says, before anything else about it is asked.
        let volume_path = self.recorded_path(&volume_id, &req.volume_path).await?;
        let new_bytes = req
            .capacity_range
            .as_ref()
            .map(|r| r.required_bytes)
            .filter(|b| *b > 0)
            .ok_or_else(|| Status::invalid_argument("capacity_range.required_bytes is required"))?;
        // The filesystem lives on the staging path for a staged volume.
        let recorded = if req.staging_target_path.is_empty() {
            volume_path
        } else {
            request::path(&req.staging_target_path, "staging_target_path")?.into()
        };
        let resolver = ServedResolver(self.calls.driver.clone());
        let outcome = self
            .calls
            .run_locked(&volume_id, move |lifecycle, _| {
                lifecycle.expand(
                    &recorded,
                    new_bytes as u64,
                    Expansion::FilesystemOnly,
                    &resolver,
                )
            })
            .await?;
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(outcome.new_bytes).unwrap_or(i64::MAX),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::rpc::Type;
        let mut capabilities = Vec::new();
        if let Some(plugin) = self.calls.driver.plugin() {
            let caps = plugin.capabilities;
            if caps.attach {
                capabilities.push(capability(Type::StageUnstageVolume));
            }
            if caps.supports_metrics {
                capabilities.push(capability(Type::GetVolumeStats));
            }
            if caps.requires_fs_resize {
                capabilities.push(capability(Type::ExpandVolume));
            }
            // flexd applies the fsGroup itself (SetUp(fsGroup)) from volume_mount_group.
            if caps.fs_group {
                capabilities.push(capability(Type::VolumeMountGroup));
            }
        }
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.calls.lifecycle.node.clone(),
            max_volumes_per_node: 0,
        }))
    }
}
