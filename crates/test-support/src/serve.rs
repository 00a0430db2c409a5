//! The one gRPC test harness: a real `flexd serve` in a sandbox, started with no flexd setting
//! from the environment, and a gRPC client doing what kubelet and the sidecars do.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::sandbox::{eventually, is_mounted, terminate, wait_for_path, Sandbox};

/// The generated CSI and plugin-registration code: flexd's own, clients included.
pub use flexd::proto::{csi, registration};

/// A running `flexd serve` on a sandbox (plugins in `exec`, CSI sockets in `plugins`,
/// registration sockets in `plugins_registry`, state in `state`, its log in `flexd.log`).
/// Killed on drop; the sandbox then releases any blocking test driver and unmounts everything.
pub struct Server {
    child: Child,
    mode: &'static str,
    pub plugin_dir: PathBuf,
    pub csi_dir: PathBuf,
    pub registration_dir: PathBuf,
    metrics_address: String,
    env: &'static [(&'static str, &'static str)],
    launch: Launch,
    sandbox: Sandbox,
}

/// How flexd is started beyond its sandbox: what a node's runtime or operator may vary.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// Soft and hard open-file limits (`None`: the test's own), as a node's runtime might
    /// start flexd (1024 is a common default for both).
    pub open_files: Option<(u64, u64)>,
    /// The umask (`None`: the test's own).
    pub umask: Option<u32>,
    /// More `serve` flags.
    pub serve_args: Vec<String>,
}

/// A free loopback port for a server's metrics (tests run in parallel).
fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

impl Server {
    /// A node-mode server; `setup` fills the plugin dir first.
    pub fn start(setup: impl FnOnce(&Path)) -> Self {
        Self::start_in_mode("node", setup)
    }

    pub fn start_in_mode(mode: &'static str, setup: impl FnOnce(&Path)) -> Self {
        Self::start_with(mode, &[], setup)
    }

    /// A server in `mode` with `env` set (FLEXD_* tuning); `setup` fills the plugin dir first.
    pub fn start_with(
        mode: &'static str,
        env: &'static [(&'static str, &'static str)],
        setup: impl FnOnce(&Path),
    ) -> Self {
        let sandbox = Sandbox::new();
        setup(&sandbox.plugin());
        Self::serve(sandbox, mode, env)
    }

    /// A server in `mode` with `env` set on a sandbox the test prepared (drivers installed in
    /// its plugin dir, files beside it).
    pub fn serve(
        sandbox: Sandbox,
        mode: &'static str,
        env: &'static [(&'static str, &'static str)],
    ) -> Self {
        Self::serve_launched(sandbox, mode, env, Launch::default())
    }

    /// [`Server::serve`], flexd started as `launch` says.
    pub fn serve_launched(
        sandbox: Sandbox,
        mode: &'static str,
        env: &'static [(&'static str, &'static str)],
        launch: Launch,
    ) -> Self {
        let metrics_address = free_address();
        let child = Self::spawn(&sandbox, mode, env, &metrics_address, &launch);
        Self {
            child,
            mode,
            plugin_dir: sandbox.plugin(),
            csi_dir: sandbox.path("plugins"),
            registration_dir: sandbox.path("plugins_registry"),
            metrics_address,
            env,
            launch,
            sandbox,
        }
    }

    /// The state dir it serves with.
    pub fn state_dir(&self) -> PathBuf {
        self.sandbox.state()
    }

    /// Where `/metrics` and `/healthz` are served.
    pub fn metrics_address(&self) -> &str {
        &self.metrics_address
    }

    /// The CSI socket of the driver served as `csi_name`, once it exists.
    pub fn socket(&self, csi_name: &str) -> PathBuf {
        let socket = self.csi_dir.join(csi_name).join("csi.sock");
        wait_for_path(&socket);
        socket
    }

    /// A server in `mode` that gets logging driver `dir_name` running `cases` (see
    /// `Sandbox::driver`) installed while it serves; returns it with the driver's CSI socket
    /// (`<csi dir>/<endpoint>/csi.sock`) once that exists.
    pub fn with_driver(
        mode: &'static str,
        dir_name: &str,
        cases: &str,
        endpoint: &str,
    ) -> (Self, PathBuf) {
        let server = Self::start_in_mode(mode, |_| {});
        server.driver(dir_name, cases);
        let sock = server.socket(endpoint);
        (server, sock)
    }

