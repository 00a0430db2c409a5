//! CSI ListVolumes through a real `flexd serve` and real driver processes, as the
//! external-attacher's reconciler calls it (docs/csi.md#list-volumes): the volumes flexd's
//! records know, a page at a time, and for a driver that attaches the nodes each volume is
//! published on, checked with the driver's `isattached`. A volume detached behind Kubernetes'
//! back (the driver's own `detach`, run by hand) drops out of its published nodes, and the
//! CO's next ControllerPublish attaches it again; a driver that cannot tell (`Not supported`),
//! fails or hangs keeps what the records say.

use std::process::Command;
use std::time::Duration;

use test_support::serve::{
    controller_client, controller_publish_request, csi, list_all_volumes, map, mount_capability,
    Server,
};
use tonic::transport::Channel;
use tonic::Code;

use csi::controller_client::ControllerClient;
use csi::controller_service_capability::rpc::Type;

/// Attaches by leaving a file `attached/<volume>@<node>` beside the sandbox's release file;
/// detach removes it; isattached says whether it is there.
const FILE_ATTACHER: &str = r#"init) echo '{"status":"Success","capabilities":{"attach":true}}';;
attach) d="$(dirname "$RELEASE")/attached"; mkdir -p "$d"
  v=$(printf '%s' "$2" | sed -n 's/.*"kubernetes.io\/pvOrVolumeName":"\([^"]*\)".*/\1/p')
  touch "$d/$v@$3"; echo '{"status":"Success","device":"/dev/fake"}';;
detach) rm -f "$(dirname "$RELEASE")/attached/$2@$3"; echo '{"status":"Success"}';;
isattached) v=$(printf '%s' "$2" | sed -n 's/.*"kubernetes.io\/pvOrVolumeName":"\([^"]*\)".*/\1/p')
  if [ -e "$(dirname "$RELEASE")/attached/$v@$3" ]; then echo '{"status":"Success","attached":true}'
  else echo '{"status":"Success","attached":false}'; fi;;"#;

/// Attaches and detaches, and has no isattached (`Not supported`, the protocol's default).
const NO_ISATTACHED: &str = r#"init) echo '{"status":"Success","capabilities":{"attach":true}}';;
attach) echo '{"status":"Success","device":"/dev/fake"}';;
detach) echo '{"status":"Success"}';;"#;

/// isattached fails for volume `flaky`, and for every other volume hangs until the sandbox's
/// release file exists (then says attached).
const FLAKY_OR_STUCK: &str = r#"init) echo '{"status":"Success","capabilities":{"attach":true}}';;
attach) echo '{"status":"Success","device":"/dev/fake"}';;
detach) echo '{"status":"Success"}';;
isattached) case "$2" in *'"kubernetes.io/pvOrVolumeName":"flaky"'*)
    echo '{"status":"Failure","message":"backend unreachable"}'; exit 1;; esac
  while [ ! -e "$RELEASE" ]; do sleep 0.05; done; echo '{"status":"Success","attached":true}';;"#;

/// Each volume listed, with the nodes its status names (`None`: no status).
fn listed(entries: &[csi::list_volumes_response::Entry]) -> Vec<(String, Option<Vec<String>>)> {
    entries
        .iter()
        .map(|e| {
            let volume = e.volume.as_ref().expect("every entry has its volume");
            let nodes = e.status.as_ref().map(|s| s.published_node_ids.clone());
            (volume.volume_id.clone(), nodes)
        })
        .collect()
}

fn nodes(volume: &str, nodes: &[&str]) -> (String, Option<Vec<String>>) {
    let nodes = nodes.iter().map(|n| (*n).to_owned()).collect();
    (volume.to_owned(), Some(nodes))
}

async fn publish(controller: &mut ControllerClient<Channel>, volume: &str, node: &str) {
    let mut request = controller_publish_request(volume, node, &[("server", "s1")]);
    request.secrets = map(&[("password", "hunter2")]);
    controller
        .controller_publish_volume(request)
        .await
        .unwrap_or_else(|e| panic!("ControllerPublish of {volume} to {node}: {e:?}"));
}

