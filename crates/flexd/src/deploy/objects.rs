//! The Kubernetes objects [`super::render`] assembles, one builder each, and the `flexd`
//! arguments of each pod.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec,
    DeploymentStrategy,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    HostPathVolumeSource, ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    SecurityContext, ServiceAccount, Toleration, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::rbac::v1::{RoleRef, Subject};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::sidecar::Sidecar;
use super::*;

pub(super) const NODE: &str = "flexd-node";
pub(super) const CONTROLLER: &str = "flexd-controller";
pub(super) const CONTROLLER_STATE: &str = "flexd-controller-state";

pub(super) fn labels(app: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), app.to_owned()),
        ("app.kubernetes.io/part-of".to_owned(), "flexd".to_owned()),
    ])
}

pub(super) fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(labels(name)),
        ..Default::default()
    }
}

pub(super) fn path(p: &Path) -> String {
    p.display().to_string()
}

pub(super) fn host_volume(name: &str, host: &str, kind: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        host_path: Some(HostPathVolumeSource {
            path: host.to_owned(),
            type_: Some(kind.to_owned()),
        }),
        ..Default::default()
    }
}

pub(super) fn mount(
    name: &str,
    at: &str,
    propagation: Option<&str>,
    read_only: bool,
) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: at.to_owned(),
        mount_propagation: propagation.map(str::to_owned),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// `/healthz` answers 503 when the driver watcher died or an endpoint stopped serving.
pub(super) fn health_probe(period: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/healthz".to_owned()),
            port: IntOrString::String("metrics".to_owned()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(3),
        ..Default::default()
    }
}

pub(super) fn resources(cpu: &str, memory: &str, limit: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(memory.to_owned())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity(limit.to_owned()),
        )])),
        ..Default::default()
    }
}

/// Host directories the drivers use: volume names `host-dir-<n>`.
pub(super) fn host_dirs(settings: &Settings) -> (Vec<Volume>, Vec<VolumeMount>) {
    settings
        .host_dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let name = format!("host-dir-{i}");
            (
                host_volume(&name, &path(dir), "DirectoryOrCreate"),
                mount(&name, &path(dir), None, false),
            )
        })
        .unzip()
}

pub(super) fn flexd_container(args: Vec<String>, mounts: Vec<VolumeMount>) -> Container {
    Container {
        name: "flexd".to_owned(),
        args: Some(args),
        // Drivers mount filesystems and set up devices: flexd runs them as root.
        security_context: Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        }),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".to_owned()),
            container_port: METRICS_PORT,
            ..Default::default()
        }]),
        liveness_probe: Some(health_probe(10)),
        readiness_probe: Some(health_probe(5)),
        resources: Some(resources("10m", "32Mi", "256Mi")),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}

pub(super) fn pod_template(app: &str, spec: PodSpec) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(app)),
            ..Default::default()
        }),
        spec: Some(spec),
    }
}

pub(super) fn selector(app: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(app)),
        ..Default::default()
    }
}

/// The node DaemonSet's `flexd` arguments.
/// The host's mount namespace as seen from a pod with `hostPID: true`.
pub const HOST_MOUNT_NAMESPACE: &str = "/proc/1/ns/mnt";

pub fn node_args(settings: &Settings) -> Vec<String> {
    let kubelet = &settings.kubelet_dir;
    vec![
        format!("--plugin-dir={}", path(&settings.plugin_dir)),
        format!("--state-dir={}", path(&settings.state_dir)),
        "--log-format=json".to_owned(),
        // Drivers run as kubelet ran them: with the host's tools, their mounts where kubelet
        // looks (docs/lifecycle.md#driver-mount-namespace). /proc/1 is the host's init: hostPID.
        format!("--driver-mount-namespace={HOST_MOUNT_NAMESPACE}"),
        "serve".to_owned(),
        "--mode=node".to_owned(),
        format!("--csi-dir={}", path(&kubelet.join("plugins"))),
        format!(
            "--registration-dir={}",
            path(&kubelet.join("plugins_registry"))
        ),
        format!("--metrics-address=0.0.0.0:{METRICS_PORT}"),
    ]
}