    /// A server in `mode` with logging driver acme/`driver` running `cases`, and its socket.
    pub fn acme(mode: &'static str, driver: &str, cases: &str) -> (Self, PathBuf) {
        let endpoint = format!("flexvolume-acme--{driver}");
        Self::with_driver(mode, &format!("acme~{driver}"), cases, &endpoint)
    }

    /// A node server with logging driver acme/`driver` running `cases`, and a node client of
    /// it: for a test that talks to the driver on that one connection only.
    pub async fn acme_node(driver: &str, cases: &str) -> (Self, NodeClient) {
        let (server, sock) = Self::acme("node", driver, cases);
        let node = node_client(&sock).await;
        (server, node)
    }

    /// A node server with driver acme/slow running `cases`, one whose mount blocks until the
    /// test releases it (`Sandbox::release`): a call that stays in flight.
    pub fn slow_node(cases: &str) -> (Self, PathBuf) {
        Self::acme("node", "slow", cases)
    }

    fn spawn(
        sandbox: &Sandbox,
        mode: &str,
        env: &[(&str, &str)],
        metrics_address: &str,
        launch: &Launch,
    ) -> Child {
        use std::os::unix::process::CommandExt as _;
        let mut command = sandbox.command();
        let limit = launch
            .open_files
            .map(|(soft, hard)| rustix::process::Rlimit {
                current: Some(soft),
                maximum: Some(hard),
            });
        let umask = launch.umask.map(rustix::fs::Mode::from_raw_mode);
        // SAFETY: setrlimit and umask are system calls, async-signal-safe, on values moved in.
        unsafe {
            command.pre_exec(move || {
                if let Some(mask) = umask {
                    rustix::process::umask(mask);
                }
                match limit {
                    Some(limit) => {
                        rustix::process::setrlimit(rustix::process::Resource::Nofile, limit)
                            .map_err(std::io::Error::from)
                    }
                    None => Ok(()),
                }
            });
        }
        command
            .args(["--probe-interval", "300ms"])
            .args(["serve", "--mode", mode])
            .arg("--csi-dir")
            .arg(sandbox.path("plugins"))
            .arg("--registration-dir")
            .arg(sandbox.path("plugins_registry"))
            .arg("--state-dir")
            .arg(sandbox.state())
            .args(["--node-name", "node-1"])
            .args(["--metrics-address", metrics_address])
            .args(&launch.serve_args)
            // Debug for tests; a RUST_LOG in `env` (benchmarks: logging as in production) wins.
            .args(
                ["--log-level", "debug"]
                    .iter()
                    .filter(|_| !env.iter().any(|(k, _)| *k == "RUST_LOG")),
            )
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(sandbox.path("flexd.log"))
                    .unwrap(),
            )
            .spawn()
            .unwrap()
    }

    /// kill -9, then a new flexd on the same directories (a fresh metrics port).
    pub fn crash_and_restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.metrics_address = free_address();
        self.child = Self::spawn(
            &self.sandbox,
            self.mode,
            self.env,
            &self.metrics_address,
            &self.launch,
        );
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What flexd logged so far.
    pub fn flexd_log(&self) -> String {
        std::fs::read_to_string(self.path("flexd.log")).unwrap_or_default()
    }

    /// The CPU time flexd itself has used so far (user + system, its threads, not its drivers):
    /// for benchmarks that say what flexd costs per call beside the wall time.
    pub fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .expect("flexd's /proc stat");
        // Fields after the command name, which is in parentheses and may hold spaces.
        let after = &stat[stat.rfind(')').expect("a stat line") + 2..];
        let fields: Vec<&str> = after.split(' ').collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        let per_second = rustix::param::clock_ticks_per_second();
        Duration::from_secs_f64(ticks as f64 / per_second as f64)
    }

    /// The volume records in the state dir.
    pub fn records(&self) -> Vec<serde_json::Value> {
        let mut records = Vec::new();
        for entry in std::fs::read_dir(self.path("state/volumes"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            // Only regular files: a test may leave a FIFO or a link named like a record.
            let regular = entry.file_type().is_ok_and(|t| t.is_file());
            if regular && name.ends_with(".json") && !name.starts_with('.') {
                let text = std::fs::read_to_string(entry.path()).unwrap();
                records.push(serde_json::from_str(&text).unwrap());
            }
        }
        records
    }

    /// GET a path from the metrics endpoint, retrying until it answers.
    pub fn http_get(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut stream) = std::net::TcpStream::connect(&self.metrics_address) {
                write!(stream, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
                let mut response = String::new();
                stream.read_to_string(&mut response).unwrap();
                return response;
            }
            assert!(Instant::now() < deadline, "metrics endpoint never answered");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM; waits for the exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        terminate(&mut self.child)
    }
}

