//! Gathering [`NodeFacts`]: the only part of `flexd preflight` that looks at the node. Nothing
//! here fails: what cannot be read is kept as such, and becomes a warning that says so.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use flexd::preflight::{
    self, Cgroups, DirFacts, KubeletDirFacts, NodeFacts, Presence, Selinux, Tool,
};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const SELINUX_ENFORCE: &str = "/sys/fs/selinux/enforce";
const LOOP_CONTROL: &str = "/dev/loop-control";
const MOUNTINFO: &str = "/proc/self/mountinfo";

pub fn gather(plugin_dir: &Path, kubelet_dir: &Path) -> NodeFacts {
    let mountinfo =
        std::fs::read_to_string(MOUNTINFO).map_err(|e| format!("cannot read {MOUNTINFO}: {e}"));
    let path = std::env::var_os("PATH");
    NodeFacts {
        kernel_release: rustix::system::uname()
            .release()
            .to_string_lossy()
            .into_owned(),
        cgroups: cgroups(Path::new(CGROUP_ROOT)),
        plugin_dir: dir(plugin_dir, &mountinfo),
        kubelet_dir: KubeletDirFacts {
            dir: dir(kubelet_dir, &mountinfo),
            plugins_registry: kubelet_dir.join("plugins_registry").is_dir(),
        },
        selinux: selinux(Path::new(SELINUX_ENFORCE)),
        loop_control: Path::new(LOOP_CONTROL).exists(),
        tools: preflight::TOOLS
            .iter()
            .map(|(name, _)| Tool {
                name: (*name).to_owned(),
                found: on_path(name, path.as_deref()),
            })
            .collect(),
    }
}

/// v2 when the root offers controllers (`cgroup.controllers`); else v1 when anything is
/// mounted there, hybrid when v2 is beside it at `unified/`.
fn cgroups(root: &Path) -> Cgroups {
    let controllers = root.join("cgroup.controllers");
    match std::fs::read_to_string(&controllers) {
        Ok(text) => {
            return Cgroups::Unified {
                controllers: text.split_whitespace().map(str::to_owned).collect(),
            }
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => {
            return Cgroups::Unknown {
                error: format!("cannot read {}: {e}", controllers.display()),
            }
        }
    }
    match std::fs::read_dir(root).map(|mut entries| entries.next().is_some()) {
        Ok(true) => Cgroups::V1 {
            hybrid: root.join("unified/cgroup.controllers").exists(),
            pids: root.join("pids").is_dir(),
        },
        Ok(false) => Cgroups::Missing,
        Err(e) if e.kind() == ErrorKind::NotFound => Cgroups::Missing,
        Err(e) => Cgroups::Unknown {
            error: format!("cannot read {}: {e}", root.display()),
        },
    }
}

/// Whether `path` is a directory, and the mount it is on (or would be created on).
fn dir(path: &Path, mountinfo: &Result<String, String>) -> DirFacts {
    let (presence, existing) = match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => (Presence::Directory, Some(path.to_owned())),
        Ok(_) => (Presence::NotDirectory, Some(path.to_owned())),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let ancestor = nearest_directory(path);
            (
                Presence::Missing {
                    ancestor: ancestor.clone(),
                },
                Some(ancestor),
            )
        }
        Err(e) => (
            Presence::Unknown {
                error: e.to_string(),
            },
            None,
        ),
    };
    let Some(existing) = existing else {
        let why = || format!("cannot look at {}", path.display());
        return DirFacts {
            path: path.to_owned(),
            presence,
            read_only: Err(why()),
            mount: Err(why()),
        };
    };
    let read_only = rustix::fs::statvfs(&existing)
        .map(|vfs| vfs.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY))
        .map_err(|e| format!("cannot statvfs {}: {e}", existing.display()));
    let mount = mountinfo.clone().and_then(|table| {
        // The table names mount points with every symlink resolved.
        let real = existing.canonicalize().unwrap_or_else(|_| existing.clone());
        flexvolume_os::mount::mount_holding(&table, &real)
            .ok_or_else(|| format!("no mount in {MOUNTINFO} holds {}", real.display()))
    });
    tracing::debug!(dir = %path.display(), ?presence, ?read_only, ?mount, "looked at");
    DirFacts {
        path: path.to_owned(),
        presence,
        read_only,
        mount,
    }
}

/// The nearest directory above `path` that exists: where it would be created.
fn nearest_directory(path: &Path) -> PathBuf {
    path.ancestors()
        .skip(1)
        .find(|a| !a.as_os_str().is_empty() && a.is_dir())
        .unwrap_or(Path::new("/"))
        .to_owned()
}

