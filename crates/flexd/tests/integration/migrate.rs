//! `flexd migrate`: every object kind and every refusal with its exact output (through the
//! library's conversion and through the real binary), and the promise that matters most, end
//! to end as root: data written through `flexd volume mount -f old-pv.yaml` with the builtin
//! loop driver is read back through a real `flexd serve` by a gRPC client doing kubelet's
//! ControllerPublish, NodeStage and NodePublish with nothing but the migrated PV's `csi` fields.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;
use std::process::{Output, Stdio};

use flexd::migrate::{migrate, Migration, Reason};
use flexvolume_host::DriverName;
use serde_json::{json, Value};
use test_support::serve::{controller_client, csi, node_client, Server};
use test_support::{
    flexd_command, install_example, is_mounted, ok, output_of_new_executable, Sandbox, TMPFS_DRIVER,
};

/// acme/block attaches, acme/nfs and acme/tmpfs do not; anything else is unknown.
fn attaches(driver: &DriverName) -> Result<bool, String> {
    match driver.as_str() {
        "acme/block" => Ok(true),
        "acme/nfs" | "acme/tmpfs" => Ok(false),
        _ => Err("not installed".into()),
    }
}

fn converted(text: &str) -> Migration {
    migrate(text, &mut attaches).unwrap_or_else(|refusals| {
        panic!(
            "refused: {:?}",
            refusals.iter().map(|r| r.to_string()).collect::<Vec<_>>()
        )
    })
}

fn refusals(text: &str) -> Vec<String> {
    match migrate(text, &mut attaches) {
        Ok(m) => panic!("converted: {:?}", m.objects),
        Err(refusals) => refusals.iter().map(|r| r.to_string()).collect(),
    }
}

fn notes(m: &Migration) -> Vec<String> {
    m.notes.iter().map(|n| n.to_string()).collect()
}

const OLD_PV: &str = r#"apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv-data
  uid: 0d2c
  resourceVersion: "4711"
  creationTimestamp: "2024-01-02T03:04:05Z"
  labels: {tier: db}
  annotations:
    pv.kubernetes.io/bound-by-controller: "yes"
    kubectl.kubernetes.io/last-applied-configuration: '{"kind":"PersistentVolume"}'
  finalizers: [kubernetes.io/pv-protection]
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: flex
  mountOptions: [noatime]
  volumeMode: Filesystem
  claimRef: {kind: PersistentVolumeClaim, namespace: prod, name: data, uid: 9a1f, apiVersion: v1, resourceVersion: "12"}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: kubernetes.io/hostname, operator: In, values: [node-1]}
  flexVolume:
    driver: acme/nfs
    fsType: ext4
    readOnly: true
    secretRef: {name: nfs-creds, namespace: storage}
    options: {server: nfs.example, share: /exports/data}
status: {phase: Bound}
"#;

/// The exact text printed for OLD_PV: everything kept but the flexVolume and what the API
/// server owns.
const NEW_PV: &str = r#"apiVersion: v1
kind: PersistentVolume
metadata:
  annotations:
    pv.kubernetes.io/bound-by-controller: "yes"
  finalizers:
  - kubernetes.io/pv-protection
  labels:
    tier: db
  name: pv-data
spec:
  accessModes:
  - ReadWriteOnce
  capacity:
    storage: "10Gi"
  claimRef:
    apiVersion: v1
    kind: PersistentVolumeClaim
    name: data
    namespace: prod
    resourceVersion: "12"
    uid: "9a1f"
  csi:
    driver: flexvolume-acme--nfs
    fsType: ext4
    nodePublishSecretRef:
      name: nfs-creds
      namespace: storage
    readOnly: true
    volumeAttributes:
      server: nfs.example
      share: "/exports/data"
    volumeHandle: pv-data
  mountOptions:
  - noatime
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - key: kubernetes.io/hostname
          operator: In
          values:
          - node-1
  persistentVolumeReclaimPolicy: Retain
  storageClassName: flex
  volumeMode: Filesystem
"#;

#[test]
fn a_flex_volume_pv_becomes_a_csi_pv_keeping_everything_else() {
    let m = converted(OLD_PV);
    assert_eq!(m.to_yaml(), NEW_PV);
    assert_eq!(
        notes(&m),
        ["document 1, PersistentVolume pv-data: migrated: driver acme/nfs is CSI driver flexvolume-acme--nfs"]
    );
}

/// Strings a YAML 1.1 reader (kubectl) would take for booleans, numbers or nulls are quoted,
/// and the printed text reads back as the very objects.
#[test]
fn printed_yaml_is_unambiguous_and_reads_back_as_the_objects() {
    let odd = [
        "yes",
        "On",
        "N",
        "null",
        "0777",
        "1_000",
        "12:30",
        "",
        "a: b",
        "- x",
        "#c",
        "multi\nline",
        "tab\there",
        "\"q\"",
        "~",
        ".inf",
        "plain-word/ok_1.2",
    ];
    let options: serde_json::Map<String, Value> = odd
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("k{i}"), json!(v)))
        .collect();
    let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "odd", "annotations": {"on": "off", "n": "y"}},
        "spec": {"mountOptions": ["yes", "nested"], "flexVolume": {"driver": "acme/nfs", "options": options}}});
    let m = converted(&pv.to_string());
    let text = m.to_yaml();
    assert!(text.contains("\n    \"on\": \"off\"\n"), "{text}");
    assert!(text.contains("\n      k0: \"yes\"\n"), "{text}");
    assert!(text.contains("\n      k16: plain-word/ok_1.2\n"), "{text}");
    assert!(text.contains("\n  - \"yes\"\n"), "{text}");
    let back: Value = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(back, m.objects[0]);
    assert_eq!(back["spec"]["csi"]["volumeAttributes"]["k0"], "yes");
}

