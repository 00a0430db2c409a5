//! A hostile CSI client against a real `flexd serve` over its Unix socket (and the CLI): symlinked
//! targets and parents, foreign mounts, a target claimed by two volumes, oversized and malformed
//! fields, concurrent calls, unstage under live publishes, publishes inside a staging path.
//!
//! Each case checks the exact gRPC code *and* that nothing was mounted outside: a scratch
//! "outside" directory stands in for a host directory such as /etc (it holds a marker file that
//! must stay as it was, and it must never become a mount point). No test points at a real system
//! directory.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::Code;

pub mod csi {
    tonic::include_proto!("csi.v1");
}

const MARKER: &str = "host data: must not change";

/// A running `flexd serve` with its own directories, a scratch "outside" directory, and every
/// mount under either cleaned up on drop.
struct Server {
    child: Child,
    root: tempfile::TempDir,
    outside: tempfile::TempDir,
}

impl Server {
    fn start(mode: &str) -> Self {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("marker"), MARKER).unwrap();
        std::fs::create_dir(root.path().join("exec")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_flexd"))
            .arg("--plugin-dir")
            .arg(root.path().join("exec"))
            .args(["--probe-interval", "300ms"])
            .arg("serve")
            .args(["--mode", mode])
            .arg("--csi-dir")
            .arg(root.path().join("plugins"))
            .arg("--registration-dir")
            .arg(root.path().join("plugins_registry"))
            .arg("--state-dir")
            .arg(root.path().join("state"))
            .args(["--node-name", "node-1", "--metrics-address", "127.0.0.1:0"])
            .args(["--log-level", "debug"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(root.path().join("flexd.log")).unwrap())
            .spawn()
            .unwrap();
        Self {
            child,
            root,
            outside,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    fn outside(&self) -> &Path {
        self.outside.path()
    }

    /// Installs a driver script that logs every call's argv before running `body`.
    fn driver(&self, dir_name: &str, body: &str) -> PathBuf {
        let dir = self.path("exec").join(dir_name);
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir_name.rsplit('~').next().unwrap();
        let script = format!(
            "#!/bin/sh\nRELEASE='{}'\nline=; for a in \"$@\"; do line=\"$line$a\t\"; done; printf '%s\\n' \"$line\" >> '{}'\ncase \"$1\" in\n{body}\n*) echo '{{\"status\":\"Not supported\"}}'; exit 1;;\nesac\n",
            self.path("release").display(),
            self.path("calls.log").display()
        );
        let staged = dir.join(format!(".{exe}"));
        std::fs::write(&staged, script).unwrap();
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&staged, dir.join(exe)).unwrap();
        let sock = self
            .path("plugins")
            .join(format!("flexvolume-{}", dir_name.replace('~', "--")))
            .join("csi.sock");
        wait_for(&sock);
        sock
    }

    /// The call-outs made, without init (the prober's).
    fn ops(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("calls.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split('\t').next().map(str::to_owned))
            .filter(|op| op != "init")
            .collect()
    }

    fn records(&self) -> usize {
        std::fs::read_dir(self.path("state/volumes"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.ends_with(".json") && !name.starts_with('.')
            })
            .count()
    }

    /// Nothing at or under the outside dir is a mount point, and its marker is unchanged.
    fn assert_outside_untouched(&self) {
        let outside = self.outside().canonicalize().unwrap();
        let mounts: Vec<PathBuf> = mount_points()
            .into_iter()
            .filter(|m| m.starts_with(&outside))
            .collect();
        assert!(mounts.is_empty(), "mounted outside: {mounts:?}");
        assert_eq!(
            std::fs::read_to_string(outside.join("marker")).unwrap(),
            MARKER
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::write(self.path("release"), "");
        let roots: Vec<PathBuf> = [self.root.path(), self.outside.path()]
            .iter()
            .map(|p| p.canonicalize().unwrap_or_else(|_| p.to_path_buf()))
            .collect();
        let mut mounts: Vec<PathBuf> = mount_points()
            .into_iter()
            .filter(|m| roots.iter().any(|r| m.starts_with(r)))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
        for m in mounts {
            let _ = rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

fn mount_points() -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    flexvolume::mount::parse_mountinfo(&info)
        .into_iter()
        .map(|m| m.mount_point)
        .collect()
}

fn is_mounted(path: &Path) -> bool {
    mount_points().iter().any(|m| m == path)
}

fn is_root() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    eprintln!("skipped: needs root to mount (tmpfs, bind)");
    false
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn node_client(socket: &Path) -> csi::node_client::NodeClient<Channel> {
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
            Ok(channel) => return csi::node_client::NodeClient::new(channel),
            Err(e) => assert!(Instant::now() < deadline, "cannot connect: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn capability(read_only: bool) -> Option<csi::VolumeCapability> {
    use csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
    let mode = if read_only {
        Mode::SingleNodeReaderOnly
    } else {
        Mode::SingleNodeWriter
    };
    Some(csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    })
}

fn publish(
    volume_id: &str,
    target: &Path,
    staging: Option<&Path>,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.display().to_string(),
        staging_target_path: staging.map(|s| s.display().to_string()).unwrap_or_default(),
        volume_capability: capability(false),
        ..Default::default()
    }
}

fn unpublish(volume_id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.display().to_string(),
    }
}

fn stage(volume_id: &str, staging: &Path) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: capability(false),
        ..Default::default()
    }
}

fn code<T>(result: Result<tonic::Response<T>, tonic::Status>) -> (Code, String) {
    match result {
        Ok(_) => (Code::Ok, String::new()),
        Err(status) => (status.code(), status.message().to_owned()),
    }
}

const TMPFS: &str = r#"init) echo '{"status":"Success","capabilities":{"attach":false}}';;
mount) mkdir -p "$2"; mount -t tmpfs tmpfs "$2" && echo '{"status":"Success"}' || { echo '{"status":"Failure","message":"mount failed"}'; exit 1; };;
unmount) umount "$2"; echo '{"status":"Success"}';;"#;

