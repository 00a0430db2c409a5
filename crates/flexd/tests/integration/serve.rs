//! `flexd serve` through the real binary: real drivers, real Unix sockets, a real gRPC client
//! doing what kubelet does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use test_support::serve::{
    connect, controller_client, csi, identity_client, map, mount_capability, node_client,
    node_offers, plugin_info, plugin_services, publish_request, registration, spawn_publish,
    unpublish_request, wait_until_mounted, PublishCall, Server, BLOCKS_AFTER_MOUNTING,
    CONTROLLER_SERVICE,
};
use test_support::{
    assert_device_mounted, assert_repeat_kept_the_mount, eventually, examples,
    install_example as install, is_mounted, wait_for_path as wait_for,
    ATTACHING_DRIVER as ATTACHING, TMPFS_DRIVER as TMPFS,
};

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

    let mut identity = identity_client(&tmpfs_sock).await;
    let plugin = plugin_info(&mut identity).await;
    assert_eq!(plugin.name, "flexvolume-acme--tmpfs");
    assert_eq!(
        plugin.manifest.get("flexvolume-driver").map(String::as_str),
        Some("acme/tmpfs")
    );
    assert_eq!(
        test_support::serve::probe_ready(&mut identity).await,
        Some(true)
    );
    // tmpfs does not attach but provisions ("provision": true): its controller service has
    // CreateVolume/DeleteVolume to offer.
    let services = plugin_services(&mut identity).await;
    assert_eq!(
        services,
        [CONTROLLER_SERVICE],
        "a provisioning, non-attaching driver advertises only the controller service"
    );

    let mut identity = identity_client(&block_sock).await;
    let services = plugin_services(&mut identity).await;
    assert!(
        services.contains(&CONTROLLER_SERVICE),
        "an attaching driver advertises the controller service: {services:?}"
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
    // The endpoint goes first, then the registration socket: wait for both.
    let stale_reg = server
        .registration_dir
        .join("flexvolume-acme--gone-reg.sock");
    eventually("the stale endpoint to be removed", || {
        !server.csi_dir.join("flexvolume-acme--gone").exists() && !stale_reg.exists()
    });
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
        install(p, "quirks/empty-output", "acme~broken");
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
    // Its value counts leftovers of earlier flexd processes on this host too (other tests').
    assert!(
        metrics.contains("\nflexd_lingering_callout_cgroups "),
        "{metrics}"
    );
    assert!(server.http_get("/nope").contains(" 404 "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_whose_init_fails_is_served_as_not_ready() {
    let server = Server::start(|p| {
        install(p, "quirks/empty-output", "acme~broken");
    });
    let sock = server.socket("flexvolume-acme--broken");
    let mut identity = identity_client(&sock).await;
    assert_eq!(
        test_support::serve::probe_ready(&mut identity).await,
        Some(false)
    );
    drop(server.plugin_dir.clone());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_installed_while_serving_gets_sockets_and_loses_them_when_removed() {
    let server = Server::start(|_| {});
    std::thread::sleep(Duration::from_millis(300));
    let source = examples().join("tmpfs/tmpfs");
    let out = server.flexd(&[
        "install",
        "--driver",
        "late/comer",
        source.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let sock = server.csi_dir.join("flexvolume-late--comer/csi.sock");
    let reg = server
        .registration_dir
        .join("flexvolume-late--comer-reg.sock");
    wait_for(&sock);
    wait_for(&reg);
    let mut identity = identity_client(&sock).await;
    assert_eq!(
        test_support::serve::probe_ready(&mut identity).await,
        Some(true)
    );

    let out = server.flexd(&["uninstall", "--driver", "late/comer"]);
    assert!(out.status.success(), "{out:?}");
    eventually("the sockets of a removed driver to be removed", || {
        !sock.exists() && !reg.exists()
    });
    let metrics = server.http_get("/metrics");
    assert!(
        metrics.contains(r#"flexd_probe_events_total{event="remove"} 1"#),
        "{metrics}"
    );
}

/// The code of a call that must fail.
fn error_code<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> tonic::Code {
    result.unwrap_err().code()
}

// ---- Node and Controller: real drivers, real mounts (root) ----

fn fs_type_at(path: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    flexvolume_os::mount::parse_mountinfo(&info)
        .into_iter()
        .rfind(|m| m.mount_point == path)
        .map(|m| m.fs_type)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachable_driver_attach_stage_publish_and_back_with_exact_call_outs() {
    test_support::require_root!();
    let (server, sock) = Server::acme("both", "block", ATTACHING);
    let mut controller = controller_client(&sock).await;
    let mut node = node_client(&sock).await;

    let caps = test_support::serve::controller_capabilities(&mut controller).await;
    let publish = csi::controller_service_capability::rpc::Type::PublishUnpublishVolume as i32;
    assert!(caps.contains(&publish), "{caps:?}");
    assert!(
        node_offers(
            &mut node,
            csi::node_service_capability::rpc::Type::StageUnstageVolume
        )
        .await
    );
    let info = node
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "node-1");

    // The controller attaches; the device reaches the node in the publish context.
    let context = map(&[("server", "s1")]);
    let attach_request = csi::ControllerPublishVolumeRequest {
        volume_id: "pv-1".into(),
        node_id: "node-1".into(),
        volume_capability: mount_capability("ext4", ""),
        volume_context: context.clone(),
        ..Default::default()
    };
    let published = controller
        .controller_publish_volume(attach_request.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(published.publish_context, map(&[("device", "/dev/fake-1")]));
    let again = controller
        .controller_publish_volume(attach_request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.publish_context, published.publish_context);
    assert_eq!(
        server.calls_of("attach").len(),
        1,
        "a recorded attach is not redone"
    );
    let attach = &server.calls_of("attach")[0];
    assert_eq!(attach[2], "node-1");
    let attach_options: serde_json::Value = serde_json::from_str(&attach[1]).unwrap();
    assert_eq!(
        attach_options,
        serde_json::json!({"kubernetes.io/fsType":"ext4","kubernetes.io/pvOrVolumeName":"pv-1","kubernetes.io/readwrite":"rw","server":"s1"})
    );

    let staging = server.path("kubelet/staging/pv-1");
    let target = server.path("kubelet/pods/uid-1/volumes/pv-1");
    let stage_request = csi::NodeStageVolumeRequest {
        volume_id: "pv-1".into(),
        publish_context: published.publish_context.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: mount_capability("ext4", ""),
        volume_context: context.clone(),
        ..Default::default()
    };
    node.node_stage_volume(stage_request.clone()).await.unwrap();
    assert!(is_mounted(&staging));
    node.node_stage_volume(stage_request).await.unwrap();
    assert_eq!(
        server.calls_of("mountdevice").len(),
        1,
        "a staged volume is not staged again"
    );
    assert_device_mounted(&server, "/dev/fake-1", &staging);

    let mut publish = publish_request("pv-1", &target, Some(&staging));
    publish.volume_context = map(&[
        ("server", "s1"),
        ("csi.storage.k8s.io/pod.name", "web-0"),
        ("csi.storage.k8s.io/pod.namespace", "prod"),
        ("csi.storage.k8s.io/pod.uid", "uid-1"),
        ("csi.storage.k8s.io/serviceAccount.name", "sa"),
    ]);
    publish.secrets = map(&[("password", "hunter2")]);
    node.node_publish_volume(publish.clone()).await.unwrap();
    assert!(is_mounted(&target));
    std::fs::write(target.join("data"), "through the bind").unwrap();
    assert_eq!(
        std::fs::read_to_string(staging.join("data")).unwrap(),
        "through the bind",
        "the target is a bind of the staged device"
    );
    node.node_publish_volume(publish).await.unwrap();
    assert_eq!(
        server.calls_of("mount").len(),
        1,
        "a published target is not published again"
    );

    // mount got the secrets (base64) and the pod; nothing else did, nor the state.
    let mount = &server.calls_of("mount")[0];
    assert_eq!(mount[1], target.to_str().unwrap());
    let mount_options: serde_json::Value = serde_json::from_str(&mount[2]).unwrap();
    for (key, want) in [
        ("kubernetes.io/secret/password", "aHVudGVyMg=="),
        ("kubernetes.io/pod.name", "web-0"),
        ("kubernetes.io/pod.namespace", "prod"),
        ("kubernetes.io/pod.uid", "uid-1"),
        ("kubernetes.io/serviceAccount.name", "sa"),
        ("server", "s1"),
    ] {
        assert_eq!(mount_options[key], want, "{key}");
    }
    assert!(mount_options.get("csi.storage.k8s.io/pod.name").is_none());
    for call in server.calls().iter().filter(|c| c[0] != "mount") {
        assert!(!call.join(" ").contains("aHVudGVyMg=="), "{call:?}");
    }
    let state = serde_json::to_string(&server.records()).unwrap();
    assert!(!state.contains("hunter2") && !state.contains("aHVudGVyMg=="));
    let log = std::fs::read_to_string(server.path("flexd.log")).unwrap();
    assert!(
        log.contains("NodePublishVolume"),
        "flexd logs at debug level"
    );
    assert!(!log.contains("hunter2") && !log.contains("aHVudGVyMg=="));
    let metrics = server.http_get("/metrics");
    assert!(
        metrics.contains("flexd_callout_duration_seconds_count"),
        "{metrics}"
    );
    assert!(!metrics.contains("hunter2") && !metrics.contains("aHVudGVyMg=="));

    let unpublish = unpublish_request("pv-1", &target);
    node.node_unpublish_volume(unpublish.clone()).await.unwrap();
    assert!(!is_mounted(&target) && !target.exists());
    assert!(is_mounted(&staging), "unpublish leaves the staged device");
    node.node_unpublish_volume(unpublish).await.unwrap();
    let unstage = csi::NodeUnstageVolumeRequest {
        volume_id: "pv-1".into(),
        staging_target_path: staging.display().to_string(),
    };
    node.node_unstage_volume(unstage.clone()).await.unwrap();
    assert!(!is_mounted(&staging) && !staging.exists());
    node.node_unstage_volume(unstage).await.unwrap();
    assert!(
        server.calls_of("detach").is_empty(),
        "unstage does not detach"
    );

    let detach_request = csi::ControllerUnpublishVolumeRequest {
        volume_id: "pv-1".into(),
        node_id: "node-1".into(),
        ..Default::default()
    };
    controller
        .controller_unpublish_volume(detach_request.clone())
        .await
        .unwrap();
    controller
        .controller_unpublish_volume(detach_request)
        .await
        .unwrap();
    let detach = server.calls_of("detach");
    assert_eq!(detach.len(), 1, "a second unpublish does not detach again");
    assert_eq!(
        (detach[0][1].as_str(), detach[0][2].as_str()),
        ("pv-1", "node-1"),
        "the volume's name, as kubelet gives detach (getvolumename's answer is ignored)"
    );
    // mount and unmount are not supported by this driver: the defaults bind and unmount.
    assert_eq!(
        server.ops(),
        [
            "getvolumename",
            "attach",
            "waitforattach",
            "mountdevice",
            "mount",
            "unmount",
            "unmountdevice",
            "detach"
        ]
    );
    assert!(server.records().is_empty(), "{:?}", server.records());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_driver_publishes_with_its_mount_once_and_unpublishes_idempotently() {
    test_support::require_root!();
    let (server, mut node) = Server::acme_node("tmpfs", TMPFS).await;
    assert!(
        !node_offers(
            &mut node,
            csi::node_service_capability::rpc::Type::StageUnstageVolume
        )
        .await,
        "a plain driver is not staged"
    );

    let target = server.path("kubelet/pods/uid-2/volumes/v");
    let mut publish = publish_request("vol-a", &target, None);
    publish.secrets = map(&[("token", "s3cr3t")]);
    node.node_publish_volume(publish.clone()).await.unwrap();
    assert_eq!(fs_type_at(&target).as_deref(), Some("tmpfs"));
    std::fs::write(target.join("file"), "kept").unwrap();
    node.node_publish_volume(publish).await.unwrap();
    let mount_calls = server.calls_of("mount").len();
    assert_repeat_kept_the_mount(mount_calls, &target.join("file"), "kept");
    let mount_options: serde_json::Value =
        serde_json::from_str(&server.calls_of("mount")[0][2]).unwrap();
    assert_eq!(mount_options["kubernetes.io/secret/token"], "czNjcjN0");
    assert_eq!(mount_options["kubernetes.io/pvOrVolumeName"], "vol-a");

    let unpublish = unpublish_request("vol-a", &target);
    node.node_unpublish_volume(unpublish.clone()).await.unwrap();
    assert!(!is_mounted(&target) && !target.exists());
    node.node_unpublish_volume(unpublish).await.unwrap();
    assert_eq!(server.ops(), ["mount", "unmount"]);
    assert!(server.records().is_empty());
}

/// flexd's resident memory, from /proc.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("a VmRSS line");
    kib * 1024
}

/// Issue 29: a FIFO named like a record made the next publish block in open(2), and every
/// publish and unpublish of any volume after it; a link to /dev/zero grew RSS past 16 GB.
/// Both are now reported (metric, log, `volume list`) and skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_in_volumes_that_are_not_records_are_reported_and_other_volumes_still_publish() {
    test_support::require_root!();
    let (server, mut node) = Server::acme_node("tmpfs", TMPFS).await;
    let volumes = server.path("state/volumes");
    std::fs::create_dir_all(&volumes).unwrap();
    let fifo = volumes.join("00000000000000f1.json");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let zero = volumes.join("00000000000000f2.json");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();

    // Generous for a loaded machine; the bug was a wait without end.
    let promptly = Duration::from_secs(60);
    for i in 0..3 {
        let target = server.path(&format!("kubelet/pods/uid-{i}/volumes/v"));
        let id = format!("vol-{i}");
        let publish = node.node_publish_volume(publish_request(&id, &target, None));
        tokio::time::timeout(promptly, publish)
            .await
            .expect("a publish beside the bad entries answers")
            .unwrap();
        assert!(is_mounted(&target));
        let unpublish = node.node_unpublish_volume(unpublish_request(&id, &target));
        tokio::time::timeout(promptly, unpublish)
            .await
            .expect("an unpublish beside the bad entries answers")
            .unwrap();
        assert!(!is_mounted(&target));
    }
    let rss = rss_bytes(server.pid());
    eprintln!("flexd's RSS after the publishes: {} MiB", rss >> 20);
    assert!(rss < 512 << 20, "flexd's RSS is {rss} bytes");

    let metrics_say = |metrics: &str| {
        metrics.contains(r#"flexd_state_unusable_records{reason="not-a-record"} 2"#)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut metrics = server.http_get("/metrics");
    while !metrics_say(&metrics) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        metrics = server.http_get("/metrics");
    }
    assert!(metrics_say(&metrics), "{metrics}");
    assert!(metrics.contains(r#"flexd_state_unusable_records{reason="corrupt"} 0"#));

    let log = server.flexd_log();
    for (entry, what) in [(&fifo, "a FIFO"), (&zero, "a symbolic link")] {
        let said = format!("{entry:?} is not a record: it is {what}");
        assert_eq!(
            log.lines().filter(|l| l.contains(&said)).count(),
            1,
            "said once, though every publish lists the records: {said} in\n{log}"
        );
    }

    let listed = test_support::stdout_json(&server.volume(&["--output", "json", "list"]));
    let mut kinds: Vec<(&str, &str)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["problem"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [("not-a-record", "fifo"), ("not-a-record", "symlink")]
    );
    let text = server.volume(&["list"]);
    assert_eq!(text.status.code(), Some(0));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("not-a-record (fifo)"), "{text}");
    assert!(text.contains("not-a-record (symlink)"), "{text}");

    // Gone: no longer counted.
    std::fs::remove_file(&fifo).unwrap();
    std::fs::remove_file(&zero).unwrap();
    test_support::eventually("the metric to drop", || {
        server
            .http_get("/metrics")
            .contains(r#"flexd_state_unusable_records{reason="not-a-record"} 0"#)
    });
}

/// Lock files of volumes that are gone do not pile up in `<state-dir>/locks/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_files_of_unpublished_volumes_are_removed() {
    test_support::require_root!();
    let (server, node) = Server::acme_node("tmpfs", TMPFS).await;
    let locks = server.path("state/locks");
    let lock_files = || {
        std::fs::read_dir(&locks)
            .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let before = lock_files();
    let volumes: Vec<_> = (0..8)
        .map(|i| {
            (
                format!("vol-{i}"),
                server.path(&format!("kubelet/pods/uid-{i}/volumes/v")),
            )
        })
        .collect();
    test_support::serve::publish_all_at_once(&node, &volumes).await;
    let published = lock_files().len();
    assert!(published >= volumes.len(), "one lock per published target");
    let unpublishes: Vec<_> = volumes
        .iter()
        .map(|(id, target)| {
            let mut node = node.clone();
            let request = unpublish_request(id, target);
            tokio::spawn(async move { node.node_unpublish_volume(request).await })
        })
        .collect();
    for unpublish in unpublishes {
        unpublish.await.unwrap().unwrap();
    }
    assert!(server.records().is_empty());
    // What is left is what was there before (the pinned drivers' lock), not one per volume.
    let after = lock_files();
    assert!(after.len() <= before.len().max(1), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_get_csi_codes_and_never_reach_the_driver() {
    let (server, sock) = Server::acme("both", "block", ATTACHING);
    let mut node = node_client(&sock).await;
    let mut controller = controller_client(&sock).await;
    let target = server.path("t");
    let staging = server.path("s");
    let code = tonic::Code::InvalidArgument;

    let mut no_target = publish_request("v", &target, Some(&staging));
    no_target.target_path.clear();
    let mut no_cap = publish_request("v", &target, Some(&staging));
    no_cap.volume_capability = None;
    let publishes = [
        ("no volume id", publish_request("", &target, Some(&staging))),
        ("no target", no_target),
        ("no capability", no_cap),
        (
            "a relative target",
            publish_request("v", Path::new("relative/t"), Some(&staging)),
        ),
    ];
    for (what, request) in publishes {
        let got = error_code(node.node_publish_volume(request).await);
        assert_eq!(got, code, "publish with {what}");
    }
    let stages = [
        (
            "no staging path",
            csi::NodeStageVolumeRequest {
                volume_id: "v".into(),
                volume_capability: mount_capability("ext4", ""),
                ..Default::default()
            },
        ),
        (
            "no capability",
            csi::NodeStageVolumeRequest {
                volume_id: "v".into(),
                staging_target_path: staging.display().to_string(),
                ..Default::default()
            },
        ),
    ];
    for (what, request) in stages {
        let got = error_code(node.node_stage_volume(request).await);
        assert_eq!(got, code, "stage with {what}");
    }
    let unstage_without_path = csi::NodeUnstageVolumeRequest {
        volume_id: "v".into(),
        ..Default::default()
    };
    let got = error_code(node.node_unstage_volume(unstage_without_path).await);
    assert_eq!(got, code, "unstage without a staging path");
    let unpublish_without_target = csi::NodeUnpublishVolumeRequest {
        volume_id: "v".into(),
        ..Default::default()
    };
    let got = error_code(node.node_unpublish_volume(unpublish_without_target).await);
    assert_eq!(got, code, "unpublish without a target");
    let attach_without_node = csi::ControllerPublishVolumeRequest {
        volume_id: "v".into(),
        volume_capability: mount_capability("ext4", ""),
        ..Default::default()
    };
    let got = error_code(
        controller
            .controller_publish_volume(attach_without_node)
            .await,
    );
    assert_eq!(got, code, "controller publish without a node");

    // An attaching driver's volume is staged first: publishing without (or before) it is a
    // precondition failure, as CSI says.
    for (what, staging) in [("without", None), ("before", Some(staging.as_path()))] {
        let got = error_code(
            node.node_publish_volume(publish_request("v", &target, staging))
                .await,
        );
        assert_eq!(
            got,
            tonic::Code::FailedPrecondition,
            "publish {what} a stage"
        );
    }
    assert!(!target.exists(), "a refused publish leaves nothing");
    // Tearing down what was never set up succeeds (CSI idempotency).
    node.node_unpublish_volume(unpublish_request("v", &target))
        .await
        .unwrap();
    assert!(
        server.ops().is_empty(),
        "the driver was called: {:?}",
        server.ops()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_installed_while_serving_serves_a_publish() {
    test_support::require_root!();
    let (server, sock) = Server::with_driver("node", "late~tmpfs", TMPFS, "flexvolume-late--tmpfs");
    let mut node = node_client(&sock).await;
    let target = server.path("pods/late");
    node.node_publish_volume(publish_request("late-1", &target, None))
        .await
        .unwrap();
    assert_eq!(fs_type_at(&target).as_deref(), Some("tmpfs"));
    node.node_unpublish_volume(unpublish_request("late-1", &target))
        .await
        .unwrap();
    assert!(!target.exists());
}

/// A kill -9 test's start: a node server whose acme/slow driver runs `cases` (a mount that
/// blocks until released), and the publish of volume `id` to `pods/<id>` in flight on it.
/// Returns the server, the driver's socket, the target and the call.
async fn publish_in_flight(cases: &str, id: &str) -> (Server, PathBuf, PathBuf, PublishCall) {
    let (server, sock) = Server::slow_node(cases);
    let target = server.path(&format!("pods/{id}"));
    let call = spawn_publish(&sock, publish_request(id, &target, None)).await;
    (server, sock, target, call)
}

/// A driver whose mount blocks until released, then fails without mounting.
const BLOCKS_THEN_FAILS: &str = r#"init) echo '{"status":"Success","capabilities":{"attach":false}}';;
mount) while [ ! -e "$RELEASE" ]; do sleep 0.05; done; echo '{"status":"Failure","message":"backend gone"}'; exit 1;;
unmount) umount "$2"; echo '{"status":"Success"}';;"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_mount_then_restart_and_unpublish_leaves_nothing() {
    test_support::require_root!();
    let (mut server, sock, target, in_flight) =
        publish_in_flight(BLOCKS_AFTER_MOUNTING, "slow-1").await;
    wait_until_mounted(&target).await;

    let server = tokio::task::spawn_blocking(move || {
        server.crash_and_restart();
        server
    })
    .await
    .unwrap();
    assert!(
        in_flight.await.unwrap().is_err(),
        "the call died with flexd"
    );
    // The orphaned driver finishes; the restarted flexd tears down what it left.
    std::fs::write(server.release(), "").unwrap();
    let server = tokio::task::spawn_blocking(move || {
        eventually("the restarted endpoint", || sock.exists());
        (server, sock)
    })
    .await
    .unwrap();
    let (server, sock) = server;
    let mut node = node_client(&sock).await;
    node.node_unpublish_volume(unpublish_request("slow-1", &target))
        .await
        .unwrap();
    assert!(!is_mounted(&target) && !target.exists());
    assert!(server.records().is_empty(), "{:?}", server.records());
    assert_eq!(server.ops(), ["mount", "unmount"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_before_the_mount_took_effect_is_rolled_back_on_restart() {
    test_support::require_root!();
    let (mut server, _, target, in_flight) = publish_in_flight(BLOCKS_THEN_FAILS, "never-1").await;
    let server = tokio::task::spawn_blocking(move || {
        eventually("the driver's mount call", || {
            !server.calls_of("mount").is_empty()
        });
        assert_eq!(server.records().len(), 1, "recorded ahead of the call-out");
        assert!(target.exists(), "the target directory was created");
        server.crash_and_restart();
        std::fs::write(server.release(), "").unwrap();
        // Reconcile waits for the orphaned driver, sees nothing mounted, and rolls back.
        eventually("the rollback", || {
            server.records().is_empty() && !target.exists()
        });
        server
    })
    .await
    .unwrap();
    assert!(in_flight.await.unwrap().is_err());
    assert_eq!(server.ops(), ["mount"]);
}

/// What a kernel crash (or a power loss) can leave of a published volume now that a fresh
/// publish record is not synced (docs/lifecycle.md#unsynced-publish): the mount gone with the
/// kernel, and the record gone, torn, or at `mounting` (its marker lost). No test can crash this
/// kernel, so each case makes that state on disk (unmount behind flexd, the record file or marker
/// removed or emptied) and then kills flexd and starts it again, as a reboot would. In every case
/// the restarted flexd and the CO's unpublish leave nothing behind, and the driver is not run for
/// a mount that no longer exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_kernel_crash_leaves_of_a_publish_leaves_nothing_behind() {
    test_support::require_root!();
    for case in ["record gone", "record torn", "marker gone"] {
        let (mut server, sock) = Server::acme("node", "tmpfs", TMPFS);
        let mut node = node_client(&sock).await;
        let target = server.path("pods/crashed");
        node.node_publish_volume(publish_request("c-1", &target, None))
            .await
            .unwrap();
        assert!(is_mounted(&target), "{case}: published");
        let volumes = server.state_dir().join("volumes");
        let named = |suffix: &str| {
            std::fs::read_dir(&volumes)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.to_string_lossy().ends_with(suffix))
                .collect::<Vec<_>>()
        };
        let (record, marker) = (named(".json"), named(".mounted"));
        assert_eq!((record.len(), marker.len()), (1, 1), "{case}: {volumes:?}");
        // The reboot: nothing mounted any more, and what the disk kept of the state dir.
        let out = std::process::Command::new("umount")
            .arg(&target)
            .output()
            .unwrap();
        assert!(out.status.success(), "{case}: {out:?}");
        match case {
            "record gone" => std::fs::remove_file(&record[0]).unwrap(),
            "record torn" => std::fs::write(&record[0], b"").unwrap(),
            _ => {}
        }
        std::fs::remove_file(&marker[0]).unwrap();
        let mut server = tokio::task::spawn_blocking(move || {
            server.crash_and_restart();
            eventually("the restarted endpoint", || sock.exists());
            (server, sock)
        })
        .await
        .unwrap();
        let mut node = node_client(&server.1).await;
        node.node_unpublish_volume(unpublish_request("c-1", &target))
            .await
            .unwrap_or_else(|e| panic!("{case}: unpublish: {e}"));
        let server = &mut server.0;
        assert!(!is_mounted(&target), "{case}");
        if case == "record torn" {
            // No record to flexd; the empty file stays until a save at its name replaces it.
            assert_eq!(named(".json"), record, "{case}");
            assert_eq!(std::fs::metadata(&record[0]).unwrap().len(), 0, "{case}");
            std::fs::remove_file(&record[0]).unwrap();
        }
        assert!(
            server.records().is_empty(),
            "{case}: {:?}",
            server.records()
        );
        assert_eq!(
            server.ops(),
            ["mount"],
            "{case}: the driver is not run for a mount the crash took away"
        );
        if case == "marker gone" {
            // Recovery rolled the record at `mounting` back, with the directory it created.
            assert!(!target.exists(), "{case}");
        }
    }
}

/// The removal of a publish record is not synced either: a crash can undo it after the
/// unpublish succeeded, leaving the record, and its marker, of a volume torn down. With the target
/// gone too, the restarted flexd removes the record on its own; with the target back as well
/// (the CO's state went back with it), the CO's retried unpublish finds the record and finishes,
/// without running the driver for a target that is not mounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpublish_whose_removal_a_crash_undid_leaves_nothing_behind() {
    test_support::require_root!();
    for target_back in [false, true] {
        let case = if target_back {
            "target back"
        } else {
            "target gone"
        };
        let (server, sock) = Server::acme("node", "tmpfs", TMPFS);
        let mut node = node_client(&sock).await;
        let target = server.path("pods/undone");
        node.node_publish_volume(publish_request("u-1", &target, None))
            .await
            .unwrap();
        let volumes = server.state_dir().join("volumes");
        let saved: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&volumes)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
            .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
            .collect();
        assert_eq!(saved.len(), 2, "{case}: the record and its marker");
        node.node_unpublish_volume(unpublish_request("u-1", &target))
            .await
            .unwrap();
        assert!(!target.exists() && server.records().is_empty(), "{case}");
        // The reboot: the removals undone.
        for (path, bytes) in &saved {
            std::fs::write(path, bytes).unwrap();
        }
        if target_back {
            std::fs::create_dir_all(&target).unwrap();
        }
        let mut server = server;
        let (server, sock) = tokio::task::spawn_blocking(move || {
            server.crash_and_restart();
            eventually("the restarted endpoint", || sock.exists());
            (server, sock)
        })
        .await
        .unwrap();
        if target_back {
            assert_eq!(server.records().len(), 1, "{case}: kept for the CO");
            node_client(&sock)
                .await
                .node_unpublish_volume(unpublish_request("u-1", &target))
                .await
                .unwrap();
        } else {
            eventually("the record removed", || server.records().is_empty());
        }
        // Nothing is mounted at the target: the driver is not run again.
        assert_eq!(server.ops(), ["mount", "unmount"], "{case}");
        assert!(
            server.records().is_empty(),
            "{case}: {:?}",
            server.records()
        );
        assert!(!is_mounted(&target) && !target.exists(), "{case}");
    }
}

const METERED: &str = r#"init) echo '{"status":"Success","capabilities":{"attach":false,"supportsMetrics":true}}';;
mount) mkdir -p "$2"; mount -t tmpfs -o size=8m tmpfs "$2" && echo '{"status":"Success"}';;
unmount) umount "$2"; echo '{"status":"Success"}';;
expandfs) echo '{"status":"Success"}';;"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_stats_and_expansion_of_a_published_volume() {
    test_support::require_root!();
    let (server, mut node) = Server::acme_node("metered", METERED).await;
    assert!(
        node_offers(
            &mut node,
            csi::node_service_capability::rpc::Type::GetVolumeStats
        )
        .await
    );
    let target = server.path("pods/metered");
    node.node_publish_volume(publish_request("m-1", &target, None))
        .await
        .unwrap();
    std::fs::write(target.join("one-mebibyte"), vec![7u8; 1 << 20]).unwrap();
    let usage = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "m-1".into(),
            volume_path: target.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .usage;
    let bytes = csi::volume_usage::Unit::Bytes as i32;
    let bytes = usage.iter().find(|u| u.unit == bytes).unwrap();
    assert_eq!(bytes.total, 8 << 20, "the driver's 8 MiB tmpfs");
    assert!(bytes.used >= 1 << 20, "{bytes:?}");
    assert!(usage
        .iter()
        .any(|u| u.unit == csi::volume_usage::Unit::Inodes as i32));
    let missing = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "m-1".into(),
            volume_path: server.path("nowhere").display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);

    let expanded = node
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: "m-1".into(),
            volume_path: target.display().to_string(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 16 << 20,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(expanded.capacity_bytes, 16 << 20);
    let expandfs = &server.calls_of("expandfs")[0];
    // expandfs <json> <device> <device-mount-dir> <new-bytes> <old-bytes>
    assert_eq!(
        &expandfs[3..],
        [target.to_str().unwrap(), "16777216", "8388608"]
    );
    let unknown = node
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: "m-1".into(),
            volume_path: server.path("nowhere").display().to_string(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 1,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    node.node_unpublish_volume(unpublish_request("m-1", &target))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_call_on_a_volume_in_flight_is_aborted_at_once() {
    test_support::require_root!();
    let (server, sock) = Server::slow_node(BLOCKS_AFTER_MOUNTING);
    let target = server.path("pods/shared");
    let mut second_client = node_client(&sock).await;
    let request = publish_request("shared-1", &target, None);
    let first = spawn_publish(&sock, request.clone()).await;
    wait_until_mounted(&target).await;
    // While the first call's driver runs, a second call on the volume is refused with ABORTED
    // (CSI: "an operation is pending for this volume") instead of waiting for it; a generous
    // deadline only guards against a hang, it does not measure speed.
    let second = tokio::time::timeout(
        Duration::from_secs(30),
        second_client.node_publish_volume(request),
    )
    .await
    .expect("the second call waited for the first instead of being refused");
    let status = second.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    assert!(status.message().contains("pending"), "{}", status.message());
    std::fs::write(server.release(), "").unwrap();
    first.await.unwrap().unwrap();
    assert_eq!(server.calls_of("mount").len(), 1);
    let mut node = node_client(&sock).await;
    node.node_unpublish_volume(unpublish_request("shared-1", &target))
        .await
        .unwrap();
    assert!(!target.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_mode_serves_the_controller_and_no_node_or_registration() {
    let (server, sock) = Server::acme("controller", "block", ATTACHING);
    let mut controller = controller_client(&sock).await;
    let published = controller
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: "pv-9".into(),
            node_id: "node-7".into(),
            volume_capability: mount_capability("", ""),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(published.publish_context, map(&[("device", "/dev/fake-1")]));
    // No node id: detached from every node it was published to.
    controller
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: "pv-9".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let detach = server.calls_of("detach");
    assert_eq!(detach.len(), 1);
    assert_eq!(detach[0][2], "node-7");
    let mut node = node_client(&sock).await;
    let err = node
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    assert!(!server
        .registration_dir
        .join("flexvolume-acme--block-reg.sock")
        .exists());
}

/// Relative directories on the command line mean the working directory's, for good: attach
/// records a path under the state dir, and detach must find it again (a relative
/// `--state-dir` once made every ControllerUnpublish fail with INVALID_ARGUMENT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relative_directories_are_resolved_once_and_detach_finds_what_attach_recorded() {
    let cwd = tempfile::tempdir().unwrap();
    test_support::install_example(
        &cwd.path().join("exec"),
        "attachable/attachable",
        "acme~attachable",
    );
    let mut child = test_support::clean_flexd()
        .current_dir(cwd.path())
        .args([
            "--plugin-dir",
            "exec",
            "--state-dir",
            "state",
            "--node-name",
            "node-1",
        ])
        .args([
            "serve",
            "--mode",
            "both",
            "--metrics-address",
            "127.0.0.1:0",
        ])
        .args(["--csi-dir", "csi", "--registration-dir", "registry"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let socket = cwd.path().join("csi/flexvolume-acme--attachable/csi.sock");
    let mut controller = controller_client(&socket).await;
    let publish = csi::ControllerPublishVolumeRequest {
        volume_id: "pv-1".into(),
        node_id: "node-1".into(),
        volume_capability: mount_capability("ext4", ""),
        ..Default::default()
    };
    controller.controller_publish_volume(publish).await.unwrap();
    let unpublish = csi::ControllerUnpublishVolumeRequest {
        volume_id: "pv-1".into(),
        node_id: "node-1".into(),
        ..Default::default()
    };
    let detached = controller.controller_unpublish_volume(unpublish).await;
    let _ = child.kill();
    let _ = child.wait();
    detached.unwrap();
}

/// The mode, owner's group and permission bits of `path` (not followed).
fn mode_and_group(path: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::symlink_metadata(path).unwrap();
    (meta.mode() & 0o7777, meta.gid())
}

/// A node-mode flexd launched so, serving the tmpfs driver as acme/tmpfs: the server, its CSI
/// socket and its registration socket (waited for).
fn tmpfs_node_launched(launch: test_support::serve::Launch) -> (Server, PathBuf, PathBuf) {
    let server = Server::serve_launched(test_support::Sandbox::new(), "node", &[], launch);
    server.driver("acme~tmpfs", TMPFS);
    let sock = server.socket("flexvolume-acme--tmpfs");
    let registration = server
        .registration_dir
        .join("flexvolume-acme--tmpfs-reg.sock");
    wait_for(&registration);
    (server, sock, registration)
}

/// Finding: under `umask 000` the CSI sockets were 0777 (any local user could call them) and
/// volume records, which hold the volume's options, 0644. Now what flexd makes is owner-only
/// whatever the umask: sockets 0600 in a 0700 dir, records and markers 0600, state dirs 0700.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_and_state_are_owner_only_whatever_the_umask() {
    test_support::require_root!();
    let (server, sock, registration) = tmpfs_node_launched(test_support::serve::Launch {
        umask: Some(0),
        ..Default::default()
    });
    assert_eq!(mode_and_group(&sock).0, 0o600, "the CSI socket");
    assert_eq!(mode_and_group(sock.parent().unwrap()).0, 0o700, "its dir");
    assert_eq!(
        mode_and_group(&registration).0,
        0o600,
        "the registration socket"
    );

    let mut node = node_client(&sock).await;
    let target = server.path("kubelet/pods/uid-1/volumes/v");
    node.node_publish_volume(publish_request("vol-a", &target, None))
        .await
        .unwrap();
    let state = server.state();
    assert_eq!(mode_and_group(&state).0, 0o700, "the state dir");
    let mut checked = 0;
    for entry in walk(&state) {
        let (mode, _) = mode_and_group(&entry);
        let kind = std::fs::symlink_metadata(&entry).unwrap().file_type();
        if kind.is_dir() {
            assert_eq!(mode, 0o700, "{}", entry.display());
        } else if entry.starts_with(state.join("volumes")) || entry.starts_with(state.join("locks"))
        {
            assert_eq!(mode, 0o600, "{}", entry.display());
        }
        checked += 1;
    }
    assert!(checked >= 3, "the record, its dir and a lock were made");
    node.node_unpublish_volume(unpublish_request("vol-a", &target))
        .await
        .unwrap();
}

/// With `--socket-group`, the CSI socket and its dir let that group in (the non-root sidecars
/// of the controller pod); the registration socket, which only kubelet uses, stays root's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_group_may_connect_to_the_csi_socket_only() {
    test_support::require_root!();
    let (_server, sock, registration) = tmpfs_node_launched(test_support::serve::Launch {
        umask: Some(0o077),
        serve_args: vec!["--socket-group".to_owned(), "4242".to_owned()],
        ..Default::default()
    });
    assert_eq!(mode_and_group(&sock), (0o660, 4242), "the CSI socket");
    assert_eq!(
        mode_and_group(sock.parent().unwrap()),
        (0o750, 4242),
        "its dir"
    );
    assert_eq!(
        mode_and_group(&registration).0,
        0o600,
        "the registration socket"
    );
    // That the non-root sidecars connect through it is shown by the e2e's controller pod.
}

/// Every path below `dir`, depth first.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            paths.extend(walk(&path));
        }
        paths.push(path);
    }
    paths
}

/// A socket path may hold 107 bytes. The VM suite's long scratch paths found the temporary name
/// a socket is made under before its rename longer than the socket's own, so a driver whose
/// registration socket fit was not served at all. Here: the longest CSI name (63 characters),
/// or the one that makes the registration socket's path exactly 107 bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_is_served_with_its_registration_socket_at_the_longest_path() {
    const LONGEST: usize = 107;
    let sandbox = test_support::Sandbox::new();
    let registry = sandbox.path("plugins_registry");
    // `<registry>/flexvolume-acme--aaa…-reg.sock`
    let fixed = registry.as_os_str().len() + "/flexvolume-acme--".len() + "-reg.sock".len();
    let longest_name = 63 - "flexvolume-acme--".len();
    let Some(letters) = LONGEST
        .checked_sub(fixed)
        .map(|room| room.min(longest_name))
        .filter(|n| *n > 0)
    else {
        test_support::skip!(format!(
            "the sandbox's path ({} bytes) leaves no room for a socket name",
            registry.as_os_str().len()
        ));
    };
    let name = "a".repeat(letters);
    test_support::install_example(&sandbox.plugin(), "tmpfs/tmpfs", &format!("acme~{name}"));
    let server = Server::serve(sandbox, "node", &[]);
    let csi_name = format!("flexvolume-acme--{name}");
    let registration = registry.join(format!("{csi_name}-reg.sock"));
    assert!(registration.as_os_str().len() <= LONGEST);
    eprintln!(
        "registration socket path: {} bytes",
        registration.as_os_str().len()
    );
    wait_for(&registration);
    let socket = server.socket(&csi_name);
    let mut identity = identity_client(&socket).await;
    assert_eq!(plugin_info(&mut identity).await.name, csi_name);
    let mut reg =
        registration::registration_client::RegistrationClient::new(connect(&registration).await);
    let info = reg
        .get_info(registration::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, csi_name);
}

/// A first run on an empty plugin dir serves nothing: flexd says so at warn level, with how to
/// install a driver, instead of only its start-up lines.
#[test]
fn an_empty_plugin_dir_is_warned_about_with_how_to_install_a_driver() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::sync::mpsc;
    use std::time::Instant;

    let root = tempfile::tempdir().unwrap();
    let plugin_dir = root.path().join("exec");
    std::fs::create_dir(&plugin_dir).unwrap();
    let mut serve = test_support::serve_command(&plugin_dir, root.path(), "node")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("flexd serve starts");
    let stderr = serve.stderr.take().expect("piped stderr");
    let (lines, said) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    // Generous: a loaded machine may take long to start flexd.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut log = Vec::new();
    let warning = loop {
        match said.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("the plugin dir has no drivers") => break Some(line),
            Ok(line) => log.push(line),
            Err(_) => break None,
        }
    };
    test_support::terminate(&mut serve);
    let warning =
        warning.unwrap_or_else(|| panic!("no warning about the empty plugin dir in: {log:#?}"));
    for text in [
        "WARN",
        "flexd install --driver VENDOR/NAME PATH",
        "flexd install --builtin loop",
        "as it is installed, without a restart",
        &plugin_dir.display().to_string(),
    ] {
        assert!(warning.contains(text), "no {text:?} in: {warning}");
    }
}
