//! `flexd preflight --cluster`: what the cluster means for flexd, after the node. The binary asks
//! the API server for [`ClusterFacts`] (`cli/preflight/cluster.rs`: its only I/O); here they
//! become findings, pure like the node's, every branch tested below with facts made up for it.
//!
//! Two checks: the Kubernetes version (is it one flexd deploys to, and what `flexd manifests
//! --kubernetes-version` chooses for it), and kube-controller-manager, which attaches and
//! detaches FlexVolume volumes that are not migrated: whether it can see the FlexVolume drivers
//! at all, and whether its image has the shell that drivers written as shell scripts need.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use super::findings::{error, ok, warning};
use super::{Check, Finding};
use crate::deploy::kubernetes_version::{
    self, KubernetesMinor, VersionError, NEWEST_TESTED_MINOR, OLDEST_MINOR,
};

/// Where kube-controller-manager's pods are looked for.
pub const KCM_NAMESPACE: &str = "kube-system";
/// The label selectors its pods are listed with: kubeadm's static pods have the first, other
/// installers the second.
pub const KCM_SELECTORS: &[&str] = &[
    "component=kube-controller-manager",
    "k8s-app=kube-controller-manager",
];
/// kube-controller-manager's `--flex-volume-plugin-dir` when it is not given.
pub const KCM_DEFAULT_FLEX_DIR: &str = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/";
const FLEX_DIR_FLAG: &str = "--flex-volume-plugin-dir";
/// The official images' repositories: distroless, no shell.
const OFFICIAL_KCM_IMAGES: &[&str] = &[
    "registry.k8s.io/kube-controller-manager",
    "k8s.gcr.io/kube-controller-manager",
];

const COMPATIBILITY_DOC: &str = "docs/compatibility.md";
const MIGRATION_DOC: &str = "docs/migration.md";

/// What `flexd preflight --cluster` got from the API server: observations only, no verdicts.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterFacts {
    /// `GET /version`, or why the API server gave none.
    pub version: Result<ServerVersion, ApiFailure>,
    pub controller_managers: ControllerManagers,
}

/// The API server's `/version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerVersion {
    /// `v1.33.2`, or a distribution's `v1.30.14-gke.1200`.
    pub git_version: String,
    /// `1`.
    pub major: String,
    /// `33`, or a managed cluster's `33+`.
    pub minor: String,
}

/// Why the API server could not be asked: no kubeconfig, unreachable, credentials refused.
/// Never holds the credentials themselves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiFailure {
    /// Its address (`https://10.0.0.1:6443`); `None` when no kubeconfig said it.
    pub server: Option<String>,
    pub reason: String,
}

/// kube-controller-manager's pods in [`KCM_NAMESPACE`], listed with [`KCM_SELECTORS`].
#[derive(Debug, Clone, PartialEq)]
pub enum ControllerManagers {
    /// Each pod once, in name order; none when the control plane runs elsewhere.
    Found(Vec<Pod>),
    /// Listing pods there is forbidden to these credentials (403).
    Forbidden { reason: String },
    /// The list failed otherwise.
    Failed { reason: String },
    /// Not asked: the API server did not answer for its version.
    NotAsked,
}

/// The findings about the cluster, after the node's: Kubernetes version, kube-controller-manager.
pub fn cluster_findings(facts: &ClusterFacts) -> Vec<Finding> {
    vec![
        version(&facts.version),
        controller_manager(&facts.controller_managers),
    ]
}

