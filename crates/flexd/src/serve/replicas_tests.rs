//! Two controller replicas over one set of records (what the API server is to replicas): what
//! one replica did, the other sees, undoes and lists; what one is doing, the other waits for.
//! A real driver executable answers; the records are a `MemoryStore`, shared and versioned as
//! the API server keeps them, each replica signing its fences with its own name.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;

use flexvolume_host::controller_records::{ControllerRecords, FenceSettings, MemoryStore};
use flexvolume_host::lifecycle::Lifecycle;
use flexvolume_host::state::StateDir;
use flexvolume_host::{DriverName, InstalledDriver, Plugin, Registry, Resolver, RunnerConfig};
use tonic::Request;

use super::calls::VolumeCalls;
use super::controller::ControllerService;
use super::driver::ServedDriver;
use super::locks::VolumeLocks;
use flexd::proto::csi::controller_server::Controller;
use flexd::proto::csi::{self, volume_capability};

/// A driver that attaches and provisions, logging every call-out with its arguments to `calls`
/// beside it. Its attach claims the volume for one node (a file `claim-<volume>`) and fails
/// for another node while claimed, as a real disk attaches to one machine; detach releases
/// only its own node's claim; `isattached` answers from the claim. Each provision makes a new
/// disk (`disk-<n>`): not idempotent by name. A call-out named in the file `slow` (`attach 2`)
/// takes that many seconds first, after logging `started <call-out>`.
const DRIVER: &str = r#"#!/bin/sh
dir=$(dirname "$0")
echo "$*" >> "$dir/calls"
if [ -f "$dir/slow" ]; then
  seconds=$(awk -v op="$1" '$1 == op {print $2}' "$dir/slow")
  if [ -n "$seconds" ]; then echo "started $1" >> "$dir/calls"; sleep "$seconds"; fi
fi
volume=$(printf '%s' "$2" | sed -n 's/.*"kubernetes.io\/pvOrVolumeName":"\([^"]*\)".*/\1/p')
case "$1" in
init) echo '{"status":"Success","capabilities":{"attach":true,"provision":true}}' ;;
attach)
  claim="$dir/claim-$volume"
  if [ -f "$claim" ] && [ "$(cat "$claim")" != "$3" ]; then
    echo "{\"status\":\"Failure\",\"message\":\"attached to $(cat "$claim")\"}"; exit 1
  fi
  echo "$3" > "$claim"; echo '{"status":"Success","device":"/dev/x"}' ;;
detach)
  claim="$dir/claim-$2"
  if [ -f "$claim" ] && [ "$(cat "$claim")" = "$3" ]; then rm -f "$claim"; fi
  echo '{"status":"Success"}' ;;
isattached)
  claim="$dir/claim-$volume"
  if [ -f "$claim" ] && [ "$(cat "$claim")" = "$3" ]; then
    echo '{"status":"Success","attached":true}'
  else
    echo '{"status":"Success","attached":false}'
  fi ;;
provision)
  n=$(ls "$dir" | grep -c '^disk-')
  echo "$volume" > "$dir/disk-$n"; echo '{"status":"Success"}' ;;
delete) echo '{"status":"Success"}' ;;
*) echo '{"status":"Not supported"}' ;;
esac
"#;

fn replica(
    dir: &Path,
    name: &str,
    plugin: &Arc<Plugin>,
    records: &MemoryStore,
) -> ControllerService {
    let runner = RunnerConfig {
        max_processes: None,
        ..Default::default()
    };
    let registry = Arc::new(Registry::new());
    registry.register_static(plugin.clone()).unwrap();
    let resolver = Arc::new(Resolver::new(registry, runner.clone()));
    let mut lifecycle = Lifecycle::new(runner, StateDir::new(dir.join(name)), name.to_owned());
    let fences = FenceSettings {
        lease: std::time::Duration::from_secs(20),
        stop_after: std::time::Duration::from_secs(15),
    };
    lifecycle.controller_records =
        Arc::new(ControllerRecords::new(Arc::new(records.clone()), fences).with_holder(name));
    let driver = Arc::new(ServedDriver::new(
        plugin.driver.name.clone(),
        "flexvolume-acme--x".to_owned(),
        dir.join(name).join("csi.sock"),
        None,
        resolver,
    ));
    ControllerService::new(
        VolumeCalls {
            driver,
            lifecycle: Arc::new(lifecycle),
            locks: VolumeLocks::default(),
        },
        false,
    )
}

fn capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume::default(),
        )),
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    }
}

