//! Two controller replicas over one set of records (what the API server is to replicas): what
//! one replica did, the other sees, undoes and lists. A real driver executable answers; the
//! records are `MemoryRecords`, shared as the Kubernetes backend shares them.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;

use flexvolume_host::controller_records::MemoryRecords;
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
/// beside it; `isattached` answers from the attach and detach it logged.
const DRIVER: &str = r#"#!/bin/sh
dir=$(dirname "$0")
echo "$*" >> "$dir/calls"
case "$1" in
init) echo '{"status":"Success","capabilities":{"attach":true,"provision":true}}' ;;
attach|detach|provision|delete) echo '{"status":"Success","device":"/dev/x"}' ;;
isattached)
  if [ "$(grep -c '^attach ' "$dir/calls")" -gt "$(grep -c '^detach ' "$dir/calls")" ]; then
    echo '{"status":"Success","attached":true}'
  else
    echo '{"status":"Success","attached":false}'
  fi ;;
*) echo '{"status":"Not supported"}' ;;
esac
"#;

fn replica(
    dir: &Path,
    name: &str,
    plugin: &Arc<Plugin>,
    records: &MemoryRecords,
) -> ControllerService {
    let runner = RunnerConfig {
        max_processes: None,
        ..Default::default()
    };
    let registry = Arc::new(Registry::new());
    registry.register_static(plugin.clone()).unwrap();
    let resolver = Arc::new(Resolver::new(registry, runner.clone()));
    let mut lifecycle = Lifecycle::new(runner, StateDir::new(dir.join(name)), name.to_owned());
    lifecycle.controller_records = Arc::new(records.clone());
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_one_replica_did_the_other_sees_and_undoes() {
    let dir = tempfile::tempdir().unwrap();
    let driver_dir = dir.path().join("driver");
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
    let plugin = Arc::new(Plugin::from_init_reply(installed, &init));
    let records = MemoryRecords::default();
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
