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

fn claim(ns: &str, name: &str, uid: &str, volume: &str) -> PersistentVolumeClaim {
    object(json!({
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": volume},
        "status": {"phase": "Bound"},
    }))
}

/// The claims the PVs' claimRefs name, each bound to its PV in return.
fn claims_of(pvs: &[PersistentVolume]) -> Vec<PersistentVolumeClaim> {
    pvs.iter()
        .filter_map(|pv| {
            let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
            Some(claim(
                r.namespace.as_deref()?,
                r.name.as_deref()?,
                r.uid.as_deref()?,
                pv.metadata.name.as_deref()?,
            ))
        })
        .collect()
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
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}")},
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
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}")},
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
    inv.persistent_volume_claims = claims_of(&inv.persistent_volumes);
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
    inv.persistent_volume_claims = claims_of(&inv.persistent_volumes);
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
    inv.persistent_volume_claims = claims_of(&inv.persistent_volumes);
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
    inv.persistent_volume_claims = claims_of(&inv.persistent_volumes);
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
    inv.persistent_volume_claims = claims_of(&inv.persistent_volumes);
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
    inv.persistent_volume_claims = claims_of(&inv.persistent_volumes);
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
    inv.persistent_volume_claims = claims_of(&inv.persistent_volumes);
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

/// A Released PV and a claim of its `claimRef`'s namespace and name, plus a Deployment using
/// that claim: what issue #51 found pulled into the PV's unit.
fn released_pv_and_a_claims_workload(claim_now: PersistentVolumeClaim) -> Inventory {
    let mut inv = cluster();
    let mut old = flex_pv("old-flex", "acme/nfs", Some(("shop", "data")));
    old.status = Some(object(json!({"phase": "Released"})));
    inv.persistent_volumes = vec![
        old,
        object(json!({
            "metadata": {"name": "new-csi", "uid": "uid-new-csi"},
            "spec": {
                "csi": {"driver": "flexvolume-acme--nfs", "volumeHandle": "new-csi"},
                "claimRef": {"namespace": "shop", "name": "data", "uid": "u"},
            },
        })),
    ];
    inv.persistent_volume_claims = vec![claim_now];
    inv.replica_sets = vec![replica_set("shop", "web-1234", "web")];
    inv.deployments = vec![deployment("shop", "web", claim_volume("data"))];
    inv.pods = vec![pod(
        "shop",
        "web-1234-a",
        Some(("ReplicaSet", "web-1234")),
        claim_volume("data"),
    )];
    inv
}

fn by_pv(name: &str) -> Selection {
    Selection {
        pvs: [name.to_owned()].into(),
        ..Selection::default()
    }
}

#[test]
fn a_stale_claim_ref_does_not_pull_in_the_workload_of_a_claim_bound_elsewhere() {
    // The claim old-flex's claimRef names (same uid), bound to another PV since.
    let inv = released_pv_and_a_claims_workload(claim("shop", "data", "u", "new-csi"));
    let plan = plan(&inv, &by_pv("old-flex"));
    assert_eq!(plan.refused, vec![]);
    assert_eq!(titles(&plan), ["PersistentVolume old-flex"]);
    let unit = &plan.units[0];
    assert!(
        unit.workloads.is_empty() && unit.pods.is_empty(),
        "{unit:?}"
    );
    assert_eq!(unit.pvs[0].claim, None);
    assert_eq!(
        plan.notes,
        [PlanNote {
            what: "PersistentVolume old-flex".into(),
            note: "its claimRef names claim shop/data, which is bound to PersistentVolume \
                   new-csi: planned without claim shop/data (its pods and workloads are not \
                   stopped with it)"
                .into(),
        }]
    );
    // Nor does the claim's workload or namespace select it.
    let web = Selection {
        workloads: [WorkloadRef::parse_flag("shop/deployment/web").unwrap()].into(),
        namespaces: ["shop".to_owned()].into(),
        ..Selection::default()
    };
    assert!(plan_of(&inv, &web).units.is_empty());
}