/// `/sys/fs/selinux/enforce`: `1` enforcing, `0` permissive; no file, no SELinux.
fn selinux(enforce: &Path) -> Selinux {
    match std::fs::read_to_string(enforce) {
        Ok(text) => match text.trim() {
            "1" => Selinux::Enforcing,
            "0" => Selinux::Permissive,
            other => Selinux::Unknown {
                error: format!("{} holds {other:?}", enforce.display()),
            },
        },
        Err(e) if e.kind() == ErrorKind::NotFound => Selinux::Absent,
        Err(e) => Selinux::Unknown {
            error: format!("cannot read {}: {e}", enforce.display()),
        },
    }
}

/// The first executable file `name` in `path` (a `PATH` value), found as flexd's runner finds
/// what it executes (its default when `PATH` is unset included).
fn on_path(name: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let path = path.unwrap_or("/usr/bin:/bin".as_ref());
    std::env::split_paths(path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            rustix::fs::access(candidate, rustix::fs::Access::EXEC_OK).is_ok()
                && candidate.is_file()
        })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn cgroup_versions_are_told_apart_by_what_is_mounted() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        assert_eq!(cgroups(&root.join("none")), Cgroups::Missing);
        assert_eq!(cgroups(root), Cgroups::Missing);
        std::fs::create_dir(root.join("memory")).unwrap();
        assert_eq!(
            cgroups(root),
            Cgroups::V1 {
                hybrid: false,
                pids: false
            }
        );
        std::fs::create_dir(root.join("pids")).unwrap();
        std::fs::create_dir(root.join("unified")).unwrap();
        std::fs::write(root.join("unified/cgroup.controllers"), "").unwrap();
        assert_eq!(
            cgroups(root),
            Cgroups::V1 {
                hybrid: true,
                pids: true
            }
        );
        std::fs::write(root.join("cgroup.controllers"), "cpuset cpu pids\n").unwrap();
        assert_eq!(
            cgroups(root),
            Cgroups::Unified {
                controllers: vec!["cpuset".into(), "cpu".into(), "pids".into()]
            }
        );
    }

    #[test]
    fn a_missing_dir_is_judged_by_its_nearest_existing_ancestor() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path().canonicalize().unwrap();
        let table = Ok(format!(
            "1 0 8:1 / / rw shared:1 - ext4 /dev/vda1 rw\n\
             2 1 0:2 / {} rw - tmpfs tmpfs rw\n",
            root.display()
        ));
        let facts = dir(&root.join("a/b/c"), &table);
        assert_eq!(
            facts.presence,
            Presence::Missing {
                ancestor: root.clone()
            }
        );
        assert_eq!(facts.read_only, Ok(false));
        let mount = facts.mount.unwrap();
        assert_eq!((mount.mount_point, mount.shared), (root.clone(), None));

        let facts = dir(&root, &Err("no table".into()));
        assert_eq!(facts.presence, Presence::Directory);
        assert_eq!(facts.mount, Err("no table".into()));

        std::fs::write(root.join("file"), "").unwrap();
        assert_eq!(
            dir(&root.join("file"), &table).presence,
            Presence::NotDirectory
        );
        assert!(matches!(
            dir(&root.join("file/below"), &table).presence,
            Presence::Unknown { .. }
        ));
    }

    #[test]
    fn selinux_modes_from_the_enforce_file() {
        let root = tempfile::tempdir().unwrap();
        let enforce = root.path().join("enforce");
        assert_eq!(selinux(&enforce), Selinux::Absent);
        std::fs::write(&enforce, "1").unwrap();
        assert_eq!(selinux(&enforce), Selinux::Enforcing);
        std::fs::write(&enforce, "0\n").unwrap();
        assert_eq!(selinux(&enforce), Selinux::Permissive);
        std::fs::write(&enforce, "x").unwrap();
        assert!(matches!(selinux(&enforce), Selinux::Unknown { .. }));
    }

    #[test]
    fn tools_are_executable_files_on_path() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        for d in [&a, &b] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(a.join("tool"), "").unwrap();
        std::fs::create_dir(a.join("dir-tool")).unwrap();
        std::fs::write(b.join("tool"), "").unwrap();
        std::fs::set_permissions(b.join("tool"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = std::env::join_paths([&a, &b]).unwrap();
        assert_eq!(on_path("tool", Some(&path)), Some(b.join("tool")));
        assert_eq!(on_path("dir-tool", Some(&path)), None);
        assert_eq!(on_path("none", Some(&path)), None);
    }
}
