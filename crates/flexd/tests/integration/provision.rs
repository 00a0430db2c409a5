//! Dynamic provisioning through a real `flexd serve --mode controller` and a real driver
//! process: CreateVolume/DeleteVolume as `provision`/`delete` call-outs with the flex
//! provisioner's JSON, idempotent across a restart, named driver errors as CSI codes, and a
//! provisioned volume attaching with the options its provision returned.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use test_support::serve::{connect, csi, Server};
use tonic::transport::Channel;
use tonic::Code;

use csi::controller_client::ControllerClient;

/// Records every call in `calls.log` beside itself. `provision` refuses the "full" tier by
/// name and dies without a reply for the "crash" tier; attach knows only the volume
/// provision made.
const DRIVER: &str = r#"#!/bin/sh
echo "$*" >> "$(dirname "$0")/calls.log"
case "$1" in
init) echo '{"status":"Success","capabilities":{"attach":true,"provision":true}}' ;;
provision)
  case "$2" in
    *'"tier":"full"'*) echo '{"status":"Failure","message":"pool full","code":"OutOfCapacity"}'; exit 1 ;;
    *'"tier":"crash"'*) exit 1 ;;
  esac
  echo '{"status":"Success","options":{"volumeID":"vol-made"}}' ;;
delete) echo '{"status":"Success"}' ;;
attach)
  case "$2" in
    *'"volumeID":"vol-made"'*) echo '{"status":"Success","device":"/dev/fake-made"}' ;;
    *) echo '{"status":"Failure","message":"no such volume","code":"NotFound"}'; exit 1 ;;
  esac ;;
detach) echo '{"status":"Success"}' ;;
*) echo '{"status":"Not supported"}'; exit 1 ;;
esac
"#;

/// `flexd serve --mode controller` (the shared harness) with acme/prov running [`DRIVER`].
struct Prov {
    server: Server,
    socket: PathBuf,
}

impl Prov {
    fn start() -> Self {
        let server = Server::start_in_mode("controller", |plugins| {
            std::fs::create_dir(plugins.join("acme~prov")).unwrap();
            test_support::install_exe(&plugins.join("acme~prov/prov"), DRIVER);
        });
        let socket = server.socket("flexvolume-acme--prov");
        Self { server, socket }
    }

    fn restart(&mut self) {
        self.server.crash_and_restart();
    }

    fn calls(&self, kind: &str) -> Vec<String> {
        std::fs::read_to_string(self.server.plugin_dir.join("acme~prov/calls.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.split(' ').next() == Some(kind))
            .map(str::to_owned)
            .collect()
    }

    async fn client(&self) -> ControllerClient<Channel> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut client = ControllerClient::new(connect(&self.socket).await);
            // Served, and the driver's init done (a restarted flexd probes first).
            if client
                .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
                .await
                .is_ok_and(|r| !r.into_inner().capabilities.is_empty())
            {
                return client;
            }
            assert!(Instant::now() < deadline, "flexd never served acme/prov");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume::default(),
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    }
}

/// ControllerPublish of `volume_id` to node-7, with no volume context.
fn attach_to_node_7(volume_id: &str) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: "node-7".into(),
        volume_capability: Some(capability()),
        ..Default::default()
    }
}

fn detach_from_node_7(volume_id: &str) -> csi::ControllerUnpublishVolumeRequest {
    csi::ControllerUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: "node-7".into(),
        ..Default::default()
    }
}

fn delete(volume_id: &str) -> csi::DeleteVolumeRequest {
    csi::DeleteVolumeRequest {
        volume_id: volume_id.into(),
        ..Default::default()
    }
}

fn create(name: &str, bytes: i64, tier: &str) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability()],
        parameters: HashMap::from([("tier".to_owned(), tier.to_owned())]),
        ..Default::default()
    }
}

