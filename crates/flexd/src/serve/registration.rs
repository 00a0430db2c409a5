//! kubelet's plugin registration for one driver: kubelet finds the socket in its registration
//! directory, asks GetInfo, and reports whether it registered the CSI endpoint.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::driver::ServedDriver;
use flexd::proto::registration::registration_server::Registration;
use flexd::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};

/// The CSI versions flexd's endpoints speak, as kubelet expects them listed.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

pub struct RegistrationService {
    pub driver: Arc<ServedDriver>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: "CSIPlugin".to_owned(),
            name: self.driver.csi_name.clone(),
            endpoint: self.driver.csi_socket.display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.driver.name, csi_name = %self.driver.csi_name, "kubelet registered the driver");
        } else {
            tracing::error!(driver = %self.driver.name, error = %status.error, "kubelet refused to register the driver");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
