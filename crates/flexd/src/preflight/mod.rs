//! `flexd preflight`: what a node means for flexd, before flexd is deployed on it, and with
//! `--cluster` what the cluster means for it.
//!
//! The binary gathers [`NodeFacts`] (uname, /sys, /proc, the directories: its only I/O,
//! `cli/preflight/facts.rs`); [`findings`] turns them into [`Finding`]s, each with a
//! [`Severity`] and, for warnings and errors, what to do. Split so that every verdict and its
//! advice is tested without the node it is about. What flexd relies on is
//! docs/compatibility.md#nodes; the advice points there and at the contract's sections. The
//! cluster's side is the same split: [`ClusterFacts`] from the API server
//! (`cli/preflight/cluster.rs`), [`cluster_findings`] from them.

mod cluster;
mod findings;

use std::path::PathBuf;

use serde::Serialize;

pub use cluster::{
    cluster_findings, ApiFailure, ClusterFacts, ControllerManagers, ServerVersion,
    KCM_DEFAULT_FLEX_DIR, KCM_NAMESPACE, KCM_SELECTORS,
};
pub use findings::{findings, LOOP_CONFIGURE_SINCE, TOOLS};

/// What `flexd preflight` saw on the node: observations only, no verdicts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// The running kernel's release (`uname -r`).
    pub kernel_release: String,
    pub cgroups: Cgroups,
    /// The FlexVolume plugin dir (the global `--plugin-dir`).
    pub plugin_dir: DirFacts,
    pub kubelet_dir: KubeletDirFacts,
    pub selinux: Selinux,
    /// Whether `/dev/loop-control` exists (the builtin loop driver's only need of the node).
    pub loop_control: bool,
    /// Each of [`TOOLS`], and where it was found on `PATH`.
    pub tools: Vec<Tool>,
}

/// The cgroup hierarchies mounted at `/sys/fs/cgroup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroups {
    /// cgroup v2 only: the controllers its root offers (`cgroup.controllers`).
    Unified { controllers: Vec<String> },
    /// cgroup v1, with v2's hierarchy beside it (`hybrid`, at `unified/`) or not; whether v1's
    /// `pids` hierarchy is mounted.
    V1 { hybrid: bool, pids: bool },
    /// Nothing mounted there.
    Missing,
    /// Could not be read.
    Unknown { error: String },
}

/// A directory flexd needs, and the mount it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirFacts {
    pub path: PathBuf,
    pub presence: Presence,
    /// Whether the directory, or for a missing one its nearest existing ancestor (where it
    /// would be created), is on a read-only mount (statvfs's `ST_RDONLY`).
    pub read_only: Result<bool, String>,
    /// The mount holding the directory, or its nearest existing ancestor.
    pub mount: Result<Mount, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    Directory,
    /// Something other than a directory is at the path.
    NotDirectory,
    /// Nothing is; `ancestor` is the nearest directory above it that exists.
    Missing {
        ancestor: PathBuf,
    },
    /// Could not be looked at (e.g. no permission).
    Unknown {
        error: String,
    },
}

/// kubelet's root dir, and what kubelet makes in it when it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletDirFacts {
    pub dir: DirFacts,
    /// Whether `plugins_registry/` (where CSI plugins register with kubelet) is a directory.
    pub plugins_registry: bool,
}

/// The mount holding a directory, and how mounts below it propagate (parsed by
/// [`flexvolume_os::mount::mount_holding`], as flexd's own propagation check reads it).
pub use flexvolume_os::mount::HoldingMount as Mount;

/// SELinux's mode, from `/sys/fs/selinux/enforce`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selinux {
    /// No SELinux (the file does not exist).
    Absent,
    Permissive,
    Enforcing,
    Unknown {
        error: String,
    },
}

/// A host tool drivers commonly call, and where `PATH` has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    pub name: String,
    pub found: Option<PathBuf>,
}

/// How much a finding matters: an error means flexd will not work on this node (or cluster) as
/// deployed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Ok,
    Warning,
    Error,
}

impl Severity {
    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "OK",
            Self::Warning => "WARNING",
            Self::Error => "ERROR",
        }
    }
}

/// What a finding is about; its JSON name (`plugin-dir`) is stable for scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    Kernel,
    Cgroups,
    PluginDir,
    KubeletDir,
    MountPropagation,
    Selinux,
    LoopDevices,
    Tools,
    KubernetesVersion,
    KubeControllerManager,
}

impl Check {
    pub fn name(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::Cgroups => "cgroups",
            Self::PluginDir => "plugin-dir",
            Self::KubeletDir => "kubelet-dir",
            Self::MountPropagation => "mount-propagation",
            Self::Selinux => "selinux",
            Self::LoopDevices => "loop-devices",
            Self::Tools => "tools",
            Self::KubernetesVersion => "kubernetes-version",
            Self::KubeControllerManager => "kube-controller-manager",
        }
    }
}

/// One thing found about the node or the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: Check,
    pub severity: Severity,
    /// What was found, in a sentence.
    pub summary: String,
    /// What to do; `None` only for [`Severity::Ok`].
    pub advice: Option<String>,
}

/// Every finding, as `flexd preflight --output json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub findings: Vec<Finding>,
    pub errors: usize,
    pub warnings: usize,
}

impl Report {
    pub fn new(findings: Vec<Finding>) -> Self {
        let count = |s: Severity| findings.iter().filter(|f| f.severity == s).count();
        Self {
            errors: count(Severity::Error),
            warnings: count(Severity::Warning),
            findings,
        }
    }
}

/// A kernel release's major and minor version (`6.1.0-18-amd64` → `(6, 1)`); `None` when it
/// does not start with `MAJOR.MINOR`.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let (major, rest) = release.split_once('.')?;
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    Some((major.parse().ok()?, rest[..digits].parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_are_read_from_the_release() {
        assert_eq!(kernel_version("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(kernel_version("5.8"), Some((5, 8)));
        assert_eq!(kernel_version("5.4.0+"), Some((5, 4)));
        assert_eq!(kernel_version("4.19-rc1"), Some((4, 19)));
        assert_eq!(kernel_version("linux"), None);
        assert_eq!(kernel_version("6"), None);
        assert_eq!(kernel_version("6.x"), None);
        assert_eq!(kernel_version(""), None);
    }

    #[test]
    fn the_report_counts_errors_and_warnings() {
        let finding = |severity| Finding {
            check: Check::Tools,
            severity,
            summary: String::new(),
            advice: None,
        };
        let report = Report::new(vec![
            finding(Severity::Ok),
            finding(Severity::Warning),
            finding(Severity::Error),
            finding(Severity::Warning),
        ]);
        assert_eq!((report.errors, report.warnings), (1, 2));
        let json = serde_json::to_value(&report.findings[1]).unwrap();
        assert_eq!(json["check"], "tools");
        assert_eq!(json["severity"], "warning");
        assert_eq!(json["advice"], serde_json::Value::Null);
    }
}