pub(super) fn node_daemonset(settings: &Settings) -> DaemonSet {
    let kubelet = path(&settings.kubelet_dir);
    let plugin_dir = path(&settings.plugin_dir);
    let state_dir = path(&settings.state_dir);
    let (mut volumes, mut mounts) = (
        vec![
            host_volume("plugin-dir", &plugin_dir, "DirectoryOrCreate"),
            host_volume("kubelet-dir", &kubelet, "Directory"),
            host_volume("state-dir", &state_dir, "DirectoryOrCreate"),
            host_volume("dev", "/dev", "Directory"),
        ],
        vec![
            mount("plugin-dir", &plugin_dir, None, false),
            // Mounts made for kubelet under its dir must propagate back to the host.
            mount("kubelet-dir", &kubelet, Some("Bidirectional"), false),
            mount("state-dir", &state_dir, Some("Bidirectional"), false),
            mount("dev", "/dev", None, false),
        ],
    );
    let (extra_volumes, extra_mounts) = host_dirs(settings);
    volumes.extend(extra_volumes);
    mounts.extend(extra_mounts);
    let mut container = flexd_container(node_args(settings), mounts);
    container.image = Some(settings.image.clone());
    container.env = Some(vec![EnvVar {
        name: "NODE_NAME".to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "spec.nodeName".to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    DaemonSet {
        metadata: meta(NODE, Some(&settings.namespace)),
        spec: Some(DaemonSetSpec {
            selector: selector(NODE),
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".to_owned()),
                ..Default::default()
            }),
            template: pod_template(
                NODE,
                PodSpec {
                    service_account_name: Some(NODE.to_owned()),
                    automount_service_account_token: Some(false),
                    priority_class_name: Some("system-node-critical".to_owned()),
                    // The host's pid namespace: /proc/1/ns/mnt is the host's mount
                    // namespace, and the host's init reaps orphaned driver helpers, which
                    // would otherwise stay flexd's zombies, counted against their call-out's
                    // process cap (Kubernetes refuses shareProcessNamespace with hostPID).
                    host_pid: Some(true),
                    // The host's network namespace: kubelet ran FlexVolume drivers there, and
                    // a driver's network mounts (NFS, CIFS, iSCSI sessions) belong to the
                    // namespace they were made in: in the pod's, they would die with the pod
                    // and reach only what the pod network reaches.
                    host_network: Some(true),
                    tolerations: Some(vec![Toleration {
                        operator: Some("Exists".to_owned()),
                        ..Default::default()
                    }]),
                    containers: vec![container],
                    volumes: Some(volumes),
                    ..Default::default()
                },
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The controller Deployment's `flexd` arguments.
pub fn controller_args(settings: &Settings) -> Vec<String> {
    vec![
        format!("--plugin-dir={}", path(&settings.plugin_dir)),
        format!("--state-dir={CONTROLLER_STATE_DIR}"),
        "--log-format=json".to_owned(),
        "serve".to_owned(),
        "--mode=controller".to_owned(),
        format!("--csi-dir={CONTROLLER_CSI_DIR}"),
        format!("--metrics-address=0.0.0.0:{METRICS_PORT}"),
    ]
}

/// The `flexd-capabilities` container's arguments: the resizers' socket (see the module doc).
/// Its state is scratch: it serves no volume, so it never records one.
pub fn capabilities_args(settings: &Settings) -> Vec<String> {
    vec![
        format!("--plugin-dir={}", path(&settings.plugin_dir)),
        format!("--state-dir={CAPABILITIES_CSI_DIR}/state"),
        "--log-format=json".to_owned(),
        "serve".to_owned(),
        "--mode=both".to_owned(),
        format!("--csi-dir={CAPABILITIES_CSI_DIR}"),
        // Nothing watches it: kubelet never learns of this flexd.
        format!("--registration-dir={CAPABILITIES_CSI_DIR}/registration"),
        format!("--metrics-address=0.0.0.0:{CAPABILITIES_PORT}"),
    ]
}

pub(super) fn capabilities_container(settings: &Settings) -> Container {
    let mut container = flexd_container(
        capabilities_args(settings),
        vec![
            mount("plugin-dir", &path(&settings.plugin_dir), None, true),
            mount("capabilities-dir", CAPABILITIES_CSI_DIR, None, false),
        ],
    );
    container.name = "flexd-capabilities".to_owned();
    container.image = Some(settings.image.clone());
    // It runs drivers' init only.
    container.security_context = None;
    container.resources = Some(resources("5m", "16Mi", "128Mi"));
    let port = "caps-metrics";
    if let Some(ports) = &mut container.ports {
        ports[0].name = Some(port.to_owned());
        ports[0].container_port = CAPABILITIES_PORT;
    }
    for probe in [
        &mut container.liveness_probe,
        &mut container.readiness_probe,
    ]
    .into_iter()
    .flatten()
    {
        if let Some(get) = &mut probe.http_get {
            get.port = IntOrString::String(port.to_owned());
        }
    }
    container
}

pub(super) fn controller_deployment(settings: &Settings, drivers: &[DriverProfile]) -> Deployment {
    let plugin_dir = path(&settings.plugin_dir);
    let (mut volumes, mut mounts) = (
        vec![
            // Installed on every node by the installer DaemonSet; flexd only reads it.
            host_volume("plugin-dir", &plugin_dir, "DirectoryOrCreate"),
            Volume {
                name: "socket-dir".to_owned(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            },
            Volume {
                name: "state".to_owned(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: CONTROLLER_STATE.to_owned(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            host_volume("dev", "/dev", "Directory"),
        ],
        vec![
            mount("plugin-dir", &plugin_dir, None, true),
            mount("socket-dir", CONTROLLER_CSI_DIR, None, false),
            mount("state", CONTROLLER_STATE_DIR, None, false),
            mount("dev", "/dev", None, false),
        ],
    );
    let (extra_volumes, extra_mounts) = host_dirs(settings);
    volumes.extend(extra_volumes);
    mounts.extend(extra_mounts);
    let mut flexd = flexd_container(controller_args(settings), mounts);
    flexd.image = Some(settings.image.clone());
    let mut containers = vec![flexd];
    let resizing = drivers
        .iter()
        .any(|d| Sidecar::for_driver(d).contains(&Sidecar::Resizer));
    if resizing {
        containers.push(capabilities_container(settings));
        volumes.push(Volume {
            name: "capabilities-dir".to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        });
    }
    for (index, driver) in drivers.iter().enumerate() {
        for sidecar in Sidecar::for_driver(driver) {
            let (volume, dir) = match sidecar {
                Sidecar::Resizer => ("capabilities-dir", CAPABILITIES_CSI_DIR),
                Sidecar::Attacher | Sidecar::Provisioner => ("socket-dir", CONTROLLER_CSI_DIR),
            };
            containers.push(Container {
                // Container names cannot hold a CSI name's dots; the socket says which driver.
                name: format!("{}-{index}", sidecar.name()),
                image: Some(sidecar.image(settings).to_owned()),
                args: Some(vec![
                    format!("--csi-address={}", driver.socket(dir)),
                    "--leader-election".to_owned(),
                    format!("--timeout={}s", sidecar_timeout().as_secs()),
                ]),
                resources: Some(resources("10m", "32Mi", "128Mi")),
                volume_mounts: Some(vec![mount(volume, dir, None, false)]),
                ..Default::default()
            });
        }
    }
    Deployment {
        metadata: meta(CONTROLLER, Some(&settings.namespace)),
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            selector: selector(CONTROLLER),
            // The state claim is ReadWriteOnce, and one controller attaches at a time.
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".to_owned()),
                ..Default::default()
            }),
            template: pod_template(
                CONTROLLER,
                PodSpec {
                    service_account_name: Some(CONTROLLER.to_owned()),
                    priority_class_name: Some("system-cluster-critical".to_owned()),
                    containers,
                    volumes: Some(volumes),
                    ..Default::default()
                },
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn state_claim(settings: &Settings) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: meta(CONTROLLER_STATE, Some(&settings.namespace)),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            storage_class_name: settings.state_storage_class.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity("1Gi".to_owned()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn csi_driver(driver: &DriverProfile) -> CSIDriver {
    let mut modes = vec!["Persistent".to_owned()];
    if !driver.attach {
        modes.push("Ephemeral".to_owned());
    }
    let mut metadata = meta(&driver.csi_name, None);
    metadata.labels = Some(BTreeMap::from([(
        "app.kubernetes.io/part-of".to_owned(),
        "flexd".to_owned(),
    )]));
    metadata.annotations = Some(BTreeMap::from([(
        "flexd/flexvolume-driver".to_owned(),
        driver.name.to_string(),
    )]));
    CSIDriver {
        metadata,
        spec: CSIDriverSpec {
            attach_required: Some(driver.attach),
            fs_group_policy: Some(if driver.fs_group { "File" } else { "None" }.to_owned()),
            pod_info_on_mount: Some(true),
            requires_republish: Some(false),
            volume_lifecycle_modes: Some(modes),
            ..Default::default()
        },
    }
}

pub(super) fn service_account(name: &str, namespace: &str, token: bool) -> ServiceAccount {
    ServiceAccount {
        metadata: meta(name, Some(namespace)),
        automount_service_account_token: Some(token),
        ..Default::default()
    }
}

pub(super) fn controller_subject(namespace: &str) -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".to_owned(),
        name: CONTROLLER.to_owned(),
        namespace: Some(namespace.to_owned()),
        ..Default::default()
    }]
}

pub(super) fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
    }
}
