//! CSI Identity for one FlexVolume driver.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::driver::ServedDriver;
use flexd::proto::csi::identity_server::Identity;
use flexd::proto::csi::{
    plugin_capability, GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse,
    GetPluginInfoRequest, GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};

pub struct IdentityService {
    pub driver: Arc<ServedDriver>,
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        let mut manifest = std::collections::HashMap::new();
        manifest.insert("flexvolume-driver".to_owned(), self.driver.name.to_string());
        Ok(Response::new(GetPluginInfoResponse {
            name: self.driver.csi_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest,
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let mut capabilities = Vec::new();
        if self
            .driver
            .plugin()
            .is_some_and(|p| p.capabilities.has_controller_side())
        {
            capabilities.push(PluginCapability {
                r#type: Some(plugin_capability::Type::Service(
                    plugin_capability::Service {
                        r#type: plugin_capability::service::Type::ControllerService as i32,
                    },
                )),
            });
        }
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        // Ready means the driver's last init succeeded.
        Ok(Response::new(ProbeResponse {
            ready: Some(self.driver.plugin().is_some()),
        }))
    }
}
