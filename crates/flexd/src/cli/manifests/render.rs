//! Everything a cluster needs to run flexd, as typed Kubernetes objects: pure functions from
//! what each driver can do ([`DriverProfile`]) and where things live ([`Settings`]) to objects,
//! so `flexd manifests`, `deploy/flexd.yaml` and the tests agree by construction.
//!
//! The choices, and why (the README's "Deploy to a cluster" says the same to operators):
//! - **Node**: a DaemonSet running `flexd serve --mode node`, privileged (drivers mount and set
//!   up devices), with the kubelet dir at its host path with Bidirectional propagation (mounts
//!   made in the pod must reach kubelet), the plugin dir, and the state dir on the host (node
//!   records must outlive the pod). flexd registers with kubelet itself: no registrar sidecar.
//!   It talks to no API server: no token, no permissions.
//! - **Controller**: only when some driver has a controller side (it attaches, or it
//!   provisions). A Deployment running `flexd serve --mode controller` beside one set of CSI
//!   sidecars per driver, talking over `<csi-dir>/<csi-name>/csi.sock` in a shared emptyDir.
//!   - Its drivers come from the **host plugin dir**, read-only: the installer DaemonSet
//!     (`deploy/installer-daemonset.yaml`) already puts every driver on every node, control plane
//!     included, so the controller runs exactly the driver version the nodes run, with no image
//!     per driver to keep in step. This is where kube-controller-manager ran FlexVolume attach.
//!   - Its **state lives on a PersistentVolumeClaim** of the cluster's default (or a named)
//!     StorageClass, provisioned volumes' records included: detach must use the volume name
//!     recorded at attach, and
//!     ControllerUnpublishVolume carries only the volume id and the node, not the spec
//!     `getvolumename` would need, so the name cannot be recomputed. One replica with the
//!     Recreate strategy, because the claim is ReadWriteOnce and two controllers must never
//!     attach the same volume.
//!   - Privileged, with `/dev`: attach and detach are the driver's own code, which FlexVolume
//!     drivers expect to run as root on a host, as they did in the controller manager.
//! - **Sidecars**, each with `--leader-election` (a lease per sidecar and driver) and a
//!   `--timeout` beyond flexd's call-out timeout ([`sidecar_timeout`]): csi-attacher
//!   for a driver that attaches; csi-provisioner for one that provisions; csi-resizer for an
//!   expanding driver (`requiresFSResize`) that has a controller side. flexd expands on the node
//!   only (NodeExpandVolume), so csi-resizer runs its "trivial" resizer: it only checks, at
//!   start, that the plugin has the controller service and the *node* EXPAND_VOLUME capability,
//!   then marks volumes for kubelet's NodeExpandVolume without calling the plugin again. The
//!   controller (`--mode controller`, which attaches to any node) has no node service, and
//!   `--mode both` publishes to its own node only, so the resizers get a second, call-out-free
//!   flexd beside it: `flexd-capabilities`, `--mode both` on a private socket dir and scratch
//!   state, which only answers those capability questions (kubelet never sees it). An expanding
//!   driver with no controller side gets no resizer, because csi-resizer refuses to start
//!   against a plugin without the controller service.
//! - **RBAC**: the official sidecars' rules (kubernetes-csi `deploy/kubernetes/rbac.yaml`), one
//!   ClusterRole per sidecar kind present, bound to the controller's ServiceAccount, and one Role
//!   for the leader-election leases. The provisioner's snapshot rules are left out: flexd
//!   provisions no volume from a snapshot.
//! - **CSIDriver** per driver: `attachRequired` from `attach`; `fsGroupPolicy` `File` when the
//!   driver takes the fsGroup (flexd's node advertises VOLUME_MOUNT_GROUP, so kubelet hands the
//!   group over in `volume_mount_group` and flexd's ownership pass applies it, kubelet changing
//!   nothing itself) and `None` when its `init` declines `fsGroup` (FlexVolume then leaves
//!   ownership alone, and so must kubelet: `File` would make kubelet chown it, since no
//!   VOLUME_MOUNT_GROUP is advertised); `podInfoOnMount` (flexd passes pod information to
//!   mount); `Persistent` volumes, and inline `Ephemeral` ones for drivers that do not attach
//!   (an inline volume has no attach step); `requiresRepublish` off.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use flexvolume::{Capabilities, DriverName};
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec,
    DeploymentStrategy,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    HostPathVolumeSource, Namespace, ObjectFieldSelector, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SecurityContext, ServiceAccount, Toleration, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;

