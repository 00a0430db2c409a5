//! The sockets of one served driver: its CSI endpoint and its kubelet registration socket.
//!
//! Created when the driver is found, removed when it goes. A stale socket file left by a crash
//! is replaced; the directory under `--csi-dir` is flexd's own and removed with the driver.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use super::driver::ServedDriver;
use super::identity::IdentityService;
use super::proto::csi::identity_server::IdentityServer;
use super::proto::registration::registration_server::RegistrationServer;
use super::registration::RegistrationService;

/// The running gRPC servers of one driver.
pub struct Endpoint {
    pub driver: Arc<ServedDriver>,
    servers: Vec<(oneshot::Sender<()>, JoinHandle<()>)>,
}

/// Binds a Unix socket, replacing a stale socket file (never any other kind of file).
fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) => {
            std::fs::remove_file(path)
                .with_context(|| format!("cannot remove stale socket {}", path.display()))?;
        }
        Ok(_) => anyhow::bail!(
            "{} exists and is not a socket; refusing to replace it",
            path.display()
        ),
        Err(_) => {}
    }
    UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))
}

fn spawn_server(
    router: tonic::transport::server::Router,
    listener: UnixListener,
) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        let incoming = UnixListenerStream::new(listener);
        if let Err(e) = router
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            })
            .await
        {
            tracing::error!(error = %e, "gRPC server failed");
        }
    });
    (stop, handle)
}

impl Endpoint {
    /// Starts the CSI server (with the given extra services) and, in node mode, the
    /// registration server.
    pub fn start(
        driver: Arc<ServedDriver>,
        add_services: impl FnOnce(tonic::transport::server::Router) -> tonic::transport::server::Router,
    ) -> anyhow::Result<Self> {
        let csi_listener = bind(&driver.csi_socket)?;
        let router = Server::builder().add_service(IdentityServer::new(IdentityService {
            driver: driver.clone(),
        }));
        let mut servers = vec![spawn_server(add_services(router), csi_listener)];
        if let Some(path) = &driver.registration_socket {
            let listener = bind(path)?;
            let router =
                Server::builder().add_service(RegistrationServer::new(RegistrationService {
                    driver: driver.clone(),
                }));
            servers.push(spawn_server(router, listener));
        }
        tracing::info!(driver = %driver.name, csi_name = %driver.csi_name, socket = %driver.csi_socket.display(), "serving driver");
        Ok(Self { driver, servers })
    }

    /// Stops the servers and removes the sockets (registration first, so kubelet deregisters
    /// before the endpoint disappears).
    pub async fn stop(self) {
        let mut paths: Vec<PathBuf> = Vec::new();
        if let Some(p) = &self.driver.registration_socket {
            paths.push(p.clone());
        }
        paths.push(self.driver.csi_socket.clone());
        for path in &paths {
            let _ = std::fs::remove_file(path);
        }
        for (stop, handle) in self.servers.into_iter().rev() {
            let _ = stop.send(());
            let _ = handle.await;
        }
        if let Some(dir) = self.driver.csi_socket.parent() {
            let _ = std::fs::remove_dir(dir);
        }
        tracing::info!(driver = %self.driver.name, "stopped serving driver");
    }
}