/// Generated objects (nested maps and lists, strings of YAML's special characters, controls,
/// line breaks, non-ASCII) print as YAML that reads back as the same value.
#[test]
fn generated_values_round_trip_through_the_printed_yaml() {
    const PIECES: [&str; 24] = [
        "a", "Z", "0", "7", ".", "-", "_", "/", ":", " ", "#", "'", "\"", "\\", "\n", "\t",
        "\u{7f}", "\u{85}", "\u{a0}", "\u{2028}", "\u{feff}", "é", "yes", "~",
    ];
    let mut seed: u64 = 0x5eed;
    let mut next = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    fn generate(next: &mut dyn FnMut(usize) -> usize, depth: usize) -> Value {
        let text = |next: &mut dyn FnMut(usize) -> usize| -> String {
            (0..next(6)).map(|_| PIECES[next(PIECES.len())]).collect()
        };
        match if depth == 0 { next(4) } else { next(6) } {
            0 => Value::String(text(next)),
            1 => json!(next(2000) as i64 - 1000),
            2 => json!(next(2) == 0),
            3 => Value::Null,
            4 => (0..next(4))
                .map(|_| (text(next), generate(next, depth - 1)))
                .collect::<serde_json::Map<_, _>>()
                .into(),
            _ => (0..next(4))
                .map(|_| generate(next, depth - 1))
                .collect::<Vec<_>>()
                .into(),
        }
    }
    for _ in 0..2000 {
        let value = generate(&mut next, 4);
        let text = flexd::migrate::to_yaml(&value);
        let back: Value =
            serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{value}\n{text}\n{e}"));
        assert_eq!(back, value, "{text}");
    }
}

#[test]
fn a_pv_secret_without_namespace_is_named_in_its_claims_namespace() {
    let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-2"},
        "spec": {"claimRef": {"namespace": "prod", "name": "c"},
                 "flexVolume": {"driver": "acme/nfs", "secretRef": {"name": "creds"}}}});
    let m = converted(&pv.to_string());
    assert_eq!(
        m.objects,
        [
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-2"},
            "spec": {"claimRef": {"namespace": "prod", "name": "c"},
                     "csi": {"driver": "flexvolume-acme--nfs", "volumeHandle": "pv-2",
                             "nodePublishSecretRef": {"name": "creds", "namespace": "prod"}}}})
        ]
    );
    assert_eq!(
        notes(&m)[0],
        "document 1, PersistentVolume pv-2: secret \"creds\" has no namespace: named in \"prod\", its claim's namespace, where FlexVolume read it (the pod's)"
    );
}

#[test]
fn a_reader_only_first_access_mode_is_noted() {
    let m = converted(&pv(
        "ro",
        json!({"accessModes": ["ReadOnlyMany", "ReadWriteOnce"], "flexVolume": {"driver": "acme/nfs"}}),
    ));
    assert_eq!(
        notes(&m),
        [
            "document 1, PersistentVolume ro: accessModes starts with ReadOnlyMany: the driver now gets kubernetes.io/readwrite ro",
            "document 1, PersistentVolume ro: migrated: driver acme/nfs is CSI driver flexvolume-acme--nfs",
        ]
    );
    let m = converted(&pv(
        "ro",
        json!({"accessModes": ["ReadOnlyMany"], "flexVolume": {"driver": "acme/nfs", "readOnly": true}}),
    ));
    assert_eq!(m.notes.len(), 1);
}

/// An attaching driver's PV converts like any other (the attach is ControllerPublish, which
/// gets no secret, as FlexVolume's attach got none).
#[test]
fn an_attaching_drivers_pv_converts_without_a_controller_publish_secret() {
    let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "disk-1"},
        "spec": {"flexVolume": {"driver": "acme/block", "secretRef": {"name": "k", "namespace": "s"}}}});
    let m = converted(&pv.to_string());
    assert_eq!(
        m.objects[0]["spec"]["csi"],
        json!({"driver": "flexvolume-acme--block", "volumeHandle": "disk-1",
               "nodePublishSecretRef": {"name": "k", "namespace": "s"}})
    );
}

fn pod_spec(volumes: Value) -> Value {
    json!({"containers": [{"name": "c", "image": "busybox"}], "volumes": volumes})
}

/// The object of `kind` around a pod spec, as `kubectl get -o json` would print it.
fn workload(api_version: &str, kind: &str, spec: Value, server_fields: bool) -> Value {
    let spec = match kind {
        "Pod" => spec,
        "Deployment" | "DaemonSet" => json!({"selector": {"matchLabels": {"app": "w"}},
            "template": {"metadata": {"labels": {"app": "w"}}, "spec": spec}}),
        "StatefulSet" => json!({"selector": {"matchLabels": {"app": "w"}}, "serviceName": "w",
            "template": {"metadata": {"labels": {"app": "w"}}, "spec": spec}}),
        "Job" => json!({"template": {"spec": spec}}),
        "CronJob" => {
            json!({"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": {"spec": spec}}}})
        }
        _ => unreachable!(),
    };
    let mut object = json!({"apiVersion": api_version, "kind": kind,
        "metadata": {"name": "w", "namespace": "prod"}, "spec": spec});
    if server_fields {
        object["metadata"]["resourceVersion"] = json!("99");
        object["metadata"]["uid"] = json!("u-1");
        object["metadata"]["generation"] = json!(3);
        object["status"] = json!({});
    }
    object
}

const KINDS: [(&str, &str); 6] = [
    ("v1", "Pod"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "DaemonSet"),
    ("batch/v1", "Job"),
    ("batch/v1", "CronJob"),
];