use crate::serve::naming::{self, CsiNameError};

/// The port `/metrics` and `/healthz` are served on, in both pods.
pub const METRICS_PORT: i32 = 9808;
/// Where the controller pod shares its CSI sockets with the sidecars.
pub const CONTROLLER_CSI_DIR: &str = "/csi";
/// Where the controller pod's capabilities-only flexd puts the resizers' sockets.
pub const CAPABILITIES_CSI_DIR: &str = "/csi-capabilities";
/// That flexd's `/metrics` and `/healthz`.
pub const CAPABILITIES_PORT: i32 = 9809;
/// Where the controller pod keeps its state (the PersistentVolumeClaim).
pub const CONTROLLER_STATE_DIR: &str = "/var/lib/flexd";

/// What the manifests need to know about one driver: what it can do, from its `init`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverProfile {
    pub name: DriverName,
    pub csi_name: String,
    /// Volumes are attached to a node by a controller (csi-attacher, `attachRequired`).
    pub attach: bool,
    /// Volumes are created and deleted on demand (csi-provisioner).
    pub provision: bool,
    /// Volumes can grow (`requiresFSResize`: csi-resizer, when there is a controller side).
    pub expand: bool,
    /// The driver takes the pod's fsGroup (`fsGroupPolicy`).
    pub fs_group: bool,
}

impl DriverProfile {
    pub fn new(name: DriverName, capabilities: &Capabilities) -> Result<Self, CsiNameError> {
        Ok(Self {
            csi_name: naming::csi_name(&name)?,
            name,
            attach: capabilities.attach,
            provision: capabilities.provision,
            expand: capabilities.requires_fs_resize,
            fs_group: capabilities.fs_group,
        })
    }

    /// Whether the driver needs the controller Deployment: the rule by which `flexd serve`
    /// offers it the Controller service ([`Capabilities::has_controller_side`]).
    pub fn has_controller(&self) -> bool {
        Capabilities {
            attach: self.attach,
            provision: self.provision,
            ..Capabilities::default()
        }
        .has_controller_side()
    }

    fn socket(&self, dir: &str) -> String {
        format!("{dir}/{}/csi.sock", self.csi_name)
    }
}

/// Where things live and which images run them.
#[derive(Debug, Clone)]
pub struct Settings {
    pub namespace: String,
    pub image: String,
    pub kubelet_dir: PathBuf,
    pub plugin_dir: PathBuf,
    /// The node's state dir, on the host.
    pub state_dir: PathBuf,
    /// Host directories the drivers use (an image dir, a config dir), mounted at their host
    /// path in both pods.
    pub host_dirs: Vec<PathBuf>,
    pub attacher_image: String,
    pub provisioner_image: String,
    pub resizer_image: String,
    /// The controller state claim's StorageClass; `None`: the cluster's default.
    pub state_storage_class: Option<String>,
}

/// The sidecar images `flexd manifests` uses unless told otherwise: the versions the e2e cluster
/// runs Kubernetes' storage suite with (tests/e2e/sidecars/), so the defaults are tested ones.
pub const DEFAULT_ATTACHER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-attacher:v4.13.0";
pub const DEFAULT_PROVISIONER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-provisioner:v6.4.0";
pub const DEFAULT_RESIZER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-resizer:v2.3.0";

/// One Kubernetes object of the output, serialized as itself (with its apiVersion and kind).
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Object {
    Namespace(Box<Namespace>),
    ServiceAccount(Box<ServiceAccount>),
    ClusterRole(Box<ClusterRole>),
    ClusterRoleBinding(Box<ClusterRoleBinding>),
    Role(Box<Role>),
    RoleBinding(Box<RoleBinding>),
    PersistentVolumeClaim(Box<PersistentVolumeClaim>),
    DaemonSet(Box<DaemonSet>),
    Deployment(Box<Deployment>),
    CSIDriver(Box<CSIDriver>),
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("no drivers to deploy")]
    NoDrivers,
    #[error("cannot write YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
}

/// The sidecars one driver gets, in container order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Sidecar {
    Attacher,
    Provisioner,
    Resizer,
}

impl Sidecar {
    pub fn for_driver(driver: &DriverProfile) -> Vec<Sidecar> {
        let mut sidecars = Vec::new();
        if driver.attach {
            sidecars.push(Sidecar::Attacher);
        }
        if driver.provision {
            sidecars.push(Sidecar::Provisioner);
        }
        if driver.expand && driver.has_controller() {
            sidecars.push(Sidecar::Resizer);
        }
        sidecars
    }

