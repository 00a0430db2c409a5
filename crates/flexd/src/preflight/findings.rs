//! [`NodeFacts`] as findings: a verdict and, for warnings and errors, what to do. Pure: every
//! branch is tested below with facts made up for it.

use std::path::Path;

use super::{
    kernel_version, Cgroups, Check, DirFacts, Finding, Mount, NodeFacts, Presence, Selinux,
    Severity,
};

/// The first kernel with `LOOP_CONFIGURE` (one ioctl backing a loop device with a descriptor);
/// before it the loop driver takes `LOOP_SET_FD` then `LOOP_SET_STATUS64`, as losetup does.
pub const LOOP_CONFIGURE_SINCE: (u32, u32) = (5, 8);

/// The host tools looked for on `PATH`, each with the package that usually has it.
pub const TOOLS: &[(&str, &str)] = &[
    ("mount", "util-linux, or Debian's mount"),
    ("umount", "util-linux, or Debian's mount"),
    ("mkfs.ext4", "e2fsprogs"),
];

const NODES_DOC: &str = "docs/compatibility.md#nodes";
const PROCESS_CAP_DOC: &str = "docs/protocol.md#process-cap";
const NAMESPACE_DOC: &str = "docs/lifecycle.md#driver-mount-namespace";

/// Every finding about the node, in a fixed order: kernel, cgroups, plugin dir, kubelet dir,
/// mount propagation, SELinux, loop devices, tools.
pub fn findings(facts: &NodeFacts) -> Vec<Finding> {
    vec![
        kernel(&facts.kernel_release),
        cgroups(&facts.cgroups),
        plugin_dir(&facts.plugin_dir),
        kubelet_dir(&facts.kubelet_dir.dir, facts.kubelet_dir.plugins_registry),
        propagation(&facts.kubelet_dir.dir),
        selinux(&facts.selinux, &facts.plugin_dir.path),
        loop_devices(facts.loop_control),
        tools(&facts.tools),
    ]
}

pub(super) fn ok(check: Check, summary: String) -> Finding {
    Finding {
        check,
        severity: Severity::Ok,
        summary,
        advice: None,
    }
}

pub(super) fn warning(check: Check, summary: String, advice: String) -> Finding {
    Finding {
        check,
        severity: Severity::Warning,
        summary,
        advice: Some(advice),
    }
}

pub(super) fn error(check: Check, summary: String, advice: String) -> Finding {
    Finding {
        check,
        severity: Severity::Error,
        summary,
        advice: Some(advice),
    }
}

fn kernel(release: &str) -> Finding {
    let (major, minor) = LOOP_CONFIGURE_SINCE;
    match kernel_version(release) {
        Some(version) if version >= LOOP_CONFIGURE_SINCE => ok(
            Check::Kernel,
            format!(
                "Linux {release}: {major}.{minor} or later, with LOOP_CONFIGURE for loop devices"
            ),
        ),
        Some(_) => warning(
            Check::Kernel,
            format!(
                "Linux {release} is older than {major}.{minor}: no LOOP_CONFIGURE, so the loop \
                 driver falls back to LOOP_SET_FD and LOOP_SET_STATUS64"
            ),
            format!(
                "flexd works here: each kernel feature it lacks has a fallback ({NODES_DOC}, \
                 and the README's kernel table). For LOOP_CONFIGURE, run Linux {major}.{minor} \
                 or later; until then, mount /proc with hidepid=2, as hidepid=invisible needs \
                 {major}.{minor} too (docs/security.md#secrets-in-argv)"
            ),
        ),
        None => warning(
            Check::Kernel,
            format!("cannot read a version from the kernel release {release:?}"),
            format!(
                "check `uname -r` by hand: flexd uses LOOP_CONFIGURE from Linux {major}.{minor} \
                 and falls back before it ({NODES_DOC})"
            ),
        ),
    }
}