#[test]
fn an_inline_flex_volume_becomes_an_inline_csi_volume_in_every_kind() {
    let old = json!([
        {"name": "cache", "flexVolume": {"driver": "acme/tmpfs", "fsType": "tmpfs", "readOnly": true,
            "secretRef": {"name": "s"}, "options": {"size": "1Mi"}}},
        {"name": "plain", "flexVolume": {"driver": "acme/nfs"}},
        {"name": "scratch", "emptyDir": {}}
    ]);
    let new = json!([
        {"name": "cache", "csi": {"driver": "flexvolume-acme--tmpfs", "fsType": "tmpfs", "readOnly": true,
            "nodePublishSecretRef": {"name": "s"}, "volumeAttributes": {"size": "1Mi"}}},
        {"name": "plain", "csi": {"driver": "flexvolume-acme--nfs"}},
        {"name": "scratch", "emptyDir": {}}
    ]);
    for (api_version, kind) in KINDS {
        let input = workload(api_version, kind, pod_spec(old.clone()), true);
        let m = converted(&input.to_string());
        let expected = workload(api_version, kind, pod_spec(new.clone()), false);
        assert_eq!(m.objects, [expected], "{kind}");
        assert_eq!(
            notes(&m),
            [
                format!("document 1, {kind} prod/w: migrated: volume \"cache\": driver acme/tmpfs is CSI driver flexvolume-acme--tmpfs; its kubernetes.io/pvOrVolumeName becomes kubelet's per-pod volume id"),
                format!("document 1, {kind} prod/w: migrated: volume \"plain\": driver acme/nfs is CSI driver flexvolume-acme--nfs; its kubernetes.io/pvOrVolumeName becomes kubelet's per-pod volume id"),
            ],
            "{kind}"
        );
    }
}

#[test]
fn only_objects_with_a_flex_volume_are_printed_and_the_rest_are_named_as_skipped() {
    let text = format!(
        "---\n{}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cfg, namespace: prod}}\n---\n{}\n---\n{}\n---\n",
        workload("apps/v1", "Deployment", pod_spec(json!([{"name": "e", "emptyDir": {}}])), false),
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-1", "namespace": "prod",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "w-5d", "uid": "r", "controller": true}]},
            "spec": pod_spec(json!([{"name": "v", "flexVolume": {"driver": "acme/block"}}]))}),
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "w-5d", "namespace": "prod",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "w", "uid": "d", "controller": true}]},
            "spec": {"template": {"spec": pod_spec(json!([{"name": "v", "flexVolume": {"driver": "acme/block"}}]))}}}),
    );
    let m = converted(&text);
    assert!(m.objects.is_empty(), "{:?}", m.objects);
    assert_eq!(m.to_yaml(), "");
    assert_eq!(
        notes(&m),
        [
            "document 1, Deployment prod/w: skipped: no flexVolume",
            "document 2, ConfigMap prod/cfg: skipped: no flexVolume",
            "document 3, Pod prod/w-1: skipped: owned by ReplicaSet w-5d; migrate that",
            "document 4, ReplicaSet prod/w-5d: skipped: owned by Deployment w; migrate that",
        ]
    );
}

#[test]
fn a_list_is_unpacked_and_its_objects_printed_one_document_each() {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "a"},
         "spec": {"flexVolume": {"driver": "acme/nfs"}}},
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "b"},
         "spec": {"hostPath": {"path": "/x"}}},
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "c"},
         "spec": {"flexVolume": {"driver": "acme/tmpfs", "options": {"k": "v"}}}}
    ]});
    let m = converted(&serde_json::to_string_pretty(&list).unwrap());
    assert_eq!(
        m.to_yaml(),
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: a\nspec:\n  csi:\n    driver: flexvolume-acme--nfs\n    volumeHandle: a\n---\napiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: c\nspec:\n  csi:\n    driver: flexvolume-acme--tmpfs\n    volumeAttributes:\n      k: v\n    volumeHandle: c\n"
    );
    assert_eq!(m.to_json_list()["kind"], "List");
    let mut api_list = list.clone();
    api_list["kind"] = json!("PersistentVolumeList");
    assert_eq!(converted(&api_list.to_string()).objects, m.objects);
    assert_eq!(m.to_json_list()["items"].as_array().unwrap().len(), 2);
    assert_eq!(
        notes(&m)[1],
        "document 1, PersistentVolume b: skipped: no flexVolume"
    );
}

fn pv(name: &str, spec: Value) -> String {
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec})
        .to_string()
}

fn pod(volumes: Value) -> String {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "prod"},
        "spec": pod_spec(volumes)})
    .to_string()
}

