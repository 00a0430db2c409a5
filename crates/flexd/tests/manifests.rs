//! `flexd manifests` and `flexd drivers`' CSI names through the real binary, against real
//! driver executables in a real plugin dir.

mod common;

use std::process::Output;

use common::{flexd, install_example as install};
use serde_json::Value;

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{out:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// A plugin dir with each (example, driver dir) installed.
fn plugin_dir(drivers: &[(&str, &str)]) -> tempfile::TempDir {
    let plugin = tempfile::tempdir().unwrap();
    for (example, dir_name) in drivers {
        install(plugin.path(), example, dir_name);
    }
    plugin
}

fn documents(text: &str) -> Vec<Value> {
    use serde::Deserialize as _;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|doc| !doc.is_null())
        .collect()
}

#[test]
fn drivers_show_the_csi_name_each_driver_is_served_under() {
    let plugin = plugin_dir(&[
        ("tmpfs/tmpfs", "acme~tmpfs"),
        ("attachable/attachable", "Big_Vendor~attachable"),
        // A valid driver name whose CSI form is not a domain name: served by no one.
        ("tmpfs/tmpfs", "a.~tmpfs"),
    ]);
    let p = plugin.path();

    let json: Value = serde_json::from_str(&stdout(&flexd(p, &["-o", "json", "drivers"]))).unwrap();
    let csi_names: Vec<(&str, &Value)> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["name"].as_str().unwrap(), &d["csiName"]))
        .collect();
    assert_eq!(
        csi_names,
        [
            (
                "Big_Vendor/attachable",
                &Value::from("flexvolume--big-1-vendor--attachable")
            ),
            ("a./tmpfs", &Value::Null),
            ("acme/tmpfs", &Value::from("flexvolume-acme--tmpfs")),
        ]
    );

    let text = stdout(&flexd(p, &["drivers"]));
    let mut lines = text.lines();
    assert!(lines.next().unwrap().contains("CSI NAME"), "{text}");
    let tmpfs = lines.find(|l| l.starts_with("acme/tmpfs")).unwrap();
    assert_eq!(
        tmpfs.split_whitespace().take(4).collect::<Vec<_>>(),
        ["acme/tmpfs", "ready", "no", "flexvolume-acme--tmpfs"],
        "{text}"
    );
}

#[test]
fn manifests_deploy_what_the_plugin_dir_holds_with_each_drivers_capabilities() {
    let plugin = plugin_dir(&[
        ("tmpfs/tmpfs", "acme~tmpfs"),
        ("attachable/attachable", "attachable"),
    ]);
    let p = plugin.path();

    let docs = documents(&stdout(&flexd(p, &["manifests", "--image", "flexd:test"])));
    let csi_drivers: Vec<(&str, bool)> = docs
        .iter()
        .filter(|d| d["kind"] == "CSIDriver")
        .map(|d| {
            (
                d["metadata"]["name"].as_str().unwrap(),
                d["spec"]["attachRequired"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        csi_drivers,
        [
            ("flexvolume-acme--tmpfs", false),
            ("flexvolume-attachable", true)
        ]
    );
    // Each driver has the sidecars its capabilities call for (tmpfs provisions, attachable
    // attaches, both expand), on its own socket.
    let sidecars = |docs: &[Value]| -> Vec<(String, String)> {
        let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        deployment["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| !c["name"].as_str().unwrap().starts_with("flexd"))
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_owned(),
                    c["args"][0].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let expected = [
        ("csi-provisioner-0", "/csi/flexvolume-acme--tmpfs"),
        ("csi-resizer-0", "/csi-capabilities/flexvolume-acme--tmpfs"),
        ("csi-attacher-1", "/csi/flexvolume-attachable"),
        ("csi-resizer-1", "/csi-capabilities/flexvolume-attachable"),
    ]
    .map(|(name, dir)| (name.to_owned(), format!("--csi-address={dir}/csi.sock")));
    assert_eq!(sidecars(&docs), expected);
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "flexd:test"
    );

    // Named drivers: only those.
    let docs = documents(&stdout(&flexd(p, &["manifests", "--driver", "attachable"])));
    assert_eq!(docs.iter().filter(|d| d["kind"] == "CSIDriver").count(), 1);
    let expected = [
        ("csi-attacher-0", "/csi/flexvolume-attachable"),
        ("csi-resizer-0", "/csi-capabilities/flexvolume-attachable"),
    ]
    .map(|(name, dir)| (name.to_owned(), format!("--csi-address={dir}/csi.sock")));
    assert_eq!(sidecars(&docs), expected);

    // A driver whose init fails is not deployed blind.
    let dir = p.join("acme~broken");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(
        common::driver_source("quirks/empty-output"),
        dir.join("broken"),
    )
    .unwrap();
    let out = flexd(p, &["manifests"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("acme/broken"),
        "{stderr}"
    );
}