/// The volume of a CreateVolume that must succeed.
async fn created(
    c: &mut ControllerClient<Channel>,
    request: csi::CreateVolumeRequest,
) -> csi::Volume {
    c.create_volume(request)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

/// The answer to a CreateVolume that must be refused.
async fn refusal(
    c: &mut ControllerClient<Channel>,
    request: csi::CreateVolumeRequest,
) -> tonic::Status {
    c.create_volume(request).await.unwrap_err()
}

/// Asserts that a call was refused with `code`.
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(
    result: Result<tonic::Response<T>, tonic::Status>,
    code: Code,
) {
    let err = result.unwrap_err();
    assert_eq!(err.code(), code, "{err:?}");
}

/// The code of a CreateVolume that must be refused.
async fn refused(c: &mut ControllerClient<Channel>, request: csi::CreateVolumeRequest) -> Code {
    refusal(c, request).await.code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioned_volumes_are_idempotent_across_restarts_attach_and_delete() {
    let mut server = Prov::start();
    let mut c = server.client().await;
    use csi::controller_service_capability::rpc::Type;
    let caps = test_support::serve::controller_capabilities(&mut c).await;
    assert_eq!(
        caps,
        vec![
            Type::CreateDeleteVolume as i32,
            Type::PublishUnpublishVolume as i32,
            Type::ListVolumes as i32,
            Type::ListVolumesPublishedNodes as i32,
        ]
    );

    let made = created(&mut c, create("pvc-1", 3 << 20, "gold")).await;
    assert_eq!(made.volume_id, "pvc-1");
    assert_eq!(made.capacity_bytes, 3 << 20);
    assert_eq!(
        made.volume_context,
        HashMap::from([
            ("tier".to_owned(), "gold".to_owned()),
            ("volumeID".to_owned(), "vol-made".to_owned())
        ])
    );
    let provision = server.calls("provision");
    assert_eq!(provision.len(), 1);
    let json: serde_json::Value =
        serde_json::from_str(provision[0].trim_start_matches("provision ")).unwrap();
    assert_eq!(json["kubernetes.io/pvOrVolumeName"], "pvc-1");
    assert_eq!(json["requestBytes"], "3145728");
    assert_eq!(json["requestMiB"], "3");
    assert_eq!(json["requestGiB"], "1");
    assert_eq!(json["tier"], "gold");

    // The same request is the same volume; the driver is not asked again, even by a
    // restarted flexd.
    assert_eq!(
        created(&mut c, create("pvc-1", 3 << 20, "gold")).await,
        made
    );
    server.restart();
    let mut c = server.client().await;
    assert_eq!(
        created(&mut c, create("pvc-1", 3 << 20, "gold")).await,
        made
    );
    assert_eq!(server.calls("provision").len(), 1);
    // The same name for something else is a conflict.
    assert_eq!(
        refused(&mut c, create("pvc-1", 6 << 20, "gold")).await,
        Code::AlreadyExists
    );
    assert_eq!(
        refused(&mut c, create("pvc-1", 3 << 20, "silver")).await,
        Code::AlreadyExists
    );

    // A failure the driver names keeps its meaning.
    let err = refusal(&mut c, create("pvc-2", 1 << 20, "full")).await;
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("pool full"), "{}", err.message());

    // Published without a volume context (csi-sanity does that): attach gets the options
    // provision returned.
    let published = c
        .controller_publish_volume(attach_to_node_7("pvc-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(published.publish_context["device"], "/dev/fake-made");
    let err = c.delete_volume(delete("pvc-1")).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("node-7"), "{}", err.message());
    assert!(server.calls("delete").is_empty());
    c.controller_unpublish_volume(detach_from_node_7("pvc-1"))
        .await
        .unwrap();
    for _ in 0..2 {
        c.delete_volume(delete("pvc-1")).await.unwrap();
    }
    let delete = server.calls("delete");
    assert_eq!(delete.len(), 1, "a deleted volume is not deleted twice");
    assert!(
        delete[0].contains(r#""volumeID":"vol-made""#),
        "{}",
        delete[0]
    );

    // A volume that was never provisioned and that no context describes does not exist, and
    // the driver is not asked; a static one the driver does not know is the driver's NotFound.
    let attaches = server.calls("attach").len();
    assert_refused(
        c.controller_publish_volume(attach_to_node_7("made-up"))
            .await,
        Code::NotFound,
    );
    assert_eq!(server.calls("attach").len(), attaches);
    assert_refused(
        c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_context: HashMap::from([("volumeID".to_owned(), "gone".to_owned())]),
            ..attach_to_node_7("static-1")
        })
        .await,
        Code::NotFound,
    );
    assert_eq!(server.calls("attach").len(), attaches + 1);
    // Nothing was attached, so there is nothing to detach.
    c.controller_unpublish_volume(detach_from_node_7("static-1"))
        .await
        .unwrap();
    assert_eq!(server.calls("detach").len(), 1);
    assert_refused(
        c.validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: "made-up".into(),
            volume_capabilities: vec![capability()],
            ..Default::default()
        })
        .await,
        Code::NotFound,
    );
}

