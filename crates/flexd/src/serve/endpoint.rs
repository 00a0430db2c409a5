//! The sockets of one served driver: its CSI endpoint and its kubelet registration socket.
//!
//! Created when the driver is found, removed when it goes. A stale socket file left by a crash
//! is replaced; the directory under `--csi-dir` is flexd's own and removed with the driver.
//!
//! Every socket bounds its connections, so that clients that connect and say nothing cannot pin
//! flexd's memory (hyper waits for the HTTP/2 preface forever, and accepts without limit):
//! - a connection must send the HTTP/2 client preface within [`PREFACE_TIMEOUT`], or it is
//!   closed before tonic ever sees it;
//! - at most [`MAX_CONNECTIONS`] connections per socket, the ones still owing their preface
//!   included; at the cap flexd stops accepting, and new clients wait in the listen backlog
//!   until a slot frees (a waiting kubelet is served late rather than refused);
//! - no maximum age by default: the CSI sidecars hold one connection for their whole life and
//!   exit when it goes (csi-lib-utils: "Lost connection to CSI driver, exiting"), so a GOAWAY
//!   restarts them; the storage e2e suite saw every sidecar restart each 5 minutes while flexd
//!   recycled connections at that age. `FLEXD_CONNECTION_MAX_AGE` sets one where no sidecar
//!   connects (kubelet dials per operation);
//! - a peer that stops answering HTTP/2 pings ([`KEEPALIVE_INTERVAL`], [`KEEPALIVE_TIMEOUT`])
//!   is dropped, even with a call in flight (it could not read the answer anyway).
//!
//! `FLEXD_PREFACE_TIMEOUT`, `FLEXD_MAX_CONNECTIONS` and `FLEXD_CONNECTION_MAX_AGE` (seconds,
//! or a count) override the first three, for tests and unusual hosts.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt as _;
use tonic::transport::server::{Connected, UdsConnectInfo};
use tonic::transport::Server;

use super::driver::ServedDriver;
use super::identity::IdentityService;
use super::registration::RegistrationService;
use flexd::http2::authority::{self, AuthorityFix};
use flexd::http2::PREFACE;
use flexd::proto::csi::identity_server::IdentityServer;
use flexd::proto::registration::registration_server::RegistrationServer;

/// The running gRPC servers of one driver.
pub struct Endpoint {
    pub driver: Arc<ServedDriver>,
    servers: Vec<(oneshot::Sender<()>, JoinHandle<()>)>,
}

/// Who may connect to a socket: root (its owner) alone, or also a group the operator named
/// (`--socket-group`: the CSI sidecars' in the controller pod, which run as non-root).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketAccess {
    pub group: Option<u32>,
}

impl SocketAccess {
    fn mode(self) -> u32 {
        if self.group.is_some() {
            0o660
        } else {
            0o600
        }
    }
}

/// Binds a Unix socket at `path`, replacing a stale socket file (never any other kind of
/// file), with the permissions `access` gives whatever the umask. The socket is made
/// under a hidden temporary name (`.<pid in hex>`) and renamed into place once its mode and group are set, so
/// nobody can connect through wider permissions in between, and kubelet's plugin watcher, which
/// ignores dot-names, sees only the finished socket. `own_dir`: the socket's directory is
/// flexd's own (`<csi-dir>/<csi-name>`) and gets the same access (0700 or 0750).
fn bind(path: &Path, access: SocketAccess, own_dir: bool) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::DirBuilderExt as _;
    let (Some(dir), Some(_)) = (path.parent(), path.file_name()) else {
        anyhow::bail!("{} is not a socket path", path.display());
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    if own_dir {
        let dir_mode = if access.group.is_some() { 0o750 } else { 0o700 };
        set_access(dir, access, dir_mode)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) => {}
        Ok(_) => anyhow::bail!(
            "{} exists and is not a socket; refusing to replace it",
            path.display()
        ),
        Err(_) => {}
    }
    // Never longer than the socket's own name (`csi.sock`, `<csi-name>-reg.sock`): a socket's
    // path holds at most 107 bytes, and a longer temporary name failed a bind that the final
    // path allowed (the VM suite's long scratch paths). One socket at a time per process.
    let temp = dir.join(format!(".{:x}", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    let listener =
        listen_owner_only(&temp).with_context(|| format!("cannot listen on {}", path.display()))?;
    let placed = set_access(&temp, access, access.mode()).and_then(|()| {
        std::fs::rename(&temp, path)
            .with_context(|| format!("cannot move the socket to {}", path.display()))
    });
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    Ok(listener)
}

/// A listening Unix socket whose file is born owner-only: Linux gives a socket's file the
/// mode of its inode (less the umask) at bind time, and the inode's mode is set first.
fn listen_owner_only(path: &Path) -> io::Result<UnixListener> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let socket = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    rustix::fs::fchmod(&socket, rustix::fs::Mode::from_raw_mode(0o600))?;
    rustix::net::bind(&socket, &SocketAddrUnix::new(path)?)?;
    rustix::net::listen(&socket, 1024)?;
    UnixListener::from_std(std::os::unix::net::UnixListener::from(socket))
}

