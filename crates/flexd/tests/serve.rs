//! `flexd serve` through the real binary: real drivers, real Unix sockets, a real gRPC client
//! doing what kubelet does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

pub mod csi {
    tonic::include_proto!("csi.v1");
}
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/drivers")
}

fn install(plugin_dir: &Path, source: &str, dir_name: &str) {
    let dir = plugin_dir.join(dir_name);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir_name.rsplit('~').next().unwrap();
    std::fs::copy(examples().join(source), dir.join(exe)).unwrap();
}

/// A running `flexd serve` with its own directories; killed and cleaned up on drop.
struct Server {
    child: Child,
    _root: tempfile::TempDir,
    plugin_dir: PathBuf,
    csi_dir: PathBuf,
    registration_dir: PathBuf,
    metrics_address: String,
}

/// A free loopback port for this server's metrics (tests run in parallel).
fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

impl Server {
    fn start(setup: impl FnOnce(&Path)) -> Self {
        let root = tempfile::tempdir().unwrap();
        let plugin_dir = root.path().join("exec");
        std::fs::create_dir(&plugin_dir).unwrap();
        setup(&plugin_dir);
        let csi_dir = root.path().join("plugins");
        let registration_dir = root.path().join("plugins_registry");
        let metrics_address = free_address();
        let child = Command::new(env!("CARGO_BIN_EXE_flexd"))
            .arg("--plugin-dir")
            .arg(&plugin_dir)
            .args(["--probe-interval", "300ms"])
            .arg("serve")
            .arg("--csi-dir")
            .arg(&csi_dir)
            .arg("--registration-dir")
            .arg(&registration_dir)
            .arg("--state-dir")
            .arg(root.path().join("state"))
            .args([
                "--node-name",
                "node-1",
                "--metrics-address",
                &metrics_address,
            ])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        Self {
            child,
            _root: root,
            plugin_dir,
            csi_dir,
            registration_dir,
            metrics_address,
        }
    }

