//! `flexd manifests` and `flexd drivers`' CSI names through the real binary, against real
//! driver executables in a real plugin dir.

use std::process::Output;

use serde_json::Value;
use test_support::{flexd, install_example as install, stdout_ok, yaml_documents};

/// A plugin dir with each (example, driver dir) installed.
fn plugin_dir(drivers: &[(&str, &str)]) -> tempfile::TempDir {
    let plugin = tempfile::tempdir().unwrap();
    for (example, dir_name) in drivers {
        install(plugin.path(), example, dir_name);
    }
    plugin
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

    let json: Value =
        serde_json::from_str(&stdout_ok(&flexd(p, &["-o", "json", "drivers"]))).unwrap();
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

    let text = stdout_ok(&flexd(p, &["drivers"]));
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

    let docs = yaml_documents(&stdout_ok(&flexd(
        p,
        &["manifests", "--image", "flexd:test"],
    )));
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
    let docs = yaml_documents(&stdout_ok(&flexd(
        p,
        &["manifests", "--driver", "attachable"],
    )));
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
        test_support::driver_source("quirks/empty-output"),
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

/// `flexd manifests` with `args` after the given drivers' capabilities (no probe needed).
fn manifests(p: &std::path::Path, args: &[&str]) -> Output {
    flexd(
        p,
        &[
            &["manifests", "--driver", r#"acme/blk={"attach":true}"#][..],
            args,
        ]
        .concat(),
    )
}

#[test]
fn values_kubernetes_would_refuse_are_bad_usage_and_print_nothing() {
    let plugin = tempfile::tempdir().unwrap();
    let p = plugin.path();
    // Once pasted into the header comment unquoted: this printed a ClusterRoleBinding of
    // cluster-admin, exit 0.
    let injection = "x\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding";
    let refused: [(&[&str], &str); 9] = [
        (&["--namespace", injection], "is not a DNS-1123 label"),
        (
            &["--namespace", &"a".repeat(64)],
            "is not a DNS-1123 label (at most 63",
        ),
        (&["--namespace", "Flexd"], "is not a DNS-1123 label"),
        (
            &["--state-storage-class", "fast\nssd"],
            "is not a DNS-1123 subdomain",
        ),
        (&["--image", "flexd:1\n---\nkind: x"], "holds '\\n'"),
        (&["--attacher-image", "a\u{1b}[2J"], "holds '\\u{1b}'"),
        (
            &["--kubelet-dir", "/var/lib/kube\rlet"],
            "control character '\\r'",
        ),
        (&["--host-dir", "/srv/../etc"], "holds '..'"),
        (&["--driver", "acme/a.={}"], "is not a valid domain name"),
    ];
    for (args, rule) in refused {
        let out = manifests(p, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(rule), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} printed something");
    }
    // The global directories are printed too.
    let out = flexd(
        p,
        &[
            "--state-dir",
            "/var/lib/flexd\n---",
            "manifests",
            "--driver",
            "acme/blk={}",
        ],
    );
    test_support::assert_fails_saying(&out, 2, &["invalid value for '--state-dir'"]);

    // What is accepted is what the header and the objects say.
    let out = manifests(
        p,
        &[
            "--namespace",
            "storage-1",
            "--state-storage-class",
            "fast.ssd",
        ],
    );
    let text = stdout_ok(&out);
    assert!(text.contains("\n# in namespace storage-1. "), "{text}");
    let docs = yaml_documents(&text);
    assert!(docs
        .iter()
        .filter(|d| d["kind"] != "Namespace" && d["metadata"]["namespace"].is_string())
        .all(|d| d["metadata"]["namespace"] == "storage-1"));
}

#[test]
fn a_driver_named_twice_is_bad_usage_naming_it() {
    let plugin = tempfile::tempdir().unwrap();
    let p = plugin.path();
    for second in ["acme/blk", r#"acme/blk={"attach":false}"#] {
        let out = manifests(p, &["--driver", "acme/other={}", "--driver", second]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{second}: {stderr}");
        assert!(
            stderr.contains("driver acme/blk is given more than once with --driver"),
            "{stderr}"
        );
        assert!(out.stdout.is_empty());
    }
}
