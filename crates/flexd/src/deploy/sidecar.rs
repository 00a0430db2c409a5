//! The CSI sidecars a driver's controller side runs with, and what each may do (RBAC).

use k8s_openapi::api::rbac::v1::PolicyRule;

use super::{DriverProfile, Settings};

/// The sidecars one driver gets, in container order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Sidecar {
    Attacher,
    Provisioner,
    Resizer,
}

impl Sidecar {
    pub(crate) fn for_driver(driver: &DriverProfile) -> Vec<Sidecar> {
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

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Attacher => "csi-attacher",
            Self::Provisioner => "csi-provisioner",
            Self::Resizer => "csi-resizer",
        }
    }

    pub(super) fn image(self, settings: &Settings) -> &str {
        match self {
            Self::Attacher => &settings.attacher_image,
            Self::Provisioner => &settings.provisioner_image,
            Self::Resizer => &settings.resizer_image,
        }
    }

    /// Flags past the sidecar's defaults, each from a measurement (bench/attach-scale.sh, 200
    /// attachments across 50 nodes). csi-attacher writes about three times an attachment: with
    /// its client's 5 requests a second they took 126 s, against 11 s through
    /// kube-controller-manager's own FlexVolume attach; at 50 a second 19-20 s, at 100 a
    /// second 15.6 s against 14.4 s. With kube-controller-manager's own client faster (100 a
    /// second), 100 held the VolumeAttachments back (attached after 5.1 s) and 300 did not
    /// (2.4 s). More workers let the call-outs of a burst overlap. The API server's priority
    /// and fairness still shares it out: these only let csi-attacher ask as fast as it has work.
    pub(super) fn tuning(self) -> &'static [&'static str] {
        match self {
            Self::Attacher => &[
                "--kube-api-qps=300",
                "--kube-api-burst=600",
                "--worker-threads=50",
            ],
            Self::Provisioner | Self::Resizer => &[],
        }
    }

    /// Flags the Kubernetes minor needs (`Settings::resizer_flags`).
    pub(super) fn version_flags(self, settings: &Settings) -> &[String] {
        match self {
            Self::Resizer => &settings.resizer_flags,
            Self::Attacher | Self::Provisioner => &[],
        }
    }

    /// The ClusterRole rules of the official sidecar's `deploy/kubernetes/rbac.yaml`.
    pub(super) fn rules(self) -> Vec<PolicyRule> {
        let table = match self {
            Self::Attacher => ATTACHER_RULES,
            Self::Provisioner => PROVISIONER_RULES,
            Self::Resizer => RESIZER_RULES,
        };
        table
            .iter()
            .map(|(group, resource, verbs)| rule(group, &[resource], verbs))
            .collect()
    }
}

/// One RBAC rule: API group, resource, verbs.
type Rule = (&'static str, &'static str, &'static [&'static str]);

const CORE: &str = "";
const STORAGE: &str = "storage.k8s.io";
const READ: &[&str] = &["get", "list", "watch"];
const READ_PATCH: &[&str] = &["get", "list", "watch", "patch"];
const EVENTS: &[&str] = &["list", "watch", "create", "update", "patch"];

const ATTACHER_RULES: &[Rule] = &[
    (CORE, "persistentvolumes", READ_PATCH),
    (STORAGE, "csinodes", READ),
    (STORAGE, "volumeattachments", READ_PATCH),
    (STORAGE, "volumeattachments/status", &["patch"]),
];

const PROVISIONER_RULES: &[Rule] = &[
    (
        CORE,
        "persistentvolumes",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    (
        CORE,
        "persistentvolumeclaims",
        &["get", "list", "watch", "update"],
    ),
    (STORAGE, "storageclasses", READ),
    (CORE, "events", EVENTS),
    (STORAGE, "csinodes", READ),
    (CORE, "nodes", READ),
    // Watched to know when a volume is no longer attached and may be deleted.
    (STORAGE, "volumeattachments", READ),
];

const RESIZER_RULES: &[Rule] = &[
    (CORE, "persistentvolumes", READ_PATCH),
    (CORE, "persistentvolumeclaims", READ),
    (CORE, "pods", READ),
    (CORE, "persistentvolumeclaims/status", &["patch"]),
    (CORE, "events", EVENTS),
];

/// How long a sidecar waits for flexd: longer than flexd's own call-out timeout and kill grace,
/// so it sees flexd's answer (DEADLINE_EXCEEDED naming the driver) rather than giving up first
/// and retrying into a call still in flight (ABORTED). The sidecars' defaults are 10-15 s.
pub(crate) fn sidecar_timeout() -> std::time::Duration {
    flexvolume_host::runner::DEFAULT_TIMEOUT
        + flexvolume_host::runner::DEFAULT_KILL_GRACE
        + std::time::Duration::from_secs(10)
}

pub(super) fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..Default::default()
    }
}
