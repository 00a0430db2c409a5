//! Generated gRPC code for the CSI v1 subset and kubelet's plugin registration API.

#[allow(clippy::all, clippy::pedantic)]
pub mod csi {
    tonic::include_proto!("csi.v1");
}

#[allow(clippy::all, clippy::pedantic)]
pub mod registration {
    tonic::include_proto!("pluginregistration");
}