    fn name(self) -> &'static str {
        match self {
            Self::Attacher => "csi-attacher",
            Self::Provisioner => "csi-provisioner",
            Self::Resizer => "csi-resizer",
        }
    }

    fn image(self, settings: &Settings) -> &str {
        match self {
            Self::Attacher => &settings.attacher_image,
            Self::Provisioner => &settings.provisioner_image,
            Self::Resizer => &settings.resizer_image,
        }
    }

    /// The ClusterRole rules of the official sidecar's `deploy/kubernetes/rbac.yaml`.
    fn rules(self) -> Vec<PolicyRule> {
        match self {
            Self::Attacher => vec![
                rule(
                    "",
                    &["persistentvolumes"],
                    &["get", "list", "watch", "patch"],
                ),
                rule("storage.k8s.io", &["csinodes"], &["get", "list", "watch"]),
                rule(
                    "storage.k8s.io",
                    &["volumeattachments"],
                    &["get", "list", "watch", "patch"],
                ),
                rule("storage.k8s.io", &["volumeattachments/status"], &["patch"]),
            ],
            Self::Provisioner => vec![
                rule(
                    "",
                    &["persistentvolumes"],
                    &["get", "list", "watch", "create", "patch", "delete"],
                ),
                rule(
                    "",
                    &["persistentvolumeclaims"],
                    &["get", "list", "watch", "update"],
                ),
                rule(
                    "storage.k8s.io",
                    &["storageclasses"],
                    &["get", "list", "watch"],
                ),
                rule(
                    "",
                    &["events"],
                    &["list", "watch", "create", "update", "patch"],
                ),
                rule("storage.k8s.io", &["csinodes"], &["get", "list", "watch"]),
                rule("", &["nodes"], &["get", "list", "watch"]),
                // Watched to know when a volume is no longer attached and may be deleted.
                rule(
                    "storage.k8s.io",
                    &["volumeattachments"],
                    &["get", "list", "watch"],
                ),
            ],
            Self::Resizer => vec![
                rule(
                    "",
                    &["persistentvolumes"],
                    &["get", "list", "watch", "patch"],
                ),
                rule("", &["persistentvolumeclaims"], &["get", "list", "watch"]),
                rule("", &["pods"], &["get", "list", "watch"]),
                rule("", &["persistentvolumeclaims/status"], &["patch"]),
                rule(
                    "",
                    &["events"],
                    &["list", "watch", "create", "update", "patch"],
                ),
            ],
        }
    }
}

/// How long a sidecar waits for flexd: longer than flexd's own call-out timeout and kill grace,
/// so it sees flexd's answer (DEADLINE_EXCEEDED naming the driver) rather than giving up first
/// and retrying into a call still in flight (ABORTED). The sidecars' defaults are 10-15 s.
pub fn sidecar_timeout() -> std::time::Duration {
    flexvolume::runner::DEFAULT_TIMEOUT
        + flexvolume::runner::DEFAULT_KILL_GRACE
        + std::time::Duration::from_secs(10)
}

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..Default::default()
    }
}

const NODE: &str = "flexd-node";
const CONTROLLER: &str = "flexd-controller";
const CONTROLLER_STATE: &str = "flexd-controller-state";

fn labels(app: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), app.to_owned()),
        ("app.kubernetes.io/part-of".to_owned(), "flexd".to_owned()),
    ])
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(labels(name)),
        ..Default::default()
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

fn host_volume(name: &str, host: &str, kind: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        host_path: Some(HostPathVolumeSource {
            path: host.to_owned(),
            type_: Some(kind.to_owned()),
        }),
        ..Default::default()
    }
}

fn mount(name: &str, at: &str, propagation: Option<&str>, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: at.to_owned(),
        mount_propagation: propagation.map(str::to_owned),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// `/healthz` answers 503 when the driver watcher died or an endpoint stopped serving.
fn health_probe(period: i32) -> Probe {
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

fn resources(cpu: &str, memory: &str, limit: &str) -> ResourceRequirements {
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
fn host_dirs(settings: &Settings) -> (Vec<Volume>, Vec<VolumeMount>) {
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

fn flexd_container(args: Vec<String>, mounts: Vec<VolumeMount>) -> Container {
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

fn pod_template(app: &str, spec: PodSpec) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(app)),
            ..Default::default()
        }),
        spec: Some(spec),
    }
}

