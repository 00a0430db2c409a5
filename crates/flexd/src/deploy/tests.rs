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
        attacher_image: kubernetes_version::ATTACHER_IMAGE.to_owned(),
        provisioner_image: kubernetes_version::PROVISIONER_IMAGE.to_owned(),
        resizer_image: kubernetes_version::RESIZER_IMAGE.to_owned(),
        resizer_flags: Vec::new(),
        expose_metrics: false,
        fence_lease: None,
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
fn a_node_only_driver_gets_no_controller_and_is_inline_only_when_the_operator_asks() {
    let objects = render(&settings(), &[driver("acme/tmpfs", false, true, false)]).unwrap();
    assert!(!objects.iter().any(|o| matches!(
        o,
        Object::Deployment(_)
            | Object::ClusterRole(_)
            | Object::CustomResourceDefinition(_)
            | Object::Secret(_)
    )));
    let spec = &csi_drivers(&objects)[0].spec;
    assert_eq!(spec.attach_required, Some(false));
    assert_eq!(spec.fs_group_policy.as_deref(), Some("None"));
    // Finding: every node-only driver took inline volumes from any pod author.
    assert_eq!(
        spec.volume_lifecycle_modes.as_deref(),
        Some(&["Persistent".to_owned()][..])
    );
    let inline = DriverProfile {
        inline: true,
        ..driver("acme/tmpfs", false, true, false)
    };
    let objects = render(&settings(), &[inline]).unwrap();
    assert_eq!(
        csi_drivers(&objects)[0]
            .spec
            .volume_lifecycle_modes
            .as_deref(),
        Some(&["Persistent".to_owned(), "Ephemeral".to_owned()][..])
    );
}

fn deployment(objects: &[Object]) -> &Deployment {
    objects
        .iter()
        .find_map(|o| match o {
            Object::Deployment(d) => Some(&**d),
            _ => None,
        })
        .unwrap()
}

fn daemonset(objects: &[Object]) -> &DaemonSet {
    objects
        .iter()
        .find_map(|o| match o {
            Object::DaemonSet(d) => Some(&**d),
            _ => None,
        })
        .unwrap()
}

fn pod_of(
    spec: Option<&k8s_openapi::api::core::v1::PodTemplateSpec>,
) -> &k8s_openapi::api::core::v1::PodSpec {
    spec.and_then(|t| t.spec.as_ref()).unwrap()
}

/// Finding: the controller pod mounted its ServiceAccount token into every container, so
/// flexd and driver code running as root could patch PersistentVolumes cluster-wide.
#[test]
fn only_the_sidecars_hold_the_controller_token() {
    let objects = render(&settings(), &[driver("acme/a", true, true, true)]).unwrap();
    let account = objects
        .iter()
        .find_map(|o| match o {
            Object::ServiceAccount(a) if a.metadata.name.as_deref() == Some(CONTROLLER) => Some(a),
            _ => None,
        })
        .unwrap();
    assert_eq!(account.automount_service_account_token, Some(false));
    let pod = pod_of(deployment(&objects).spec.as_ref().map(|s| &s.template));
    assert_eq!(pod.automount_service_account_token, Some(false));
    for container in &pod.containers {
        let has_token = container
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == "/var/run/secrets/kubernetes.io/serviceaccount");
        assert_eq!(
            has_token,
            container.name.starts_with("csi-"),
            "{}",
            container.name
        );
    }
}

