//! A hostile CSI client against a real `flexd serve` over its Unix socket (and the CLI): symlinked
//! targets and parents, foreign mounts, a target claimed by two volumes, oversized and malformed
//! fields, concurrent calls, unstage under live publishes, publishes inside a staging path.
//!
//! Each case checks the exact gRPC code *and* that nothing was mounted outside: a scratch
//! "outside" directory stands in for a host directory such as /etc (it holds a marker file that
//! must stay as it was, and it must never become a mount point). No test points at a real system
//! directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use test_support::serve::{
    csi, mount_capability, node_client, publish_request as publish, spawn_publish,
    unpublish_request as unpublish, wait_until_mounted, NodeClient, Server, BLOCKS_AFTER_MOUNTING,
};
use test_support::{
    is_mounted, mount_points, mount_tmpfs, unmount_all_below, Sandbox,
    ATTACHING_DRIVER as ATTACHING, TMPFS_DRIVER as TMPFS,
};
use tonic::Code;

const MARKER: &str = "host data: must not change";

/// The stand-in for a host directory such as /etc: a scratch directory with a marker file.
/// Dropped, it unmounts anything a failing test let onto it.
struct Outside {
    dir: tempfile::TempDir,
    root: PathBuf,
}

impl Outside {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::write(root.join("marker"), MARKER).unwrap();
        Self { dir, root }
    }

    fn path(&self) -> &Path {
        &self.root
    }

    /// Nothing at or under it is a mount point, and its marker is unchanged.
    fn assert_untouched(&self) {
        let mounts: Vec<PathBuf> = mount_points()
            .into_iter()
            .filter(|m| m.starts_with(&self.root))
            .collect();
        assert!(mounts.is_empty(), "mounted outside: {mounts:?}");
        assert_eq!(
            std::fs::read_to_string(self.root.join("marker")).unwrap(),
            MARKER
        );
        let _ = self.dir.path();
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        unmount_all_below(&self.root);
    }
}

/// A node server with a tmpfs driver, a client of it, and the stand-in for /etc to watch.
async fn tmpfs_node() -> (Server, NodeClient, Outside) {
    let (server, node) = Server::acme_node("tmpfs", TMPFS).await;
    (server, node, Outside::new())
}

fn stage(volume_id: &str, staging: &Path) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: mount_capability("ext4", ""),
        ..Default::default()
    }
}