/// Gives `path` the group of `access` (if any) and `mode`.
fn set_access(path: &Path, access: SocketAccess, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(gid) = access.group {
        rustix::fs::chown(path, None, Some(rustix::fs::Gid::from_raw(gid)))
            .with_context(|| format!("cannot give {} to group {gid}", path.display()))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
}

/// Time a new connection has to send the HTTP/2 client preface (24 bytes every gRPC client
/// sends at once).
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections per socket at most. kubelet holds one or two per driver, each sidecar one; 256
/// leaves room for bursts and for every socket of several drivers under the default 1024 open
/// files, while 256 connections' buffers stay within a few tens of MiB.
pub const MAX_CONNECTIONS: usize = 256;
/// HTTP/2 pings on every connection this often...
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
/// ...and a peer that does not answer one within this is dropped.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The connection bounds in force (the defaults, or the environment's overrides).
#[derive(Debug, Clone, Copy)]
struct Limits {
    preface_timeout: Duration,
    max_connections: usize,
    /// Age at which a connection is asked to go (GOAWAY); none unless set.
    max_age: Option<Duration>,
}

fn limits() -> Limits {
    static LIMITS: OnceLock<Limits> = OnceLock::new();
    *LIMITS.get_or_init(|| {
        let seconds = |var: &str| {
            std::env::var(var)
                .ok()
                .and_then(|v| v.trim().parse::<f64>().ok())
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .filter(|d| !d.is_zero())
        };
        let limits = Limits {
            preface_timeout: seconds("FLEXD_PREFACE_TIMEOUT").unwrap_or(PREFACE_TIMEOUT),
            max_connections: std::env::var("FLEXD_MAX_CONNECTIONS")
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|n| (1..=Semaphore::MAX_PERMITS).contains(n))
                .unwrap_or(MAX_CONNECTIONS),
            max_age: seconds("FLEXD_CONNECTION_MAX_AGE"),
        };
        tracing::info!(
            preface_timeout_seconds = limits.preface_timeout.as_secs_f64(),
            max_connections = limits.max_connections,
            max_age_seconds = limits.max_age.map(|age| age.as_secs_f64()),
            "gRPC connection bounds (per socket)"
        );
        limits
    })
}

/// A gRPC server builder with the connection bounds set. The frame and header-list sizes it
/// advertises are hyper's defaults, set here because the `:authority` rewriter enforces the
/// same numbers on every frame before h2 sees it.
fn server() -> Server {
    let server = Server::builder()
        .max_frame_size(authority::MAX_FRAME_SIZE)
        .http2_max_header_list_size(authority::MAX_HEADER_LIST_SIZE)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT));
    match limits().max_age {
        Some(age) => server.max_connection_age(age),
        None => server,
    }
}

/// An accepted connection that sent its preface: the preface is replayed to hyper, and the
/// connection's slot under the cap is held until hyper drops it.
struct Admitted {
    stream: UnixStream,
    replayed: usize,
    _slot: OwnedSemaphorePermit,
}