/// Finding 6: sidecars and flexd-capabilities ran as root with default capabilities and no
/// seccomp profile; the controller's flexd was privileged for every driver.
#[test]
fn the_controller_is_unprivileged_unless_a_driver_needs_devices() {
    let objects = render(&settings(), &[driver("acme/a", true, true, true)]).unwrap();
    let pod = pod_of(deployment(&objects).spec.as_ref().map(|s| &s.template));
    assert_eq!(
        pod.security_context
            .as_ref()
            .and_then(|c| c.seccomp_profile.as_ref())
            .map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );
    assert!(!pod.volumes.iter().flatten().any(|v| v.name == "dev"));
    for container in &pod.containers {
        let security = container.security_context.as_ref().unwrap();
        assert_ne!(security.privileged, Some(true), "{}", container.name);
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert_eq!(security.read_only_root_filesystem, Some(true));
        let capabilities = security.capabilities.as_ref().unwrap();
        assert_eq!(capabilities.drop.as_deref(), Some(&["ALL".to_owned()][..]));
        if container.name.starts_with("csi-") {
            assert_eq!(security.run_as_non_root, Some(true));
            assert_eq!(security.run_as_user, Some(objects::SIDECAR_USER));
            assert_eq!(capabilities.add, None);
        } else {
            assert_eq!(capabilities.add.as_deref(), Some(&["CHOWN".to_owned()][..]));
            assert!(container
                .args
                .iter()
                .flatten()
                .any(|a| a == &format!("--socket-group={}", objects::SIDECAR_USER)));
        }
    }
    let devices = DriverProfile {
        privileged_controller: true,
        ..driver("acme/a", true, true, true)
    };
    let objects = render(&settings(), &[devices]).unwrap();
    let pod = pod_of(deployment(&objects).spec.as_ref().map(|s| &s.template));
    let flexd = pod.containers.iter().find(|c| c.name == "flexd").unwrap();
    assert_eq!(
        flexd.security_context.as_ref().unwrap().privileged,
        Some(true)
    );
    assert!(flexd
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path == "/dev"));
    let capabilities = pod
        .containers
        .iter()
        .find(|c| c.name == "flexd-capabilities")
        .unwrap();
    assert_ne!(
        capabilities.security_context.as_ref().unwrap().privileged,
        Some(true),
        "it runs drivers' init only"
    );
}

/// Findings 1 and 6: the node's metrics were on every interface of every node, and the node
/// pod mounted all of kubelet's dir (its pki/ included) and the plugin dir read-write.
#[test]
fn the_node_pod_gets_only_what_it_uses() {
    let objects = render(&settings(), &[driver("acme/tmpfs", false, true, false)]).unwrap();
    let pod = pod_of(daemonset(&objects).spec.as_ref().map(|s| &s.template));
    let flexd = &pod.containers[0];
    assert!(flexd
        .args
        .iter()
        .flatten()
        .any(|a| a == "--metrics-address=127.0.0.1:9808"));
    for probe in [&flexd.liveness_probe, &flexd.readiness_probe] {
        let get = probe.as_ref().and_then(|p| p.http_get.as_ref()).unwrap();
        assert_eq!(get.host.as_deref(), Some("127.0.0.1"));
    }
    let host_paths: Vec<&str> = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.host_path.as_ref().map(|h| h.path.as_str()))
        .collect();
    assert!(!host_paths.contains(&"/var/lib/kubelet"), "{host_paths:?}");
    for needed in [
        "/var/lib/kubelet/pods",
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry",
    ] {
        assert!(host_paths.contains(&needed), "{needed} in {host_paths:?}");
    }
    let plugin_dir = flexd
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/plugins")
        .unwrap();
    assert_eq!(plugin_dir.read_only, Some(true));
    let security = flexd.security_context.as_ref().unwrap();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert!(flexd
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path == "/tmp"));

    let exposed = Settings {
        expose_metrics: true,
        ..settings()
    };
    let objects = render(&exposed, &[driver("acme/tmpfs", false, true, false)]).unwrap();
    let pod = pod_of(daemonset(&objects).spec.as_ref().map(|s| &s.template));
    assert!(pod.containers[0]
        .args
        .iter()
        .flatten()
        .any(|a| a == "--metrics-address=0.0.0.0:9808"));
}

#[test]
fn the_namespace_says_its_pod_security_level() {
    let objects = render(&settings(), &[driver("acme/tmpfs", false, true, false)]).unwrap();
    let Object::Namespace(namespace) = &objects[0] else {
        panic!("the namespace first")
    };
    let labels = namespace.metadata.labels.as_ref().unwrap();
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("privileged")
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
