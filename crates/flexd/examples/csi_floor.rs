//! The least a CSI node plugin can do to serve a FlexVolume driver: the floor that
//! bench/pod-startup.sh measures flexd against, beside kubelet's own FlexVolume plugin.
//!
//! NodePublishVolume runs the driver's `mount <target> <options>` and answers; NodeUnpublishVolume
//! its `unmount <target>`. Nothing else: no record, no lock, no cgroup, no timeout, no check of
//! the target, no output cap. It is what kubelet's FlexVolume plugin does, moved behind kubelet's
//! CSI plugin, so what it costs over kubelet's FlexVolume plugin is what the CSI design costs any
//! plugin; what flexd costs over it is flexd's own. A bench tool, not something to deploy.
//!
//! It registers itself with kubelet (the plugin registration socket), as flexd does, and answers
//! NodeGetCapabilities as flexd does for a driver that neither attaches nor reports metrics, so
//! kubelet makes the same calls on both.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::Stdio;

use anyhow::Context as _;
use clap::Parser;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::StreamExt as _;
use tonic::{Request, Response, Status};

use flexd::http2::authority::AuthorityFix;
use flexd::proto::csi::identity_server::{Identity, IdentityServer};
use flexd::proto::csi::node_server::{Node, NodeServer};
use flexd::proto::csi::*;
use flexd::proto::registration::registration_server::{Registration, RegistrationServer};
use flexd::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};

#[derive(Parser, Clone)]
struct Args {
    /// The CSI name kubelet knows the plugin by.
    #[arg(long)]
    name: String,
    /// The driver executable.
    #[arg(long)]
    driver: PathBuf,
    /// kubelet's plugins dir: the CSI socket is `<dir>/<name>/csi.sock`.
    #[arg(long)]
    csi_dir: PathBuf,
    /// kubelet's plugin registration dir.
    #[arg(long)]
    registration_dir: PathBuf,
    /// The mount namespace the driver runs in (flexd's `--driver-mount-namespace`).
    #[arg(long)]
    driver_mount_namespace: Option<PathBuf>,
    /// The node id NodeGetInfo answers.
    #[arg(long, env = "NODE_NAME")]
    node: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let socket_dir = args.csi_dir.join(&args.name);
    std::fs::create_dir_all(&socket_dir).with_context(|| format!("{}", socket_dir.display()))?;
    let csi_socket = socket_dir.join("csi.sock");
    let registration_socket = args
        .registration_dir
        .join(format!("{}-reg.sock", args.name));
    let csi = listen(&csi_socket)?;
    let registration = listen(&registration_socket)?;
    let plugin = Floor { args: args.clone() };
    let registrar = Registrar {
        name: args.name.clone(),
        endpoint: csi_socket.display().to_string(),
    };
    let csi = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(plugin.clone()))
        .add_service(NodeServer::new(plugin))
        .serve_with_incoming(incoming(csi));
    let registration = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(registrar))
        .serve_with_incoming(incoming(registration));
    tokio::try_join!(csi, registration)?;
    Ok(())
}

/// The listener's connections, each with any `:authority` a gRPC client sends over a Unix socket
/// made one h2 accepts, as flexd does (kubelet's registration client sends the socket's path).
fn incoming(
    listener: UnixListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<AuthorityFix<tokio::net::UnixStream>>> {
    UnixListenerStream::new(listener).map(|accepted| accepted.map(AuthorityFix::new))
}

fn listen(path: &std::path::Path) -> anyhow::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => {}
    }
    UnixListener::bind(path).with_context(|| format!("listening on {}", path.display()))
}

#[derive(Clone)]
struct Floor {
    args: Args,
}

impl Floor {
    /// Runs the driver with `argv` in its mount namespace, on a blocking thread as a Go plugin's
    /// exec holds one; Ok when it answered Success.
    async fn call(&self, argv: Vec<String>) -> Result<(), Status> {
        let floor = self.clone();
        tokio::task::spawn_blocking(move || floor.run(&argv))
            .await
            .map_err(|e| Status::internal(format!("the call did not finish: {e}")))?
    }

    fn run(&self, argv: &[String]) -> Result<(), Status> {
        use std::os::unix::process::CommandExt as _;
        let mut command = std::process::Command::new(&self.args.driver);
        command
            .args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(path) = &self.args.driver_mount_namespace {
            let namespace = std::fs::File::open(path)
                .map_err(|e| Status::internal(format!("{}: {e}", path.display())))?;
            // SAFETY: the child only calls setns (async-signal-safe) before exec; the closure
            // owns the descriptor, open until the exec.
            unsafe {
                command.pre_exec(move || {
                    rustix::thread::move_into_link_name_space(
                        namespace.as_fd(),
                        Some(rustix::thread::LinkNameSpaceType::Mount),
                    )
                    .map_err(std::io::Error::from)
                });
            }
        }
        let output = command
            .output()
            .map_err(|e| Status::internal(format!("running the driver: {e}")))?;
        let answer: serde_json::Value = serde_json::from_slice(&output.stdout)
            .map_err(|e| Status::internal(format!("the driver's answer is not JSON ({e})")))?;
        match answer.get("status").and_then(|s| s.as_str()) {
            Some("Success") => Ok(()),
            _ => Err(Status::internal(format!("the driver answered {answer}"))),
        }
    }
}

#[tonic::async_trait]
impl Identity for Floor {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.args.name.clone(),
            vendor_version: "0".to_owned(),
            ..Default::default()
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Node for Floor {
    async fn node_stage_volume(
        &self,
        _: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        Err(Status::unimplemented("no staging"))
    }

    async fn node_unstage_volume(
        &self,
        _: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        Err(Status::unimplemented("no staging"))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let request = request.into_inner();
        let mut options: serde_json::Map<String, serde_json::Value> = request
            .volume_context
            .into_iter()
            .map(|(k, v)| (k, v.into()))
            .collect();
        let readwrite = if request.readonly { "ro" } else { "rw" };
        options.insert("kubernetes.io/readwrite".to_owned(), readwrite.into());
        let options = serde_json::Value::Object(options).to_string();
        self.call(vec!["mount".into(), request.target_path, options])
            .await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        self.call(vec!["unmount".into(), request.into_inner().target_path])
            .await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        _: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        Err(Status::unimplemented("no stats"))
    }

    async fn node_expand_volume(
        &self,
        _: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("no expansion"))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::rpc::Type;
        let capability = NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(
                node_service_capability::Rpc {
                    r#type: Type::VolumeMountGroup as i32,
                },
            )),
        };
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![capability],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.args.node.clone(),
            ..Default::default()
        }))
    }
}

struct Registrar {
    name: String,
    endpoint: String,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: "CSIPlugin".to_owned(),
            name: self.name.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec!["1.0.0".to_owned()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if !status.plugin_registered {
            eprintln!(
                "csi-floor: kubelet refused the registration: {}",
                status.error
            );
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