/// The server's sandbox: its paths, drivers and their call log.
impl Deref for Server {
    type Target = Sandbox;
    fn deref(&self) -> &Sandbox {
        &self.sandbox
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects to a socket, retrying while nothing listens yet (a socket file a killed flexd
/// left behind refuses connections until the new one replaces it).
pub async fn connect(socket: &Path) -> Channel {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let path = socket.to_owned();
        let connected = Endpoint::try_from("http://[::]:50051")
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await;
        match connected {
            Ok(channel) => return channel,
            Err(e) => assert!(
                Instant::now() < deadline,
                "cannot connect to {}: {e}",
                socket.display()
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn identity_client(sock: &Path) -> csi::identity_client::IdentityClient<Channel> {
    csi::identity_client::IdentityClient::new(connect(sock).await)
}

/// A client of the node service, as kubelet holds one.
pub type NodeClient = csi::node_client::NodeClient<Channel>;

pub async fn node_client(sock: &Path) -> NodeClient {
    csi::node_client::NodeClient::new(connect(sock).await)
}

pub async fn controller_client(sock: &Path) -> csi::controller_client::ControllerClient<Channel> {
    csi::controller_client::ControllerClient::new(connect(sock).await)
}

/// What the identity service says the plugin offers (the call must succeed).
pub async fn plugin_capabilities(
    identity: &mut csi::identity_client::IdentityClient<Channel>,
) -> csi::GetPluginCapabilitiesResponse {
    let request = csi::GetPluginCapabilitiesRequest {};
    identity
        .get_plugin_capabilities(request)
        .await
        .unwrap()
        .into_inner()
}

/// What the identity service says of the plugin: its CSI name, version and manifest (the call
/// must succeed).
pub async fn plugin_info(
    identity: &mut csi::identity_client::IdentityClient<Channel>,
) -> csi::GetPluginInfoResponse {
    let info = identity.get_plugin_info(csi::GetPluginInfoRequest {}).await;
    info.unwrap().into_inner()
}

/// What the plugin's Probe says of its readiness.
pub async fn probe_ready(
    identity: &mut csi::identity_client::IdentityClient<Channel>,
) -> Option<bool> {
    let probe = identity.probe(csi::ProbeRequest {}).await.unwrap();
    probe.into_inner().ready
}

/// The plugin's capabilities as the services they name, in its order (`None` for one that
/// names no service).
pub async fn plugin_services(
    identity: &mut csi::identity_client::IdentityClient<Channel>,
) -> Vec<Option<i32>> {
    plugin_capabilities(identity)
        .await
        .capabilities
        .into_iter()
        .map(|c| match c.r#type {
            Some(csi::plugin_capability::Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect()
}

/// The CONTROLLER_SERVICE plugin capability.
pub const CONTROLLER_SERVICE: Option<i32> =
    Some(csi::plugin_capability::service::Type::ControllerService as i32);

/// The RPCs the controller service says it offers, in its order (the call must succeed, and
/// every capability must name its RPC).
pub async fn controller_capabilities(
    controller: &mut csi::controller_client::ControllerClient<Channel>,
) -> Vec<i32> {
    let request = csi::ControllerGetCapabilitiesRequest {};
    let caps = controller.controller_get_capabilities(request).await;
    let caps = caps.unwrap().into_inner();
    caps.capabilities
        .iter()
        .map(|c| match &c.r#type {
            Some(csi::controller_service_capability::Type::Rpc(rpc)) => rpc.r#type,
            None => panic!("a controller capability names no RPC: {caps:?}"),
        })
        .collect()
}

pub fn mount_capability(fs_type: &str, group: &str) -> Option<csi::VolumeCapability> {
    use csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
    Some(csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            mount_flags: vec![],
            volume_mount_group: group.into(),
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    })
}

/// A ControllerPublish (what csi-attacher sends) of `volume_id` to `node_id`, with a mount
/// capability and `context` as the volume context (a PV's `volumeAttributes`).
pub fn controller_publish_request(
    volume_id: &str,
    node_id: &str,
    context: &[(&str, &str)],
) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: node_id.into(),
        volume_capability: mount_capability("", ""),
        volume_context: map(context),
        ..Default::default()
    }
}

/// Every entry ListVolumes has, `max_entries` at a time (0: no limit), following `next_token`
/// as csi-attacher's lister does; with the number of pages it took (every call must succeed).
pub async fn list_all_volumes(
    controller: &mut csi::controller_client::ControllerClient<Channel>,
    max_entries: i32,
) -> (Vec<csi::list_volumes_response::Entry>, usize) {
    let mut entries = Vec::new();
    let mut token = String::new();
    for pages in 1.. {
        let page = controller
            .list_volumes(csi::ListVolumesRequest {
                max_entries,
                starting_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        if max_entries > 0 {
            assert!(page.entries.len() <= max_entries as usize, "{page:?}");
        }
        entries.extend(page.entries);
        if page.next_token.is_empty() {
            return (entries, pages);
        }
        assert!(pages < 10_000, "ListVolumes never ends");
        token = page.next_token;
    }
    unreachable!()
}

/// A driver whose mount mounts, then blocks until the test releases it.
pub const BLOCKS_AFTER_MOUNTING: &str = r#"init) echo '{"status":"Success","capabilities":{"attach":false}}';;
mount) mkdir -p "$2"; mount -t tmpfs tmpfs "$2" || exit 1; while [ ! -e "$RELEASE" ]; do sleep 0.05; done; echo '{"status":"Success"}';;
unmount) umount "$2"; echo '{"status":"Success"}';;"#;

/// A publish running in the background: what the call answered, once it has.
pub type PublishCall =
    tokio::task::JoinHandle<Result<tonic::Response<csi::NodePublishVolumeResponse>, tonic::Status>>;

/// The publish of `request` on a connection of its own, in the background (for a call that is
/// to stay in flight).
pub async fn spawn_publish(sock: &Path, request: csi::NodePublishVolumeRequest) -> PublishCall {
    let mut node = node_client(sock).await;
    tokio::spawn(async move { node.node_publish_volume(request).await })
}

/// Publishes every `(volume id, target)` at once, each call on its own task over one shared
/// connection, and waits for all of them; panics naming the volume whose publish failed.
pub async fn publish_all_at_once(node: &NodeClient, volumes: &[(String, PathBuf)]) {
    let calls: Vec<_> = volumes
        .iter()
        .map(|(id, target)| {
            let mut node = node.clone();
            let request = publish_request(id, target, None);
            let id = id.clone();
            tokio::spawn(async move { (id, node.node_publish_volume(request).await) })
        })
        .collect();
    for call in calls {
        let (id, result) = call.await.expect("the publish task ran");
        if let Err(status) = result {
            panic!("publish of {id} failed: {status:?}");
        }
    }
}

/// Waits (off the async runtime) until something is mounted at `target`.
pub async fn wait_until_mounted(target: &Path) {
    let target = target.to_owned();
    tokio::task::spawn_blocking(move || eventually("the driver's mount", || is_mounted(&target)))
        .await
        .unwrap();
}

pub fn map(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

pub fn publish_request(
    volume_id: &str,
    target: &Path,
    staging: Option<&Path>,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.display().to_string(),
        staging_target_path: staging.map(|s| s.display().to_string()).unwrap_or_default(),
        volume_capability: mount_capability("ext4", ""),
        ..Default::default()
    }
}

pub fn unpublish_request(volume_id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.display().to_string(),
    }
}

pub async fn node_capabilities(node: &mut NodeClient) -> Vec<i32> {
    let caps = node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await;
    let caps = caps.unwrap().into_inner();
    caps.capabilities
        .iter()
        .filter_map(|c| {
            let csi::node_service_capability::Type::Rpc(rpc) = c.r#type.as_ref()?;
            Some(rpc.r#type)
        })
        .collect()
}

/// Whether the node service advertises the RPC capability `kind`.
pub async fn node_offers(
    node: &mut NodeClient,
    kind: csi::node_service_capability::rpc::Type,
) -> bool {
    node_capabilities(node).await.contains(&(kind as i32))
}
