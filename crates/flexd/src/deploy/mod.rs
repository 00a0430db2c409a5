//! Everything a cluster needs to run flexd, as typed Kubernetes objects: pure functions from
//! what each driver can do ([`DriverProfile`]) and where things live ([`Settings`]) to objects,
//! so `flexd manifests`, `deploy/flexd.yaml` and the tests agree by construction.
//!
//! The choices, and why (docs/operator-guide.md, "What gets deployed", says the same to operators):
//! - **Node**: a DaemonSet running `flexd serve --mode node`, privileged (drivers mount and set
//!   up devices), with only the parts of kubelet's dir it uses (`pods/` and `plugins/` with
//!   Bidirectional propagation, since mounts made in the pod must reach kubelet, and
//!   `plugins_registry/`; never `pki/`), the plugin dir read-only, and the state dir on the host
//!   (node records must outlive the pod). flexd registers with kubelet itself: no registrar
//!   sidecar. It talks to no API server: no token, no permissions. Its metrics and health
//!   endpoint is on the node's loopback, where kubelet probes it (`host: 127.0.0.1`), unless the
//!   operator exposes it for scraping. Root filesystem read-only, `/tmp` an emptyDir.
//! - **Controller**: only when some driver has a controller side (it attaches, or it
//!   provisions). A Deployment running `flexd serve --mode controller` beside one set of CSI
//!   sidecars per driver, talking over `<csi-dir>/<csi-name>/csi.sock` in a shared emptyDir.
//!   - Its drivers come from the **host plugin dir**, read-only: the installer DaemonSet
//!     (`deploy/installer-daemonset.yaml`) already puts every driver on every node, control plane
//!     included, so the controller runs exactly the driver version the nodes run, with no image
//!     per driver to keep in step. This is where kube-controller-manager ran FlexVolume attach.
//!   - **Two replicas, no PersistentVolumeClaim.** What the controller must remember (its
//!     attachments, with the name detach will need, and the volumes it provisioned, with the
//!     options `delete` will need) is kept as `FlexdRecord` objects in the API server, where
//!     any replica reads them after any node is lost; its state dir is an emptyDir of
//!     scratch. Every sidecar elects a leader, replicas prefer different nodes, a rolling
//!     update starts the new replica before the old one goes, and a PodDisruptionBudget lets a
//!     drain take one replica at a time.
//!   - Root, as FlexVolume drivers expect (they ran in the controller manager), but privileged
//!     with the host's `/dev` only when the operator says a driver's attach sets up devices
//!     (not the builtin loop driver: its attach claims the volume, its node sets up the
//!     device); otherwise no capability but CHOWN (to give its sockets to the sidecars'
//!     group), no escalation, a read-only root filesystem.
//!   - The sidecars' ServiceAccount token is projected into the sidecars alone, so driver
//!     code running as root never holds their cluster-wide permissions. flexd's container
//!     holds another token, of `flexd-controller-records`, whose Role allows `flexdrecords` in
//!     flexd's namespace and nothing else.
//!   - The sidecars run as uid and gid 65532 with no capability, no escalation and a read-only
//!     root filesystem; flexd's CSI sockets are 0660 with that group (`--socket-group`).
//! - **Sidecars**, each with `--leader-election` (a lease per sidecar and driver) and a
//!   `--timeout` beyond flexd's call-out timeout ([`sidecar::sidecar_timeout`]): csi-attacher
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
//!   (an inline volume has no attach step) that the operator names with `--inline-volumes`:
//!   an inline volume lets any pod author hand any options to a root driver on the host, which
//!   Pod Security's `restricted` profile does not stop (it forbids `flexVolume:`, not `csi:`);
//!   `requiresRepublish` off.
//! - **Namespace** labelled for Pod Security `privileged`, said rather than left to the
//!   cluster's default; every pod with the runtime's default seccomp profile.

use std::path::PathBuf;

use flexvolume_host::{Capabilities, DriverName};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::Subject;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::storage::v1::CSIDriver;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use crate::naming::{self, CsiNameError};

pub mod checks;
pub mod kubernetes_version;
mod migrator;
mod objects;
mod sidecar;
#[cfg(test)]
mod tests;

pub use migrator::{migrator_to_yaml, render_migrator, MIGRATOR};
use objects::{
    controller_deployment, controller_disruption_budget, controller_subject, csi_driver,
    import_job, meta, node_daemonset, records_definition, records_token, role_ref, service_account,
    CONTROLLER, CONTROLLER_RECORDS, IMPORT_JOB, NODE,
};
use sidecar::rule;
use sidecar::Sidecar;

