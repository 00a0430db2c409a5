//! CSI inline ephemeral volumes through a real `flexd serve`: kubelet publishes them with no
//! stage step, a `csi-<hash>` volume id it makes up, and everything the driver needs in the
//! volume context (`csi.storage.k8s.io/ephemeral: "true"` among kubelet's keys).

use std::process::{Command, Stdio};

use test_support::serve::{csi, map, node_offers, publish_request, Server};

/// The volume id kubelet gives an inline volume: `csi-` and the hex SHA-256 of the pod's uid
/// followed by the volume's name in the pod spec (kubelet's `makeVolumeHandle`).
fn kubelet_volume_id(pod_uid: &str, volume_name: &str) -> String {
    let mut sha = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum runs");
    std::io::Write::write_all(
        sha.stdin.as_mut().unwrap(),
        format!("{pod_uid}{volume_name}").as_bytes(),
    )
    .unwrap();
    drop(sha.stdin.take());
    let out = sha.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let hex = text.split_whitespace().next().unwrap();
    assert_eq!(hex.len(), 64);
    format!("csi-{hex}")
}

const POD_UID: &str = "9d1c5a52-8b1e-4c2c-a1b4-1f0e6a7c3d21";

/// The volume context kubelet sends for an inline volume of pod web-0 (podInfoOnMount), with
/// the driver's own attributes.
fn ephemeral_context(value: &str) -> std::collections::HashMap<String, String> {
    map(&[
        ("csi.storage.k8s.io/ephemeral", value),
        ("csi.storage.k8s.io/pod.name", "web-0"),
        ("csi.storage.k8s.io/pod.namespace", "shop"),
        ("csi.storage.k8s.io/pod.uid", POD_UID),
        ("csi.storage.k8s.io/serviceAccount.name", "web"),
        ("server", "files.example"),
        ("share", "/exports/web"),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_attaching_driver_publishes_an_inline_volume_from_its_context_alone() {
    test_support::require_root!();
    let (server, mut node) = Server::acme_node("tmpfs", test_support::TMPFS_DRIVER).await;
    assert!(
        !node_offers(
            &mut node,
            csi::node_service_capability::rpc::Type::StageUnstageVolume
        )
        .await
    );

    let volume_id = kubelet_volume_id(POD_UID, "scratch");
    let target = server.path(&format!(
        "kubelet/pods/{POD_UID}/volumes/kubernetes.io~csi/scratch/mount"
    ));
    let mut publish = publish_request(&volume_id, &target, None);
    publish.volume_context = ephemeral_context("true");
    publish.secrets = map(&[("token", "s3cr3t")]);
    node.node_publish_volume(publish.clone()).await.unwrap();
    assert!(test_support::is_mounted(&target));
    // A retry (kubelet repeats publishes) does not mount again.
    node.node_publish_volume(publish).await.unwrap();
    assert_eq!(server.ops(), ["mount"], "no stage step, one mount");

    let mount = &server.calls_of("mount")[0];
    assert_eq!(mount[1], target.display().to_string());
    let options: serde_json::Value = serde_json::from_str(&mount[2]).unwrap();
    // The driver's attributes, as a flexVolume's options.
    assert_eq!(options["server"], "files.example");
    assert_eq!(options["share"], "/exports/web");
    // kubelet's keys become the pod information, never options.
    let keys: Vec<&String> = options.as_object().unwrap().keys().collect();
    assert!(
        keys.iter().all(|k| !k.starts_with("csi.storage.k8s.io/")),
        "kubelet's context keys reached the driver: {keys:?}"
    );
    assert_eq!(options["kubernetes.io/pod.name"], "web-0");
    assert_eq!(options["kubernetes.io/pod.namespace"], "shop");
    assert_eq!(options["kubernetes.io/pod.uid"], POD_UID);
    assert_eq!(options["kubernetes.io/serviceAccount.name"], "web");
    assert_eq!(options["kubernetes.io/pvOrVolumeName"], volume_id.as_str());
    assert_eq!(options["kubernetes.io/secret/token"], "czNjcjN0");
    let records = server.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["volume_name"], volume_id.as_str());

    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: volume_id.clone(),
        target_path: target.display().to_string(),
    })
    .await
    .unwrap();
    assert!(!test_support::is_mounted(&target));
    assert_eq!(server.ops(), ["mount", "unmount"]);
    assert!(
        server.records().is_empty(),
        "the inline volume left a record"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attaching_driver_refuses_an_inline_volume_with_the_reason() {
    let (server, mut node) = Server::acme_node("block", test_support::ATTACHING_DRIVER).await;
    let volume_id = kubelet_volume_id(POD_UID, "data");
    let target = server.path("kubelet/pods/p/volumes/kubernetes.io~csi/data/mount");
    let mut publish = publish_request(&volume_id, &target, None);
    publish.volume_context = ephemeral_context("true");
    let err = node.node_publish_volume(publish).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("inline ephemeral") && err.message().contains("attaches"),
        "{}",
        err.message()
    );

    // A value kubelet never sends is refused rather than guessed at.
    let mut publish = publish_request(&volume_id, &target, None);
    publish.volume_context = ephemeral_context("yes");
    let err = node.node_publish_volume(publish).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("csi.storage.k8s.io/ephemeral"),
        "{}",
        err.message()
    );

    assert!(
        server.ops().is_empty(),
        "the driver was called: {:?}",
        server.ops()
    );
    assert!(!target.exists(), "the refused publish made the target");
    assert!(server.records().is_empty());
}