fn cgroups(cgroups: &Cgroups) -> Finding {
    let uncapped = "drivers run without the process cap";
    let why = format!(
        "a driver that forks without end is then stopped only by its timeout ({PROCESS_CAP_DOC}, \
         {NODES_DOC})"
    );
    match cgroups {
        Cgroups::Unified { controllers } if controllers.iter().any(|c| c == "pids") => ok(
            Check::Cgroups,
            "cgroup v2 with the pids controller: each driver call-out runs capped".to_owned(),
        ),
        Cgroups::Unified { controllers } => warning(
            Check::Cgroups,
            format!(
                "cgroup v2 without the pids controller (it offers: {}): {uncapped}",
                if controllers.is_empty() {
                    "none".to_owned()
                } else {
                    controllers.join(" ")
                }
            ),
            format!(
                "use a kernel with the pids controller (CONFIG_CGROUP_PIDS), not disabled on \
                 its command line (cgroup_disable=pids); {why}"
            ),
        ),
        Cgroups::V1 { hybrid, pids: true } => ok(
            Check::Cgroups,
            format!(
                "cgroup v1{} with the pids hierarchy: each driver call-out runs capped",
                if *hybrid { " and v2 (hybrid)" } else { "" }
            ),
        ),
        Cgroups::V1 {
            hybrid,
            pids: false,
        } => warning(
            Check::Cgroups,
            format!(
                "cgroup v1{} without a pids hierarchy at /sys/fs/cgroup/pids: {uncapped}",
                if *hybrid { " and v2 (hybrid)" } else { "" }
            ),
            format!(
                "mount the pids controller (`mount -t cgroup -o pids cgroup /sys/fs/cgroup/pids`, \
                 as systemd does at boot), or boot with cgroup v2 only \
                 (systemd.unified_cgroup_hierarchy=1); {why}"
            ),
        ),
        Cgroups::Missing => warning(
            Check::Cgroups,
            format!("no cgroup hierarchy is mounted at /sys/fs/cgroup: {uncapped}"),
            format!("mount cgroup v2 at /sys/fs/cgroup (systemd does at boot); {why}"),
        ),
        Cgroups::Unknown { error } => warning(
            Check::Cgroups,
            format!("cannot tell which cgroups this node has: {error}"),
            format!(
                "run flexd preflight as root; flexd needs cgroup v2, or v1 with the pids \
                 controller, or {uncapped}: {why}"
            ),
        ),
    }
}

/// "/usr/libexec is on a read-only mount (the mount at /usr)", naming the mount when the
/// table said which it is and it is not `dir` itself.
fn on_read_only_mount(dir: &Path, mount: &Result<Mount, String>) -> String {
    match mount {
        Ok(mount) if mount.mount_point == dir => format!("{} is a read-only mount", dir.display()),
        Ok(mount) => format!(
            "{} is on a read-only mount (the mount at {})",
            dir.display(),
            mount.mount_point.display()
        ),
        Err(_) => format!("{} is on a read-only mount", dir.display()),
    }
}

fn plugin_dir(dir: &DirFacts) -> Finding {
    let path = dir.path.display();
    let writable_elsewhere =
        "use a writable directory (on hosts whose /usr is read-only, one under /var or /opt), \
         start kubelet with --volume-plugin-dir=<it>, and pass the same path to flexd manifests \
         --node-plugin-dir, and as --plugin-dir to flexd install and to this command (drivers \
         are installed into the plugin dir, and flexd's pods mount it as a hostPath of type \
         DirectoryOrCreate: both need a writable mount)";
    let cannot_tell = |what: &str| {
        warning(
            Check::PluginDir,
            format!("cannot tell whether the plugin dir {path} {what}"),
            "run flexd preflight as root".to_owned(),
        )
    };
    match (&dir.presence, &dir.read_only) {
        (Presence::Unknown { error }, _) => cannot_tell(&format!("exists or is writable: {error}")),
        (Presence::NotDirectory, _) => error(
            Check::PluginDir,
            format!("the plugin dir {path} is not a directory"),
            "remove what is there, or choose another plugin dir: start kubelet with \
             --volume-plugin-dir=<it> and pass the same path to flexd manifests \
             --node-plugin-dir"
                .to_owned(),
        ),
        (Presence::Directory | Presence::Missing { .. }, Err(e)) => {
            cannot_tell(&format!("is writable: {e}"))
        }
        (Presence::Directory, Ok(true)) => error(
            Check::PluginDir,
            format!(
                "the plugin dir {}: no driver can be installed",
                on_read_only_mount(&dir.path, &dir.mount)
            ),
            writable_elsewhere.to_owned(),
        ),
        (Presence::Missing { ancestor }, Ok(true)) => error(
            Check::PluginDir,
            format!(
                "the plugin dir {path} does not exist and cannot be created: {}",
                on_read_only_mount(ancestor, &dir.mount)
            ),
            writable_elsewhere.to_owned(),
        ),
        (Presence::Missing { .. }, Ok(false)) => warning(
            Check::PluginDir,
            format!("the plugin dir {path} does not exist"),
            "kubelet creates its plugin dir when it starts: is kubelet running with another \
             --volume-plugin-dir? Pass that one as --plugin-dir (here and to flexd install) and \
             to flexd manifests --node-plugin-dir. If this is kubelet's, flexd install creates \
             it"
            .to_owned(),
        ),
        (Presence::Directory, Ok(false)) => ok(
            Check::PluginDir,
            format!("the plugin dir {path} exists and is writable"),
        ),
    }
}