async fn capabilities(controller: &mut ControllerClient<Channel>) -> Vec<i32> {
    test_support::serve::controller_capabilities(controller).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_detached_behind_kubernetes_back_leaves_its_published_nodes_until_attached_again()
{
    let (server, sock) = Server::acme("controller", "files", FILE_ATTACHER);
    let mut controller = controller_client(&sock).await;
    assert_eq!(
        capabilities(&mut controller).await,
        [
            Type::PublishUnpublishVolume as i32,
            Type::ListVolumes as i32,
            Type::ListVolumesPublishedNodes as i32
        ]
    );
    let (entries, _) = list_all_volumes(&mut controller, 0).await;
    assert!(entries.is_empty(), "{entries:?}");

    publish(&mut controller, "vol-b", "node-2").await;
    publish(&mut controller, "vol-a", "node-2").await;
    publish(&mut controller, "vol-a", "node-1").await;
    let (entries, pages) = list_all_volumes(&mut controller, 0).await;
    assert_eq!(pages, 1);
    assert_eq!(
        listed(&entries),
        [
            nodes("vol-a", &["node-1", "node-2"]),
            nodes("vol-b", &["node-2"])
        ]
    );
    let volume = entries[0].volume.as_ref().unwrap();
    assert_eq!(volume.volume_context, map(&[("server", "s1")]));
    assert_eq!(
        volume.capacity_bytes, 0,
        "a static volume's size is unknown"
    );
    assert_eq!(server.calls_of("isattached").len(), 3, "one check per node");

    // A page at a time, as csi-attacher's --max-entries does.
    let (paged, pages) = list_all_volumes(&mut controller, 1).await;
    assert_eq!((listed(&paged), pages), (listed(&entries), 2));

    // Detached behind Kubernetes' back: the driver's own detach, run by hand.
    let driver = test_support::executable_of(&server.plugin_dir, "acme~files");
    let detached = Command::new(&driver)
        .args(["detach", "vol-b", "node-2"])
        .output()
        .unwrap();
    assert!(detached.status.success(), "{detached:?}");
    let (entries, _) = list_all_volumes(&mut controller, 0).await;
    assert_eq!(
        listed(&entries),
        [nodes("vol-a", &["node-1", "node-2"]), nodes("vol-b", &[])],
        "the volume stays listed (flexd knows it), on no node"
    );
    let log = server.flexd_log();
    assert!(log.contains("no longer attached"), "{log}");

    // The CO's answer (csi-attacher's forced re-sync): ControllerPublish again, which must
    // attach again rather than answer from the record.
    let attaches = server.calls_of("attach").len();
    publish(&mut controller, "vol-b", "node-2").await;
    assert_eq!(server.calls_of("attach").len(), attaches + 1);
    let (entries, _) = list_all_volumes(&mut controller, 0).await;
    assert_eq!(listed(&entries)[1], nodes("vol-b", &["node-2"]));
    publish(&mut controller, "vol-b", "node-2").await;
    assert_eq!(
        server.calls_of("attach").len(),
        attaches + 1,
        "attached again once, then answered from the record as before"
    );

    // Detached through CSI: gone from the listing.
    controller
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: "vol-b".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let (entries, _) = list_all_volumes(&mut controller, 0).await;
    assert_eq!(listed(&entries), [nodes("vol-a", &["node-1", "node-2"])]);

    // Secrets reach no answer and no log.
    assert!(!format!("{entries:?}").contains("hunter2"));
    assert!(!server.flexd_log().contains("hunter2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_isattached_the_records_decide() {
    // `--mode both`: one node's whole plugin, which publishes to its own node (node-1) only.
    let (server, sock) = Server::acme("both", "blind", NO_ISATTACHED);
    let mut controller = controller_client(&sock).await;
    let caps = capabilities(&mut controller).await;
    assert!(
        caps.contains(&(Type::ListVolumesPublishedNodes as i32)),
        "{caps:?}"
    );
    publish(&mut controller, "vol-1", "node-1").await;
    let driver = test_support::executable_of(&server.plugin_dir, "acme~blind");
    let detached = Command::new(&driver)
        .args(["detach", "vol-1", "node-1"])
        .output()
        .unwrap();
    assert!(detached.status.success(), "{detached:?}");
    for _ in 0..2 {
        let (entries, _) = list_all_volumes(&mut controller, 0).await;
        assert_eq!(listed(&entries), [nodes("vol-1", &["node-1"])]);
    }
    // Asked once: Not supported is remembered, as for every call-out.
    assert_eq!(server.calls_of("isattached").len(), 1);
    let log = server.flexd_log();
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN") && l.contains("isattached")),
        "Not supported is not worth a warning:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_or_hanging_isattached_keeps_the_node_and_is_warned_about() {
    let (server, sock) = Server::acme("controller", "flaky", FLAKY_OR_STUCK);
    let mut controller = controller_client(&sock).await;
    publish(&mut controller, "flaky", "node-1").await;
    let stuck_nodes: Vec<String> = (0..10).map(|i| format!("node-{i:02}")).collect();
    for node in &stuck_nodes {
        publish(&mut controller, "stuck", node).await;
    }
    let all_nodes: Vec<&str> = stuck_nodes.iter().map(String::as_str).collect();
    let expected = [nodes("flaky", &["node-1"]), nodes("stuck", &all_nodes)];
    let stuck_checks = || {
        let calls = server.calls_of("isattached");
        calls
            .iter()
            .filter(|c| c[1].contains(r#""kubernetes.io/pvOrVolumeName":"stuck""#))
            .count()
    };

    // The client's deadline (csi-attacher's --timeout) is honoured: the answer comes before
    // it, with what the records say for every check that did not answer.
    let list_within = |deadline: Duration| {
        let mut controller = controller.clone();
        async move {
            let mut request = tonic::Request::new(csi::ListVolumesRequest::default());
            request.set_timeout(deadline);
            let answer = controller.list_volumes(request).await;
            // After the deadline tonic would answer DEADLINE_EXCEEDED instead.
            let answer = answer.expect("answered before the client's deadline");
            answer.into_inner()
        }
    };
    // Deadlines of seconds: the listing keeps 2 s of them to answer in, room on a loaded node.
    let page = list_within(Duration::from_secs(6)).await;
    assert_eq!(listed(&page.entries), expected);
    let log = server.flexd_log();
    assert!(log.contains("isattached failed"), "{log}");
    assert!(log.contains("backend unreachable"), "{log}");
    assert!(log.contains("did not answer"), "{log}");
    // At most 8 isattached of the driver at once (the slots of ListVolumes' checks).
    assert_eq!(stuck_checks(), 8);

    // The hanging ones still hold every slot: nothing more runs, the records answer.
    let page = list_within(Duration::from_secs(4)).await;
    assert_eq!(listed(&page.entries), expected);
    assert_eq!(stuck_checks(), 8);

    // Once the driver answers again, every node is checked (this listing waits for the slots
    // the released checks free).
    std::fs::write(server.release(), "").unwrap();
    let (entries, _) = list_all_volumes(&mut controller, 0).await;
    assert_eq!(listed(&entries), expected);
    assert_eq!(stuck_checks(), 8 + 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioned_volumes_are_listed_a_page_at_a_time_and_a_bad_token_is_aborted() {
    let server = Server::start_in_mode("controller", |plugins| {
        test_support::install_example(plugins, "tmpfs/tmpfs", "acme~tmpfs");
    });
    let mut controller = controller_client(&server.socket("flexvolume-acme--tmpfs")).await;
    assert_eq!(
        capabilities(&mut controller).await,
        [Type::CreateDeleteVolume as i32, Type::ListVolumes as i32],
        "no published nodes for a driver that does not attach"
    );
    for (name, mib) in [("pvc-c", 3), ("pvc-a", 1), ("pvc-b", 2)] {
        controller
            .create_volume(csi::CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: mib << 20,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![mount_capability("", "").unwrap()],
                secrets: map(&[("password", "hunter2")]),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let (entries, pages) = list_all_volumes(&mut controller, 1).await;
    assert_eq!(pages, 3);
    let volumes: Vec<(String, i64, String)> = entries
        .iter()
        .map(|e| {
            assert!(e.status.is_none(), "{e:?}");
            let v = e.volume.as_ref().unwrap();
            (
                v.volume_id.clone(),
                v.capacity_bytes,
                v.volume_context["size"].clone(),
            )
        })
        .collect();
    assert_eq!(
        volumes,
        [
            ("pvc-a".to_owned(), 1 << 20, "1m".to_owned()),
            ("pvc-b".to_owned(), 2 << 20, "2m".to_owned()),
            ("pvc-c".to_owned(), 3 << 20, "3m".to_owned()),
        ]
    );
    assert!(!format!("{entries:?}").contains("hunter2"));

    // A token stays good when the volume it names is deleted before the next page.
    let first = controller
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 2,
            starting_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.entries.len(), 2);
    controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: "pvc-b".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let rest = controller
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 2,
            starting_token: first.next_token,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed(&rest.entries), [("pvc-c".to_owned(), None)]);
    assert!(rest.next_token.is_empty());

    for (max_entries, token, code) in [
        (0, "invalid-token", Code::Aborted),
        (1, "after:zz", Code::Aborted),
        (-1, "", Code::InvalidArgument),
    ] {
        let answer = controller
            .list_volumes(csi::ListVolumesRequest {
                max_entries,
                starting_token: token.into(),
            })
            .await;
        assert_eq!(answer.unwrap_err().code(), code, "{max_entries} {token:?}");
    }
    assert!(!server.flexd_log().contains("hunter2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_without_a_controller_side_answers_list_volumes_unimplemented() {
    for mode in ["controller", "both"] {
        let init = test_support::init_case(r#"{"attach":false}"#);
        let (_server, sock) = Server::acme(mode, "plain", &init);
        let mut controller = controller_client(&sock).await;
        let answer = controller
            .list_volumes(csi::ListVolumesRequest::default())
            .await;
        assert_eq!(answer.unwrap_err().code(), Code::Unimplemented, "{mode}");
    }
}
