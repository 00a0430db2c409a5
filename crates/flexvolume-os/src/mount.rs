//! Mount helpers: reading the mount table, bind mounts, unmounts, format-and-mount.
//!
//! Mounts go through the syscalls (rustix), not the `mount` command, so paths with spaces or
//! options-looking names are never reinterpreted. Formatting shells out to `mkfs.<fs>` (the
//! filesystems' own tools) and never runs on a device that already holds a filesystem.
//!
//! Every mount point is resolved by [`safe_path`] (no symlink followed anywhere) and mounted
//! through its descriptor; unmounts refuse a path through a symlink and use `UMOUNT_NOFOLLOW`.

pub mod safe_path;

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("cannot read the mount table: {0}")]
    MountTable(#[source] io::Error),
    #[error("mount {source_path} on {target} failed: {error}")]
    Mount {
        source_path: String,
        target: PathBuf,
        #[source]
        error: io::Error,
    },
    #[error("unmount {target} failed: {error}")]
    Unmount {
        target: PathBuf,
        #[source]
        error: io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    Tool {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("filesystem type {0:?} is not supported here (no mkfs.{0})")]
    UnsupportedFs(String),
    #[error(transparent)]
    Path(#[from] safe_path::PathError),
}

/// One line of /proc/self/mountinfo, the fields we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    pub mount_point: PathBuf,
    pub root: String,
    pub fs_type: String,
    pub source: String,
    pub options: String,
}

/// Undoes the octal escapes of mountinfo (`\040` for a space, `\011` tab, `\012` newline,
/// `\134` backslash).
pub fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                let value = (u32::from(d[0] - b'0') << 6)
                    | (u32::from(d[1] - b'0') << 3)
                    | u32::from(d[2] - b'0');
                match u8::try_from(value) {
                    Ok(v) => out.push(v),
                    Err(_) => out.extend_from_slice(&bytes[i..i + 4]),
                }
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount holding a directory, and how mounts below it propagate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldingMount {
    pub mount_point: PathBuf,
    /// Its peer group (`shared:N`): mounts below it propagate to and from its peers.
    pub shared: Option<u64>,
    /// The peer group it is a slave of (`master:N`): mounts propagate into it only.
    pub master: Option<u64>,
}

/// The mount holding `dir` (absolute, symlinks resolved) in the text of a mountinfo table: the
/// last one listed at the longest mount point above it (a later mount at the same point covers
/// the earlier one). `None` when no mount holds it; malformed lines are skipped.
pub fn mount_holding(mountinfo: &str, dir: &Path) -> Option<HoldingMount> {
    let mut best: Option<(usize, HoldingMount)> = None;
    for line in mountinfo.lines() {
        let Some((before, _)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = before.split(' ').collect();
        let Some(mount_point) = fields.get(4) else {
            continue;
        };
        let mount_point = PathBuf::from(unescape(mount_point));
        if !dir.starts_with(&mount_point) {
            continue;
        }
        let depth = mount_point.components().count();
        if best.as_ref().is_some_and(|(d, _)| *d > depth) {
            continue;
        }
        // Optional fields: from the 7th to the ` - ` separator.
        let tag = |name: &str| {
            fields
                .iter()
                .skip(6)
                .find_map(|f| f.strip_prefix(name)?.parse().ok())
        };
        best = Some((
            depth,
            HoldingMount {
                mount_point,
                shared: tag("shared:"),
                master: tag("master:"),
            },
        ));
    }
    best.map(|(_, mount)| mount)
}

/// Parses the text of /proc/self/mountinfo. Malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            Some(MountInfo {
                root: unescape(left.get(3)?),
                mount_point: PathBuf::from(unescape(left.get(4)?)),
                options: left.get(5)?.to_string(),
                fs_type: right.first()?.to_string(),
                source: unescape(right.get(1).unwrap_or(&"")),
            })
        })
        .collect()
}

pub fn mount_table() -> Result<Vec<MountInfo>, MountError> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").map_err(MountError::MountTable)?;
    Ok(parse_mountinfo(&text))
}