fn kubelet_dir(dir: &DirFacts, plugins_registry: bool) -> Finding {
    let path = dir.path.display();
    let other_root = "is kubelet running with another --root-dir? Pass it to flexd manifests \
                      --kubelet-dir (and to this command's --kubelet-dir)";
    match &dir.presence {
        Presence::Directory if plugins_registry => ok(
            Check::KubeletDir,
            format!(
                "the kubelet dir {path} has plugins_registry/, where flexd registers its CSI \
                 drivers with kubelet"
            ),
        ),
        Presence::Directory => error(
            Check::KubeletDir,
            format!(
                "the kubelet dir {path} has no plugins_registry/, where flexd registers its CSI \
                 drivers with kubelet (kubelet makes it when it starts)"
            ),
            format!("{other_root}; or start kubelet on this node first"),
        ),
        Presence::Missing { .. } => error(
            Check::KubeletDir,
            format!("the kubelet dir {path} does not exist"),
            format!("{other_root}; or start kubelet on this node first"),
        ),
        Presence::NotDirectory => error(
            Check::KubeletDir,
            format!("the kubelet dir {path} is not a directory"),
            other_root.to_owned(),
        ),
        Presence::Unknown { error } => warning(
            Check::KubeletDir,
            format!("cannot look at the kubelet dir {path}: {error}"),
            "run flexd preflight as root".to_owned(),
        ),
    }
}

/// Bidirectional propagation of kubelet's dir into flexd's node pod needs its mount shared.
fn propagation(dir: &DirFacts) -> Finding {
    let path = dir.path.display();
    let mount = match &dir.mount {
        Ok(mount) => mount,
        Err(e) => {
            return warning(
                Check::MountPropagation,
                format!("cannot tell whether mounts below {path} propagate: {e}"),
                format!(
                    "check that the mount holding {path} is shared (`findmnt -o TARGET,PROPAGATION \
                     --target {path}`): flexd's node pod mounts it with Bidirectional \
                     propagation ({NAMESPACE_DOC})"
                ),
            );
        }
    };
    let point = mount.mount_point.display();
    match (mount.shared, mount.master) {
        (Some(group), _) => ok(
            Check::MountPropagation,
            format!(
                "{path} is on a shared mount ({point}, peer group {group}): Bidirectional \
                 mount propagation works"
            ),
        ),
        (None, master) => warning(
            Check::MountPropagation,
            format!(
                "{path} is on a mount that is not shared ({point}, {}): Bidirectional mount \
                 propagation fails there",
                match master {
                    Some(group) => format!("a slave of peer group {group}"),
                    None => "private".to_owned(),
                }
            ),
            format!(
                "make it shared (`mount --make-rshared {point}`; systemd makes every mount \
                 shared at boot, so find what made it otherwise). flexd's node pod mounts \
                 kubelet's dir with Bidirectional propagation, which the container runtime \
                 refuses on a mount that is not shared, and which drivers' mounts need to reach \
                 kubelet ({NAMESPACE_DOC})"
            ),
        ),
    }
}