fn version(version: &Result<ServerVersion, ApiFailure>) -> Finding {
    let check = Check::KubernetesVersion;
    let server = match version {
        Ok(server) => server,
        Err(failure) => {
            let at = failure
                .server
                .as_deref()
                .map(|s| format!(" at {s}"))
                .unwrap_or_default();
            return error(
                check,
                format!(
                    "cannot ask the API server{at} for its version: {}",
                    failure.reason
                ),
                "check that the kubeconfig (--kubeconfig, else KUBECONFIG, ~/.kube/config or \
                 the pod's service account) names this cluster's API server with credentials \
                 it accepts, and that the API server is reachable from here; then run again"
                    .to_owned(),
            );
        }
    };
    let git = &server.git_version;
    match minor_of(server) {
        Err(e @ VersionError::TooOld(_)) => error(
            check,
            format!("the API server runs {git}: {e}"),
            format!(
                "upgrade the cluster to 1.{OLDEST_MINOR} or newer before deploying flexd \
                 ({COMPATIBILITY_DOC})"
            ),
        ),
        Err(e) => warning(
            check,
            format!(
                "cannot tell the Kubernetes minor from the API server's version {git:?} \
                 (major {:?}, minor {:?}): {e}",
                server.major, server.minor
            ),
            format!(
                "find the cluster's minor (1.{OLDEST_MINOR} or newer is supported) and pass it \
                 to flexd manifests --kubernetes-version; without it, flexd manifests deploys \
                 for the newest minor tested, 1.{NEWEST_TESTED_MINOR} ({COMPATIBILITY_DOC})"
            ),
        ),
        Ok(minor) if minor.is_untested() => warning(
            check,
            format!(
                "the API server runs {git}, newer than the newest Kubernetes flexd is tested \
                 on (1.{NEWEST_TESTED_MINOR})"
            ),
            format!(
                "flexd manifests --kubernetes-version {minor} deploys the newest tested \
                 sidecars there ({}), untested on {minor}: look for a newer flexd tested on it \
                 ({COMPATIBILITY_DOC}), or try your drivers on a staging cluster first",
                sidecars(minor)
            ),
        ),
        Ok(minor) => ok(
            check,
            format!(
                "the API server runs {git}, which flexd supports and is tested on: pass \
                 --kubernetes-version {minor} to flexd manifests, which then deploys {}",
                sidecars(minor)
            ),
        ),
    }
}

/// The minor of the gitVersion, or when that does not read, of `major.minor`.
fn minor_of(server: &ServerVersion) -> Result<KubernetesMinor, VersionError> {
    match kubernetes_version::parse(&server.git_version) {
        // A fallback too old is said as such; otherwise the gitVersion's error.
        Err(e @ VersionError::Unparsable(_)) => {
            kubernetes_version::parse(&format!("{}.{}", server.major, server.minor)).map_err(
                |fallback| match fallback {
                    VersionError::TooOld(_) => fallback,
                    _ => e,
                },
            )
        }
        other => other,
    }
}

/// `csi-attacher:v4.13.0, csi-provisioner:v6.4.0, csi-resizer:v2.3.0`, with csi-resizer's flags.
fn sidecars(minor: KubernetesMinor) -> String {
    let sidecars = minor.sidecars();
    let name = |image: &'static str| image.rsplit('/').next().unwrap_or(image);
    let mut text = format!(
        "{}, {}, {}",
        name(sidecars.attacher),
        name(sidecars.provisioner),
        name(sidecars.resizer)
    );
    if !sidecars.resizer_flags.is_empty() {
        text.push_str(&format!(" (with {})", sidecars.resizer_flags.join(" ")));
    }
    text
}

/// What one kube-controller-manager pod means for FlexVolume.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KcmPod {
    name: String,
    /// Its FlexVolume dir, and whether `--flex-volume-plugin-dir` gave it.
    flex_dir: PathBuf,
    flex_dir_given: bool,
    /// Whether the container sees a hostPath there.
    mounted: bool,
    /// Its image, when an official one (distroless).
    official_image: Option<String>,
}

impl KcmPod {
    fn of(pod: &Pod) -> Self {
        let name = pod.metadata.name.clone().unwrap_or_default();
        // The API server refuses a pod without containers: a default stands in for the test.
        let default_spec = PodSpec::default();
        let spec = pod.spec.as_ref().unwrap_or(&default_spec);
        let default_container = Container::default();
        let container = spec
            .containers
            .iter()
            .find(|c| c.name == "kube-controller-manager")
            .or(spec.containers.first())
            .unwrap_or(&default_container);
        let given = flex_dir_flag(container);
        let flex_dir = PathBuf::from(given.as_deref().unwrap_or(KCM_DEFAULT_FLEX_DIR));
        let mounted = sees_host_dir(spec, container, &flex_dir);
        let official_image = container
            .image
            .as_deref()
            .filter(|image| is_official(image))
            .map(str::to_owned);
        Self {
            name,
            flex_dir_given: given.is_some(),
            flex_dir,
            mounted,
            official_image,
        }
    }