#[test]
fn every_refusal_says_where_and_why() {
    let long_name = format!(
        "document 1, PersistentVolume x: the CSI name of driver acme/{} would be 77 characters; CSI allows 63",
        "n".repeat(60)
    );
    let too_long_name = format!(
        "document 1, PersistentVolume {}: the name is 129 bytes and becomes the volume handle, which flexd serve takes up to 128 bytes (CSI's limit)",
        "p".repeat(129)
    );
    let cases: Vec<(String, &str)> = vec![
        ("a: [b\n".into(), "document 1: is not YAML or JSON: "),
        ("just text\n".into(), "document 1: is not a Kubernetes object (no apiVersion and kind)"),
        (
            r#"{"apiVersion":"v1","kind":"List","items":{"a":1}}"#.into(),
            "document 1, List: is not a valid List: items is not a list",
        ),
        (
            r#"{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"x"},"spec":{"capacity":7}}"#.into(),
            "document 1, PersistentVolume x: is not a valid PersistentVolume: ",
        ),
        (
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {},
                "spec": {"flexVolume": {"driver": "acme/nfs"}}}).to_string(),
            "document 1, PersistentVolume (no name): has no metadata.name (a migrated PersistentVolume's volumeHandle is its name)",
        ),
        (
            pv("x", json!({"flexVolume": {"driver": "../evil"}})),
            "document 1, PersistentVolume x: flexVolume.driver \"../evil\" is not a driver name: ",
        ),
        (
            pv("x", json!({"flexVolume": {"driver": format!("acme/{}", "n".repeat(60))}})),
            &long_name,
        ),
        (
            pod(json!([{"name": "disk", "flexVolume": {"driver": "acme/block"}}])),
            "document 1, Pod prod/p, volume \"disk\": driver acme/block attaches, and an inline CSI volume cannot be attached (kubelet never calls ControllerPublish for it); make it a PersistentVolume and claim it",
        ),
        (
            pod(json!([{"name": "v", "flexVolume": {"driver": "other/x"}}])),
            "document 1, Pod prod/p, volume \"v\": cannot tell whether driver other/x attaches (not installed); install it in the plugin dir or say --attaching other/x or --not-attaching other/x",
        ),
        (
            pv("x", json!({"flexVolume": {"driver": "acme/nfs", "options": {"csi.storage.k8s.io/pod.name": "p"}}})),
            "document 1, PersistentVolume x: option \"csi.storage.k8s.io/pod.name\" would not reach the driver: flexd serve takes csi.storage.k8s.io/ keys as kubelet's pod information",
        ),
        (
            pv(&"p".repeat(129), json!({"flexVolume": {"driver": "acme/nfs"}})),
            &too_long_name,
        ),
        (
            pv("x", json!({"flexVolume": {"driver": "acme/nfs", "options": {"k": "v".repeat(3335)}}})),
            "document 1, PersistentVolume x: the options are 3336 bytes (keys and values); with kubelet's pod information (up to 761) they must fit in the 4096 bytes of volume context flexd serve accepts, so at most 3335",
        ),
        (
            pod(json!([{"name": "v", "flexVolume": {"driver": "acme/tmpfs", "options": {"k": "v".repeat(4000)}}}])),
            "document 1, Pod prod/p, volume \"v\": the options are 4001 bytes",
        ),
        (
            pv("x", json!({"flexVolume": {"driver": "acme/nfs", "secretRef": {"namespace": "s"}}})),
            "document 1, PersistentVolume x: flexVolume.secretRef has no name",
        ),
        (
            pv("x", json!({"flexVolume": {"driver": "acme/nfs", "secretRef": {"name": "creds"}}})),
            "document 1, PersistentVolume x: flexVolume.secretRef \"creds\" has no namespace and the PersistentVolume has no claimRef: FlexVolume read it from the pod's namespace, CSI needs it named (set secretRef.namespace)",
        ),
        (
            pv("x", json!({"volumeMode": "Block", "flexVolume": {"driver": "acme/nfs"}})),
            "document 1, PersistentVolume x: volumeMode is Block: FlexVolume drivers mount filesystems, and flexd serve refuses block access",
        ),
        (
            pv("x", json!({"flexVolume": {"driver": "acme/nfs"}, "csi": {"driver": "d", "volumeHandle": "h"}})),
            "document 1, PersistentVolume x: has both flexVolume and csi",
        ),
        (
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs", "namespace": "prod"},
                "spec": {"template": {"spec": pod_spec(json!([{"name": "v", "flexVolume": {"driver": "acme/nfs"}}]))}}}).to_string(),
            "document 1, ReplicaSet prod/rs: holds a flexVolume, and flexd migrate does not convert a ReplicaSet; convert its owner or write the csi volume by hand",
        ),
    ];
    for (text, expected) in cases {
        let got = refusals(&text);
        assert_eq!(got.len(), 1, "{text}: {got:?}");
        assert!(
            got[0].starts_with(expected),
            "{text}:\n{}\n{expected}",
            got[0]
        );
    }
}

/// The limits are flexd serve's, not stricter: at them, everything converts.
#[test]
fn a_name_and_options_at_serves_limits_convert() {
    let name = "p".repeat(128);
    let m = converted(&pv(
        &name,
        json!({"flexVolume": {"driver": "acme/nfs", "options": {"k": "v".repeat(3334)}}}),
    ));
    assert_eq!(m.objects[0]["spec"]["csi"]["volumeHandle"], json!(name));
}

/// One refusal anywhere: every refusal is reported and no object at all is returned.
#[test]
fn nothing_is_half_converted() {
    let text = format!(
        "{}\n---\n{}\n---\n{}\n",
        pv("good", json!({"flexVolume": {"driver": "acme/nfs"}})),
        pod(json!([
            {"name": "ok", "flexVolume": {"driver": "acme/tmpfs"}},
            {"name": "disk", "flexVolume": {"driver": "acme/block"}}
        ])),
        pv(
            "bad",
            json!({"flexVolume": {"driver": "acme/nfs", "secretRef": {"name": "c"}}})
        ),
    );
    let Err(refusals) = migrate(&text, &mut attaches) else {
        panic!("converted")
    };
    let where_: Vec<_> = refusals
        .iter()
        .map(|r| (r.document, r.volume.clone(), r.reason.clone()))
        .collect();
    assert_eq!(
        where_,
        [
            (
                2,
                Some("disk".to_owned()),
                Reason::InlineAttaching {
                    driver: "acme/block".into()
                }
            ),
            (3, None, Reason::SecretNamespaceUnknown { name: "c".into() }),
        ]
    );
}

