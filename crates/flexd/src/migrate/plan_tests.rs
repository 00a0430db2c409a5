//! The plan from objects written as the API server returns them.

use serde_json::{json, Value};

use super::*;

fn object<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("a valid object")
}

fn flex_pv(name: &str, driver: &str, claim: Option<(&str, &str)>) -> PersistentVolume {
    let mut pv = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "uid": format!("uid-{name}")},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "flexVolume": {"driver": driver, "options": {"volumeID": name}},
        },
    });
    if let Some((ns, claim)) = claim {
        pv["spec"]["claimRef"] = json!({"namespace": ns, "name": claim, "uid": "u"});
    }
    object(pv)
}

fn csi_driver(name: &str, attach: bool) -> CSIDriver {
    object(json!({"metadata": {"name": name}, "spec": {"attachRequired": attach}}))
}

fn csi_node(node: &str, drivers: &[&str]) -> CSINode {
    let drivers: Vec<Value> = drivers
        .iter()
        .map(|d| json!({"name": d, "nodeID": node}))
        .collect();
    object(json!({"metadata": {"name": node}, "spec": {"drivers": drivers}}))
}

fn pod(ns: &str, name: &str, owner: Option<(&str, &str)>, volumes: Value) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c"}], "volumes": volumes},
        "status": {"phase": "Running"},
    });
    if let Some((kind, owner)) = owner {
        pod["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps/v1", "kind": kind, "name": owner, "uid": "x", "controller": true,
        }]);
    }
    object(pod)
}

fn claim_volume(claim: &str) -> Value {
    json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}])
}

fn replica_set(ns: &str, name: &str, deployment: &str) -> ReplicaSet {
    object(json!({
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "Deployment", "name": deployment, "uid": "d",
            "controller": true,
        }]},
        "spec": {"selector": {}},
    }))
}

fn deployment(ns: &str, name: &str, volumes: Value) -> Deployment {
    object(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "c"}], "volumes": volumes}}},
    }))
}

/// A cluster with two drivers served on node-a: acme/nfs (not attaching) and flexd/loop.
fn cluster() -> Inventory {
    Inventory {
        csi_drivers: vec![
            csi_driver("flexvolume-acme--nfs", false),
            csi_driver("flexvolume-flexd--loop", true),
        ],
        csi_nodes: vec![csi_node(
            "node-a",
            &["flexvolume-acme--nfs", "flexvolume-flexd--loop"],
        )],
        ..Inventory::default()
    }
}

fn all() -> Selection {
    Selection {
        all: true,
        ..Selection::default()
    }
}

fn titles(plan: &Plan) -> Vec<String> {
    plan.units.iter().map(Unit::title).collect()
}