    /// How bad it is: unable to see the drivers, then unable to run shell scripts, then fine.
    fn rank(&self) -> u8 {
        u8::from(!self.mounted) * 2 + u8::from(self.official_image.is_some())
    }
}

/// `--flex-volume-plugin-dir=PATH` or `--flex-volume-plugin-dir PATH` in the command and its
/// arguments; the last one wins, as with every flag of kube-controller-manager.
fn flex_dir_flag(container: &Container) -> Option<String> {
    let words: Vec<&String> = container
        .command
        .iter()
        .chain(container.args.iter())
        .flatten()
        .collect();
    let mut found = None;
    for (at, word) in words.iter().enumerate() {
        if let Some(value) = word
            .strip_prefix(FLEX_DIR_FLAG)
            .and_then(|rest| rest.strip_prefix('='))
        {
            found = Some(value.to_owned());
        } else if word.as_str() == FLEX_DIR_FLAG {
            found = words.get(at + 1).map(|value| (*value).clone());
        }
    }
    found
}

/// Whether the container sees a host directory at `dir`: a hostPath volume whose path (with the
/// mount's subPath) is `dir` or above it, mounted at `dir` or above it.
fn sees_host_dir(spec: &PodSpec, container: &Container, dir: &Path) -> bool {
    container.volume_mounts.iter().flatten().any(|mount| {
        let host = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .and_then(|v| v.host_path.as_ref());
        let Some(host) = host else {
            return false;
        };
        let host = match mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => Path::new(&host.path).join(sub),
            None => PathBuf::from(&host.path),
        };
        dir.starts_with(&host) && dir.starts_with(&mount.mount_path)
    })
}

/// An official kube-controller-manager image, by tag or digest.
fn is_official(image: &str) -> bool {
    let repository = image.split('@').next().unwrap_or(image);
    let repository = match repository.rsplit_once(':') {
        // A tag follows the last colon only when no slash does (`host:5000/name` has none).
        Some((name, tag)) if !tag.contains('/') => name,
        _ => repository,
    };
    OFFICIAL_KCM_IMAGES.contains(&repository)
}