fn code<T>(result: Result<tonic::Response<T>, tonic::Status>) -> (Code, String) {
    match result {
        Ok(_) => (Code::Ok, String::new()),
        Err(status) => (status.code(), status.message().to_owned()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinked_targets_and_parents_are_refused_and_nothing_is_mounted_outside() {
    test_support::require_root!();
    let (server, mut node, outside) = tmpfs_node().await;
    let pods = server.dir("pods");
    std::os::unix::fs::symlink(outside.path(), pods.join("letc")).unwrap();
    std::os::unix::fs::symlink(outside.path(), pods.join("dirlink")).unwrap();

    // The target itself is a symlink to the stand-in for /etc.
    let (c, message) = code(
        node.node_publish_volume(publish("vol-a", &pods.join("letc"), None))
            .await,
    );
    assert_eq!(c, Code::FailedPrecondition, "{message}");
    assert!(message.contains("symbolic link"), "{message}");
    outside.assert_untouched();
    // A parent is: nothing is created or mounted through it.
    let through = pods.join("dirlink/vol");
    let (c, message) = code(
        node.node_publish_volume(publish("vol-a", &through, None))
            .await,
    );
    assert_eq!(c, Code::FailedPrecondition, "{message}");
    assert!(
        !outside.path().join("vol").exists(),
        "created through the link"
    );
    // Deeper: a missing directory under a symlinked parent.
    let deeper = pods.join("dirlink/a/b/vol");
    let (c, _) = code(
        node.node_publish_volume(publish("vol-a", &deeper, None))
            .await,
    );
    assert_eq!(c, Code::FailedPrecondition);
    assert!(!outside.path().join("a").exists());
    outside.assert_untouched();
    assert!(
        server.ops().is_empty(),
        "the driver was called: {:?}",
        server.ops()
    );
    assert!(server.records().is_empty());

    // Unpublishing through a symlink never unmounts what it leads to (a host mount, here a
    // tmpfs the test put on a scratch directory).
    let host_mount = tempfile::tempdir().unwrap();
    mount_tmpfs(host_mount.path(), c"");
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
    test_support::require_root!();
    let (server, mut node, outside) = tmpfs_node().await;
    let target = server.dir("pods/foreign");
    mount_tmpfs(&target, c"");
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
    assert!(server.records().is_empty(), "no record");
    // Unpublish of it leaves it alone too (no record: not ours).
    let (c, _) = code(
        node.node_unpublish_volume(unpublish("vol-a", &target))
            .await,
    );
    assert_eq!(c, Code::Ok);
    assert!(is_mounted(&target) && target.join("someone-else").exists());
    outside.assert_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_belongs_to_one_volume_with_one_set_of_settings() {
    test_support::require_root!();
    let (server, mut node, outside) = tmpfs_node().await;
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
    assert!(!target.exists() && server.records().is_empty());
    outside.assert_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_malformed_fields_are_invalid_before_any_call_out() {
    let (server, mut node, outside) = tmpfs_node().await;
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
    assert!(server.records().is_empty());
    assert!(!target.exists());
    outside.assert_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_a_volume_in_flight_is_aborted_at_once() {
    test_support::require_root!();
    let (server, sock) = Server::slow_node(BLOCKS_AFTER_MOUNTING);
    let outside = Outside::new();
    let mut second = node_client(&sock).await;
    let target = server.path("pods/slow");
    let request = publish("slow-1", &target, None);
    let first = spawn_publish(&sock, request.clone()).await;
    wait_until_mounted(&target).await;
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
    std::fs::write(server.release(), "").unwrap();
    first.await.unwrap().unwrap();
    second
        .node_unpublish_volume(unpublish("slow-1", &target))
        .await
        .unwrap();
    assert!(!target.exists());
    outside.assert_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staging_paths_are_not_unstaged_under_publishes_nor_published_into() {
    test_support::require_root!();
    let (server, mut node) = Server::acme_node("block", ATTACHING).await;
    let outside = Outside::new();
    let staging = server.path("plugins/staging/vol-s");
    let target = server.path("pods/uid-1/vol-s");

    // A symlinked staging path is refused like a symlinked target.
    std::fs::create_dir_all(server.path("plugins/staging")).unwrap();
    let linked = server.path("plugins/staging/linked");
    std::os::unix::fs::symlink(outside.path(), &linked).unwrap();
    let (c, message) = code(node.node_stage_volume(stage("vol-s", &linked)).await);
    assert_eq!(c, Code::FailedPrecondition, "{message}");
    outside.assert_untouched();
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
    assert!(server.records().is_empty());
    outside.assert_untouched();
}

/// `flexd volume mount` goes through the same lifecycle: a symlinked target is refused, and an
/// error is printed once.
#[test]
fn the_cli_refuses_a_symlinked_target_and_prints_each_error_once() {
    test_support::require_root!();
    let sandbox = Sandbox::with_driver("acme~tmpfs", TMPFS);
    let outside = Outside::new();
    let link = sandbox.target("letc");
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(outside.path(), &link).unwrap();

    let out = sandbox.volume_mount("acme/tmpfs", &link, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("symbolic link"), "{stderr}");
    outside.assert_untouched();
    let out = sandbox.volume_mount("acme/tmpfs", link.join("vol"), &[]);
    assert!(!out.status.success());
    assert!(!outside.path().join("vol").exists());
    outside.assert_untouched();
    let out = sandbox.volume_unmount(&link);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        sandbox.ops().is_empty(),
        "the driver was called: {:?}",
        sandbox.ops()
    );

    // Options beyond what one argv string can carry (two 100 KiB secrets, base64 in the one
    // options JSON): refused before exec, said once, never "Argument list too long".
    let big = format!("a={}", "s".repeat(100 * 1024));
    let big2 = format!("b={}", "s".repeat(100 * 1024));
    let target = sandbox.target("big");
    let out = sandbox.volume_mount(
        "acme/tmpfs",
        &target,
        &["--secret", &big, "--secret", &big2],
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert!(stderr.contains("MAX_ARG_STRLEN"), "{stderr}");
    assert!(!stderr.contains("os error 7"), "{stderr}");
    assert_eq!(
        stderr.matches("MAX_ARG_STRLEN").count(),
        1,
        "said once: {stderr}"
    );
    assert!(
        sandbox.calls_of("mount").is_empty(),
        "the driver's mount ran"
    );
    assert!(!is_mounted(&target));
}
