//! The manifests in deploy/ are valid Kubernetes objects: each document parses into its typed
//! k8s-openapi object, and nothing in it is silently dropped by that parse (a misspelt field
//! such as `mountPropogation` would be), and the pieces fit together.

mod common;

use std::path::PathBuf;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::api::storage::v1::CSIDriver;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    common::repo_path("deploy")
}

fn documents(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize_from(doc))
        .collect()
}

trait DeserializeFrom {
    fn deserialize_from(doc: serde_yaml_ng::Deserializer<'_>) -> Self;
}
impl DeserializeFrom for Value {
    fn deserialize_from(doc: serde_yaml_ng::Deserializer<'_>) -> Self {
        serde::Deserialize::deserialize(doc).unwrap()
    }
}

/// Every key of `original` must survive the typed round trip (null and empty values aside).
fn assert_nothing_dropped(original: &Value, round_trip: &Value, path: &str) {
    match (original, round_trip) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let here = format!("{path}.{key}");
                match b.get(key) {
                    Some(other) => assert_nothing_dropped(value, other, &here),
                    None => panic!("{here} is not a field of the typed object (misspelt?)"),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{path}");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert_nothing_dropped(x, y, &format!("{path}[{i}]"));
            }
        }
        // Quantities and int-or-strings may be normalised; scalars are compared loosely.
        (a, b) => assert!(
            a == b || a.to_string().trim_matches('"') == b.to_string().trim_matches('"'),
            "{path}: {a} became {b}"
        ),
    }
}

fn typed<T: DeserializeOwned + Serialize>(doc: &Value) -> T {
    let object: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("invalid {}: {e}", doc["kind"]));
    let back = serde_json::to_value(&object).unwrap();
    assert_nothing_dropped(doc, &back, doc["kind"].as_str().unwrap_or("?"));
    object
}

fn check_daemonset(ds: &DaemonSet) {
    let spec = ds.spec.as_ref().unwrap();
    let selector = spec.selector.match_labels.as_ref().unwrap();
    let labels = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .as_ref()
        .unwrap();
    for (k, v) in selector {
        assert_eq!(
            labels.get(k),
            Some(v),
            "selector {k} does not match the pod template"
        );
    }
    let pod = spec.template.spec.as_ref().unwrap();
    let volumes: Vec<&str> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect();
    for container in &pod.containers {
        for mount in container.volume_mounts.iter().flatten() {
            assert!(
                volumes.contains(&mount.name.as_str()),
                "mount of undeclared volume {}",
                mount.name
            );
        }
    }
}

#[test]
fn every_manifest_is_a_valid_typed_object() {
    let mut kinds = Vec::new();
    for entry in std::fs::read_dir(deploy_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let file = path.file_name().unwrap().to_str().unwrap().to_owned();
        for doc in documents(&file) {
            let kind = format!(
                "{}/{}",
                doc["apiVersion"].as_str().unwrap(),
                doc["kind"].as_str().unwrap()
            );
            match kind.as_str() {
                "apps/v1/DaemonSet" => check_daemonset(&typed::<DaemonSet>(&doc)),
                "v1/Namespace" => drop(typed::<Namespace>(&doc)),
                "v1/ServiceAccount" => drop(typed::<ServiceAccount>(&doc)),
                "rbac.authorization.k8s.io/v1/ClusterRole" => drop(typed::<ClusterRole>(&doc)),
                "storage.k8s.io/v1/CSIDriver" => drop(typed::<CSIDriver>(&doc)),
                other => panic!("{file}: unexpected kind {other}"),
            }
            kinds.push(kind);
        }
    }
    assert!(
        kinds.iter().filter(|k| k.ends_with("DaemonSet")).count() >= 2,
        "{kinds:?}"
    );
}

#[test]
fn the_installer_daemonset_mounts_the_host_plugin_dir_at_flexmnt() {
    let docs = documents("installer-daemonset.yaml");
    let ds: DaemonSet = typed(&docs[0]);
    let pod = ds.spec.unwrap().template.spec.unwrap();
    let mount = pod.containers[0]
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.mount_path == "/flexmnt")
        .unwrap();
    let volume = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == mount.name)
        .unwrap();
    assert_eq!(
        volume.host_path.unwrap().path,
        "/usr/libexec/kubernetes/kubelet-plugins/volume/exec"
    );
    // The image's entry point installs into /flexmnt and sleeps.
    let dockerfile = std::fs::read_to_string(deploy_dir().join("Dockerfile")).unwrap();
    assert!(
        dockerfile.contains("--plugin-dir /flexmnt install") && dockerfile.contains("--then-sleep")
    );
}

#[test]
fn the_flexd_daemonset_arguments_are_accepted_by_flexd() {
    let docs = documents("flexd-daemonset.yaml");
    let ds_doc = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let ds: DaemonSet = typed(ds_doc);
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod.share_process_namespace,
        Some(true),
        "flexd must not be pid 1: orphaned driver helpers need a reaper"
    );
    let container = &pod.containers[0];
    let args = container.args.clone().unwrap();
    // `--help` after the real arguments: clap validates everything before it, then prints help.
    let out = std::process::Command::new(common::FLEXD)
        .args(&args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "flexd refused the DaemonSet's arguments {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mounts: Vec<String> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.clone())
        .collect();
    assert!(mounts.contains(&"/var/lib/kubelet".to_owned()));
}