/// The port `/metrics` and `/healthz` are served on, in both pods.
pub(crate) const METRICS_PORT: i32 = 9808;
/// Where the controller pod shares its CSI sockets with the sidecars.
pub(crate) const CONTROLLER_CSI_DIR: &str = "/csi";
/// Where the controller pod's capabilities-only flexd puts the resizers' sockets.
pub(crate) const CAPABILITIES_CSI_DIR: &str = "/csi-capabilities";
/// That flexd's `/metrics` and `/healthz`.
pub(crate) const CAPABILITIES_PORT: i32 = 9809;
/// Where the controller pod keeps its state (the PersistentVolumeClaim).
pub(crate) const CONTROLLER_STATE_DIR: &str = "/var/lib/flexd";

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
    /// The operator offers its volumes inline in pods (`Ephemeral`; never when it attaches).
    pub inline: bool,
    /// Its attach and detach set up devices: the controller's flexd runs privileged, with the
    /// host's `/dev` (the operator's choice, `--privileged-controller`).
    pub privileged_controller: bool,
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
            inline: false,
            privileged_controller: false,
        })
    }

    /// Whether the driver needs the controller Deployment: the rule by which `flexd serve`
    /// offers it the Controller service ([`Capabilities::has_controller_side`]).
    pub(crate) fn has_controller(&self) -> bool {
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
    /// The nodes' plugin dir (kubelet's `--volume-plugin-dir`), which is not necessarily the
    /// one `flexd manifests` read the drivers from.
    pub plugin_dir: PathBuf,
    /// The node's state dir, on the host.
    pub state_dir: PathBuf,
    /// Host directories the drivers use (an image dir, a config dir), mounted at their host
    /// path in both pods.
    pub host_dirs: Vec<PathBuf>,
    pub attacher_image: String,
    pub provisioner_image: String,
    pub resizer_image: String,
    /// csi-resizer's flags for the Kubernetes minor (`KubernetesMinor::sidecars`).
    pub resizer_flags: Vec<String>,
    /// The node's metrics on every address of the node, for scraping from the network; by
    /// default only on its loopback.
    pub expose_metrics: bool,
    /// The controller's `--fence-lease`; `None` leaves serve's default.
    pub fence_lease: Option<std::time::Duration>,
}

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
    CustomResourceDefinition(Box<CustomResourceDefinition>),
    Secret(Box<Secret>),
    PodDisruptionBudget(Box<PodDisruptionBudget>),
    Job(Box<Job>),
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
                // Said, not left to the cluster's default: the node plugin is privileged, and
                // nothing else belongs in this namespace.
                labels: Some(
                    ["enforce", "audit", "warn"]
                        .iter()
                        .map(|mode| {
                            (
                                format!("pod-security.kubernetes.io/{mode}"),
                                "privileged".to_owned(),
                            )
                        })
                        .collect(),
                ),
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
        // Its token is projected into the sidecars alone (objects::api_access).
        objects.push(Object::ServiceAccount(Box::new(service_account(
            CONTROLLER, ns, false,
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
        objects.extend(records_objects(settings));
    }
    objects.push(Object::DaemonSet(Box::new(node_daemonset(settings))));
    if !controlled.is_empty() {
        objects.push(Object::Deployment(Box::new(controller_deployment(
            settings,
            &controlled,
        ))));
        objects.push(Object::PodDisruptionBudget(Box::new(
            controller_disruption_budget(settings),
        )));
    }
    objects.extend(
        drivers
            .iter()
            .map(|d| Object::CSIDriver(Box::new(csi_driver(d)))),
    );
    Ok(objects)
}

/// The controller's records: their resource, and an identity allowed them alone, whose token
/// the controller's flexd container (and the import Job) mounts.
fn records_objects(settings: &Settings) -> Vec<Object> {
    let ns = settings.namespace.as_str();
    vec![
        Object::CustomResourceDefinition(Box::new(records_definition())),
        Object::ServiceAccount(Box::new(service_account(CONTROLLER_RECORDS, ns, false))),
        Object::Role(Box::new(Role {
            metadata: meta(CONTROLLER_RECORDS, Some(ns)),
            rules: Some(vec![rule(
                crate::controller_records::GROUP,
                &[crate::controller_records::PLURAL],
                &["get", "list", "create", "update", "delete"],
            )]),
        })),
        Object::RoleBinding(Box::new(RoleBinding {
            metadata: meta(CONTROLLER_RECORDS, Some(ns)),
            role_ref: role_ref("Role", CONTROLLER_RECORDS),
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".to_owned(),
                name: CONTROLLER_RECORDS.to_owned(),
                namespace: Some(ns.to_owned()),
                ..Default::default()
            }]),
        })),
        Object::Secret(Box::new(records_token(settings))),
    ]
}

/// The upgrade from a controller that kept its records on the claim `claim`: the records'
/// resource and identity, and a Job that imports the claim's records into the API server
/// (`flexd records import`). Applied and completed before the new controller serves.
pub fn render_import(settings: &Settings, claim: &str) -> Vec<Object> {
    let mut objects = records_objects(settings);
    objects.push(Object::Job(Box::new(import_job(settings, claim))));
    objects
}

/// [`render_import`]'s objects as YAML, after a comment saying what they are for.
pub fn import_to_yaml(
    settings: &Settings,
    claim: &str,
    objects: &[Object],
) -> Result<String, RenderError> {
    let mut out = format!(
        "# flexd: import the controller records kept on claim {claim} into the API server\n\
         # (namespace {}). Apply, wait for job/{IMPORT_JOB} to complete, then apply the\n\
         # manifests: docs/operator-guide.md#upgrade-state-claim\n",
        settings.namespace
    );
    for object in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(object)?);
    }
    Ok(out)
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
        "# in namespace {}. Why each piece is there: docs/operator-guide.md#what-gets-deployed\n",
        settings.namespace
    ));
    for object in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(object)?);
    }
    Ok(out)
}