#[test]
fn a_deployment_and_its_pv_are_one_unit_and_csi_pvs_are_left_alone() {
    let mut inv = cluster();
    inv.persistent_volumes = vec![
        flex_pv("pv-web", "acme/nfs", Some(("shop", "web-data"))),
        object(
            json!({"metadata": {"name": "already-csi"}, "spec": {"csi": {"driver": "x", "volumeHandle": "h"}}}),
        ),
    ];
    inv.replica_sets = vec![replica_set("shop", "web-1234", "web")];
    inv.deployments = vec![deployment("shop", "web", claim_volume("web-data"))];
    inv.pods = vec![pod(
        "shop",
        "web-1234-a",
        Some(("ReplicaSet", "web-1234")),
        claim_volume("web-data"),
    )];
    let plan = plan(&inv, &all());
    assert_eq!(plan.refused, vec![]);
    assert_eq!(
        titles(&plan),
        ["Deployment shop/web, PersistentVolume pv-web"]
    );
    let unit = &plan.units[0];
    assert_eq!(unit.pods, ["shop/web-1234-a"]);
    assert_eq!(unit.templates, Vec::<WorkloadRef>::new());
    let pv = &unit.pvs[0];
    assert_eq!(pv.csi_driver, "flexvolume-acme--nfs");
    assert_eq!(pv.claim.as_deref(), Some("shop/web-data"));
    assert!(!pv.attaches);
    assert_eq!(pv.reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(pv.nodes.iter().collect::<Vec<_>>(), ["node-a"]);
}

#[test]
fn workloads_sharing_a_volume_stop_together_and_others_apart() {
    let mut inv = cluster();
    inv.persistent_volumes = vec![
        flex_pv("shared", "flexd/loop", Some(("shop", "shared"))),
        flex_pv("alone", "flexd/loop", Some(("shop", "alone"))),
        flex_pv("unused", "acme/nfs", None),
    ];
    inv.pods = vec![
        pod(
            "shop",
            "db-0",
            Some(("StatefulSet", "db")),
            claim_volume("shared"),
        ),
        pod(
            "shop",
            "batch-0",
            Some(("StatefulSet", "batch")),
            claim_volume("shared"),
        ),
        pod(
            "shop",
            "cache-0",
            Some(("StatefulSet", "cache")),
            claim_volume("alone"),
        ),
    ];
    let plan = plan(&inv, &all());
    assert_eq!(plan.refused, vec![]);
    assert_eq!(
        titles(&plan),
        [
            "PersistentVolume unused",
            "StatefulSet shop/batch, StatefulSet shop/db, PersistentVolume shared",
            "StatefulSet shop/cache, PersistentVolume alone",
        ]
    );
    assert!(plan.units[1].pvs[0].attaches);
}

#[test]
fn a_selection_takes_whole_units() {
    let mut inv = cluster();
    inv.persistent_volumes = vec![
        flex_pv("a", "acme/nfs", Some(("one", "a"))),
        flex_pv("b", "acme/nfs", Some(("two", "b"))),
    ];
    inv.pods = vec![
        pod("one", "x-0", Some(("StatefulSet", "x")), claim_volume("a")),
        pod("two", "y-0", Some(("StatefulSet", "y")), claim_volume("b")),
    ];
    let by_pv = Selection {
        pvs: ["a".to_owned()].into(),
        ..Selection::default()
    };
    assert_eq!(
        titles(&plan(&inv, &by_pv)),
        ["StatefulSet one/x, PersistentVolume a"]
    );
    let by_namespace = Selection {
        namespaces: ["two".to_owned()].into(),
        ..Selection::default()
    };
    assert_eq!(
        titles(&plan(&inv, &by_namespace)),
        ["StatefulSet two/y, PersistentVolume b"]
    );
    let by_workload = Selection {
        workloads: [WorkloadRef::parse_flag("one/statefulset/x").unwrap()].into(),
        ..Selection::default()
    };
    assert_eq!(
        titles(&plan(&inv, &by_workload)),
        ["StatefulSet one/x, PersistentVolume a"]
    );
    assert!(plan(&inv, &Selection::default()).units.is_empty());
}

#[test]
fn what_flexd_cannot_stop_and_start_again_is_refused_with_its_whole_unit() {
    let mut inv = cluster();
    inv.persistent_volumes = vec![
        flex_pv("bare", "acme/nfs", Some(("ns", "bare"))),
        flex_pv("daemon", "acme/nfs", Some(("ns", "daemon"))),
        flex_pv("fine", "acme/nfs", Some(("ns", "fine"))),
    ];
    inv.pods = vec![
        pod("ns", "lonely", None, claim_volume("bare")),
        pod(
            "ns",
            "ds-abc",
            Some(("DaemonSet", "agent")),
            claim_volume("daemon"),
        ),
        pod(
            "ns",
            "fine-0",
            Some(("StatefulSet", "fine")),
            claim_volume("fine"),
        ),
    ];
    let plan = plan(&inv, &all());
    assert_eq!(
        titles(&plan),
        ["StatefulSet ns/fine, PersistentVolume fine"]
    );
    let refused: Vec<(&str, &str)> = plan
        .refused
        .iter()
        .map(|r| (r.what.as_str(), r.reason.as_str()))
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert_eq!(refused[0].0, "Pod ns/ds-abc");
    assert!(refused[0].1.contains("DaemonSet agent"), "{}", refused[0].1);
    assert_eq!(refused[1].0, "Pod ns/lonely");
    assert!(refused[1].1.contains("bare Pod"), "{}", refused[1].1);
}

#[test]
fn a_driver_flexd_does_not_serve_is_refused() {
    let mut inv = cluster();
    // No CSIDriver for other/drv; flexd/loop's not registered on node-b.
    inv.csi_nodes
        .push(csi_node("node-b", &["flexvolume-acme--nfs"]));
    inv.persistent_volumes = vec![
        flex_pv("unknown", "other/drv", None),
        flex_pv("elsewhere", "flexd/loop", Some(("ns", "elsewhere"))),
    ];
    let mut on_b = pod(
        "ns",
        "app-0",
        Some(("StatefulSet", "app")),
        claim_volume("elsewhere"),
    );
    on_b.spec.as_mut().unwrap().node_name = Some("node-b".into());
    inv.pods = vec![on_b];
    let plan = plan(&inv, &all());
    assert!(plan.units.is_empty(), "{:?}", titles(&plan));
    let text: Vec<String> = plan
        .refused
        .iter()
        .map(|r| format!("{}: {}", r.what, r.reason))
        .collect();
    assert!(
        text.iter()
            .any(|t| t.starts_with("PersistentVolume unknown: no CSIDriver flexvolume-other--drv")),
        "{text:?}"
    );
    assert!(
        text.iter().any(|t| t.starts_with(
            "Pod ns/app-0: runs on node node-b, where flexd does not serve driver flexd/loop"
        )),
        "{text:?}"
    );
}

#[test]
fn inline_volumes_go_through_the_template_and_attaching_ones_are_refused() {
    let mut inv = cluster();
    let inline = |driver: &str| json!([{"name": "v", "flexVolume": {"driver": driver, "options": {"volumeID": "x"}}}]);
    inv.deployments = vec![
        deployment("ns", "inline", inline("acme/nfs")),
        deployment("ns", "attaching", inline("flexd/loop")),
        deployment("ns", "plain", json!([{"name": "e", "emptyDir": {}}])),
    ];
    inv.replica_sets = vec![replica_set("ns", "inline-1", "inline")];
    inv.pods = vec![pod(
        "ns",
        "inline-1-a",
        Some(("ReplicaSet", "inline-1")),
        inline("acme/nfs"),
    )];
    let plan = plan(&inv, &all());
    assert_eq!(titles(&plan), ["Deployment ns/inline"]);
    assert_eq!(plan.units[0].templates, plan.units[0].workloads);
    assert_eq!(plan.units[0].pods, ["ns/inline-1-a"]);
    assert_eq!(plan.refused.len(), 1, "{:?}", plan.refused);
    assert_eq!(plan.refused[0].what, "Deployment ns/attaching");
    assert!(
        plan.refused[0].reason.contains("attaches"),
        "{}",
        plan.refused[0].reason
    );
}

#[test]
fn finished_pods_do_not_count() {
    let mut inv = cluster();
    inv.persistent_volumes = vec![flex_pv("done", "acme/nfs", Some(("ns", "done")))];
    let mut finished = pod("ns", "job-x", None, claim_volume("done"));
    finished.status.as_mut().unwrap().phase = Some("Succeeded".into());
    inv.pods = vec![finished];
    let plan = plan(&inv, &all());
    assert_eq!(plan.refused, vec![]);
    assert_eq!(titles(&plan), ["PersistentVolume done"]);
}

#[test]
fn workload_names_read_back_and_bad_flags_say_why() {
    let w = WorkloadRef::parse_flag("shop/StatefulSet/db").unwrap();
    assert_eq!(w.to_string(), "StatefulSet shop/db");
    assert_eq!("StatefulSet shop/db".parse::<WorkloadRef>().unwrap(), w);
    assert!(WorkloadRef::parse_flag("shop/daemonset/x")
        .unwrap_err()
        .contains("daemonset"));
    assert!(WorkloadRef::parse_flag("shop/db").is_err());
    assert!(WorkloadRef::parse_flag("/deployment/x").is_err());
}

#[test]
fn bare_pods_are_recreated_when_asked_and_their_attaching_inline_volumes_still_refused() {
    let mut inv = cluster();
    inv.persistent_volumes = vec![flex_pv("data", "acme/nfs", Some(("ns", "data")))];
    let inline = |driver: &str| json!([{"name": "v", "flexVolume": {"driver": driver}}]);
    inv.pods = vec![
        pod("ns", "lonely", None, claim_volume("data")),
        pod("ns", "scratch", None, inline("acme/nfs")),
        pod("ns", "disk", None, inline("flexd/loop")),
    ];
    let refused_without = plan(&inv, &all());
    assert!(refused_without.units.is_empty());
    assert_eq!(
        refused_without.refused.len(),
        3,
        "{:?}",
        refused_without.refused
    );
    assert!(refused_without
        .refused
        .iter()
        .all(|r| r.reason.contains("--recreate-pods")));

    let recreate = Selection {
        recreate_pods: true,
        ..all()
    };
    let plan = plan(&inv, &recreate);
    assert_eq!(
        titles(&plan),
        ["Pod ns/lonely, PersistentVolume data", "Pod ns/scratch"]
    );
    assert_eq!(plan.units[0].bare_pods, ["ns/lonely"]);
    assert_eq!(plan.refused.len(), 1, "{:?}", plan.refused);
    assert_eq!(plan.refused[0].what, "Pod ns/disk");
    assert!(
        plan.refused[0].reason.contains("attaches"),
        "{}",
        plan.refused[0].reason
    );
}