    /// GET a path from the metrics endpoint, retrying until it answers.
    fn http_get(&self, path: &str) -> String {
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

    fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "flexd serve did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn connect(socket: &Path) -> Channel {
    let socket = socket.to_owned();
    Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_driver_gets_a_csi_endpoint_and_a_registration_socket() {
    let mut server = Server::start(|p| {
        install(p, "tmpfs/tmpfs", "acme~tmpfs");
        install(p, "attachable/attachable", "acme~Block_dev");
    });
    let tmpfs_sock = server.csi_dir.join("flexvolume-acme--tmpfs/csi.sock");
    let block_sock = server.csi_dir.join("flexvolume-acme---block-1dev/csi.sock");
    let tmpfs_reg = server
        .registration_dir
        .join("flexvolume-acme--tmpfs-reg.sock");
    for path in [&tmpfs_sock, &block_sock, &tmpfs_reg] {
        wait_for(path);
    }

    // What kubelet does with the registration socket.
    let mut reg =
        registration::registration_client::RegistrationClient::new(connect(&tmpfs_reg).await);
    let info = reg
        .get_info(registration::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, "flexvolume-acme--tmpfs");
    assert_eq!(Path::new(&info.endpoint), tmpfs_sock);
    assert_eq!(info.supported_versions, vec!["1.0.0".to_owned()]);
    reg.notify_registration_status(registration::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .unwrap();

    let mut identity = csi::identity_client::IdentityClient::new(connect(&tmpfs_sock).await);
    let plugin_info = identity
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plugin_info.name, "flexvolume-acme--tmpfs");
    assert_eq!(
        plugin_info
            .manifest
            .get("flexvolume-driver")
            .map(String::as_str),
        Some("acme/tmpfs")
    );
    let probe = identity
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    let caps = identity
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        caps.capabilities.is_empty(),
        "a non-attaching driver has no controller service"
    );

    let mut identity = csi::identity_client::IdentityClient::new(connect(&block_sock).await);
    let caps = identity
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let controller = csi::plugin_capability::service::Type::ControllerService as i32;
    assert!(
        caps.capabilities.iter().any(|c| matches!(
            &c.r#type,
            Some(csi::plugin_capability::Type::Service(s)) if s.r#type == controller
        )),
        "an attaching driver advertises the controller service: {caps:?}"
    );

    let status = tokio::task::spawn_blocking(move || {
        let status = server.terminate();
        (status, server)
    })
    .await
    .unwrap();
    let (status, server) = status;
    assert_eq!(status.code(), Some(0));
    assert!(
        !tmpfs_sock.exists() && !tmpfs_reg.exists() && !block_sock.exists(),
        "sockets removed on exit"
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_sockets_of_a_crashed_flexd_are_removed_and_others_left_alone() {
    let server = Server::start(|p| {
        install(p, "tmpfs/tmpfs", "acme~tmpfs");
        let root = p.parent().unwrap();
        // Leftovers of a driver that is gone, and a foreign driver's files.
        let gone = root.join("plugins/flexvolume-acme--gone");
        std::fs::create_dir_all(&gone).unwrap();
        std::os::unix::net::UnixListener::bind(gone.join("csi.sock")).unwrap();
        std::fs::create_dir_all(root.join("plugins_registry")).unwrap();
        std::os::unix::net::UnixListener::bind(
            root.join("plugins_registry/flexvolume-acme--gone-reg.sock"),
        )
        .unwrap();
        std::fs::create_dir_all(root.join("plugins/ebs.csi.aws.com")).unwrap();
        std::os::unix::net::UnixListener::bind(
            root.join("plugins_registry/ebs.csi.aws.com-reg.sock"),
        )
        .unwrap();
    });
    wait_for(
        &server
            .registration_dir
            .join("flexvolume-acme--tmpfs-reg.sock"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.csi_dir.join("flexvolume-acme--gone").exists() {
        assert!(Instant::now() < deadline, "stale endpoint not removed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!server
        .registration_dir
        .join("flexvolume-acme--gone-reg.sock")
        .exists());
    assert!(
        server.csi_dir.join("ebs.csi.aws.com").exists(),
        "foreign driver untouched"
    );
    assert!(server
        .registration_dir
        .join("ebs.csi.aws.com-reg.sock")
        .exists());
}

#[test]
fn metrics_count_call_outs_and_drivers_and_health_answers() {
    let server = Server::start(|p| {
        install(p, "tmpfs/tmpfs", "acme~tmpfs");
        let dir = p.join("acme~broken");
        std::fs::create_dir(&dir).unwrap();
        std::fs::copy(examples().join("quirks/empty-output"), dir.join("broken")).unwrap();
    });
    wait_for(&server.csi_dir.join("flexvolume-acme--tmpfs/csi.sock"));
    let health = server.http_get("/healthz");
    assert!(
        health.starts_with("HTTP/1.0 200") || health.starts_with("HTTP/1.1 200"),
        "{health}"
    );
    assert!(health.ends_with("ok\n"));
    let metrics = server.http_get("/metrics");
    for line in [
        r#"flexd_callout_duration_seconds_count{driver="acme/tmpfs",callout="init",result="success"} 1"#,
        r#"flexd_callout_duration_seconds_count{driver="acme/broken",callout="init",result="error"} 1"#,
        r#"flexd_drivers{status="ready"} 1"#,
        r#"flexd_drivers{status="failed"} 1"#,
        r#"flexd_probe_events_total{event="add"} 1"#,
        r#"flexd_probe_events_total{event="failed"} 1"#,
    ] {
        assert!(metrics.contains(line), "missing {line} in:\n{metrics}");
    }
    assert!(server.http_get("/nope").contains(" 404 "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_whose_init_fails_is_served_as_not_ready() {
    let server = Server::start(|p| {
        let dir = p.join("acme~broken");
        std::fs::create_dir(&dir).unwrap();
        std::fs::copy(examples().join("quirks/empty-output"), dir.join("broken")).unwrap();
    });
    let sock = server.csi_dir.join("flexvolume-acme--broken/csi.sock");
    wait_for(&sock);
    let mut identity = csi::identity_client::IdentityClient::new(connect(&sock).await);
    let probe = identity
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(false));
    drop(server.plugin_dir.clone());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_installed_while_serving_gets_sockets_and_loses_them_when_removed() {
    let server = Server::start(|_| {});
    std::thread::sleep(Duration::from_millis(300));
    let out = Command::new(env!("CARGO_BIN_EXE_flexd"))
        .arg("--plugin-dir")
        .arg(&server.plugin_dir)
        .args(["install", "--driver", "late/comer"])
        .arg(examples().join("tmpfs/tmpfs"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let sock = server.csi_dir.join("flexvolume-late--comer/csi.sock");
    let reg = server
        .registration_dir
        .join("flexvolume-late--comer-reg.sock");
    wait_for(&sock);
    wait_for(&reg);
    let mut identity = csi::identity_client::IdentityClient::new(connect(&sock).await);
    let probe = identity
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));

    let out = Command::new(env!("CARGO_BIN_EXE_flexd"))
        .arg("--plugin-dir")
        .arg(&server.plugin_dir)
        .args(["uninstall", "--driver", "late/comer"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while sock.exists() || reg.exists() {
        assert!(
            Instant::now() < deadline,
            "sockets of a removed driver were not removed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let metrics = server.http_get("/metrics");
    assert!(
        metrics.contains(r#"flexd_probe_events_total{event="remove"} 1"#),
        "{metrics}"
    );
}