fn selector(app: &str) -> LabelSelector {
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

fn node_daemonset(settings: &Settings) -> DaemonSet {
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

fn capabilities_container(settings: &Settings) -> Container {
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

fn controller_deployment(settings: &Settings, drivers: &[DriverProfile]) -> Deployment {
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

fn state_claim(settings: &Settings) -> PersistentVolumeClaim {
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

fn csi_driver(driver: &DriverProfile) -> CSIDriver {
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

fn service_account(name: &str, namespace: &str, token: bool) -> ServiceAccount {
    ServiceAccount {
        metadata: meta(name, Some(namespace)),
        automount_service_account_token: Some(token),
        ..Default::default()
    }
}

fn controller_subject(namespace: &str) -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".to_owned(),
        name: CONTROLLER.to_owned(),
        namespace: Some(namespace.to_owned()),
        ..Default::default()
    }]
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
    }
}

/// Every object, in the order `kubectl apply` needs them (namespace and identities first).
pub fn render(settings: &Settings, drivers: &[DriverProfile]) -> Result<Vec<Object>, RenderError> {
    if drivers.is_empty() {
        return Err(RenderError::NoDrivers);
    }
    let ns = settings.namespace.as_str();
    let mut objects = vec![
        Object::Namespace(Box::new(Namespace {
            metadata: ObjectMeta {
                name: Some(ns.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        })),
        // The node talks to no API server: kubelet hands it secrets and pod information.
        Object::ServiceAccount(Box::new(service_account(NODE, ns, false))),
    ];
    let controlled: Vec<DriverProfile> = drivers
        .iter()
        .filter(|d| d.has_controller())
        .cloned()
        .collect();
    if !controlled.is_empty() {
        objects.push(Object::ServiceAccount(Box::new(service_account(
            CONTROLLER, ns, true,
        ))));
        let mut kinds: Vec<Sidecar> = controlled.iter().flat_map(Sidecar::for_driver).collect();
        kinds.sort();
        kinds.dedup();
        for kind in kinds {
            let name = format!("flexd-{}", kind.name());
            objects.push(Object::ClusterRole(Box::new(ClusterRole {
                metadata: meta(&name, None),
                rules: Some(kind.rules()),
                ..Default::default()
            })));
            objects.push(Object::ClusterRoleBinding(Box::new(ClusterRoleBinding {
                metadata: meta(&name, None),
                role_ref: role_ref("ClusterRole", &name),
                subjects: Some(controller_subject(ns)),
            })));
        }
        let election = "flexd-leader-election";
        objects.push(Object::Role(Box::new(Role {
            metadata: meta(election, Some(ns)),
            rules: Some(vec![rule(
                "coordination.k8s.io",
                &["leases"],
                &["get", "watch", "list", "delete", "update", "create"],
            )]),
        })));
        objects.push(Object::RoleBinding(Box::new(RoleBinding {
            metadata: meta(election, Some(ns)),
            role_ref: role_ref("Role", election),
            subjects: Some(controller_subject(ns)),
        })));
        objects.push(Object::PersistentVolumeClaim(Box::new(state_claim(
            settings,
        ))));
    }
    objects.push(Object::DaemonSet(Box::new(node_daemonset(settings))));
    if !controlled.is_empty() {
        objects.push(Object::Deployment(Box::new(controller_deployment(
            settings,
            &controlled,
        ))));
    }
    objects.extend(
        drivers
            .iter()
            .map(|d| Object::CSIDriver(Box::new(csi_driver(d)))),
    );
    Ok(objects)
}

/// The objects as one multi-document YAML stream, after a comment saying what it is for.
pub fn to_yaml(
    settings: &Settings,
    drivers: &[DriverProfile],
    objects: &[Object],
) -> Result<String, RenderError> {
    let mut out =
        String::from("# flexd for a cluster: `flexd manifests` printed this for the drivers\n");
    for d in drivers {
        let mut sidecars: Vec<&str> = Sidecar::for_driver(d).iter().map(|s| s.name()).collect();
        if sidecars.is_empty() {
            sidecars.push("node only");
        }
        out.push_str(&format!(
            "#   {} as CSI driver {} ({})\n",
            d.name,
            d.csi_name,
            sidecars.join(", ")
        ));
    }
    out.push_str(&format!(
        "# in namespace {}. Why each piece is there: README, \"Deploy to a cluster\".\n",
        settings.namespace
    ));
    for object in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(object)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
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
        use super::super::checks::{dns_label, dns_subdomain};
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
}