/// A driver is asked about once per volume that needs to know, and never for a PV.
#[test]
fn only_inline_volumes_ask_whether_a_driver_attaches() {
    let mut asked = Vec::new();
    let text = format!(
        "{}\n---\n{}\n",
        pv("a", json!({"flexVolume": {"driver": "acme/nfs"}})),
        pod(json!([{"name": "v", "flexVolume": {"driver": "acme/tmpfs"}}])),
    );
    migrate(&text, &mut |d: &DriverName| {
        asked.push(d.to_string());
        Ok(false)
    })
    .unwrap();
    assert_eq!(asked, ["acme/tmpfs"]);
}

// ---- the binary ----

/// A sandbox whose plugin dir has acme/tmpfs (does not attach) and acme/block (the attachable
/// example).
fn with_examples() -> Sandbox {
    let sandbox = Sandbox::new();
    install_example(&sandbox.plugin(), "tmpfs/tmpfs", "acme~tmpfs");
    install_example(&sandbox.plugin(), "attachable/attachable", "acme~block");
    sandbox
}

/// `flexd --plugin-dir <plugins> <args>` with `stdin` written to it.
fn flexd(plugins: &Path, args: &[&str], stdin: &str) -> Output {
    let mut child = flexd_command(plugins)
        .args(["--driver-max-processes", "0"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `flexd migrate -f -` of `input`, which must exit with `code`: what it said on stderr. A
/// refused migration (any code but 0) prints nothing.
fn migrate_said(sandbox: &Sandbox, input: &str, code: i32) -> String {
    let out = flexd(&sandbox.plugin(), &["migrate", "-f", "-"], input);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    if code != 0 {
        assert_eq!(text(&out.stdout), "", "{stderr}");
    }
    stderr
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_binary_probes_the_plugin_dir_and_prints_nothing_when_anything_is_refused() {
    let sandbox = with_examples();
    let plugins = sandbox.plugin();
    let input = format!(
        "{}\n---\n{}\n",
        pv("pv-1", json!({"flexVolume": {"driver": "acme/block"}})),
        pod(json!([{"name": "disk", "flexVolume": {"driver": "acme/block"}}])),
    );
    let out = flexd(&plugins, &["migrate", "-f", "-"], &input);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        text(&out.stderr),
        "flexd: cannot migrate document 2, Pod prod/p, volume \"disk\": driver acme/block attaches, and an inline CSI volume cannot be attached (kubelet never calls ControllerPublish for it); make it a PersistentVolume and claim it\n\
         flexd: error: cannot migrate -: 1 problem above; nothing was printed\n"
    );

    // The probed driver that does not attach converts; the flags need no driver installed.
    let input = format!(
        "{}\n---\n{}\n",
        pod(json!([{"name": "t", "flexVolume": {"driver": "acme/tmpfs"}}])),
        pod(json!([{"name": "n", "flexVolume": {"driver": "acme/nfs"}}])),
    );
    let file = sandbox.write("in.yaml", &input);
    let file = file.to_str().unwrap();
    let out = flexd(
        &plugins,
        &[
            "-o",
            "json",
            "migrate",
            "-f",
            file,
            "--not-attaching",
            "acme/nfs",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(
        list["items"][0]["spec"]["volumes"][0],
        json!({"name": "t", "csi": {"driver": "flexvolume-acme--tmpfs"}})
    );
    assert_eq!(
        list["items"][1]["spec"]["volumes"][0],
        json!({"name": "n", "csi": {"driver": "flexvolume-acme--nfs"}})
    );

    // Not installed and not said: refused with what to do.
    let out = flexd(&plugins, &["migrate", "-f", file], "");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "");
    assert!(
        text(&out.stderr).contains("cannot tell whether driver acme/nfs attaches (no plugin"),
        "{}",
        text(&out.stderr)
    );
    // --attaching wins over the probe.
    let out = flexd(
        &plugins,
        &[
            "migrate",
            "-f",
            file,
            "--attaching",
            "acme/tmpfs",
            "--not-attaching",
            "acme/nfs",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("driver acme/tmpfs attaches, and an inline CSI volume"));
}

#[test]
fn the_binary_refuses_deep_nesting_before_parsing_it() {
    let sandbox = Sandbox::new();
    // 100,000 levels (500 KB): libyaml's scanner alone took 38 s over this in a release build.
    let levels = 100_000;
    let input = format!(
        "{}\n---\napiVersion: v1\nkind: Pod\nmetadata: {}x{}\n",
        pv("pv-1", json!({"flexVolume": {"driver": "acme/nfs"}})),
        "{a: ".repeat(levels),
        "}".repeat(levels)
    );
    let stderr = migrate_said(&sandbox, &input, 1);
    // The PV is one line of JSON: the Pod's metadata is on line 5.
    assert!(
        stderr.starts_with(&format!(
            "flexd: cannot migrate document 2: nests {{…}} or […] deeper than 128 levels at line 5 column {} (the YAML parser's limit",
            "metadata: ".len() + 128 * "{a: ".len() + 1
        )),
        "{stderr}"
    );
    // JSON too: serde_json, which reads JSON first, stops at its own limit of 128.
    let input = format!(
        "{}1{}",
        "{\"a\": [".repeat(levels / 2),
        "]}".repeat(levels / 2)
    );
    let stderr = migrate_said(&sandbox, &input, 1);
    assert!(
        stderr.starts_with("flexd: cannot migrate document 1: nests {…} or […] deeper than 128 levels at line 1 column 449 "),
        "{stderr}"
    );
    // At the limit it parses (and is skipped: no flexVolume).
    let input = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: s, x: {}1{}}}\n",
        "[".repeat(126),
        "]".repeat(126)
    );
    let stderr = migrate_said(&sandbox, &input, 0);
    assert_eq!(
        stderr,
        "flexd: document 1, Secret s: skipped: no flexVolume\n"
    );
}

#[test]
fn the_binary_refuses_a_key_given_twice() {
    let sandbox = Sandbox::new();
    // Read as the last `kind`, this was a Secret, silently skipped.
    let input = format!(
        "{}\n---\napiVersion: v1\nkind: PersistentVolume\nkind: Secret\nmetadata: {{name: s}}\n",
        pv("pv-1", json!({"flexVolume": {"driver": "acme/nfs"}})),
    );
    let stderr = migrate_said(&sandbox, &input, 1);
    assert!(
        stderr.starts_with("flexd: cannot migrate document 2: is not YAML or JSON: key \"kind\" is given twice in one mapping"),
        "{stderr}"
    );
    // In JSON too (which serde_json reads first, and then refuses as well).
    let input = r#"{"apiVersion": "v1", "kind": "PersistentVolume", "kind": "Secret"}"#;
    let stderr = migrate_said(&sandbox, input, 1);
    assert!(
        stderr.starts_with(
            "flexd: cannot migrate document 1: is not YAML or JSON: key \"kind\" is given twice"
        ),
        "{stderr}"
    );
    // Deeper in, too: a volume's options.
    let input = "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: p}\nspec:\n  flexVolume:\n    driver: acme/nfs\n    options: {server: a, server: b}\n";
    let stderr = migrate_said(&sandbox, input, 1);
    assert!(stderr.contains("key \"server\" is given twice"), "{stderr}");
}

#[test]
fn names_from_the_input_reach_the_terminal_escaped() {
    let sandbox = Sandbox::new();
    let input = "apiVersion: v1\nkind: \"Secret\\e[2J\"\nmetadata: {name: \"s\\e]0;owned\\a\", namespace: \"n\\nflexd: fake line\"}\nflexVolume: {}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: \"c\\u009b31m\"}\n";
    let stderr = migrate_said(&sandbox, input, 1);
    assert_eq!(
        stderr,
        "flexd: cannot migrate document 1, Secret\\u{1b}[2J n\\nflexd: fake line/s\\u{1b}]0;owned\\u{7}: holds a flexVolume, and flexd migrate does not convert a Secret\\u{1b}[2J; convert its owner or write the csi volume by hand\n\
         flexd: error: cannot migrate -: 1 problem above; nothing was printed\n"
    );
    // Notes too (a C1 control: CSI).
    let (_, skipped) = input.split_once("---\n").unwrap();
    let stderr = migrate_said(&sandbox, skipped, 0);
    assert_eq!(
        stderr,
        "flexd: document 1, ConfigMap c\\u{9b}31m: skipped: no flexVolume\n"
    );
}

#[test]
fn a_driver_said_twice_or_not_a_name_is_bad_usage() {
    let sandbox = Sandbox::new();
    for args in [
        ["--attaching", "acme/a", "--not-attaching", "acme/a"],
        ["--attaching", "acme/a", "--attaching", "acme/a"],
    ] {
        let out = flexd(
            &sandbox.plugin(),
            &[&["migrate", "-f", "-"][..], &args].concat(),
            "",
        );
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr)
                .contains("driver acme/a is given more than once to --attaching/--not-attaching"),
            "{}",
            text(&out.stderr)
        );
    }
    let out = flexd(
        &sandbox.plugin(),
        &["migrate", "-f", "-", "--attaching", "../x"],
        "",
    );
    test_support::assert_fails_saying(&out, 2, &["invalid value '../x' for '--attaching"]);
}