fn plan_of(inv: &Inventory, selection: &Selection) -> Plan {
    plan(inv, selection)
}

#[test]
fn a_claim_of_the_same_name_created_again_or_gone_is_not_joined_and_the_plan_says_why() {
    // Deleted and created again, bound to old-flex by name (volumeName): another claim.
    let inv = released_pv_and_a_claims_workload(claim("shop", "data", "u2", "old-flex"));
    let plan = plan(&inv, &by_pv("old-flex"));
    assert_eq!(titles(&plan), ["PersistentVolume old-flex"]);
    assert_eq!(plan.notes.len(), 1, "{:?}", plan.notes);
    assert!(
        plan.notes[0].note.starts_with(
            "its claimRef names claim shop/data with uid u, and the claim of that name has uid u2"
        ),
        "{}",
        plan.notes[0].note
    );

    let mut gone = released_pv_and_a_claims_workload(claim("shop", "data", "u", "old-flex"));
    gone.persistent_volume_claims.clear();
    let plan = plan_of(&gone, &by_pv("old-flex"));
    assert_eq!(titles(&plan), ["PersistentVolume old-flex"]);
    assert!(
        plan.notes[0]
            .note
            .starts_with("its claimRef names claim shop/data, which does not exist"),
        "{:?}",
        plan.notes
    );

    let mut pending = released_pv_and_a_claims_workload(claim("shop", "data", "u", ""));
    pending.persistent_volume_claims[0]
        .spec
        .as_mut()
        .unwrap()
        .volume_name = None;
    let plan = plan_of(&pending, &by_pv("old-flex"));
    assert_eq!(titles(&plan), ["PersistentVolume old-flex"]);
    assert!(
        plan.notes[0].note.contains("which is not bound to it"),
        "{:?}",
        plan.notes
    );
}

#[test]
fn a_claim_bound_to_its_pv_in_return_joins_it_and_the_unit_records_every_uid() {
    let inv = released_pv_and_a_claims_workload(claim("shop", "data", "u", "old-flex"));
    let plan = plan(&inv, &by_pv("old-flex"));
    assert_eq!(plan.notes, vec![]);
    assert_eq!(
        titles(&plan),
        ["Deployment shop/web, PersistentVolume old-flex"]
    );
    let unit = &plan.units[0];
    assert_eq!(unit.pvs[0].claim.as_deref(), Some("shop/data"));
    assert_eq!(
        unit.uids,
        BTreeMap::from([
            ("Deployment shop/web".to_owned(), "uid-shop-web".to_owned()),
            (
                "PersistentVolume old-flex".to_owned(),
                "uid-old-flex".to_owned()
            ),
        ])
    );

    // A claimRef without a uid (a PV pre-bound by hand) joins on the claim's volumeName alone.
    let mut prebound = inv.clone();
    let spec = prebound.persistent_volumes[0].spec.as_mut().unwrap();
    spec.claim_ref.as_mut().unwrap().uid = None;
    assert_eq!(
        titles(&plan_of(&prebound, &by_pv("old-flex"))),
        ["Deployment shop/web, PersistentVolume old-flex"]
    );
}

#[test]
fn an_object_without_a_uid_is_refused_with_its_unit() {
    let mut inv = cluster();
    let mut pv = flex_pv("nameless", "acme/nfs", None);
    pv.metadata.uid = None;
    inv.persistent_volumes = vec![pv];
    let plan = plan(&inv, &all());
    assert!(plan.units.is_empty(), "{:?}", titles(&plan));
    assert_eq!(plan.refused.len(), 1, "{:?}", plan.refused);
    assert_eq!(plan.refused[0].what, "PersistentVolume nameless");
    assert!(
        plan.refused[0].reason.starts_with("has no uid"),
        "{}",
        plan.refused[0].reason
    );
}