/// Whether something is mounted exactly at `path`: the one answer to "is it mounted" in flexd.
/// A path that does not exist is not; a path through a symlink is never reported mounted
/// (flexd neither mounts nor unmounts through one), and a path that is not absolute or holds
/// `..` is an error.
pub fn is_mount_point(path: &Path) -> Result<bool, MountError> {
    match safe_path::look(path) {
        Ok(Some(entry)) => entry.is_mount_root().map_err(MountError::MountTable),
        Ok(None)
        | Err(safe_path::PathError::Symlink { .. } | safe_path::PathError::NotDirectory { .. }) => {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Bind-mounts `source` onto `target`, read-only when asked (bind, then remount read-only: a
/// read-only bind needs both steps on Linux). Both are resolved without following symlinks and
/// mounted through their descriptors.
pub fn bind_mount(source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
    let err = |error: rustix::io::Errno| MountError::Mount {
        source_path: source.display().to_string(),
        target: target.to_owned(),
        error: error.into(),
    };
    let source_fd = safe_dir(source)?;
    let target_fd = safe_dir(target)?;
    rustix::mount::mount_bind(
        safe_path::fd_path(&source_fd),
        safe_path::fd_path(&target_fd),
    )
    .map_err(err)?;
    drop(target_fd);
    // The mount now on top of the target: what the remount and the propagation change act on.
    let mounted = safe_dir(target)?;
    let mounted_path = safe_path::fd_path(&mounted);
    if read_only {
        let flags = MountFlags::BIND | MountFlags::RDONLY;
        if let Err(e) = rustix::mount::mount_remount(&mounted_path, flags, "") {
            drop(mounted);
            let _ = unmount(target);
            return Err(err(e));
        }
    }
    // Volumes are private to their target: a mount made inside one never propagates elsewhere.
    let _ = rustix::mount::mount_change(&mounted_path, MountPropagationFlags::PRIVATE);
    Ok(())
}

/// The directory at `path`, opened without following symlinks; absent is an error here.
fn safe_dir(path: &Path) -> Result<std::os::fd::OwnedFd, MountError> {
    safe_path::open_dir(path)?.ok_or_else(|| MountError::Mount {
        source_path: String::new(),
        target: path.to_owned(),
        error: io::Error::from(io::ErrorKind::NotFound),
    })
}

/// How long [`unmount`] keeps trying a mount that is busy. A busy mount is most often busy for
/// a moment: any process forked (or cloned without `CLONE_FILES`, as flexd starts drivers)
/// while someone had a descriptor open in it holds a copy until its exec, and a `blkid` probe
/// opens a device for milliseconds. A mount still busy after this is truly in use.
pub const BUSY_GRACE: Duration = Duration::from_secs(2);

/// Unmounts `target`; not mounted (or absent) is success. A path through a symlink is refused
/// (a symlinked target is never flexd's mount), and the last component is not followed either.
///
/// The target itself is never opened ([`safe_path::look`]): the unmount goes through its
/// parent's descriptor. `EBUSY` is retried for [`BUSY_GRACE`].
pub fn unmount(target: &Path) -> Result<(), MountError> {
    let err = |error: io::Error| MountError::Unmount {
        target: target.to_owned(),
        error,
    };
    if safe_path::check(target)? == Path::new("/") {
        return Err(err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "flexd never unmounts /",
        )));
    }
    let Some(entry) = safe_path::look(target)? else {
        return Ok(());
    };
    let through_parent = entry.via_parent();
    let deadline = Instant::now() + BUSY_GRACE;
    let mut pause = Duration::from_millis(5);
    loop {
        match rustix::mount::unmount(&through_parent, UnmountFlags::NOFOLLOW) {
            Ok(()) | Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => return Ok(()),
            Err(rustix::io::Errno::BUSY) if Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            Err(e) => return Err(err(e.into())),
        }
    }
}

/// The filesystem on a block device, or `None` when it holds none (`blkid -p` exit status 2).
pub fn filesystem_of(device: &Path) -> Result<Option<String>, MountError> {
    let out = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE"])
        .arg(device)
        .output()
        .map_err(|e| MountError::Tool {
            command: "blkid".into(),
            status: e.to_string(),
            stderr: String::new(),
        })?;
    match out.status.code() {
        Some(0) => {
            let fs = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            // A signature that is not a filesystem (a partition table, LVM, …) is still data.
            Ok(Some(if fs.is_empty() {
                "unknown".to_owned()
            } else {
                fs
            }))
        }
        Some(2) => Ok(None),
        _ => Err(MountError::Tool {
            command: format!("blkid -p {}", device.display()),
            status: format!("{}", out.status),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        }),
    }
}

/// Formats `device` with `fs_type` (default ext4) only if it holds nothing, then mounts it on
/// `dir`. Returns whether it formatted. A device holding anything is never formatted.
pub fn format_and_mount(
    device: &Path,
    dir: &Path,
    fs_type: &str,
    read_only: bool,
) -> Result<bool, MountError> {
    let fs_type = if fs_type.is_empty() { "ext4" } else { fs_type };
    // Proven a plain directory (no symlink on the way) before anything is formatted.
    let dir_fd = safe_dir(dir)?;
    let mut formatted = false;
    let existing = filesystem_of(device)?;
    if existing.is_none() {
        if read_only {
            return Err(MountError::Tool {
                command: format!("mount {} read-only", device.display()),
                status: "refused".into(),
                stderr: "the device holds no filesystem and the volume is read-only".into(),
            });
        }
        let mkfs = format!("mkfs.{fs_type}");
        let mut cmd = Command::new(&mkfs);
        if fs_type.starts_with("ext") {
            cmd.arg("-F").arg("-q");
        } else if fs_type == "xfs" {
            cmd.arg("-q");
        }
        let out = cmd
            .arg(device)
            .output()
            .map_err(|_| MountError::UnsupportedFs(fs_type.to_owned()))?;
        if !out.status.success() {
            return Err(MountError::Tool {
                command: format!("{mkfs} {}", device.display()),
                status: format!("{}", out.status),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        formatted = true;
    }
    let mounted_type = existing
        .filter(|t| t != "unknown")
        .unwrap_or_else(|| fs_type.to_owned());
    let mut flags = MountFlags::empty();
    if read_only {
        flags |= MountFlags::RDONLY;
    }
    let on = safe_path::fd_path(&dir_fd);
    rustix::mount::mount(device, &on, mounted_type.as_str(), flags, None).map_err(|e| {
        MountError::Mount {
            source_path: device.display().to_string(),
            target: dir.to_owned(),
            error: e.into(),
        }
    })?;
    Ok(formatted)
}

/// Grows the filesystem mounted at `dir` from `device` to fill it.
pub fn grow_filesystem(device: &Path, dir: &Path) -> Result<(), MountError> {
    let fs = filesystem_of(device)?.unwrap_or_default();
    let mut cmd = if fs == "xfs" {
        let mut c = Command::new("xfs_growfs");
        c.arg(dir);
        c
    } else {
        let mut c = Command::new("resize2fs");
        c.arg(device);
        c
    };
    let out = cmd.output().map_err(|e| MountError::Tool {
        command: format!("grow {fs}"),
        status: e.to_string(),
        stderr: String::new(),
    })?;
    if !out.status.success() {
        let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        // The kernel refuses an online ext4 resize without CAP_SYS_RESOURCE, which container
        // runtimes often drop; resize2fs then only says "Permission denied".
        if fs != "xfs" && !has_capability(CAP_SYS_RESOURCE) {
            stderr.push_str(
                " (online ext4 resize needs CAP_SYS_RESOURCE, which this process lacks: \
                 grant it to flexd, or grow the filesystem while it is unmounted)",
            );
        }
        return Err(MountError::Tool {
            command: format!("grow {fs} on {}", device.display()),
            status: format!("{}", out.status),
            stderr,
        });
    }
    Ok(())
}

/// The capability that online ext4 resize needs.
pub const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process has a capability in its effective set (from /proc/self/status).
pub fn has_capability(cap: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| effective_capabilities(&status))
        .is_some_and(|set| cap < 64 && set & (1 << cap) != 0)
}

/// The `CapEff:` mask of a /proc/<pid>/status text.
fn effective_capabilities(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
23 22 8:2 / /usr ro,relatime shared:2 - ext4 /dev/vda2 ro
30 22 0:30 / /var/lib/kubelet rw,relatime - ext4 /dev/sda1 rw
31 22 0:31 / /var/lib/flexd rw master:9 - ext4 /dev/sda1 rw
32 30 0:32 / /var/lib/kubelet/pods/x rw shared:4 - tmpfs tmpfs rw
33 22 0:33 / /var/lib/kubelet rw shared:8 master:7 - ext4 /dev/sda1 rw
34 22 0:34 / /mnt/with\\040space rw shared:5 - tmpfs tmpfs rw
";

    fn holding(dir: &str) -> Option<HoldingMount> {
        mount_holding(TABLE, Path::new(dir))
    }

    #[test]
    fn the_mount_holding_a_dir_is_the_latest_at_the_deepest_point() {
        let mount = |point: &str, shared, master| HoldingMount {
            mount_point: PathBuf::from(point),
            shared,
            master,
        };
        assert_eq!(
            holding("/usr/libexec/kubernetes"),
            Some(mount("/usr", Some(2), None))
        );
        // The later mount on /var/lib/kubelet covers the first.
        assert_eq!(
            holding("/var/lib/kubelet/plugins_registry"),
            Some(mount("/var/lib/kubelet", Some(8), Some(7)))
        );
        assert_eq!(
            holding("/var/lib/kubelet/pods/x/volumes"),
            Some(mount("/var/lib/kubelet/pods/x", Some(4), None))
        );
        assert_eq!(
            holding("/var/lib/flexd"),
            Some(mount("/var/lib/flexd", None, Some(9)))
        );
        // Components, not string prefixes.
        assert_eq!(holding("/usrx"), Some(mount("/", Some(1), None)));
        assert_eq!(
            holding("/mnt/with space/d"),
            Some(mount("/mnt/with space", Some(5), None))
        );
        assert_eq!(mount_holding("", Path::new("/etc")), None);
        assert_eq!(mount_holding("garbage\n", Path::new("/etc")), None);
    }

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
36 22 0:32 / /var/lib/kubelet/pods/a\\040b/volumes rw,nosuid - tmpfs tmpfs rw,size=65536k
40 22 7:0 / /mnt/with\\011tab\\012nl\\134back rw - ext4 /dev/loop0 rw
41 22 8:1 /srv/data /mnt/bind ro - ext4 /dev/vda1 rw
garbage line without separator
";

    #[test]
    fn mountinfo_fields_and_escapes() {
        let table = parse_mountinfo(SAMPLE);
        assert_eq!(table.len(), 4);
        assert_eq!(table[0].mount_point, PathBuf::from("/"));
        assert_eq!(
            table[1].mount_point,
            PathBuf::from("/var/lib/kubelet/pods/a b/volumes")
        );
        assert_eq!(
            (table[1].fs_type.as_str(), table[1].source.as_str()),
            ("tmpfs", "tmpfs")
        );
        assert_eq!(
            table[2].mount_point,
            PathBuf::from("/mnt/with\ttab\nnl\\back")
        );
        assert_eq!(table[2].source, "/dev/loop0");
        assert_eq!(
            (table[3].root.as_str(), table[3].options.as_str()),
            ("/srv/data", "ro")
        );
    }

    #[test]
    fn effective_capabilities_are_read_from_status() {
        let status = "Name:\tx\nCapPrm:\t000001ffffffffff\nCapEff:\t000001fffeffffff\n";
        let set = effective_capabilities(status).unwrap();
        assert_eq!(set & (1 << CAP_SYS_RESOURCE), 0);
        assert_ne!(set & (1 << 21), 0, "CAP_SYS_ADMIN is there");
        assert_eq!(effective_capabilities("Name: x\n"), None);
        assert_eq!(effective_capabilities("CapEff:\tzz\n"), None);
    }

    #[test]
    fn unescape_leaves_lone_backslashes() {
        assert_eq!(unescape("a\\b"), "a\\b");
        assert_eq!(unescape("a\\0"), "a\\0");
        assert_eq!(unescape("\\040"), " ");
        assert_eq!(unescape("x\\999"), "x\\999");
        assert_eq!(unescape("é\\é"), "é\\é");
        assert_eq!(unescape("\\777"), "\\777");
    }

    /// A tmpfs on `<temp dir>/target`, lazily unmounted whatever the test left.
    struct Tmpfs {
        dir: tempfile::TempDir,
        target: PathBuf,
    }

    impl Tmpfs {
        /// Mounted for `test`; without root, `None` and a line where `cargo test`'s reader sees
        /// it saying why `test` did not run.
        fn new(test: &str) -> Option<Self> {
            if !rustix::process::geteuid().is_root() {
                use std::io::Write;
                let line = format!("SKIPPED {test}: needs root (mounts a tmpfs)\n");
                let _ = io::stderr().lock().write_all(line.as_bytes());
                return None;
            }
            let dir = tempfile::tempdir().unwrap();
            let target = dir.path().join("target");
            std::fs::create_dir(&target).unwrap();
            rustix::mount::mount("tmpfs", &target, "tmpfs", MountFlags::empty(), c"").unwrap();
            Some(Self { dir, target })
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = rustix::mount::unmount(&self.target, UnmountFlags::DETACH);
        }
    }

    #[test]
    fn unmount_waits_out_a_mount_held_busy_for_a_moment() {
        let Some(t) = Tmpfs::new("mount::tests::unmount_waits_out_a_mount_held_busy_for_a_moment")
        else {
            return;
        };
        let held = std::fs::File::open(&t.target).unwrap();
        assert_eq!(
            rustix::mount::unmount(&t.target, UnmountFlags::empty()),
            Err(rustix::io::Errno::BUSY),
            "an open descriptor holds it busy"
        );
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(held);
        });
        unmount(&t.target).unwrap();
        release.join().unwrap();
        assert!(!is_mount_point(&t.target).unwrap());
    }

    #[test]
    fn unmount_of_a_mount_in_use_fails_busy_and_leaves_it_mounted() {
        let Some(t) =
            Tmpfs::new("mount::tests::unmount_of_a_mount_in_use_fails_busy_and_leaves_it_mounted")
        else {
            return;
        };
        let held = std::fs::File::open(&t.target).unwrap();
        match unmount(&t.target) {
            Err(MountError::Unmount { error, .. }) => {
                assert_eq!(
                    error.raw_os_error(),
                    Some(rustix::io::Errno::BUSY.raw_os_error())
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(is_mount_point(&t.target).unwrap());
        drop(held);
        unmount(&t.target).unwrap();
        assert!(!is_mount_point(&t.target).unwrap());
    }

    #[test]
    fn unmount_refuses_symlinks_and_takes_absent_for_done() {
        let Some(t) =
            Tmpfs::new("mount::tests::unmount_refuses_symlinks_and_takes_absent_for_done")
        else {
            return;
        };
        let last = t.dir.path().join("last");
        std::os::unix::fs::symlink(&t.target, &last).unwrap();
        assert!(matches!(
            unmount(&last),
            Err(MountError::Path(safe_path::PathError::Symlink { .. }))
        ));
        std::os::unix::fs::symlink(t.dir.path(), t.dir.path().join("parent")).unwrap();
        assert!(matches!(
            unmount(&t.dir.path().join("parent/target")),
            Err(MountError::Path(safe_path::PathError::Symlink { .. }))
        ));
        assert!(is_mount_point(&t.target).unwrap(), "nothing unmounted");
        assert!(matches!(
            unmount(Path::new("/")),
            Err(MountError::Unmount { .. })
        ));
        unmount(&t.dir.path().join("absent")).unwrap();
        unmount(&t.dir.path().join("absent/deeper")).unwrap();
        unmount(&t.target).unwrap();
        unmount(&t.target).unwrap();
        assert!(!is_mount_point(&t.target).unwrap());
    }
}