// ---- end to end: the old PV's data through the migrated PV, as root ----

/// kubelet's access mode for a PV's access modes (the ones a migrated loop PV can have).
fn access_mode(pv: &k8s_openapi::api::core::v1::PersistentVolume) -> i32 {
    use csi::volume_capability::access_mode::Mode;
    let modes = pv
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.clone())
        .unwrap_or_default();
    match modes.first().map(String::as_str) {
        Some("ReadOnlyMany") => Mode::MultiNodeReaderOnly as i32,
        Some("ReadWriteMany") => Mode::MultiNodeMultiWriter as i32,
        _ => Mode::SingleNodeWriter as i32,
    }
}

/// The PersistentVolume `flexd migrate -f <file>` prints for the one in `file`.
fn migrated_pv(plugins: &Path, file: &Path) -> k8s_openapi::api::core::v1::PersistentVolume {
    let printed = test_support::stdout_ok(&flexd(
        plugins,
        &["migrate", "-f", file.to_str().unwrap()],
        "",
    ));
    serde_yaml_ng::from_str(&printed).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_written_through_the_old_pv_is_read_through_the_migrated_pv_over_csi() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    // One node: the builtin loop driver installed, flexd serve (node and controller) running
    // with its own state dir; the sandbox unmounts and releases the loop devices on drop.
    let server = Server::start_in_mode("both", |plugins| {
        // The sandbox's images dir (beside `exec`) is the one the driver may use.
        let images = plugins.with_file_name("images");
        ok(&output_of_new_executable(
            flexd_command(plugins)
                .args(["install", "--builtin", "loop", "--image-dir"])
                .arg(images),
        ))
    });
    let plugins = server.plugin_dir.clone();
    std::fs::create_dir(server.path("images")).unwrap();

    // Before: a FlexVolume PV of the loop driver, mounted as kubelet's FlexVolume plugin would
    // (its own state dir: kubelet's FlexVolume plugin is not flexd serve).
    let old_pv = json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv-orders", "resourceVersion": "1"},
        "spec": {"capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain",
                 "claimRef": {"namespace": "shop", "name": "orders"},
                 "flexVolume": {"driver": "flexd/loop", "fsType": "ext4",
                     "options": {"imageDir": server.path("images"), "size": "64Mi"}}}});
    let old_file = server.write("old-pv.yaml", &serde_yaml_ng::to_string(&old_pv).unwrap());
    let old_target = server.target("flex-pod");
    let state_flex = server.path("state-flex");
    let volume = |args: &[&str]| {
        flexd(
            &plugins,
            &[
                &[
                    "--state-dir",
                    state_flex.to_str().unwrap(),
                    "--node-name",
                    "node-1",
                    "volume",
                ][..],
                args,
            ]
            .concat(),
            "",
        )
    };
    ok(&volume(&[
        "mount",
        "-f",
        old_file.to_str().unwrap(),
        "--target",
        old_target.to_str().unwrap(),
    ]));
    std::fs::write(old_target.join("orders.db"), "order 1: 3 apples\n").unwrap();
    ok(&volume(&[
        "unmount",
        "--target",
        old_target.to_str().unwrap(),
    ]));
    assert!(!is_mounted(&old_target));
    assert!(
        server.loop_devices().is_empty(),
        "unmount detached the volume"
    );

    // The migration, through the binary.
    let new_pv = migrated_pv(&plugins, &old_file);
    let source = new_pv.spec.as_ref().unwrap().csi.clone().unwrap();
    assert_eq!(source.volume_handle, "pv-orders");

    // After: kubelet's calls built from the migrated PV's csi fields only, on the socket of
    // the CSI driver the PV names.
    let socket = server.csi_dir.join(&source.driver).join("csi.sock");
    test_support::wait_for_path(&socket);
    let mut controller = controller_client(&socket).await;
    let mut node = node_client(&socket).await;
    let capability = Some(csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: source.fs_type.clone().unwrap_or_default(),
                ..Default::default()
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: access_mode(&new_pv),
        }),
    });
    let context: HashMap<String, String> = source
        .volume_attributes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let readonly = source.read_only.unwrap_or(false);

    let published = controller
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: source.volume_handle.clone(),
            node_id: "node-1".into(),
            volume_capability: capability.clone(),
            readonly,
            volume_context: context.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let staging = server.target("kubelet/plugins/kubernetes.io/csi/pv/pv-orders/globalmount");
    node.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: source.volume_handle.clone(),
        publish_context: published.publish_context.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: capability.clone(),
        volume_context: context.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let target = server.target("kubelet/pods/uid-7/volumes/kubernetes.io~csi/pv-orders/mount");
    let mut publish_context = context.clone();
    publish_context.insert("csi.storage.k8s.io/pod.name".into(), "shop-0".into());
    publish_context.insert("csi.storage.k8s.io/pod.namespace".into(), "shop".into());
    node.node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: source.volume_handle.clone(),
        publish_context: published.publish_context.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: capability.clone(),
        readonly,
        volume_context: publish_context,
        ..Default::default()
    })
    .await
    .unwrap();

    assert!(is_mounted(&target));
    assert_eq!(
        std::fs::read_to_string(target.join("orders.db")).unwrap(),
        "order 1: 3 apples\n",
        "the migrated PV names the volume the FlexVolume PV mounted"
    );
    let images: Vec<_> = std::fs::read_dir(server.path("images"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".img"))
        .collect();
    assert_eq!(images, ["pv-orders.img"], "no second volume was made");

    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: source.volume_handle.clone(),
        target_path: target.display().to_string(),
    })
    .await
    .unwrap();
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: source.volume_handle.clone(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
    controller
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: source.volume_handle.clone(),
            node_id: "node-1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!is_mounted(&target) && !is_mounted(&staging));
    assert!(
        server.loop_devices().is_empty(),
        "ControllerUnpublish detached the volume"
    );
}

