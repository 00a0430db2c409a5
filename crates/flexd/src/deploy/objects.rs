//! The Kubernetes objects [`super::render`] assembles, one builder each, and the `flexd`
//! arguments of each pod.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec,
    DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities as LinuxCapabilities, ConfigMapProjection, Container, ContainerPort,
    DownwardAPIProjection, DownwardAPIVolumeFile, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, HostPathVolumeSource, KeyToPath, ObjectFieldSelector,
    PersistentVolumeClaimVolumeSource, PodAffinityTerm, PodAntiAffinity, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, ProjectedVolumeSource, ResourceRequirements, SeccompProfile,
    Secret, SecretVolumeSource, SecurityContext, ServiceAccount, ServiceAccountTokenProjection,
    Toleration, Volume, VolumeMount, VolumeProjection, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{RoleRef, Subject};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceValidation,
    JSONSchemaProps, JSONSchemaPropsOrBool,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::sidecar::{sidecar_timeout, Sidecar};
use super::{
    DriverProfile, Settings, CAPABILITIES_CSI_DIR, CAPABILITIES_PORT, CONTROLLER_CSI_DIR,
    CONTROLLER_STATE_DIR, METRICS_PORT,
};

pub(super) const NODE: &str = "flexd-node";
pub(super) const CONTROLLER: &str = "flexd-controller";
/// The ServiceAccount (and its token Secret) of the controller's records.
pub(super) const CONTROLLER_RECORDS: &str = "flexd-controller-records";
/// Where the records token is mounted in the controller's flexd container.
pub(super) const CONTROLLER_RECORDS_DIR: &str = crate::controller_records::DEFAULT_CREDENTIALS;
/// The Job that imports an older controller's records (`flexd manifests --import-state-claim`).
pub(super) const IMPORT_JOB: &str = "flexd-import-records";
/// Replicas of the controller Deployment.
pub(super) const CONTROLLER_REPLICAS: i32 = 2;

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

/// `/healthz` answers 503 when the driver watcher died or an endpoint stopped serving. On the
/// host network kubelet probes the node's loopback, where flexd listens by default.
pub(super) fn health_probe(period: i32, host: Option<&str>) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/healthz".to_owned()),
            port: IntOrString::String("metrics".to_owned()),
            host: host.map(str::to_owned),
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

/// `resources` with a CPU limit too: for a one-off Job, where throttling costs only time (the
/// pods serving call-outs have none: deploy/checkov-accepted.txt says why).
pub(super) fn capped(mut resources: ResourceRequirements, cpu: &str) -> ResourceRequirements {
    resources
        .limits
        .get_or_insert_with(BTreeMap::new)
        .insert("cpu".to_owned(), Quantity(cpu.to_owned()));
    resources
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

/// A container that needs no privilege: no capability (but those named), no escalation, a
/// read-only root filesystem; `user`: a non-root uid and gid to run as.
pub(super) fn unprivileged(user: Option<i64>, add: &[&str]) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(LinuxCapabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: (!add.is_empty()).then(|| add.iter().map(|c| (*c).to_owned()).collect()),
        }),
        run_as_non_root: user.map(|_| true),
        run_as_user: user,
        run_as_group: user,
        ..Default::default()
    }
}

/// flexd runs drivers as root, as kubelet and the controller manager did. `privileged`: they
/// mount filesystems or set up devices (every node; a controller only where the operator
/// says its drivers attach devices, as the loop driver does). Otherwise it keeps CHOWN
/// alone, to give its sockets to the sidecars' group. Its root filesystem is read-only
/// either way; drivers get a writable `/tmp`.
pub(super) fn flexd_security(privileged: bool) -> SecurityContext {
    if privileged {
        SecurityContext {
            privileged: Some(true),
            read_only_root_filesystem: Some(true),
            ..Default::default()
        }
    } else {
        unprivileged(None, &["CHOWN"])
    }
}