/// issue 29: a failed CreateVolume blocked its name (ALREADY_EXISTS for the corrected retry)
/// until a DeleteVolume. A Failure reply leaves no record; a provision cut short (no reply)
/// is deleted, with its own options, before a retry that asks for another volume.
/// `flexd records import --output json` of `from` into the state dir `into`: its report.
fn import(from: &Path, into: &Path) -> serde_json::Value {
    let out = test_support::output_ok(
        test_support::clean_flexd()
            .arg("--state-dir")
            .arg(into)
            .args(["--output", "json", "records", "import", "--from"])
            .arg(from),
        "flexd records import",
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The upgrade from a controller that kept its records on a claim: its state dir, imported
/// into another controller's records, is that controller's. The new one answers a repeated
/// CreateVolume without provisioning, detaches under the recorded name, and deletes with the
/// options the old one's provision returned; a second import changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_imported_from_an_older_controllers_state_dir_serve_the_new_one() {
    let old = Prov::start();
    let mut c = old.client().await;
    created(&mut c, create("pvc-1", 1 << 20, "gold")).await;
    c.controller_publish_volume(attach_to_node_7("pvc-1"))
        .await
        .unwrap();
    let new = Prov::start();
    let report = import(&old.server.state_dir(), &new.server.state_dir());
    assert_eq!(report["imported"]["provisioned"], 1, "{report}");
    assert_eq!(report["imported"]["attachments"], 1, "{report}");
    let again = import(&old.server.state_dir(), &new.server.state_dir());
    assert_eq!(again["imported"]["provisioned"], 0, "{again}");
    assert_eq!(again["already_there"]["provisioned"], 1, "{again}");
    assert_eq!(again["already_there"]["attachments"], 1, "{again}");

    let mut c = new.client().await;
    let volume = created(&mut c, create("pvc-1", 1 << 20, "gold")).await;
    assert_eq!(volume.volume_context["volumeID"], "vol-made");
    assert!(
        new.calls("provision").is_empty(),
        "{:?}",
        new.calls("provision")
    );
    c.controller_publish_volume(attach_to_node_7("pvc-1"))
        .await
        .unwrap();
    assert!(
        new.calls("attach").is_empty(),
        "answered from the imported record"
    );
    c.controller_unpublish_volume(detach_from_node_7("pvc-1"))
        .await
        .unwrap();
    assert_eq!(new.calls("detach"), ["detach pvc-1 node-7"]);
    c.delete_volume(delete("pvc-1")).await.unwrap();
    let deletes = new.calls("delete");
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert!(
        deletes[0].contains(r#""volumeID":"vol-made""#),
        "{deletes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_cut_short_create_volume_does_not_block_the_corrected_retry() {
    let server = Prov::start();
    let mut c = server.client().await;
    assert_eq!(
        refused(&mut c, create("pvc-full", 1 << 20, "full")).await,
        Code::ResourceExhausted
    );
    let made = created(&mut c, create("pvc-full", 1 << 20, "gold")).await;
    assert_eq!(made.volume_id, "pvc-full");
    assert!(server.calls("delete").is_empty(), "nothing to clean up");

    assert_eq!(
        refused(&mut c, create("pvc-cut", 1 << 20, "crash")).await,
        Code::Internal
    );
    created(&mut c, create("pvc-cut", 2 << 20, "gold")).await;
    let deleted = server.calls("delete");
    assert_eq!(deleted.len(), 1, "{deleted:?}");
    assert!(
        deleted[0].contains(r#""tier":"crash""#) && deleted[0].contains("pvc-cut"),
        "{}",
        deleted[0]
    );
    let provisioned = server.calls("provision");
    assert!(provisioned.last().unwrap().contains(r#""tier":"gold""#));
}

/// A driver that neither attaches nor provisions has no controller side: in both mode its
/// endpoint does not offer the Controller service (the Identity does not advertise it, every
/// Controller call is UNIMPLEMENTED), until an update in place makes it attach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_without_a_controller_side_gets_no_controller_service_until_it_has_one() {
    let driver = |attach: bool| {
        format!("#!/bin/sh\ncase \"$1\" in\ninit) echo '{{\"status\":\"Success\",\"capabilities\":{{\"attach\":{attach}}}}}' ;;\n*) echo '{{\"status\":\"Not supported\"}}'; exit 1 ;;\nesac\n")
    };
    let server = Server::start_in_mode("both", |plugins| {
        std::fs::create_dir(plugins.join("acme~plain")).unwrap();
        test_support::write_exe(&plugins.join("acme~plain/plain"), &driver(false));
    });
    let exe = server.plugin_dir.join("acme~plain/plain");
    let socket = server.socket("flexvolume-acme--plain");
    let channel = connect(&socket).await;
    let mut identity = csi::identity_client::IdentityClient::new(channel.clone());
    let plugin = test_support::serve::plugin_capabilities(&mut identity).await;
    assert!(plugin.capabilities.is_empty(), "{plugin:?}");
    let mut c = ControllerClient::new(channel);
    let caps = c
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap_err();
    assert_eq!(caps.code(), Code::Unimplemented, "{caps:?}");
    assert_eq!(
        refused(&mut c, create("pvc-1", 1 << 20, "gold")).await,
        Code::Unimplemented
    );

    // Updated in place (an installer's rename) to a driver that attaches: same endpoint, and
    // now it has a controller.
    test_support::install_exe(&exe, &driver(true));
    let publish = csi::controller_service_capability::rpc::Type::PublishUnpublishVolume as i32;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = c
            .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
            .await;
        if answer.is_ok() {
            let caps = test_support::serve::controller_capabilities(&mut c).await;
            assert!(caps.contains(&publish), "{caps:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the updated driver never got a controller"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `flexd serve --mode both` with the builtin loop driver installed, allowed to keep images in
/// the sandbox's `images` dir only (the sandbox unmounts and frees its loop devices on drop),
/// a controller client on its socket, and that dir.
async fn loop_server() -> (Server, ControllerClient<Channel>, PathBuf) {
    loop_server_in("both").await
}

/// [`loop_server`] in `mode`.
async fn loop_server_in(mode: &'static str) -> (Server, ControllerClient<Channel>, PathBuf) {
    let server = Server::start_in_mode(mode, |plugins| {
        test_support::ok(&test_support::output_of_new_executable(
            test_support::flexd_command(plugins)
                .args(["install", "--builtin", "loop", "--image-dir"])
                .arg(plugins.with_file_name("images")),
        ))
    });
    let socket = server.socket("flexvolume-flexd--loop");
    let client = ControllerClient::new(connect(&socket).await);
    let images = server.path("images");
    (server, client, images)
}

/// A CreateVolume of the loop driver with `parameters` and no capacity range.
fn create_loop(name: &str, parameters: &[(&str, &str)]) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![capability()],
        parameters: test_support::serve::map(parameters),
        ..Default::default()
    }
}

/// Every entry of `dir`, sorted (none when it does not exist).
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// issue 29: a StorageClass chose where the loop driver made files (`/etc`, `/`, a deep new
/// dir made with `mkdir -p`). Only the operator's image dirs are used; anything else is
/// INVALID_ARGUMENT, and nothing is made anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_class_cannot_choose_where_the_loop_driver_makes_files() {
    test_support::require_root!("needs root (the loop driver's delete asks losetup)");
    let (server, mut c, images) = loop_server().await;
    let deep = server.path("images/a/b");
    let name = format!("pvc-escape-{}", std::process::id());
    for dir in ["/etc", "/", deep.to_str().unwrap()] {
        let err = refusal(&mut c, create_loop(&name, &[("imageDir", dir)])).await;
        assert_eq!(err.code(), Code::InvalidArgument, "{dir}: {err:?}");
        assert!(
            err.message().contains("not an image dir this node allows"),
            "{}",
            err.message()
        );
    }
    for made in [
        PathBuf::from(format!("/etc/{name}.img")),
        PathBuf::from(format!("/etc/.{name}.lock")),
        PathBuf::from(format!("/{name}.img")),
        server.path("images/a"),
    ] {
        assert!(!made.exists(), "{} was made", made.display());
    }
    // The operator's dir: made (one level), used, and the name is free after the refusals.
    let made = created(
        &mut c,
        create_loop(&name, &[("imageDir", images.to_str().unwrap())]),
    )
    .await;
    assert!(images.join(format!("{name}.img")).is_file());
    // No size asked for: the driver's 1Gi, reported as it is (it was 0).
    assert_eq!(made.capacity_bytes, 1 << 30);
    c.delete_volume(delete(&name)).await.unwrap();
    assert_eq!(entries(&images), Vec::<String>::new());
}

/// issue 29: `volumeID: victim` made a new volume share `victim.img`, and deleting it deleted
/// victim's image; `kubernetes.io/pvOrVolumeName` renamed the image and `requestBytes: "5"`
/// made a 5-byte one. Parameters and volume contexts cannot set flexd's own keys, provision
/// never adopts an image it did not make, and delete never removes one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_cannot_take_another_volumes_name_or_image() {
    test_support::require_root!("needs root (the loop driver's delete asks losetup)");
    let (server, mut c, images) = loop_server().await;
    let dir = images.to_str().unwrap();
    // Volume "victim": a static volume's image, made by hand.
    std::fs::create_dir(&images).unwrap();
    let victim = images.join("victim.img");
    std::fs::write(&victim, b"victim's data").unwrap();
    for (key, value) in [
        ("volumeID", "victim"),
        ("kubernetes.io/pvOrVolumeName", "victim"),
        ("requestBytes", "5"),
        ("requestMiB", "1"),
        ("kubernetes.io/secret/token", "x"),
    ] {
        let err = refusal(
            &mut c,
            create_loop("pvc-new", &[("imageDir", dir), (key, value)]),
        )
        .await;
        assert_eq!(err.code(), Code::InvalidArgument, "{key}: {err:?}");
        assert!(err.message().contains(key), "{}", err.message());
    }
    assert!(!images.join("pvc-new.img").exists());
    // Its own name: the image is not one a provision made.
    let err = refusal(&mut c, create_loop("victim", &[("imageDir", dir)])).await;
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(
        err.message().contains("not made by a provision"),
        "{}",
        err.message()
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"victim's data");

    // A volume context cannot set them either, on any call that takes one.
    let context = test_support::serve::map(&[
        ("imageDir", dir),
        ("volumeID", "victim"),
        ("kubernetes.io/pvOrVolumeName", "victim"),
    ]);
    assert_refused(
        c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: "pvc-x".into(),
            node_id: "node-1".into(),
            volume_capability: Some(capability()),
            volume_context: context.clone(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    let mut node =
        test_support::serve::node_client(&server.csi_dir.join("flexvolume-flexd--loop/csi.sock"))
            .await;
    assert_refused(
        node.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: "pvc-x".into(),
            staging_target_path: server.path("staging").display().to_string(),
            volume_capability: Some(capability()),
            volume_context: context.clone(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    let publish = csi::NodePublishVolumeRequest {
        volume_context: context.clone(),
        ..test_support::serve::publish_request("pvc-x", &server.path("target"), None)
    };
    assert_refused(
        node.node_publish_volume(publish).await,
        Code::InvalidArgument,
    );

    // DeleteVolume removes only the image its provision made: one put in its place stays.
    created(
        &mut c,
        create_loop("pvc-mine", &[("imageDir", dir), ("size", "8Mi")]),
    )
    .await;
    let mine = images.join("pvc-mine.img");
    std::fs::remove_file(&mine).unwrap();
    std::fs::write(&mine, b"planted").unwrap();
    let err = c.delete_volume(delete("pvc-mine")).await.unwrap_err();
    assert!(err.message().contains("not made by a provision"), "{err:?}");
    assert_eq!(std::fs::read(&mine).unwrap(), b"planted");
    assert_eq!(std::fs::read(&victim).unwrap(), b"victim's data");
}

/// issue 29: after `size: 1Ei` failed (INTERNAL), the corrected retry under the same name was
/// ALREADY_EXISTS until a DeleteVolume, and each failure left a lock file behind. A bad size
/// is now OUT_OF_RANGE or INVALID_ARGUMENT with its reason, and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_create_volume_leaves_nothing_and_the_corrected_retry_succeeds() {
    test_support::require_root!("needs root (the loop driver's delete asks losetup)");
    // Named, so that flexd runs until the end of the test.
    let (_server, mut c, images) = loop_server().await;
    let dir = images.to_str().unwrap();
    for (size, code, reason) in [
        ("1Ei", Code::OutOfRange, "whole filesystem"),
        ("16Ei", Code::OutOfRange, "more bytes than any file"),
        ("lots", Code::InvalidArgument, "not a size"),
        ("0", Code::InvalidArgument, "not a size"),
    ] {
        let err = refusal(
            &mut c,
            create_loop("pvc-retry", &[("imageDir", dir), ("size", size)]),
        )
        .await;
        assert_eq!(err.code(), code, "{size}: {err:?}");
        assert!(err.message().contains(reason), "{size}: {}", err.message());
        assert_eq!(entries(&images), Vec::<String>::new(), "{size}");
    }
    let err = refusal(
        &mut c,
        csi::CreateVolumeRequest {
            capacity_range: Some(csi::CapacityRange {
                required_bytes: i64::MAX,
                limit_bytes: 0,
            }),
            ..create_loop("pvc-retry", &[("imageDir", dir)])
        },
    )
    .await;
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert_eq!(entries(&images), Vec::<String>::new());

    let made = created(
        &mut c,
        create_loop("pvc-retry", &[("imageDir", dir), ("size", "64Mi")]),
    )
    .await;
    assert_eq!(made.capacity_bytes, 64 << 20);
    assert_eq!(
        std::fs::metadata(images.join("pvc-retry.img"))
            .unwrap()
            .len(),
        64 << 20
    );
    c.delete_volume(delete("pvc-retry")).await.unwrap();
    assert_eq!(entries(&images), Vec::<String>::new());
}

/// The loop driver is a shared-storage driver: behind a CSI controller that publishes to any
/// node (`--mode controller`), ControllerPublish claims a volume for one node and names no
/// device (the node makes its own loop device), and makes none on the controller's host. A
/// second node's publish is refused naming the first. Its code is INTERNAL: FlexVolume has no
/// named failure for CSI's FAILED_PRECONDITION ("published to another node"), so this pins
/// what a CO sees today. The second node's unpublish (the CO undoing its failed publish)
/// releases nothing; DeleteVolume is refused while the volume is published (by flexd's own
/// record, before the driver, which would refuse too); after the first
/// node's unpublish the second node's publish succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_volume_is_published_to_one_node_at_a_time() {
    test_support::require_root!("needs root (the loop driver's delete asks losetup)");
    let (server, mut c, images) = loop_server_in("controller").await;
    let dir = images.to_str().unwrap();
    let volume = created(
        &mut c,
        create_loop("pvc-shared", &[("imageDir", dir), ("size", "8Mi")]),
    )
    .await;
    let publish = |node: &str| csi::ControllerPublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: node.into(),
        volume_capability: Some(capability()),
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    };
    let unpublish = |node: &str| csi::ControllerUnpublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: node.into(),
        ..Default::default()
    };
    let published = c
        .controller_publish_volume(publish("node-a"))
        .await
        .unwrap()
        .into_inner();
    assert!(
        published.publish_context.is_empty(),
        "no device: {published:?}"
    );
    assert!(server.loop_devices().is_empty(), "a loop device was made");
    c.controller_publish_volume(publish("node-a"))
        .await
        .unwrap();

    let err = c
        .controller_publish_volume(publish("node-b"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert!(err.message().contains("attached to node node-a"), "{err:?}");
    c.controller_unpublish_volume(unpublish("node-b"))
        .await
        .unwrap();
    // flexd's own record of the publish refuses first (the driver would too).
    let err = c.delete_volume(delete("pvc-shared")).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("attached to node node-a"), "{err:?}");

    c.controller_unpublish_volume(unpublish("node-a"))
        .await
        .unwrap();
    c.controller_publish_volume(publish("node-b"))
        .await
        .unwrap();
    c.controller_unpublish_volume(unpublish("node-b"))
        .await
        .unwrap();
    c.delete_volume(delete("pvc-shared")).await.unwrap();
    assert_eq!(entries(&images), Vec::<String>::new());
}