/// The mount call-out's options JSON, parsed, of the `n`th logged mount.
fn mount_options(server: &Server, n: usize) -> Value {
    let mounts = server.calls_of("mount");
    serde_json::from_str(&mounts[n][2]).unwrap()
}

/// What kubelet publishes a migrated volume with: the `csi` source of the migrated object, a
/// PV's (the volume id its volume handle) or an inline volume's (ephemeral, with an id kubelet
/// makes up).
struct CsiSource {
    volume_id: String,
    fs_type: Option<String>,
    read_only: Option<bool>,
    attributes: Option<std::collections::BTreeMap<String, String>>,
    ephemeral: bool,
}

impl CsiSource {
    fn pv(source: k8s_openapi::api::core::v1::CSIPersistentVolumeSource) -> Self {
        Self {
            volume_id: source.volume_handle,
            fs_type: source.fs_type,
            read_only: source.read_only,
            attributes: source.volume_attributes,
            ephemeral: false,
        }
    }

    fn inline(volume_id: String, source: k8s_openapi::api::core::v1::CSIVolumeSource) -> Self {
        Self {
            volume_id,
            fs_type: source.fs_type,
            read_only: source.read_only,
            attributes: source.volume_attributes,
            ephemeral: true,
        }
    }
}

/// What the driver's `mount` receives is the same through the migrated objects, byte for
/// byte, as through the FlexVolume ones: a PV's, and an inline volume's but for the volume
/// name kubelet gives an inline CSI volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_gets_the_same_options_through_the_migrated_objects() {
    test_support::require_root!();
    let (server, socket) = Server::acme("node", "logged", TMPFS_DRIVER);
    let plugins = server.plugin_dir.clone();
    let state_flex = server.path("state-flex");
    let flex_mount = |file: &Path, target: &Path| {
        let mount = [
            "--state-dir",
            state_flex.to_str().unwrap(),
            "volume",
            "mount",
            "-f",
            file.to_str().unwrap(),
            "--target",
            target.to_str().unwrap(),
        ];
        ok(&flexd(
            &plugins,
            &[&mount, &test_support::POD_MOUNT_ARGS[..]].concat(),
            "",
        ))
    };
    let mut node = node_client(&socket).await;
    let pod_info = [
        ("csi.storage.k8s.io/pod.name", "web-0"),
        ("csi.storage.k8s.io/pod.namespace", "prod"),
        ("csi.storage.k8s.io/pod.uid", "uid-1"),
        ("csi.storage.k8s.io/serviceAccount.name", "sa"),
    ];
    let publish = |target: &Path, source: CsiSource| {
        let mut context: HashMap<String, String> =
            source.attributes.unwrap_or_default().into_iter().collect();
        context.extend(
            pod_info
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        if source.ephemeral {
            context.insert("csi.storage.k8s.io/ephemeral".into(), "true".into());
        }
        csi::NodePublishVolumeRequest {
            volume_id: source.volume_id,
            target_path: target.display().to_string(),
            volume_capability: Some(csi::VolumeCapability {
                access_type: Some(csi::volume_capability::AccessType::Mount(
                    csi::volume_capability::MountVolume {
                        fs_type: source.fs_type.unwrap_or_default(),
                        ..Default::default()
                    },
                )),
                access_mode: Some(csi::volume_capability::AccessMode {
                    mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                }),
            }),
            readonly: source.read_only.unwrap_or(false),
            volume_context: context,
            secrets: [("password".to_owned(), "hunter2".to_owned())].into(),
            ..Default::default()
        }
    };

    // A PersistentVolume: identical options.
    let old_pv = server.write(
        "old-pv.yaml",
        &pv(
            "pv-web",
            json!({"accessModes": ["ReadWriteOnce"],
                "flexVolume": {"driver": "acme/logged", "fsType": "xfs", "readOnly": true,
                    "secretRef": {"name": "creds", "namespace": "prod"},
                    "options": {"server": "nfs.example", "share": "/exports/web"}}}),
        ),
    );
    flex_mount(&old_pv, &server.target("flex-pv"));
    let source = migrated_pv(&plugins, &old_pv).spec.unwrap().csi.unwrap();
    node.node_publish_volume(publish(&server.target("csi-pv"), CsiSource::pv(source)))
        .await
        .unwrap();
    let before = mount_options(&server, 0);
    assert_eq!(before["kubernetes.io/pvOrVolumeName"], "pv-web");
    assert_eq!(before["kubernetes.io/readwrite"], "ro");
    assert_eq!(mount_options(&server, 1), before);

    // An inline volume: the same options but the name, which kubelet makes per pod.
    let old_volume = server.write(
        "old-volume.yaml",
        &json!({"name": "cache", "flexVolume": {"driver": "acme/logged",
            "secretRef": {"name": "s"}, "options": {"size": "1Mi"}}})
        .to_string(),
    );
    flex_mount(&old_volume, &server.target("flex-inline"));
    let printed = test_support::stdout_ok(&flexd(
        &plugins,
        &["migrate", "-f", "-", "--not-attaching", "acme/logged"],
        &pod(
            json!([{"name": "cache", "flexVolume": {"driver": "acme/logged",
            "secretRef": {"name": "s"}, "options": {"size": "1Mi"}}}]),
        ),
    ));
    let new_pod: k8s_openapi::api::core::v1::Pod = serde_yaml_ng::from_str(&printed).unwrap();
    let source = new_pod.spec.unwrap().volumes.unwrap()[0]
        .csi
        .clone()
        .unwrap();
    assert_eq!(source.driver, "flexvolume-acme--logged");
    let kubelets_id = format!("csi-{}", "0f".repeat(32));
    let inline = CsiSource::inline(kubelets_id.clone(), source);
    node.node_publish_volume(publish(&server.target("csi-inline"), inline))
        .await
        .unwrap();
    let mut before = mount_options(&server, 2);
    assert_eq!(before["kubernetes.io/pvOrVolumeName"], "cache");
    before["kubernetes.io/pvOrVolumeName"] = json!(kubelets_id);
    assert_eq!(mount_options(&server, 3), before);
}