impl AsyncRead for Admitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.replayed < PREFACE.len() {
            let rest = &PREFACE[self.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            self.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Connected for Admitted {
    type ConnectInfo = UdsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

/// Reads the 24-byte HTTP/2 client preface (without io-util: readiness and `try_read`).
async fn read_preface(stream: &UnixStream) -> io::Result<()> {
    let mut got = [0u8; PREFACE.len()];
    let mut filled = 0;
    while filled < got.len() {
        stream.readable().await?;
        match stream.try_read(&mut got[filled..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        if got[..filled] != PREFACE[..filled] {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not an HTTP/2 client preface",
            ));
        }
    }
    Ok(())
}

/// The connections of `listener` that sent their preface in time, at most
/// `limits.max_connections` at once (admitted or still owing their preface). Accepting stops
/// when tonic drops the stream.
fn admitted(
    listener: UnixListener,
    socket: PathBuf,
    limits: Limits,
) -> impl tokio_stream::Stream<Item = io::Result<AuthorityFix<Admitted>>> {
    let (admit, incoming) = mpsc::channel::<Admitted>(16);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::spawn(async move {
        let full = AtomicBool::new(false);
        loop {
            let slot = match slots.clone().try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    if !full.swap(true, Ordering::Relaxed) {
                        tracing::warn!(socket = %socket.display(), max_connections = limits.max_connections, "connection cap reached; new connections wait until one closes");
                    }
                    tokio::select! {
                        slot = slots.clone().acquire_owned() => match slot {
                            Ok(slot) => slot,
                            Err(_) => return,
                        },
                        () = admit.closed() => return,
                    }
                }
            };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = admit.closed() => return,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors (EMFILE) or memory: retrying at once would spin.
                    tracing::warn!(socket = %socket.display(), error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if slots.available_permits() > 0 {
                full.store(false, Ordering::Relaxed);
            }
            let admit = admit.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(limits.preface_timeout, read_preface(&stream)).await {
                    Ok(Ok(())) => {
                        let _ = admit
                            .send(Admitted {
                                stream,
                                replayed: 0,
                                _slot: slot,
                            })
                            .await;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "connection closed before its HTTP/2 preface")
                    }
                    Err(_) => tracing::debug!(
                        timeout_seconds = limits.preface_timeout.as_secs_f64(),
                        "connection sent no HTTP/2 preface in time; closed"
                    ),
                }
            });
        }
    });
    // Every gRPC client's authority, whatever it sends over a Unix socket (see `authority`).
    ReceiverStream::new(incoming).map(|admitted| Ok(AuthorityFix::new(admitted)))
}

fn spawn_server(
    router: tonic::transport::server::Router,
    listener: UnixListener,
    socket: PathBuf,
) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        let incoming = admitted(listener, socket, limits());
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
        access: SocketAccess,
        add_services: impl FnOnce(tonic::transport::server::Router) -> tonic::transport::server::Router,
    ) -> anyhow::Result<Self> {
        let csi_listener = bind(&driver.csi_socket, access, true)?;
        let router = server().add_service(IdentityServer::new(IdentityService {
            driver: driver.clone(),
        }));
        let mut servers = vec![spawn_server(
            add_services(router),
            csi_listener,
            driver.csi_socket.clone(),
        )];
        if let Some(path) = &driver.registration_socket {
            // kubelet's registration dir: root's alone, whoever else may use the CSI socket.
            let listener = bind(path, SocketAccess::default(), false)?;
            let router = server().add_service(RegistrationServer::new(RegistrationService {
                driver: driver.clone(),
            }));
            servers.push(spawn_server(router, listener, path.clone()));
        }
        tracing::info!(driver = %driver.name, csi_name = %driver.csi_name, socket = %driver.csi_socket.display(), "serving driver");
        Ok(Self { driver, servers })
    }

    /// Why this endpoint does not serve although it should (a server task ended, a socket
    /// was removed from under it), for `/healthz`.
    pub fn problems(&self) -> Vec<String> {
        use std::os::unix::fs::FileTypeExt as _;
        let mut problems = Vec::new();
        if self.servers.iter().any(|(_, handle)| handle.is_finished()) {
            problems.push(format!(
                "driver {}: its gRPC server stopped",
                self.driver.name
            ));
        }
        let sockets = std::iter::once(&self.driver.csi_socket)
            .chain(self.driver.registration_socket.as_ref());
        for socket in sockets {
            let is_socket =
                std::fs::symlink_metadata(socket).is_ok_and(|m| m.file_type().is_socket());
            if !is_socket {
                problems.push(format!(
                    "driver {}: socket {} is gone",
                    self.driver.name,
                    socket.display()
                ));
            }
        }
        problems
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