fn selinux(selinux: &Selinux, plugin_dir: &Path) -> Finding {
    match selinux {
        Selinux::Absent => ok(Check::Selinux, "SELinux is not enabled".to_owned()),
        Selinux::Permissive => ok(
            Check::Selinux,
            "SELinux is permissive: it logs denials, enforces none".to_owned(),
        ),
        Selinux::Enforcing => warning(
            Check::Selinux,
            "SELinux is enforcing".to_owned(),
            format!(
                "flexd's container executes the drivers from the plugin dir {}: the policy must \
                 allow it, or every call-out fails on an exec denial (as on Bottlerocket). \
                 After deploying, look for AVC denials (`ausearch -m avc -ts recent`)",
                plugin_dir.display()
            ),
        ),
        Selinux::Unknown { error } => warning(
            Check::Selinux,
            format!("cannot tell whether SELinux is enforcing: {error}"),
            "check with `getenforce`: when enforcing, the policy must let flexd's container \
             execute the drivers in the plugin dir"
                .to_owned(),
        ),
    }
}

fn loop_devices(loop_control: bool) -> Finding {
    if loop_control {
        ok(
            Check::LoopDevices,
            "/dev/loop-control exists: the builtin loop driver can set up loop devices".to_owned(),
        )
    } else {
        warning(
            Check::LoopDevices,
            "/dev/loop-control is missing: the builtin loop driver cannot set up loop devices \
             (no other driver of flexd's needs it)"
                .to_owned(),
            "load the loop module (`modprobe loop`, and name it in /etc/modules-load.d/ to keep \
             it), or do not deploy the loop driver on this node"
                .to_owned(),
        )
    }
}

fn tools(tools: &[super::Tool]) -> Finding {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|t| t.found.is_none())
        .map(|t| t.name.as_str())
        .collect();
    let names = |list: &[&str]| list.join(", ");
    if missing.is_empty() {
        let found: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        return ok(Check::Tools, format!("on PATH: {}", names(&found)));
    }
    let packages: Vec<String> = missing
        .iter()
        .map(|name| {
            let package = TOOLS
                .iter()
                .find(|(tool, _)| tool == name)
                .map_or("its package", |(_, package)| package);
            format!("{name} ({package})")
        })
        .collect();
    warning(
        Check::Tools,
        format!("not on PATH: {}", names(&missing)),
        format!(
            "install {} if your drivers call them: drivers run with the host's tools \
             ({NAMESPACE_DOC}). flexd's own mounts use the tools in its image",
            packages.join(", ")
        ),
    )
}

#[cfg(test)]
pub(super) mod tests {
    use std::path::PathBuf;

    use super::super::{KubeletDirFacts, Tool};
    use super::*;

    /// A node where everything is as flexd wants it.
    fn good_node() -> NodeFacts {
        let mount = |point: &str| {
            Ok(Mount {
                mount_point: PathBuf::from(point),
                shared: Some(1),
                master: None,
            })
        };
        NodeFacts {
            kernel_release: "6.1.0-18-amd64".to_owned(),
            cgroups: Cgroups::Unified {
                controllers: vec!["cpu".into(), "memory".into(), "pids".into()],
            },
            plugin_dir: DirFacts {
                path: PathBuf::from("/usr/libexec/kubernetes/kubelet-plugins/volume/exec"),
                presence: Presence::Directory,
                read_only: Ok(false),
                mount: mount("/"),
            },
            kubelet_dir: KubeletDirFacts {
                dir: DirFacts {
                    path: PathBuf::from("/var/lib/kubelet"),
                    presence: Presence::Directory,
                    read_only: Ok(false),
                    mount: mount("/"),
                },
                plugins_registry: true,
            },
            selinux: Selinux::Absent,
            loop_control: true,
            tools: TOOLS
                .iter()
                .map(|(name, _)| Tool {
                    name: (*name).to_owned(),
                    found: Some(PathBuf::from("/usr/bin").join(name)),
                })
                .collect(),
        }
    }