#[test]
fn the_cluster_modes_are_one_at_a_time_and_apply_needs_a_selection() {
    let sandbox = with_examples();
    let plugins = sandbox.plugin();
    for args in [
        &["migrate"][..],
        &["migrate", "--apply"],
        &["migrate", "--plan"],
        &["migrate", "--apply", "--rollback", "--all"],
        &["migrate", "--resume", "--all"],
        &["migrate", "-f", "-", "--all"],
        &["migrate", "--plan", "--workload", "ns/daemonset/x"],
    ] {
        let out = flexd(&plugins, args, "");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(text(&out.stdout), "", "{args:?}");
    }
}

#[test]
fn an_api_server_out_of_reach_is_an_error_that_names_it_and_changes_nothing() {
    let sandbox = with_examples();
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"http://127.0.0.1:{port}\"}}}}]\n\
             users: [{{name: u, user: {{token: secret-token-value}}}}]\n\
             contexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    let kubeconfig = kubeconfig.to_str().unwrap();
    for mode in [
        &["--plan", "--all"][..],
        &["--apply", "--all", "--yes"],
        &["--resume", "--yes"],
        &["--rollback", "--yes"],
    ] {
        let mut args = vec![
            "migrate",
            "--kubeconfig",
            kubeconfig,
            "--wait-timeout",
            "1s",
        ];
        args.extend_from_slice(mode);
        let out = flexd(&sandbox.plugin(), &args, "");
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{mode:?}: {stderr}");
        assert!(stderr.contains("flexd: error:"), "{mode:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{mode:?}: {stderr}");
        assert!(!stderr.contains("secret-token-value"), "{mode:?}: {stderr}");
    }
}