/// The pods' own settings: the runtime's default seccomp profile (a privileged container runs
/// without one whatever this says).
pub(super) fn pod_security() -> PodSecurityContext {
    PodSecurityContext {
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A writable `/tmp` on a read-only root filesystem.
pub(super) fn tmp_volume() -> (Volume, VolumeMount) {
    (
        Volume {
            name: "tmp".to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
        mount("tmp", "/tmp", None, false),
    )
}

/// flexd's CPU request, node and controller alike. Its drivers run in its pod's cgroup, so
/// under contention they get the CPU weight of its request (on a node whose only Burstable pod
/// it is, the whole Burstable class weighs that much against the pods being started). At 10m, in
/// a burst of 50 pods on two cores, each driver run waited 1.9-2.8 times as long for a CPU as
/// the same driver run by kubelet; at 100m about as long (bench/README.md#pod-startupsh).
const FLEXD_CPU_REQUEST: &str = "100m";

pub(super) fn flexd_container(
    args: Vec<String>,
    mounts: Vec<VolumeMount>,
    privileged: bool,
    probe_host: Option<&str>,
) -> Container {
    Container {
        name: "flexd".to_owned(),
        args: Some(args),
        security_context: Some(flexd_security(privileged)),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".to_owned()),
            container_port: METRICS_PORT,
            ..Default::default()
        }]),
        liveness_probe: Some(health_probe(10, probe_host)),
        readiness_probe: Some(health_probe(5, probe_host)),
        resources: Some(resources(FLEXD_CPU_REQUEST, "32Mi", "256Mi")),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}

/// Where client-go looks for in-cluster credentials.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The ServiceAccount token, CA and namespace kubelet would mount into every container,
/// projected by hand so that only the sidecars, which talk to the API server, get them: flexd
/// and the drivers it runs as root never hold the sidecars' cluster-wide permissions.
pub(super) fn api_access() -> (Volume, VolumeMount) {
    let name = "kube-api-access";
    (
        Volume {
            name: name.to_owned(),
            projected: Some(ProjectedVolumeSource {
                default_mode: Some(0o644),
                sources: Some(vec![
                    VolumeProjection {
                        service_account_token: Some(ServiceAccountTokenProjection {
                            expiration_seconds: Some(3607),
                            path: "token".to_owned(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        config_map: Some(ConfigMapProjection {
                            name: "kube-root-ca.crt".to_owned(),
                            items: Some(vec![KeyToPath {
                                key: "ca.crt".to_owned(),
                                path: "ca.crt".to_owned(),
                                ..Default::default()
                            }]),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        downward_api: Some(DownwardAPIProjection {
                            items: Some(vec![DownwardAPIVolumeFile {
                                path: "namespace".to_owned(),
                                field_ref: Some(ObjectFieldSelector {
                                    api_version: Some("v1".to_owned()),
                                    field_path: "metadata.namespace".to_owned(),
                                }),
                                ..Default::default()
                            }]),
                        }),
                        ..Default::default()
                    },
                ]),
            }),
            ..Default::default()
        },
        mount(name, SERVICE_ACCOUNT_DIR, None, true),
    )
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

/// The host's mount namespace as seen from a pod with `hostPID: true`.
pub(crate) const HOST_MOUNT_NAMESPACE: &str = "/proc/1/ns/mnt";

/// The uid and gid the CSI sidecars run as (the distroless images' `nonroot`), and the group
/// the controller's flexd gives its CSI sockets to (`--socket-group`).
pub(crate) const SIDECAR_USER: i64 = 65532;

/// Where the node's flexd serves `/metrics` and `/healthz`: the node's loopback (kubelet's
/// probes), or every address when the operator asked to scrape it from the network.
fn node_metrics_address(settings: &Settings) -> String {
    let host = if settings.expose_metrics {
        "0.0.0.0"
    } else {
        "127.0.0.1"
    };
    format!("{host}:{METRICS_PORT}")
}

/// The node DaemonSet's `flexd` arguments.
pub(crate) fn node_args(settings: &Settings) -> Vec<String> {
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
        format!("--metrics-address={}", node_metrics_address(settings)),
    ]
}

pub(super) fn node_daemonset(settings: &Settings) -> DaemonSet {
    let kubelet = &settings.kubelet_dir;
    let [pods, plugins, registry] =
        ["pods", "plugins", "plugins_registry"].map(|dir| path(&kubelet.join(dir)));
    let plugin_dir = path(&settings.plugin_dir);
    let state_dir = path(&settings.state_dir);
    let (tmp, tmp_mount) = tmp_volume();
    // Only what flexd uses of kubelet's dir (never its pki/ or its config): the pods' volume
    // dirs, where volumes are published, and the plugins dir (CSI sockets and staging paths),
    // both with Bidirectional propagation so that mounts made here reach kubelet; and the
    // registration dir. The plugin dir is read-only: the installer writes it, flexd reads it.
    let (mut volumes, mut mounts) = (
        vec![
            host_volume("plugin-dir", &plugin_dir, "DirectoryOrCreate"),
            host_volume("kubelet-pods", &pods, "Directory"),
            host_volume("kubelet-plugins", &plugins, "DirectoryOrCreate"),
            host_volume("kubelet-registration", &registry, "DirectoryOrCreate"),
            host_volume("state-dir", &state_dir, "DirectoryOrCreate"),
            host_volume("dev", "/dev", "Directory"),
            tmp,
        ],
        vec![
            mount("plugin-dir", &plugin_dir, None, true),
            mount("kubelet-pods", &pods, Some("Bidirectional"), false),
            mount("kubelet-plugins", &plugins, Some("Bidirectional"), false),
            mount("kubelet-registration", &registry, None, false),
            mount("state-dir", &state_dir, Some("Bidirectional"), false),
            mount("dev", "/dev", None, false),
            tmp_mount,
        ],
    );
    let (extra_volumes, extra_mounts) = host_dirs(settings);
    volumes.extend(extra_volumes);
    mounts.extend(extra_mounts);
    let mut container = flexd_container(node_args(settings), mounts, true, Some("127.0.0.1"));
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
                    security_context: Some(pod_security()),
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

/// The controller Deployment's `flexd` arguments. It is not on the host network: its metrics
/// port is on the pod's own address, where kubelet's probes reach it.
pub(crate) fn controller_args(settings: &Settings) -> Vec<String> {
    let mut args = vec![
        format!("--plugin-dir={}", path(&settings.plugin_dir)),
        format!("--state-dir={CONTROLLER_STATE_DIR}"),
        "--log-format=json".to_owned(),
        "serve".to_owned(),
        "--mode=controller".to_owned(),
        "--controller-records=kubernetes".to_owned(),
        format!("--records-credentials={CONTROLLER_RECORDS_DIR}"),
        format!("--csi-dir={CONTROLLER_CSI_DIR}"),
        format!("--socket-group={SIDECAR_USER}"),
        format!("--metrics-address=0.0.0.0:{METRICS_PORT}"),
    ];
    if let Some(lease) = settings.fence_lease {
        args.push(format!("--fence-lease={}ms", lease.as_millis()));
    }
    args
}

/// The `flexd-capabilities` container's arguments: the resizers' socket (see the module doc).
/// Its state is scratch: it serves no volume, so it never records one.
pub(crate) fn capabilities_args(settings: &Settings) -> Vec<String> {
    vec![
        format!("--plugin-dir={}", path(&settings.plugin_dir)),
        format!("--state-dir={CAPABILITIES_CSI_DIR}/state"),
        "--log-format=json".to_owned(),
        "serve".to_owned(),
        "--mode=both".to_owned(),
        format!("--csi-dir={CAPABILITIES_CSI_DIR}"),
        // Nothing watches it: kubelet never learns of this flexd.
        format!("--registration-dir={CAPABILITIES_CSI_DIR}/registration"),
        format!("--socket-group={SIDECAR_USER}"),
        format!("--metrics-address=0.0.0.0:{CAPABILITIES_PORT}"),
    ]
}

pub(super) fn capabilities_container(settings: &Settings, tmp: &VolumeMount) -> Container {
    let mut container = flexd_container(
        capabilities_args(settings),
        vec![
            mount("plugin-dir", &path(&settings.plugin_dir), None, true),
            mount("capabilities-dir", CAPABILITIES_CSI_DIR, None, false),
            tmp.clone(),
        ],
        // It runs drivers' init only.
        false,
        None,
    );
    container.name = "flexd-capabilities".to_owned();
    container.image = Some(settings.image.clone());
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
    // Privileged, with the host's /dev, only when a driver's attach sets up devices here.
    let privileged = drivers.iter().any(|d| d.privileged_controller);
    let (tmp, tmp_mount) = tmp_volume();
    let (api, api_mount) = api_access();
    let (mut volumes, mut mounts) = (
        vec![
            // Installed on every node by the installer DaemonSet; flexd only reads it.
            host_volume("plugin-dir", &plugin_dir, "DirectoryOrCreate"),
            Volume {
                name: "socket-dir".to_owned(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            },
            // Scratch (locks, pinned drivers): what must outlive the pod is in the API server.
            Volume {
                name: "state".to_owned(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            },
            records_credentials().0,
            tmp,
            api,
        ],
        vec![
            mount("plugin-dir", &plugin_dir, None, true),
            mount("socket-dir", CONTROLLER_CSI_DIR, None, false),
            mount("state", CONTROLLER_STATE_DIR, None, false),
            records_credentials().1,
            tmp_mount.clone(),
        ],
    );
    if privileged {
        volumes.push(host_volume("dev", "/dev", "Directory"));
        mounts.push(mount("dev", "/dev", None, false));
    }
    let (extra_volumes, extra_mounts) = host_dirs(settings);
    volumes.extend(extra_volumes);
    mounts.extend(extra_mounts);
    let mut flexd = flexd_container(controller_args(settings), mounts, privileged, None);
    flexd.image = Some(settings.image.clone());
    let mut containers = vec![flexd];
    let resizing = drivers
        .iter()
        .any(|d| Sidecar::for_driver(d).contains(&Sidecar::Resizer));
    if resizing {
        containers.push(capabilities_container(settings, &tmp_mount));
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
                args: Some(
                    [
                        format!("--csi-address={}", driver.socket(dir)),
                        "--leader-election".to_owned(),
                        format!("--timeout={}s", sidecar_timeout().as_secs()),
                    ]
                    .into_iter()
                    .chain(sidecar.tuning().iter().map(|flag| (*flag).to_owned()))
                    .chain(sidecar.version_flags(settings).iter().cloned())
                    .collect(),
                ),
                resources: Some(resources("10m", "32Mi", "128Mi")),
                // Not root: flexd's sockets let the sidecars' group in.
                security_context: Some(unprivileged(Some(SIDECAR_USER), &[])),
                volume_mounts: Some(vec![mount(volume, dir, None, false), api_mount.clone()]),
                ..Default::default()
            });
        }
    }
    Deployment {
        metadata: meta(CONTROLLER, Some(&settings.namespace)),
        spec: Some(DeploymentSpec {
            // Every sidecar elects a leader, and any replica reads the records: a lost node
            // leaves a replica elsewhere to take over.
            replicas: Some(CONTROLLER_REPLICAS),
            selector: selector(CONTROLLER),
            // One replica at a time, the new one up before the old one goes.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: pod_template(
                CONTROLLER,
                PodSpec {
                    // Replicas on different nodes where there are several.
                    affinity: Some(spread_by_node(CONTROLLER)),
                    service_account_name: Some(CONTROLLER.to_owned()),
                    // Only the sidecars get the token (api_access): not flexd, not drivers.
                    automount_service_account_token: Some(false),
                    priority_class_name: Some("system-cluster-critical".to_owned()),
                    security_context: Some(pod_security()),
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

/// Preferred, not required: a one-node cluster still runs every replica.
fn spread_by_node(app: &str) -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: selector(app).match_labels.map(|labels| LabelSelector {
                            match_labels: Some(labels),
                            ..Default::default()
                        }),
                        topology_key: "kubernetes.io/hostname".to_owned(),
                        ..Default::default()
                    },
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// At most one controller replica down at a time by a drain.
pub(super) fn controller_disruption_budget(settings: &Settings) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(CONTROLLER, Some(&settings.namespace)),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(selector(CONTROLLER)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The resource the controller's records are kept as ([`crate::serve`]'s
/// `kubernetes_records`): namespaced, so that a Role in flexd's namespace is all the
/// controller's records credentials allow.
pub(super) fn records_definition() -> CustomResourceDefinition {
    use crate::controller_records::{GROUP, KIND, PLURAL, VERSION};
    let string = || JSONSchemaProps {
        type_: Some("string".to_owned()),
        ..Default::default()
    };
    let object = || JSONSchemaProps {
        type_: Some("object".to_owned()),
        x_kubernetes_preserve_unknown_fields: Some(true),
        ..Default::default()
    };
    let integer = || JSONSchemaProps {
        type_: Some("integer".to_owned()),
        minimum: Some(0.0),
        ..Default::default()
    };
    // One record per volume: its fence, its provisioned volume, its attachments by node
    // (flexvolume_host::controller_records::ControllerRecord).
    let fence = JSONSchemaProps {
        type_: Some("object".to_owned()),
        required: Some(
            ["holder", "token", "operation", "leaseSeconds", "renewals"]
                .map(str::to_owned)
                .to_vec(),
        ),
        properties: Some(BTreeMap::from([
            ("holder".to_owned(), string()),
            ("token".to_owned(), integer()),
            ("operation".to_owned(), string()),
            ("leaseSeconds".to_owned(), integer()),
            ("renewals".to_owned(), integer()),
        ])),
        ..Default::default()
    };
    let spec = JSONSchemaProps {
        type_: Some("object".to_owned()),
        required: Some(["driver", "volume"].map(str::to_owned).to_vec()),
        properties: Some(BTreeMap::from([
            ("driver".to_owned(), string()),
            ("volume".to_owned(), string()),
            ("fence".to_owned(), fence),
            ("fences".to_owned(), integer()),
            ("provisioned".to_owned(), object()),
            (
                "attachments".to_owned(),
                JSONSchemaProps {
                    type_: Some("object".to_owned()),
                    additional_properties: Some(JSONSchemaPropsOrBool::Schema(Box::new(object()))),
                    ..Default::default()
                },
            ),
        ])),
        ..Default::default()
    };
    let mut metadata = meta(&format!("{PLURAL}.{GROUP}"), None);
    metadata.labels = Some(labels(CONTROLLER));
    CustomResourceDefinition {
        metadata,
        spec: CustomResourceDefinitionSpec {
            group: GROUP.to_owned(),
            scope: "Namespaced".to_owned(),
            names: CustomResourceDefinitionNames {
                kind: KIND.to_owned(),
                plural: PLURAL.to_owned(),
                singular: Some(KIND.to_lowercase()),
                list_kind: Some(format!("{KIND}List")),
                ..Default::default()
            },
            versions: vec![CustomResourceDefinitionVersion {
                name: VERSION.to_owned(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(JSONSchemaProps {
                        type_: Some("object".to_owned()),
                        properties: Some(BTreeMap::from([("spec".to_owned(), spec)])),
                        required: Some(vec!["spec".to_owned()]),
                        ..Default::default()
                    }),
                }),
                additional_printer_columns: Some(
                    [
                        ("Driver", ".spec.driver"),
                        ("Volume", ".spec.volume"),
                        ("Fenced by", ".spec.fence.holder"),
                        ("Operation", ".spec.fence.operation"),
                    ]
                    .map(|(name, path)| CustomResourceColumnDefinition {
                        name: name.to_owned(),
                        type_: "string".to_owned(),
                        json_path: path.to_owned(),
                        ..Default::default()
                    })
                    .to_vec(),
                ),
                ..Default::default()
            }],
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The records token Secret (token, CA, namespace), owner-only, and its read-only mount where
/// `--records-credentials` looks.
fn records_credentials() -> (Volume, VolumeMount) {
    let name = "records-credentials";
    (
        Volume {
            name: name.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(CONTROLLER_RECORDS.to_owned()),
                default_mode: Some(0o400),
                ..Default::default()
            }),
            ..Default::default()
        },
        mount(name, CONTROLLER_RECORDS_DIR, None, true),
    )
}

/// `flexd records import` of the claim's records into the API server: root's uid (the old
/// state dir is root's, 0700) with no capability, the claim read-only, the records token.
pub(super) fn import_job(settings: &Settings, claim: &str) -> Job {
    let old = "/var/lib/flexd-import/old-state";
    let (tmp, tmp_mount) = tmp_volume();
    let container = Container {
        name: "import".to_owned(),
        image: Some(settings.image.clone()),
        args: Some(vec![
            "--state-dir=/tmp/state".to_owned(),
            "--log-format=json".to_owned(),
            "records".to_owned(),
            "import".to_owned(),
            format!("--from={old}"),
            "--controller-records=kubernetes".to_owned(),
            format!("--records-credentials={CONTROLLER_RECORDS_DIR}"),
        ]),
        security_context: Some(unprivileged(None, &[])),
        resources: Some(capped(resources("10m", "32Mi", "128Mi"), "500m")),
        volume_mounts: Some(vec![
            mount("old-state", old, None, true),
            records_credentials().1,
            tmp_mount,
        ]),
        ..Default::default()
    };
    Job {
        metadata: meta(IMPORT_JOB, Some(&settings.namespace)),
        spec: Some(JobSpec {
            backoff_limit: Some(3),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(IMPORT_JOB)),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("OnFailure".to_owned()),
                    service_account_name: Some(CONTROLLER_RECORDS.to_owned()),
                    automount_service_account_token: Some(false),
                    security_context: Some(pod_security()),
                    containers: vec![container],
                    volumes: Some(vec![
                        Volume {
                            name: "old-state".to_owned(),
                            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                                claim_name: claim.to_owned(),
                                read_only: Some(true),
                            }),
                            ..Default::default()
                        },
                        records_credentials().0,
                        tmp,
                    ]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The token the controller's flexd container holds: of its own ServiceAccount, whose Role
/// allows the records and nothing else. The sidecars' token never reaches flexd nor its
/// drivers.
pub(super) fn records_token(settings: &Settings) -> Secret {
    let mut metadata = meta(CONTROLLER_RECORDS, Some(&settings.namespace));
    metadata.annotations = Some(BTreeMap::from([(
        "kubernetes.io/service-account.name".to_owned(),
        CONTROLLER_RECORDS.to_owned(),
    )]));
    Secret {
        metadata,
        type_: Some("kubernetes.io/service-account-token".to_owned()),
        ..Default::default()
    }
}

pub(super) fn csi_driver(driver: &DriverProfile) -> CSIDriver {
    let mut modes = vec!["Persistent".to_owned()];
    // Inline volumes let any pod author hand options to a root driver on the host; only
    // where the operator asked (and never for a driver that attaches: no attach step).
    if driver.inline && !driver.attach {
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