    /// The one finding about `check`.
    fn about(facts: &NodeFacts, check: Check) -> Finding {
        let all = findings(facts);
        let mut about = all.into_iter().filter(|f| f.check == check);
        let found = about.next().expect("a finding for every check");
        assert!(about.next().is_none(), "one finding per check");
        found
    }

    /// The finding has the severity, says each of `says` (summary or advice), and has advice
    /// exactly when it is not ok. The cluster findings' tests use it too.
    #[track_caller]
    pub(in crate::preflight) fn assert_finding(
        finding: &Finding,
        severity: Severity,
        says: &[&str],
    ) {
        assert_eq!(finding.severity, severity, "{finding:?}");
        let text = format!(
            "{} {}",
            finding.summary,
            finding.advice.as_deref().unwrap_or_default()
        );
        for s in says {
            assert!(text.contains(s), "no {s:?} in {finding:?}");
        }
        // Advice exactly for what needs doing.
        assert_eq!(
            finding.advice.is_some(),
            severity != Severity::Ok,
            "{finding:?}"
        );
    }

    #[test]
    fn a_good_node_has_only_ok_findings_one_per_check_in_order() {
        let all = findings(&good_node());
        let checks: Vec<&str> = all.iter().map(|f| f.check.name()).collect();
        assert_eq!(
            checks,
            [
                "kernel",
                "cgroups",
                "plugin-dir",
                "kubelet-dir",
                "mount-propagation",
                "selinux",
                "loop-devices",
                "tools"
            ]
        );
        for finding in &all {
            assert_finding(finding, Severity::Ok, &[]);
            // The JSON name is the one printed for humans.
            assert_eq!(
                serde_json::to_value(finding.check).unwrap(),
                finding.check.name()
            );
        }
    }

    #[test]
    fn kernel_before_5_8_is_a_warning_citing_the_compatibility_doc() {
        let mut facts = good_node();
        for release in ["5.8.0", "5.10.0-28-amd64", "6.18.44"] {
            facts.kernel_release = release.to_owned();
            assert_finding(
                &about(&facts, Check::Kernel),
                Severity::Ok,
                &[release, "LOOP_CONFIGURE"],
            );
        }
        for release in ["5.7.19", "4.19.0-26-amd64", "3.10.0-1160.el7.x86_64"] {
            facts.kernel_release = release.to_owned();
            assert_finding(
                &about(&facts, Check::Kernel),
                Severity::Warning,
                &[
                    release,
                    "older than 5.8",
                    "LOOP_SET_FD",
                    "docs/compatibility.md#nodes",
                ],
            );
        }
        facts.kernel_release = "weird".to_owned();
        assert_finding(
            &about(&facts, Check::Kernel),
            Severity::Warning,
            &["\"weird\"", "docs/compatibility.md#nodes"],
        );
    }

    #[test]
    fn cgroups_without_pids_mean_no_process_cap() {
        let mut facts = good_node();
        let cap = ["without the process cap", "docs/protocol.md#process-cap"];
        facts.cgroups = Cgroups::Unified {
            controllers: vec!["cpu".into(), "io".into()],
        };
        let finding = about(&facts, Check::Cgroups);
        assert_finding(&finding, Severity::Warning, &cap);
        assert_finding(&finding, Severity::Warning, &["cgroup v2", "cpu io"]);
        facts.cgroups = Cgroups::Unified {
            controllers: vec![],
        };
        assert_finding(
            &about(&facts, Check::Cgroups),
            Severity::Warning,
            &["offers: none"],
        );

        for hybrid in [false, true] {
            facts.cgroups = Cgroups::V1 { hybrid, pids: true };
            let finding = about(&facts, Check::Cgroups);
            assert_finding(&finding, Severity::Ok, &["cgroup v1", "capped"]);
            assert_eq!(finding.summary.contains("hybrid"), hybrid);
            facts.cgroups = Cgroups::V1 {
                hybrid,
                pids: false,
            };
            let finding = about(&facts, Check::Cgroups);
            assert_finding(&finding, Severity::Warning, &cap);
            assert_finding(&finding, Severity::Warning, &["/sys/fs/cgroup/pids"]);
            assert_eq!(finding.summary.contains("hybrid"), hybrid);
        }

        facts.cgroups = Cgroups::Missing;
        assert_finding(&about(&facts, Check::Cgroups), Severity::Warning, &cap);
        facts.cgroups = Cgroups::Unknown {
            error: "EACCES".into(),
        };
        assert_finding(
            &about(&facts, Check::Cgroups),
            Severity::Warning,
            &["EACCES", "without the process cap"],
        );
    }

