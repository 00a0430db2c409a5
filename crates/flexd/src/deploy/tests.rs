//! The manifests' choices, object by object.

use super::*;

fn settings() -> Settings {
    Settings {
        namespace: "flexd-system".to_owned(),
        image: "flexd:test".to_owned(),
        kubelet_dir: PathBuf::from("/var/lib/kubelet"),
        plugin_dir: PathBuf::from("/plugins"),
        state_dir: PathBuf::from("/var/lib/flexd"),
        host_dirs: vec![],
        attacher_image: DEFAULT_ATTACHER_IMAGE.to_owned(),
        provisioner_image: DEFAULT_PROVISIONER_IMAGE.to_owned(),
        resizer_image: DEFAULT_RESIZER_IMAGE.to_owned(),
        state_storage_class: None,
    }
}

fn driver(name: &str, attach: bool, expand: bool, fs_group: bool) -> DriverProfile {
    let caps = Capabilities {
        attach,
        requires_fs_resize: expand,
        fs_group,
        ..Capabilities::default()
    };
    DriverProfile::new(DriverName::parse(name).unwrap(), &caps).unwrap()
}

fn csi_drivers(objects: &[Object]) -> Vec<&CSIDriver> {
    objects
        .iter()
        .filter_map(|o| match o {
            Object::CSIDriver(d) => Some(&**d),
            _ => None,
        })
        .collect()
}

#[test]
fn a_node_only_driver_gets_no_controller_and_may_be_inline() {
    let objects = render(&settings(), &[driver("acme/tmpfs", false, true, false)]).unwrap();
    assert!(!objects.iter().any(|o| matches!(
        o,
        Object::Deployment(_) | Object::ClusterRole(_) | Object::PersistentVolumeClaim(_)
    )));
    let spec = &csi_drivers(&objects)[0].spec;
    assert_eq!(spec.attach_required, Some(false));
    assert_eq!(spec.fs_group_policy.as_deref(), Some("None"));
    assert_eq!(
        spec.volume_lifecycle_modes.as_deref(),
        Some(&["Persistent".to_owned(), "Ephemeral".to_owned()][..])
    );
}

#[test]
fn each_controlled_driver_gets_its_own_sidecars_on_its_own_socket() {
    let drivers = [
        driver("acme/a", true, false, true),
        driver("acme/b", true, true, true),
        driver("acme/c", false, true, true),
    ];
    let objects = render(&settings(), &drivers).unwrap();
    let deployment = objects
        .iter()
        .find_map(|o| match o {
            Object::Deployment(d) => Some(d),
            _ => None,
        })
        .unwrap();
    let pod = deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    let sidecars: Vec<(String, String)> = pod.containers[2..]
        .iter()
        .map(|c| (c.name.clone(), c.args.as_ref().unwrap()[0].clone()))
        .collect();
    assert_eq!(
        sidecars,
        [
            (
                "csi-attacher-0",
                "--csi-address=/csi/flexvolume-acme--a/csi.sock"
            ),
            (
                "csi-attacher-1",
                "--csi-address=/csi/flexvolume-acme--b/csi.sock"
            ),
            (
                "csi-resizer-1",
                "--csi-address=/csi-capabilities/flexvolume-acme--b/csi.sock"
            ),
        ]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );
    // The controller attaches to any node; the resizer's socket answers node capabilities.
    let mode = |i: usize| pod.containers[i].args.as_ref().unwrap()[4].clone();
    assert_eq!(
        (
            mode(0).as_str(),
            pod.containers[1].name.as_str(),
            mode(1).as_str()
        ),
        ("--mode=controller", "flexd-capabilities", "--mode=both")
    );
    let roles: Vec<&str> = objects
        .iter()
        .filter_map(|o| match o {
            Object::ClusterRole(r) => r.metadata.name.as_deref(),
            _ => None,
        })
        .collect();
    assert_eq!(roles, ["flexd-csi-attacher", "flexd-csi-resizer"]);
    let policies: Vec<_> = csi_drivers(&objects)
        .iter()
        .map(|d| (d.spec.attach_required, d.spec.fs_group_policy.clone()))
        .collect();
    assert_eq!(policies[0], (Some(true), Some("File".to_owned())));
}

/// The names flexd makes up itself (accounts, roles, containers, volumes) are ones the API
/// server takes, as the flag values are checked to be (`checks`).
#[test]
fn every_name_is_one_kubernetes_takes() {
    use super::checks::{dns_label, dns_subdomain};
    let mut d = driver("Big_Vendor/x-y", true, true, true);
    d.provision = true;
    let objects = render(&settings(), &[d, driver("a/b", false, true, false)]).unwrap();
    let mut containers = 0;
    for object in &objects {
        let value = serde_json::to_value(object).unwrap();
        let name = value["metadata"]["name"].as_str().unwrap();
        dns_subdomain(name).unwrap();
        if let Some(ns) = value["metadata"]["namespace"].as_str() {
            dns_label(ns).unwrap();
        }
        let pod = &value["spec"]["template"]["spec"];
        for list in ["containers", "volumes"] {
            for item in pod[list].as_array().into_iter().flatten() {
                dns_label(item["name"].as_str().unwrap()).unwrap();
                containers += usize::from(list == "containers");
            }
        }
    }
    // flexd in the node pod; flexd, flexd-capabilities and three sidecars in the controller.
    assert_eq!(containers, 6);
}

#[test]
fn a_provisioning_driver_gets_a_provisioner() {
    let mut d = driver("acme/p", false, false, true);
    d.provision = true;
    assert_eq!(Sidecar::for_driver(&d), [Sidecar::Provisioner]);
    let objects = render(&settings(), &[d]).unwrap();
    assert!(objects.iter().any(|o| matches!(o, Object::Deployment(_))));
    assert!(render(&settings(), &[]).is_err());
}