fn controller_manager(managers: &ControllerManagers) -> Finding {
    let check = Check::KubeControllerManager;
    let by_hand = format!(
        "check kube-controller-manager's manifest by hand: its --flex-volume-plugin-dir \
         (default {KCM_DEFAULT_FLEX_DIR}) must be a hostPath mount of its pod for it to attach \
         FlexVolume volumes, and drivers written as shell scripts need an image with a shell"
    );
    let pods = match managers {
        ControllerManagers::Found(pods) if !pods.is_empty() => pods,
        ControllerManagers::Found(_) => {
            return warning(
                check,
                format!(
                    "no kube-controller-manager pod in {KCM_NAMESPACE} (a managed control plane, \
                     or it runs outside pods): cannot check whether it runs FlexVolume drivers; \
                     flexd's controller attaches for the drivers it serves"
                ),
                format!(
                    "if drivers that attach have FlexVolume volumes in the cluster, ask whoever \
                     runs the control plane whether kube-controller-manager has those drivers \
                     (and a shell, for drivers written as shell scripts); if not, deploy \
                     flexd's controller (flexd manifests) and migrate the volumes \
                     ({MIGRATION_DOC})"
                ),
            );
        }
        ControllerManagers::Forbidden { reason } => {
            return warning(
                check,
                format!(
                    "not allowed to list pods in {KCM_NAMESPACE} (RBAC: {reason}): cannot check \
                     kube-controller-manager"
                ),
                format!(
                    "run with credentials that may list pods in {KCM_NAMESPACE} (`kubectl auth \
                     can-i list pods -n {KCM_NAMESPACE}`), or {by_hand}"
                ),
            );
        }
        ControllerManagers::Failed { reason } => {
            return warning(
                check,
                format!(
                    "cannot list pods in {KCM_NAMESPACE}: {reason}: cannot check \
                     kube-controller-manager"
                ),
                format!("run again, or {by_hand}"),
            );
        }
        ControllerManagers::NotAsked => {
            return warning(
                check,
                "not checked: the API server did not answer (kubernetes-version says why)"
                    .to_owned(),
                "make the API server reachable with the kubeconfig's credentials and run again"
                    .to_owned(),
            );
        }
    };

    let all: Vec<KcmPod> = pods.iter().map(KcmPod::of).collect();
    let worst = all.iter().map(KcmPod::rank).max().unwrap_or_default();
    let alike: Vec<&KcmPod> = all.iter().filter(|p| p.rank() == worst).collect();
    let pod = alike[0];
    let which = match (all.len(), alike.len()) {
        (1, _) => format!("{KCM_NAMESPACE}/{}", pod.name),
        (n, k) if k == n => format!(
            "{KCM_NAMESPACE}/{}, and all {n} of its pods alike",
            pod.name
        ),
        (n, k) => format!(
            "{KCM_NAMESPACE}/{}, and {k} of its {n} pods alike (the others fare better)",
            pod.name
        ),
    };
    let dir = pod.flex_dir.display();
    let from = if pod.flex_dir_given {
        "its --flex-volume-plugin-dir"
    } else {
        "the default: no --flex-volume-plugin-dir"
    };
    let no_shell = pod.official_image.as_deref().map(|image| {
        format!(
            "its image {image} is the official one, distroless, with no shell: drivers written \
             as shell scripts cannot attach there; flexd's controller runs them (its image has a \
             shell)"
        )
    });
    let deploy_flexd = format!(
        "deploy flexd's controller (flexd manifests), which attaches for the drivers it serves, \
         and migrate the volumes ({MIGRATION_DOC})"
    );
    match (pod.mounted, no_shell) {
        (true, None) => ok(
            check,
            format!(
                "kube-controller-manager ({which}) sees the FlexVolume dir {dir} ({from}) as a \
                 hostPath mount: it can attach and detach with the drivers there"
            ),
        ),
        (true, Some(no_shell)) => warning(
            check,
            format!(
                "kube-controller-manager ({which}) sees the FlexVolume dir {dir} ({from}), but \
                 {no_shell}"
            ),
            format!("if a driver that attaches is a shell script, {deploy_flexd}"),
        ),
        (false, no_shell) => warning(
            check,
            format!(
                "kube-controller-manager cannot see FlexVolume drivers (kubeadm 1.36 and later \
                 no longer mounts the FlexVolume dir): attach and detach of FlexVolume volumes \
                 that are not migrated fail there. Its FlexVolume dir {dir} ({from}) is no \
                 hostPath mount of its pod ({which}){}",
                no_shell.map(|s| format!("; and {s}")).unwrap_or_default()
            ),
            format!(
                "{deploy_flexd}; or add the hostPath mount to the kube-controller-manager \
                 manifest (on kubeadm, /etc/kubernetes/manifests/kube-controller-manager.yaml): \
                 a hostPath volume of {dir} mounted at the same path{}",
                if pod.official_image.is_some() {
                    ", which does not help drivers written as shell scripts there"
                } else {
                    ""
                }
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{HostPathVolumeSource, Volume, VolumeMount};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::super::findings::tests::assert_finding;
    use super::super::Severity;
    use super::*;
    use crate::deploy::kubernetes_version::{
        ATTACHER_IMAGE, PROVISIONER_IMAGE_BEFORE_1_34, RESIZER_IMAGE,
    };

    const KUBEADM_IMAGE: &str = "registry.k8s.io/kube-controller-manager:v1.33.2";
    const OTHER_IMAGE: &str = "registry.example/kube-controller-manager-with-shell:v1.33.2";

    fn server(git_version: &str, major: &str, minor: &str) -> Result<ServerVersion, ApiFailure> {
        Ok(ServerVersion {
            git_version: git_version.to_owned(),
            major: major.to_owned(),
            minor: minor.to_owned(),
        })
    }

    /// A kube-controller-manager pod as kubeadm writes it, with `args` after the command's
    /// name and the hostPath volumes `(host path, mount path)`.
    fn kcm_pod(name: &str, image: &str, args: &[&str], host_paths: &[(&str, &str)]) -> Pod {
        let volumes = host_paths
            .iter()
            .enumerate()
            .map(|(i, (host, _))| Volume {
                name: format!("v{i}"),
                host_path: Some(HostPathVolumeSource {
                    path: (*host).to_owned(),
                    type_: Some("DirectoryOrCreate".to_owned()),
                }),
                ..Volume::default()
            })
            .collect();
        let mounts = host_paths
            .iter()
            .enumerate()
            .map(|(i, (_, at))| VolumeMount {
                name: format!("v{i}"),
                mount_path: (*at).to_owned(),
                ..VolumeMount::default()
            })
            .collect();
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(KCM_NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "kube-controller-manager".to_owned(),
                    image: Some(image.to_owned()),
                    command: Some(
                        std::iter::once("kube-controller-manager")
                            .chain(args.iter().copied())
                            .map(str::to_owned)
                            .collect(),
                    ),
                    volume_mounts: Some(mounts),
                    ..Container::default()
                }],
                volumes: Some(volumes),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    const FLEX: &str = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec";
    /// kubeadm before 1.36: the FlexVolume dir mounted at its own path.
    const KUBEADM_FLEX_MOUNT: (&str, &str) = (FLEX, FLEX);
    const CERTS: (&str, &str) = ("/etc/kubernetes/pki", "/etc/kubernetes/pki");

    fn kcm(pods: Vec<Pod>) -> Finding {
        controller_manager(&ControllerManagers::Found(pods))
    }

    fn version_of(git: &str) -> Finding {
        version(&server(git, "1", ""))
    }

    #[test]
    fn the_cluster_findings_come_in_order_with_their_json_names() {
        let all = cluster_findings(&ClusterFacts {
            version: server("v1.33.2", "1", "33"),
            controller_managers: ControllerManagers::Found(vec![kcm_pod(
                "kube-controller-manager-cp1",
                OTHER_IMAGE,
                &[],
                &[CERTS, KUBEADM_FLEX_MOUNT],
            )]),
        });
        let checks: Vec<&str> = all.iter().map(|f| f.check.name()).collect();
        assert_eq!(checks, ["kubernetes-version", "kube-controller-manager"]);
        for finding in &all {
            assert_finding(finding, Severity::Ok, &[]);
            assert_eq!(
                serde_json::to_value(finding.check).unwrap(),
                finding.check.name()
            );
        }
    }

    #[test]
    fn a_supported_version_names_what_flexd_manifests_deploys_for_it() {
        let finding = version_of("v1.33.2");
        assert_finding(
            &finding,
            Severity::Ok,
            &[
                "v1.33.2",
                "--kubernetes-version 1.33 to flexd manifests",
                "csi-attacher:v4.13.0, csi-provisioner:v5.3.0, csi-resizer:v1.14.0",
            ],
        );
        assert!(!finding.summary.contains("feature-gates"), "{finding:?}");
        // The tags are the ones flexd manifests chooses.
        assert!(ATTACHER_IMAGE.ends_with("/csi-attacher:v4.13.0"));
        assert!(PROVISIONER_IMAGE_BEFORE_1_34.ends_with("/csi-provisioner:v5.3.0"));

        // csi-resizer's flag before 1.32, and a distribution's version.
        assert_finding(
            &version_of("v1.30.14-gke.1200"),
            Severity::Ok,
            &[
                "v1.30.14-gke.1200",
                "--kubernetes-version 1.30",
                "(with --feature-gates=RecoverVolumeExpansionFailure=false)",
            ],
        );
        for (git, minor) in [("v1.29.0", 29), ("v1.38.1+k3s1", NEWEST_TESTED_MINOR)] {
            assert_finding(
                &version_of(git),
                Severity::Ok,
                &[git, &format!("--kubernetes-version 1.{minor} ")],
            );
        }
        let newest = version_of("v1.38.0");
        assert!(
            newest
                .summary
                .ends_with(RESIZER_IMAGE.rsplit('/').next().unwrap()),
            "{newest:?}"
        );
    }

    #[test]
    fn a_version_below_the_minimum_is_an_error_saying_to_upgrade() {
        for git in ["v1.28.9", "v1.20.0-eks-1"] {
            assert_finding(
                &version_of(git),
                Severity::Error,
                &[
                    git,
                    "the oldest is 1.29",
                    "upgrade the cluster to 1.29 or newer before deploying flexd",
                    "docs/compatibility.md",
                ],
            );
        }
    }

    #[test]
    fn a_version_newer_than_the_newest_tested_is_a_warning() {
        let finding = version_of("v1.40.2");
        assert_finding(
            &finding,
            Severity::Warning,
            &[
                "v1.40.2",
                "newer than the newest Kubernetes flexd is tested on (1.38)",
                "flexd manifests --kubernetes-version 1.40 deploys the newest tested sidecars",
                "csi-resizer:v2.3.0",
                "docs/compatibility.md",
            ],
        );
    }

    #[test]
    fn an_unreadable_git_version_falls_back_on_major_and_minor() {
        // A development build's gitVersion, with the minor given apart.
        assert_finding(
            &version(&server("v0.0.0-master+$Format:%H$", "1", "33+")),
            Severity::Ok,
            &["--kubernetes-version 1.33 "],
        );
        assert_finding(
            &version(&server("v0.0.0-master", "1", "27")),
            Severity::Error,
            &["the oldest is 1.29"],
        );
        assert_finding(
            &version(&server("v0.0.0-master", "", "")),
            Severity::Warning,
            &[
                "cannot tell the Kubernetes minor",
                "\"v0.0.0-master\"",
                "flexd manifests --kubernetes-version",
                "1.38",
            ],
        );
    }

    #[test]
    fn an_api_server_out_of_reach_is_an_error_with_the_reason() {
        let finding = version(&Err(ApiFailure {
            server: Some("https://10.0.0.1:6443".to_owned()),
            reason: "tcp connect error: Connection refused".to_owned(),
        }));
        assert_finding(
            &finding,
            Severity::Error,
            &[
                "cannot ask the API server at https://10.0.0.1:6443 for its version: tcp connect \
                 error: Connection refused",
                "--kubeconfig",
            ],
        );
        let finding = version(&Err(ApiFailure {
            server: None,
            reason: "no kubeconfig".to_owned(),
        }));
        assert_finding(
            &finding,
            Severity::Error,
            &["cannot ask the API server for its version: no kubeconfig"],
        );
    }

    #[test]
    fn a_controller_manager_with_the_flexvolume_dir_mounted_is_ok() {
        let finding = kcm(vec![kcm_pod(
            "kube-controller-manager-cp1",
            OTHER_IMAGE,
            &["--leader-elect=true"],
            &[CERTS, KUBEADM_FLEX_MOUNT],
        )]);
        assert_finding(
            &finding,
            Severity::Ok,
            &[
                "kube-system/kube-controller-manager-cp1",
                &format!("{FLEX}/ (the default: no --flex-volume-plugin-dir)"),
                "hostPath mount",
            ],
        );
        assert!(!finding.summary.contains("pods alike"), "{finding:?}");

        // A parent of the dir mounted at its own path, and the dir given as a flag both ways.
        for args in [
            &["--flex-volume-plugin-dir=/opt/flex/exec"][..],
            &["--flex-volume-plugin-dir", "/opt/flex/exec"],
            &[
                "--flex-volume-plugin-dir=/elsewhere",
                "--flex-volume-plugin-dir=/opt/flex/exec",
            ],
        ] {
            assert_finding(
                &kcm(vec![kcm_pod(
                    "kcm",
                    OTHER_IMAGE,
                    args,
                    &[CERTS, ("/opt", "/opt")],
                )]),
                Severity::Ok,
                &["/opt/flex/exec (its --flex-volume-plugin-dir)"],
            );
        }
    }

    #[test]
    fn a_controller_manager_without_the_flexvolume_dir_cannot_see_the_drivers() {
        let not_seen = [
            "kube-controller-manager cannot see FlexVolume drivers (kubeadm 1.36 and later no \
             longer mounts the FlexVolume dir): attach and detach of FlexVolume volumes that are \
             not migrated fail there",
            "flexd manifests",
            "docs/migration.md",
            "add the hostPath mount to the kube-controller-manager manifest",
        ];
        // kubeadm 1.36: the certificates, no FlexVolume dir.
        let finding = kcm(vec![kcm_pod("kcm-cp1", OTHER_IMAGE, &[], &[CERTS])]);
        assert_finding(&finding, Severity::Warning, &not_seen);
        assert_finding(
            &finding,
            Severity::Warning,
            &["kube-system/kcm-cp1", FLEX, "the default"],
        );
        assert!(!finding.summary.contains("distroless"), "{finding:?}");

        for (args, mounts) in [
            // The default dir mounted, another one used.
            (
                &["--flex-volume-plugin-dir=/opt/flex"][..],
                &[KUBEADM_FLEX_MOUNT][..],
            ),
            // A hostPath above the dir, mounted elsewhere in the container.
            (&[], &[("/usr/libexec/kubernetes", "/flex")]),
            // Mounted above the dir, from a host path that is not above it.
            (
                &["--flex-volume-plugin-dir=/opt/flex"],
                &[("/srv/flex", "/opt")],
            ),
            // Below the dir: the drivers are not seen.
            (&[], &[(FLEX_DRIVER, FLEX_DRIVER)]),
        ] {
            assert_finding(
                &kcm(vec![kcm_pod("kcm", OTHER_IMAGE, args, mounts)]),
                Severity::Warning,
                &not_seen,
            );
        }

        // A volume mount of a volume that is not a hostPath, or of no volume at all.
        let mut pod = kcm_pod("kcm", OTHER_IMAGE, &[], &[KUBEADM_FLEX_MOUNT]);
        let spec = pod.spec.as_mut().unwrap();
        spec.volumes.as_mut().unwrap()[0].host_path = None;
        assert_finding(&kcm(vec![pod.clone()]), Severity::Warning, &not_seen);
        pod.spec.as_mut().unwrap().volumes = None;
        assert_finding(&kcm(vec![pod]), Severity::Warning, &not_seen);
    }

    const FLEX_DRIVER: &str = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/acme~nfs";

    #[test]
    fn a_sub_path_is_part_of_the_host_path() {
        let mut pod = kcm_pod("kcm", OTHER_IMAGE, &[], &[("/usr/libexec", FLEX)]);
        let mount = &mut pod.spec.as_mut().unwrap().containers[0]
            .volume_mounts
            .as_mut()
            .unwrap()[0];
        mount.sub_path = Some("kubernetes/kubelet-plugins/volume/exec".to_owned());
        assert_finding(&kcm(vec![pod.clone()]), Severity::Ok, &[]);
        pod.spec.as_mut().unwrap().containers[0]
            .volume_mounts
            .as_mut()
            .unwrap()[0]
            .sub_path = Some("other".to_owned());
        assert_finding(
            &kcm(vec![pod]),
            Severity::Warning,
            &["cannot see FlexVolume drivers"],
        );
    }

    #[test]
    fn the_official_image_has_no_shell_for_drivers_that_are_scripts() {
        let no_shell = [
            "is the official one, distroless, with no shell: drivers written as shell scripts \
             cannot attach there; flexd's controller runs them (its image has a shell)",
        ];
        for image in [
            KUBEADM_IMAGE,
            "registry.k8s.io/kube-controller-manager:v1.33.2@sha256:0123abcd",
            "registry.k8s.io/kube-controller-manager@sha256:0123abcd",
            "k8s.gcr.io/kube-controller-manager:v1.21.0",
            "registry.k8s.io/kube-controller-manager",
        ] {
            // Mounted: the shell alone.
            let finding = kcm(vec![kcm_pod("kcm", image, &[], &[KUBEADM_FLEX_MOUNT])]);
            assert_finding(&finding, Severity::Warning, &no_shell);
            assert_finding(
                &finding,
                Severity::Warning,
                &[
                    image,
                    "sees the FlexVolume dir",
                    "shell script",
                    "flexd manifests",
                ],
            );
            assert!(!finding.summary.contains("cannot see"), "{finding:?}");
            // Not mounted: both, in one finding.
            let finding = kcm(vec![kcm_pod("kcm", image, &[], &[CERTS])]);
            assert_finding(&finding, Severity::Warning, &no_shell);
            assert_finding(
                &finding,
                Severity::Warning,
                &[
                    "cannot see FlexVolume drivers",
                    "does not help drivers written as shell scripts",
                ],
            );
        }
        for image in [
            OTHER_IMAGE,
            "registry.k8s.io/kube-controller-manager-amd64:v1.33.2",
            "mirror.example/registry.k8s.io/kube-controller-manager:v1.33.2",
            "registry.example:5000/kube-controller-manager",
        ] {
            assert!(!is_official(image), "{image}");
        }
    }

    #[test]
    fn the_first_of_several_pods_is_reported_with_how_many() {
        let mounted = |name: &str| kcm_pod(name, OTHER_IMAGE, &[], &[KUBEADM_FLEX_MOUNT]);
        let finding = kcm(vec![mounted("kcm-a"), mounted("kcm-b"), mounted("kcm-c")]);
        assert_finding(
            &finding,
            Severity::Ok,
            &["kube-system/kcm-a, and all 3 of its pods alike"],
        );
        // The worst is reported: the first of those that cannot see the dir.
        let unmounted = |name: &str| kcm_pod(name, OTHER_IMAGE, &[], &[CERTS]);
        let official = |name: &str| kcm_pod(name, KUBEADM_IMAGE, &[], &[KUBEADM_FLEX_MOUNT]);
        let finding = kcm(vec![
            mounted("kcm-a"),
            official("kcm-b"),
            unmounted("kcm-c"),
            unmounted("kcm-d"),
        ]);
        assert_finding(
            &finding,
            Severity::Warning,
            &[
                "cannot see FlexVolume drivers",
                "kube-system/kcm-c, and 2 of its 4 pods alike (the others fare better)",
            ],
        );
        assert!(!finding.summary.contains("distroless"), "{finding:?}");
        let finding = kcm(vec![mounted("kcm-a"), official("kcm-b")]);
        assert_finding(
            &finding,
            Severity::Warning,
            &["kube-system/kcm-b, and 1 of its 2 pods alike", "distroless"],
        );
    }

    #[test]
    fn the_controller_manager_container_is_found_by_name() {
        let mut pod = kcm_pod("kcm", OTHER_IMAGE, &[], &[KUBEADM_FLEX_MOUNT]);
        let spec = pod.spec.as_mut().unwrap();
        let kcm_container = spec.containers.remove(0);
        // A sidecar first, without the mount, then kube-controller-manager itself.
        spec.containers.push(Container {
            name: "proxy".to_owned(),
            image: Some(KUBEADM_IMAGE.to_owned()),
            ..Container::default()
        });
        spec.containers.push(kcm_container.clone());
        assert_finding(&kcm(vec![pod.clone()]), Severity::Ok, &[]);
        // Named otherwise: the first container is taken.
        let spec = pod.spec.as_mut().unwrap();
        spec.containers[1].name = "controller-manager".to_owned();
        assert_finding(
            &kcm(vec![pod.clone()]),
            Severity::Warning,
            &["cannot see FlexVolume drivers", "distroless"],
        );
        // Without a spec (the API server never returns one): as without mounts.
        pod.spec = None;
        assert_finding(
            &kcm(vec![pod]),
            Severity::Warning,
            &["cannot see FlexVolume drivers"],
        );
    }

    #[test]
    fn without_a_controller_manager_pod_nothing_can_be_checked() {
        assert_finding(
            &kcm(vec![]),
            Severity::Warning,
            &[
                "no kube-controller-manager pod in kube-system (a managed control plane, or it \
                 runs outside pods): cannot check whether it runs FlexVolume drivers; flexd's \
                 controller attaches for the drivers it serves",
                "docs/migration.md",
            ],
        );
        assert_finding(
            &controller_manager(&ControllerManagers::Forbidden {
                reason: "pods is forbidden: User \"bob\" cannot list resource \"pods\"".to_owned(),
            }),
            Severity::Warning,
            &[
                "not allowed to list pods in kube-system (RBAC: pods is forbidden",
                "kubectl auth can-i list pods -n kube-system",
                "--flex-volume-plugin-dir",
            ],
        );
        assert_finding(
            &controller_manager(&ControllerManagers::Failed {
                reason: "no answer in 30s".to_owned(),
            }),
            Severity::Warning,
            &[
                "cannot list pods in kube-system: no answer in 30s",
                "by hand",
            ],
        );
        assert_finding(
            &controller_manager(&ControllerManagers::NotAsked),
            Severity::Warning,
            &["not checked", "kubernetes-version says why"],
        );
    }
}