    #[test]
    fn a_read_only_plugin_dir_is_an_error_saying_how_to_move_it() {
        let move_it = [
            "--volume-plugin-dir=",
            "flexd manifests --node-plugin-dir",
            "writable directory",
        ];
        let mut facts = good_node();
        facts.plugin_dir.read_only = Ok(true);
        facts.plugin_dir.mount = Ok(Mount {
            mount_point: PathBuf::from("/usr"),
            shared: None,
            master: None,
        });
        let finding = about(&facts, Check::PluginDir);
        assert_finding(&finding, Severity::Error, &move_it);
        assert_finding(
            &finding,
            Severity::Error,
            &["exec is on a read-only mount (the mount at /usr)"],
        );

        // Missing, where its nearest ancestor is read-only: CoreOS-like hosts, k3os.
        facts.plugin_dir.presence = Presence::Missing {
            ancestor: PathBuf::from("/usr"),
        };
        let finding = about(&facts, Check::PluginDir);
        assert_finding(&finding, Severity::Error, &move_it);
        assert_finding(
            &finding,
            Severity::Error,
            &["does not exist and cannot be created: /usr is a read-only mount"],
        );
        facts.plugin_dir.presence = Presence::Missing {
            ancestor: PathBuf::from("/usr/libexec"),
        };
        assert_finding(
            &about(&facts, Check::PluginDir),
            Severity::Error,
            &["/usr/libexec is on a read-only mount (the mount at /usr)"],
        );
        facts.plugin_dir.mount = Err("no mountinfo".into());
        let finding = about(&facts, Check::PluginDir);
        assert_finding(
            &finding,
            Severity::Error,
            &["/usr/libexec is on a read-only mount"],
        );
        assert!(!finding.summary.contains("the mount at"), "{finding:?}");
    }

    #[test]
    fn a_missing_or_odd_plugin_dir() {
        let mut facts = good_node();
        facts.plugin_dir.presence = Presence::Missing {
            ancestor: PathBuf::from("/usr/libexec"),
        };
        assert_finding(
            &about(&facts, Check::PluginDir),
            Severity::Warning,
            &[
                "does not exist",
                "another --volume-plugin-dir",
                "flexd install creates it",
            ],
        );
        facts.plugin_dir.presence = Presence::NotDirectory;
        assert_finding(
            &about(&facts, Check::PluginDir),
            Severity::Error,
            &["not a directory", "--volume-plugin-dir="],
        );
        facts.plugin_dir.presence = Presence::Unknown {
            error: "Permission denied".into(),
        };
        assert_finding(
            &about(&facts, Check::PluginDir),
            Severity::Warning,
            &["Permission denied", "as root"],
        );
        for presence in [
            Presence::Directory,
            Presence::Missing {
                ancestor: PathBuf::from("/"),
            },
        ] {
            facts.plugin_dir.presence = presence;
            facts.plugin_dir.read_only = Err("statvfs: EIO".into());
            assert_finding(
                &about(&facts, Check::PluginDir),
                Severity::Warning,
                &["writable", "statvfs: EIO"],
            );
        }
    }