/// Refuses malformed ids the way a strict driver would, had it been called.
const ATTACHING: &str = r#"init) echo '{"status":"Success","capabilities":{"attach":true}}';;
waitforattach) echo "{\"status\":\"Success\",\"device\":\"$2\"}";;
mountdevice) mkdir -p "$2"; mount -t tmpfs tmpfs "$2"; echo '{"status":"Success"}';;
unmountdevice) umount "$2"; echo '{"status":"Success"}';;"#;

const BLOCKS_AFTER_MOUNTING: &str = r#"init) echo '{"status":"Success","capabilities":{"attach":false}}';;
mount) mkdir -p "$2"; mount -t tmpfs tmpfs "$2" || exit 1; while [ ! -e "$RELEASE" ]; do sleep 0.05; done; echo '{"status":"Success"}';;
unmount) umount "$2"; echo '{"status":"Success"}';;"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinked_targets_and_parents_are_refused_and_nothing_is_mounted_outside() {
    if !is_root() {
        return;
    }
    let server = Server::start("node");
    let sock = server.driver("acme~tmpfs", TMPFS);
    let mut node = node_client(&sock).await;
    let pods = server.path("pods");
    std::fs::create_dir(&pods).unwrap();
    std::os::unix::fs::symlink(server.outside(), pods.join("letc")).unwrap();
    std::os::unix::fs::symlink(server.outside(), pods.join("dirlink")).unwrap();

    // The target itself is a symlink to the stand-in for /etc.
    let (c, message) = code(
        node.node_publish_volume(publish("vol-a", &pods.join("letc"), None))
            .await,
    );
    assert_eq!(c, Code::FailedPrecondition, "{message}");
    assert!(message.contains("symbolic link"), "{message}");
    server.assert_outside_untouched();
    // A parent is: nothing is created or mounted through it.
    let through = pods.join("dirlink/vol");
    let (c, message) = code(
        node.node_publish_volume(publish("vol-a", &through, None))
            .await,
    );
    assert_eq!(c, Code::FailedPrecondition, "{message}");
    assert!(
        !server.outside().join("vol").exists(),
        "created through the link"
    );
    // Deeper: a missing directory under a symlinked parent.
    let deeper = pods.join("dirlink/a/b/vol");
    let (c, _) = code(
        node.node_publish_volume(publish("vol-a", &deeper, None))
            .await,
    );
    assert_eq!(c, Code::FailedPrecondition);
    assert!(!server.outside().join("a").exists());
    server.assert_outside_untouched();
    assert!(
        server.ops().is_empty(),
        "the driver was called: {:?}",
        server.ops()
    );
    assert_eq!(server.records(), 0);

    // Unpublishing through a symlink never unmounts what it leads to (a host mount, here a
    // tmpfs the test put on a scratch directory).
    let host_mount = tempfile::tempdir().unwrap();
    rustix::mount::mount(
        "tmpfs",
        host_mount.path(),
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .unwrap();
    std::os::unix::fs::symlink(host_mount.path(), pods.join("lmnt")).unwrap();
    let (c, _) = code(
        node.node_unpublish_volume(unpublish("vol-a", &pods.join("lmnt")))
            .await,
    );
    assert_eq!(c, Code::Ok, "nothing of flexd's there: nothing to do");
    assert!(is_mounted(&host_mount.path().canonicalize().unwrap()));
    rustix::mount::unmount(host_mount.path(), rustix::mount::UnmountFlags::DETACH).unwrap();
    assert!(server.ops().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_flexd_did_not_make_is_never_reported_published() {
    if !is_root() {
        return;
    }
    let server = Server::start("node");
    let sock = server.driver("acme~tmpfs", TMPFS);
    let mut node = node_client(&sock).await;
    let target = server.path("pods/foreign");
    std::fs::create_dir_all(&target).unwrap();
    rustix::mount::mount(
        "tmpfs",
        &target,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .unwrap();
    std::fs::write(target.join("someone-else"), "theirs").unwrap();

    let (c, message) = code(
        node.node_publish_volume(publish("vol-a", &target, None))
            .await,
    );
    assert_eq!(c, Code::FailedPrecondition, "{message}");
    assert!(message.contains("flexd did not make"), "{message}");
    assert!(
        server.ops().is_empty(),
        "no driver call: {:?}",
        server.ops()
    );
    assert_eq!(server.records(), 0, "no record");
    // Unpublish of it leaves it alone too (no record: not ours).
    let (c, _) = code(
        node.node_unpublish_volume(unpublish("vol-a", &target))
            .await,
    );
    assert_eq!(c, Code::Ok);
    assert!(is_mounted(&target) && target.join("someone-else").exists());
    server.assert_outside_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_belongs_to_one_volume_with_one_set_of_settings() {
    if !is_root() {
        return;
    }
    let server = Server::start("node");
    let sock = server.driver("acme~tmpfs", TMPFS);
    let mut node = node_client(&sock).await;
    let target = server.path("pods/uid-1/vol");

    node.node_publish_volume(publish("vol-a", &target, None))
        .await
        .unwrap();
    std::fs::write(target.join("a-data"), "A").unwrap();
    // The same call again is fine (idempotent) and calls nothing.
    node.node_publish_volume(publish("vol-a", &target, None))
        .await
        .unwrap();

    let (c, message) = code(
        node.node_publish_volume(publish("vol-b", &target, None))
            .await,
    );
    assert_eq!(c, Code::FailedPrecondition, "{message}");
    assert!(
        message.contains("vol-a"),
        "names the volume that is there: {message}"
    );
    let mut read_only = publish("vol-a", &target, None);
    read_only.readonly = true;
    let (c, message) = code(node.node_publish_volume(read_only).await);
    assert_eq!(c, Code::AlreadyExists, "{message}");
    let mut other_context = publish("vol-a", &target, None);
    other_context.volume_context = [("server".to_owned(), "other".to_owned())].into();
    let (c, _) = code(node.node_publish_volume(other_context).await);
    assert_eq!(c, Code::AlreadyExists);

    let (c, message) = code(
        node.node_unpublish_volume(unpublish("vol-b", &target))
            .await,
    );
    assert_eq!(c, Code::FailedPrecondition, "{message}");
    assert!(message.contains("vol-a"), "{message}");
    assert!(
        is_mounted(&target),
        "vol-b's unpublish must not unmount vol-a"
    );
    assert_eq!(std::fs::read_to_string(target.join("a-data")).unwrap(), "A");
    assert_eq!(server.ops(), ["mount"]);

    node.node_unpublish_volume(unpublish("vol-a", &target))
        .await
        .unwrap();
    assert!(!target.exists() && server.records() == 0);
    server.assert_outside_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_malformed_fields_are_invalid_before_any_call_out() {
    let server = Server::start("node");
    let sock = server.driver("acme~tmpfs", TMPFS);
    let mut node = node_client(&sock).await;
    let target = server.path("pods/vol");
    let megabyte = "x".repeat(1 << 20);

    let mut cases: Vec<(&str, csi::NodePublishVolumeRequest)> = vec![
        ("1 MB volume id", publish(&megabyte, &target, None)),
        (
            "129-byte volume id",
            publish(&"v".repeat(129), &target, None),
        ),
        ("volume id ../escape", publish("../escape", &target, None)),
        ("volume id ..", publish("..", &target, None)),
        ("volume id with NUL", publish("a\0b", &target, None)),
        ("volume id with newline", publish("a\nb", &target, None)),
    ];
    let mut context = publish("vol-a", &target, None);
    context.volume_context = [("k".to_owned(), megabyte.clone())].into();
    cases.push(("1 MB volume context", context));
    let mut secrets = publish("vol-a", &target, None);
    secrets.secrets = [("token".to_owned(), megabyte.clone())].into();
    cases.push(("1 MB secret", secrets));
    let mut nul_path = publish("vol-a", &target, None);
    nul_path.target_path = format!("{}/a\0b", server.path("pods").display());
    cases.push(("NUL in target path", nul_path));
    let mut dotdot = publish("vol-a", &target, None);
    dotdot.target_path = format!("{}/../../escape", target.display());
    cases.push(("`..` in target path", dotdot));
    let mut long = publish("vol-a", &target, None);
    long.target_path = format!("/{}", "p".repeat(5000));
    cases.push(("5000-byte target path", long));
    cases.push((
        "relative target",
        publish("vol-a", Path::new("pods/vol"), None),
    ));

    for (what, request) in cases {
        let (c, message) = code(node.node_publish_volume(request).await);
        assert_eq!(c, Code::InvalidArgument, "{what}: {message}");
        assert!(
            message.len() < 1024,
            "{what}: the hostile value is not echoed whole"
        );
        assert!(!message.contains("os error"), "{what}: {message}");
    }
    let (c, _) = code(
        node.node_unpublish_volume(unpublish(&megabyte, &target))
            .await,
    );
    assert_eq!(c, Code::InvalidArgument);
    let mut nul = unpublish("vol-a", &target);
    nul.target_path.push('\0');
    let (c, _) = code(node.node_unpublish_volume(nul).await);
    assert_eq!(c, Code::InvalidArgument);
    assert!(
        server.ops().is_empty(),
        "a driver was called: {:?}",
        server.ops()
    );
    assert_eq!(server.records(), 0);
    assert!(!target.exists());
    server.assert_outside_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_a_volume_in_flight_is_aborted_at_once() {
    if !is_root() {
        return;
    }
    let server = Server::start("node");
    let sock = server.driver("acme~slow", BLOCKS_AFTER_MOUNTING);
    let mut first_client = node_client(&sock).await;
    let mut second = node_client(&sock).await;
    let target = server.path("pods/slow");
    let request = publish("slow-1", &target, None);
    let first = tokio::spawn({
        let request = request.clone();
        async move { first_client.node_publish_volume(request).await }
    });
    let mounted = target.clone();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !is_mounted(&mounted) {
            assert!(Instant::now() < deadline, "the driver never mounted");
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap();
    // Publish and unpublish of the same volume alike: refused at once, never queued behind
    // the call-out (the deadline only guards against a hang).
    let (c, message) = code(
        tokio::time::timeout(Duration::from_secs(30), second.node_publish_volume(request))
            .await
            .expect("the second publish waited"),
    );
    assert_eq!(c, Code::Aborted, "{message}");
    let (c, _) = code(
        tokio::time::timeout(
            Duration::from_secs(30),
            second.node_unpublish_volume(unpublish("slow-1", &target)),
        )
        .await
        .expect("the unpublish waited"),
    );
    assert_eq!(c, Code::Aborted);
    std::fs::write(server.path("release"), "").unwrap();
    first.await.unwrap().unwrap();
    second
        .node_unpublish_volume(unpublish("slow-1", &target))
        .await
        .unwrap();
    assert!(!target.exists());
    server.assert_outside_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staging_paths_are_not_unstaged_under_publishes_nor_published_into() {
    if !is_root() {
        return;
    }
    let server = Server::start("node");
    let sock = server.driver("acme~block", ATTACHING);
    let mut node = node_client(&sock).await;
    let staging = server.path("plugins/staging/vol-s");
    let target = server.path("pods/uid-1/vol-s");

    // A symlinked staging path is refused like a symlinked target.
    std::fs::create_dir_all(server.path("plugins/staging")).unwrap();
    let linked = server.path("plugins/staging/linked");
    std::os::unix::fs::symlink(server.outside(), &linked).unwrap();
    let (c, message) = code(node.node_stage_volume(stage("vol-s", &linked)).await);
    assert_eq!(c, Code::FailedPrecondition, "{message}");
    server.assert_outside_untouched();
    let mut nul = stage("vol-s", &staging);
    nul.staging_target_path.push_str("\0x");
    let (c, _) = code(node.node_stage_volume(nul).await);
    assert_eq!(c, Code::InvalidArgument);
    assert!(server.ops().is_empty(), "{:?}", server.ops());

    node.node_stage_volume(stage("vol-s", &staging))
        .await
        .unwrap();
    node.node_publish_volume(publish("vol-s", &target, Some(&staging)))
        .await
        .unwrap();
    assert!(is_mounted(&staging) && is_mounted(&target));

    // Publishing inside the staging path, onto it, or into flexd's state dir is refused.
    for bad in [
        staging.join("inner"),
        staging.clone(),
        server.path("state/volumes/x"),
    ] {
        let (c, message) = code(
            node.node_publish_volume(publish("vol-s", &bad, Some(&staging)))
                .await,
        );
        assert_eq!(c, Code::InvalidArgument, "{}: {message}", bad.display());
    }
    assert!(!staging.join("inner").exists());

    // Unstage while the publish remains: refused, both stay mounted.
    let unstage = csi::NodeUnstageVolumeRequest {
        volume_id: "vol-s".into(),
        staging_target_path: staging.display().to_string(),
    };
    let (c, message) = code(node.node_unstage_volume(unstage.clone()).await);
    assert_eq!(c, Code::FailedPrecondition, "{message}");
    assert!(message.contains(&target.display().to_string()), "{message}");
    assert!(is_mounted(&staging) && is_mounted(&target));
    // Unstage naming another volume is refused too.
    let mut wrong = unstage.clone();
    wrong.volume_id = "vol-other".into();
    let (c, _) = code(node.node_unstage_volume(wrong).await);
    assert_eq!(c, Code::FailedPrecondition);

    node.node_unpublish_volume(unpublish("vol-s", &target))
        .await
        .unwrap();
    node.node_unstage_volume(unstage).await.unwrap();
    assert!(!is_mounted(&staging) && !is_mounted(&target));
    assert_eq!(server.records(), 0);
    server.assert_outside_untouched();
}

/// `flexd volume mount` goes through the same lifecycle: a symlinked target is refused, and an
/// error is printed once.
#[test]
fn the_cli_refuses_a_symlinked_target_and_prints_each_error_once() {
    if !is_root() {
        return;
    }
    let sandbox = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("marker"), MARKER).unwrap();
    let plugin = sandbox.path().join("exec/acme~tmpfs");
    std::fs::create_dir_all(&plugin).unwrap();
    let log = sandbox.path().join("calls.log");
    let script = format!(
        "#!/bin/sh\necho \"$1\" >> '{}'\ncase \"$1\" in\n{TMPFS}\n*) echo '{{\"status\":\"Not supported\"}}'; exit 1;;\nesac\n",
        log.display()
    );
    std::fs::write(plugin.join("tmpfs"), script).unwrap();
    std::fs::set_permissions(plugin.join("tmpfs"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let link = sandbox.path().join("letc");
    std::os::unix::fs::symlink(outside.path(), &link).unwrap();
    let flexd = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_flexd"))
            .arg("--plugin-dir")
            .arg(sandbox.path().join("exec"))
            .args(["volume", "--node", "node-1", "--state-dir"])
            .arg(sandbox.path().join("state"))
            .args(args)
            .output()
            .unwrap()
    };
    let cleanup = || {
        for m in mount_points() {
            if m.starts_with(outside.path()) || m.starts_with(sandbox.path()) {
                let _ = rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH);
            }
        }
    };
    let out = flexd(&[
        "mount",
        "--driver",
        "acme/tmpfs",
        "--target",
        link.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let outside_mounted = mount_points().iter().any(|m| m.starts_with(outside.path()));
    cleanup();
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("symbolic link"), "{stderr}");
    assert!(!outside_mounted, "mounted over the outside dir");
    assert_eq!(
        std::fs::read_to_string(outside.path().join("marker")).unwrap(),
        MARKER
    );
    let through = link.join("vol");
    let out = flexd(&[
        "mount",
        "--driver",
        "acme/tmpfs",
        "--target",
        through.to_str().unwrap(),
    ]);
    cleanup();
    assert!(!out.status.success());
    assert!(!outside.path().join("vol").exists());
    let out = flexd(&["unmount", "--target", link.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Options beyond what one argv string can carry: refused before exec, said once.
    let target = sandbox.path().join("big");
    let big = format!("a={}", "s".repeat(100 * 1024));
    let big2 = format!("b={}", "s".repeat(100 * 1024));
    let out = flexd(&[
        "mount",
        "--driver",
        "acme/tmpfs",
        "--target",
        target.to_str().unwrap(),
        "--secret",
        &big,
        "--secret",
        &big2,
    ]);
    cleanup();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert!(stderr.contains("MAX_ARG_STRLEN"), "{stderr}");
    assert!(!stderr.contains("os error 7"), "{stderr}");
    assert_eq!(
        stderr.matches("MAX_ARG_STRLEN").count(),
        1,
        "said once: {stderr}"
    );
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !calls.lines().any(|l| l == "mount"),
        "the driver's mount ran: {calls}"
    );
}