fn calls_of(dir: &Path, call_out: &str) -> Vec<String> {
    std::fs::read_to_string(dir.join("driver").join("calls"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').next() == Some(call_out))
        .map(str::to_owned)
        .collect()
}

async fn published_nodes(replica: &ControllerService) -> HashMap<String, Vec<String>> {
    let listed = replica
        .list_volumes(Request::new(csi::ListVolumesRequest::default()))
        .await
        .unwrap()
        .into_inner();
    listed
        .entries
        .into_iter()
        .map(|e| {
            let id = e.volume.unwrap().volume_id;
            (
                id,
                e.status.map(|s| s.published_node_ids).unwrap_or_default(),
            )
        })
        .collect()
}

/// The driver of [`DRIVER`] installed in `dir/driver`, initialised.
fn plugin(dir: &Path) -> Arc<Plugin> {
    let driver_dir = dir.join("driver");
    std::fs::create_dir_all(&driver_dir).unwrap();
    let exe = driver_dir.join("x");
    std::fs::write(&exe, DRIVER).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let installed = InstalledDriver {
        name: DriverName::parse("acme/x").unwrap(),
        dir: driver_dir.clone(),
        path: exe,
    };
    let init = flexvolume_protocol::find_reply(
        br#"{"status":"Success","capabilities":{"attach":true,"provision":true}}"#,
    )
    .unwrap();
    Arc::new(Plugin::from_init_reply(installed, &init))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_one_replica_did_the_other_sees_and_undoes() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = plugin(dir.path());
    let records = MemoryStore::default();
    let a = replica(dir.path(), "a", &plugin, &records);
    let b = replica(dir.path(), "b", &plugin, &records);

    // Provisioned by A; B's repeat of the same CreateVolume is that volume, not a second one.
    let create = || csi::CreateVolumeRequest {
        name: "pvc-1".into(),
        volume_capabilities: vec![capability()],
        parameters: [("pool".to_owned(), "gold".to_owned())].into(),
        ..Default::default()
    };
    let made = a
        .create_volume(Request::new(create()))
        .await
        .unwrap()
        .into_inner();
    let again = b
        .create_volume(Request::new(create()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(made.volume, again.volume);
    assert_eq!(
        calls_of(dir.path(), "provision").len(),
        1,
        "provisioned once"
    );

    // Attached by A (the CO sends no context: B's records give the provisioned options).
    let publish = csi::ControllerPublishVolumeRequest {
        volume_id: "pvc-1".into(),
        node_id: "node-1".into(),
        volume_capability: Some(capability()),
        ..Default::default()
    };
    a.controller_publish_volume(Request::new(publish.clone()))
        .await
        .unwrap();
    let attaches = calls_of(dir.path(), "attach");
    assert_eq!(attaches.len(), 1);
    assert!(attaches[0].contains(r#""pool":"gold""#), "{attaches:?}");
    // B answers a repeat from the record A wrote: no second attach.
    b.controller_publish_volume(Request::new(publish))
        .await
        .unwrap();
    assert_eq!(calls_of(dir.path(), "attach").len(), 1, "attached once");
    // B lists what A attached, checked with isattached.
    assert_eq!(
        published_nodes(&b).await.get("pvc-1"),
        Some(&vec!["node-1".to_owned()])
    );

    // Detached by B, under the name A recorded; A's listing then shows no node.
    b.controller_unpublish_volume(Request::new(csi::ControllerUnpublishVolumeRequest {
        volume_id: "pvc-1".into(),
        node_id: "node-1".into(),
        ..Default::default()
    }))
    .await
    .unwrap();
    assert_eq!(calls_of(dir.path(), "detach"), ["detach pvc-1 node-1"]);
    assert_eq!(
        published_nodes(&a).await.get("pvc-1"),
        Some(&Vec::<String>::new())
    );

    // Deleted by B with the options A's provision recorded; gone for A as well.
    b.delete_volume(Request::new(csi::DeleteVolumeRequest {
        volume_id: "pvc-1".into(),
        ..Default::default()
    }))
    .await
    .unwrap();
    let deletes = calls_of(dir.path(), "delete");
    assert_eq!(deletes.len(), 1);
    assert!(deletes[0].contains(r#""pool":"gold""#), "{deletes:?}");
    assert!(published_nodes(&a).await.is_empty());
}

/// Replicas "a" (shared, to run a call in a task) and "b" of [`DRIVER`] in `dir`, over one
/// store.
fn two_replicas(dir: &Path) -> (Arc<ControllerService>, ControllerService) {
    let plugin = plugin(dir);
    let records = MemoryStore::default();
    (
        Arc::new(replica(dir, "a", &plugin, &records)),
        replica(dir, "b", &plugin, &records),
    )
}

fn publish(volume: &str, node: &str) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        volume_capability: Some(capability()),
        volume_context: [("pool".to_owned(), "gold".to_owned())].into(),
        ..Default::default()
    }
}

fn unpublish(volume: &str, node: &str) -> csi::ControllerUnpublishVolumeRequest {
    csi::ControllerUnpublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        ..Default::default()
    }
}

/// Makes `call_out` take `seconds` from now on.
fn slow(dir: &Path, call_out: &str, seconds: u32) {
    std::fs::write(
        dir.join("driver").join("slow"),
        format!("{call_out} {seconds}\n"),
    )
    .unwrap();
}

/// Waits (generously) until the driver has started `call_out` `times` times.
async fn started(dir: &Path, call_out: &str, times: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while calls_of(dir, "started")
        .iter()
        .filter(|l| l.as_str() == format!("started {call_out}"))
        .count()
        < times
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{call_out} never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

fn claim(dir: &Path, volume: &str) -> Option<String> {
    std::fs::read_to_string(dir.join("driver").join(format!("claim-{volume}")))
        .ok()
        .map(|c| c.trim().to_owned())
}

/// Issue #48's first finding: replica A's slow attach and replica B's detach of the same volume
/// ran at once; B found no claim yet, dropped the record, and A's attach then left a claim with
/// no record (ListVolumes blind to it, every attach elsewhere failing for good). With the
/// volume's fence B is refused while A's attach runs, and the record follows the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detach_waits_for_the_other_replicas_attach_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_replicas(dir.path());
    slow(dir.path(), "attach", 2);
    let attaching = {
        let a = a.clone();
        tokio::spawn(async move {
            a.controller_publish_volume(Request::new(publish("pv-1", "node-1")))
                .await
        })
    };
    started(dir.path(), "attach", 1).await;
    let refused = b
        .controller_unpublish_volume(Request::new(unpublish("pv-1", "node-1")))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Aborted, "{refused:?}");
    assert!(refused.message().contains("replica a"), "{refused:?}");
    attaching.await.unwrap().unwrap();
    assert_eq!(claim(dir.path(), "pv-1").as_deref(), Some("node-1"));
    assert_eq!(
        published_nodes(&b).await.get("pv-1"),
        Some(&vec!["node-1".to_owned()]),
        "the claim has its record, and ListVolumes shows it"
    );
    // The CO's retry of the detach, now the attach is over: claim and record go together.
    std::fs::remove_file(dir.path().join("driver").join("slow")).unwrap();
    b.controller_unpublish_volume(Request::new(unpublish("pv-1", "node-1")))
        .await
        .unwrap();
    assert_eq!(claim(dir.path(), "pv-1"), None);
    b.controller_publish_volume(Request::new(publish("pv-1", "node-2")))
        .await
        .unwrap();
    assert_eq!(claim(dir.path(), "pv-1").as_deref(), Some("node-2"));
}

/// The mirror of the first finding: a late detach must not release a fresh attachment. A's
/// detach from node-1 is slow; B's attach to node-2 meanwhile is refused, then succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_waits_for_the_other_replicas_detach_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_replicas(dir.path());
    a.controller_publish_volume(Request::new(publish("pv-1", "node-1")))
        .await
        .unwrap();
    slow(dir.path(), "detach", 2);
    let detaching = {
        let a = a.clone();
        tokio::spawn(async move {
            a.controller_unpublish_volume(Request::new(unpublish("pv-1", "node-1")))
                .await
        })
    };
    started(dir.path(), "detach", 1).await;
    let refused = b
        .controller_publish_volume(Request::new(publish("pv-1", "node-2")))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Aborted, "{refused:?}");
    detaching.await.unwrap().unwrap();
    b.controller_publish_volume(Request::new(publish("pv-1", "node-2")))
        .await
        .unwrap();
    assert_eq!(claim(dir.path(), "pv-1").as_deref(), Some("node-2"));
    assert_eq!(
        published_nodes(&a).await.get("pv-1"),
        Some(&vec!["node-2".to_owned()])
    );
}

/// Issue #48's third finding: B took A's provision in flight (its record not done yet) for a
/// crash and provisioned again, and a driver that is not idempotent by name made two disks.
/// With the fence B is refused until A's provision ends, then answered from A's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provision_in_flight_is_never_run_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_replicas(dir.path());
    let create = || csi::CreateVolumeRequest {
        name: "pvc-1".into(),
        volume_capabilities: vec![capability()],
        ..Default::default()
    };
    slow(dir.path(), "provision", 2);
    let provisioning = {
        let a = a.clone();
        tokio::spawn(async move { a.create_volume(Request::new(create())).await })
    };
    started(dir.path(), "provision", 1).await;
    let refused = b.create_volume(Request::new(create())).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Aborted, "{refused:?}");
    let made = provisioning.await.unwrap().unwrap().into_inner();
    let again = b
        .create_volume(Request::new(create()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(made.volume, again.volume);
    let disks = std::fs::read_dir(dir.path().join("driver"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("disk-"))
        .count();
    assert_eq!(
        disks,
        1,
        "provisioned once: {:?}",
        calls_of(dir.path(), "provision")
    );
}

/// Issue #48's sixth finding, last part: ControllerUnpublish took any node id. One it could not
/// have published to is refused before anything is read or run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpublish_to_a_node_id_no_publish_could_have_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = plugin(dir.path());
    let a = replica(dir.path(), "a", &plugin, &MemoryStore::default());
    for bad in ["node\n1", &"n".repeat(1024)] {
        let refused = a
            .controller_unpublish_volume(Request::new(unpublish("pv-1", bad)))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{bad:?}");
    }
    assert!(calls_of(dir.path(), "detach").is_empty());
}