    #[test]
    fn the_kubelet_dir_needs_plugins_registry() {
        let other_root = ["another --root-dir", "flexd manifests --kubelet-dir"];
        let mut facts = good_node();
        facts.kubelet_dir.plugins_registry = false;
        let finding = about(&facts, Check::KubeletDir);
        assert_finding(&finding, Severity::Error, &other_root);
        assert_finding(&finding, Severity::Error, &["no plugins_registry/"]);

        facts.kubelet_dir.dir.presence = Presence::Missing {
            ancestor: PathBuf::from("/var/lib"),
        };
        let finding = about(&facts, Check::KubeletDir);
        assert_finding(&finding, Severity::Error, &other_root);
        assert_finding(
            &finding,
            Severity::Error,
            &["/var/lib/kubelet does not exist"],
        );

        facts.kubelet_dir.dir.presence = Presence::NotDirectory;
        assert_finding(
            &about(&facts, Check::KubeletDir),
            Severity::Error,
            &["not a directory", "another --root-dir"],
        );
        facts.kubelet_dir.dir.presence = Presence::Unknown {
            error: "Permission denied".into(),
        };
        assert_finding(
            &about(&facts, Check::KubeletDir),
            Severity::Warning,
            &["Permission denied", "as root"],
        );
    }

    #[test]
    fn the_kubelet_dir_must_be_on_a_shared_mount() {
        let mut facts = good_node();
        assert_finding(
            &about(&facts, Check::MountPropagation),
            Severity::Ok,
            &["shared mount (/, peer group 1)"],
        );
        let need = [
            "not shared",
            "Bidirectional",
            "docs/lifecycle.md#driver-mount-namespace",
            "mount --make-rshared /var/lib/kubelet",
        ];
        for (master, says) in [(None, "private"), (Some(7), "a slave of peer group 7")] {
            facts.kubelet_dir.dir.mount = Ok(Mount {
                mount_point: PathBuf::from("/var/lib/kubelet"),
                shared: None,
                master,
            });
            let finding = about(&facts, Check::MountPropagation);
            assert_finding(&finding, Severity::Warning, &need);
            assert_finding(&finding, Severity::Warning, &[says]);
        }
        facts.kubelet_dir.dir.mount = Err("cannot read /proc/self/mountinfo".into());
        assert_finding(
            &about(&facts, Check::MountPropagation),
            Severity::Warning,
            &["cannot read /proc/self/mountinfo", "findmnt"],
        );
    }

    #[test]
    fn selinux_enforcing_is_a_warning_about_executing_drivers() {
        let mut facts = good_node();
        facts.selinux = Selinux::Permissive;
        assert_finding(
            &about(&facts, Check::Selinux),
            Severity::Ok,
            &["permissive"],
        );
        facts.selinux = Selinux::Enforcing;
        assert_finding(
            &about(&facts, Check::Selinux),
            Severity::Warning,
            &[
                "enforcing",
                "execute",
                "/usr/libexec/kubernetes",
                "Bottlerocket",
            ],
        );
        facts.selinux = Selinux::Unknown {
            error: "holds \"2\"".into(),
        };
        assert_finding(
            &about(&facts, Check::Selinux),
            Severity::Warning,
            &["holds \"2\"", "getenforce"],
        );
    }

    #[test]
    fn no_loop_control_is_a_warning_for_the_loop_driver() {
        let mut facts = good_node();
        facts.loop_control = false;
        assert_finding(
            &about(&facts, Check::LoopDevices),
            Severity::Warning,
            &["/dev/loop-control", "loop driver", "modprobe loop"],
        );
    }

    #[test]
    fn missing_tools_are_a_warning_naming_them_and_their_packages() {
        let mut facts = good_node();
        assert_finding(
            &about(&facts, Check::Tools),
            Severity::Ok,
            &["mount, umount, mkfs.ext4"],
        );
        facts.tools[2].found = None;
        let finding = about(&facts, Check::Tools);
        assert_finding(
            &finding,
            Severity::Warning,
            &["not on PATH: mkfs.ext4", "e2fsprogs"],
        );
        assert!(!finding.summary.contains("umount"), "{finding:?}");
        facts.tools.push(Tool {
            name: "other".into(),
            found: None,
        });
        assert_finding(
            &about(&facts, Check::Tools),
            Severity::Warning,
            &["mkfs.ext4, other", "other (its package)"],
        );
    }
}
