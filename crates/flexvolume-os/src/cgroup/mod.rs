//! Finding the cgroup hierarchy that caps call-outs: flexd's own cgroup in the `pids`
//! hierarchy (cgroup v2, or v1's `pids` on hybrid hosts), with `flexd-callouts/` below it for
//! the call-outs' cgroups (the runner's `capped` module makes one per call-out).
//!
//! Why a cgroup: drivers run as root, and the kernel ignores `RLIMIT_NPROC` for root, so a
//! driver that forks without end (a bug in a retry loop, or a fork bomb) could use up the node's
//! pid space. `pids.max` holds for root too.
//!
//! Where no usable `pids` hierarchy exists (controller missing, or cgroup v2 without it
//! delegated to flexd's cgroup), call-outs run uncapped and a warning says why, once.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rustix::process::Pid;

use crate::mount::unescape;

pub mod leftovers;

/// The directory, below flexd's own cgroup, that holds the call-outs' cgroups.
pub const CALLOUTS_DIR: &str = "flexd-callouts";

/// Where the per-call-out cgroups go.
#[derive(Debug)]
pub struct Hierarchy {
    pub base: PathBuf,
    /// cgroup v2: `cgroup.kill`, and no per-thread membership.
    pub v2: bool,
}

static HIERARCHY: OnceLock<Result<Hierarchy, String>> = OnceLock::new();

/// The directory call-outs are capped in, or why they cannot be. Detected once per process.
pub fn process_cap() -> Result<&'static Path, &'static str> {
    match hierarchy() {
        Ok(h) => Ok(&h.base),
        Err(why) => Err(why),
    }
}

pub fn hierarchy() -> &'static Result<Hierarchy, String> {
    HIERARCHY.get_or_init(|| {
        let found = detect();
        match &found {
            Ok(h) => {
                tracing::debug!(dir = %h.base.display(), v2 = h.v2, "driver process cap ready");
                sweep_stale(&h.base);
            }
            Err(why) => tracing::warn!(
                reason = %why,
                "drivers run without a process cap: a driver that forks without end is stopped \
                 only by its timeout"
            ),
        }
        found
    })
}

fn detect() -> Result<Hierarchy, String> {
    let read =
        |path: &str| std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"));
    let candidates = locate(&read("/proc/self/cgroup")?, &read("/proc/self/mountinfo")?);
    if candidates.is_empty() {
        return Err("no cgroup hierarchy with the pids controller is mounted".into());
    }
    let mut reasons = Vec::new();
    for candidate in candidates {
        match prepare(&candidate) {
            Ok(h) => return Ok(h),
            Err(why) => reasons.push(why),
        }
    }
    Err(reasons.join("; "))
}

/// flexd's own cgroup directory in a hierarchy that may carry the pids controller.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    own: PathBuf,
    v2: bool,
}

/// Finds, from `/proc/self/cgroup` and `/proc/self/mountinfo`, flexd's own cgroup directory in
/// the unified (v2) hierarchy and in a v1 `pids` hierarchy, v2 first. Pure, for tests.
fn locate(cgroups: &str, mountinfo: &str) -> Vec<Candidate> {
    let mut own_v2 = None;
    let mut own_v1 = None;
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            own_v2 = Some(path.to_owned());
        } else if controllers.split(',').any(|c| c == "pids") {
            own_v1 = Some(path.to_owned());
        }
    }
    let mut v2 = None;
    let mut v1 = None;
    for line in mountinfo.lines() {
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        let before: Vec<&str> = before.split(' ').collect();
        let after: Vec<&str> = after.split(' ').collect();
        let (Some(root), Some(mount_point), Some(fstype)) =
            (before.get(3), before.get(4), after.first())
        else {
            continue;
        };
        let super_options = after.get(2).copied().unwrap_or("");
        let own = match *fstype {
            "cgroup2" if v2.is_none() => own_v2.as_deref().map(|own| (own, true)),
            "cgroup" if v1.is_none() && super_options.split(',').any(|o| o == "pids") => {
                own_v1.as_deref().map(|own| (own, false))
            }
            _ => None,
        };
        let Some((own, is_v2)) = own else { continue };
        let Some(dir) = own_dir(&unescape(root), &unescape(mount_point), own) else {
            continue;
        };
        let found = Some(Candidate {
            own: dir,
            v2: is_v2,
        });
        if is_v2 {
            v2 = found;
        } else {
            v1 = found;
        }
    }
    v2.into_iter().chain(v1).collect()
}

/// The directory of cgroup `own` in a hierarchy whose `root` is mounted at `mount_point`.
fn own_dir(root: &str, mount_point: &str, own: &str) -> Option<PathBuf> {
    let relative = if root == "/" {
        own
    } else {
        own.strip_prefix(root)?
    };
    let relative = relative.trim_start_matches('/');
    if relative.split('/').any(|c| c == "..") {
        return None;
    }
    Some(Path::new(mount_point).join(relative))
}

/// Makes `<own>/flexd-callouts` a cgroup whose children get `pids.max`.
fn prepare(candidate: &Candidate) -> Result<Hierarchy, String> {
    let own = &candidate.own;
    let base = own.join(CALLOUTS_DIR);
    let context = |what: &str, path: &Path, e: io::Error| format!("{what} {}: {e}", path.display());
    if candidate.v2 {
        let controllers = std::fs::read_to_string(own.join("cgroup.controllers"))
            .map_err(|e| context("cannot read", &own.join("cgroup.controllers"), e))?;
        if !controllers.split_whitespace().any(|c| c == "pids") {
            return Err(format!(
                "cgroup v2: the pids controller is not available in {}",
                own.display()
            ));
        }
        enable_pids_below_self(own).map_err(|e| {
            format!(
                "cgroup v2: cannot enable pids below {} ({e}); give flexd a cgroup of its own \
                 with the pids controller delegated",
                own.display()
            )
        })?;
    }
    match std::fs::create_dir(&base) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(context("cannot create", &base, e)),
    }
    if candidate.v2 {
        enable_pids(&base).map_err(|e| context("cannot enable pids in", &base, e))?;
    }
    Ok(Hierarchy {
        base,
        v2: candidate.v2,
    })
}

/// The leaf flexd moves into when it is alone in a v2 cgroup (see `enable_pids_below_self`).
pub const DAEMON_DIR: &str = "flexd-daemon";

/// Enables pids for the children of flexd's own v2 cgroup. cgroup v2 lets a cgroup that has
/// processes hand controllers to its children only at the root ("no internal processes"). pids
/// is a threaded controller, so the kernel does accept `+pids` from a cgroup that has processes,
/// but that makes it a thread root, whose new children are invalid domains: they can neither
/// enable pids nor hold a driver (EOPNOTSUPP). So flexd enables it from a cgroup without
/// processes: alone in its cgroup (a container, a service), it first moves into a leaf of its
/// own, as container inits do. If other processes share the cgroup, it leaves them alone and
/// reports why.
fn enable_pids_below_self(own: &Path) -> io::Result<()> {
    // Only the root cgroup has no `cgroup.type`; it may hold processes and enable anything.
    if !own.join("cgroup.type").exists() {
        return enable_pids(own);
    }
    let procs = std::fs::read_to_string(own.join("cgroup.procs"))?;
    if !holds_only(&procs, std::process::id()) {
        return Err(io::Error::other("other processes share it"));
    }
    let leaf = own.join(DAEMON_DIR);
    match std::fs::create_dir(&leaf) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let join = || std::fs::write(leaf.join("cgroup.procs"), std::process::id().to_string());
    if join().is_err() {
        // A flexd restarted in the cgroup an earlier one prepared: with a process in it and
        // pids enabled, it is a thread root, whose leaf takes no process. Undone bottom-up (the
        // kernel keeps a controller a child still enables), then enabled again below.
        disable_pids(&own.join(CALLOUTS_DIR))?;
        disable_pids(own)?;
        join()?;
    }
    tracing::info!(cgroup = %leaf.display(), "moved into a leaf cgroup to cap drivers below it");
    enable_pids(own)
}

/// Whether `cgroup.procs` text lists exactly the process `pid`.
fn holds_only(procs: &str, pid: u32) -> bool {
    let mut listed = procs.split_whitespace().map(str::parse::<u32>);
    listed.next() == Some(Ok(pid)) && listed.all(|p| p == Ok(pid))
}

/// Lets the children of a v2 cgroup have `pids.max`.
fn enable_pids(dir: &Path) -> io::Result<()> {
    let control = dir.join("cgroup.subtree_control");
    if std::fs::read_to_string(&control)?
        .split_whitespace()
        .any(|c| c == "pids")
    {
        return Ok(());
    }
    std::fs::write(control, "+pids")
}

/// Takes pids back from the children of a v2 cgroup, if it exists and gave it.
fn disable_pids(dir: &Path) -> io::Result<()> {
    let control = dir.join("cgroup.subtree_control");
    match std::fs::read_to_string(&control) {
        Ok(enabled) if enabled.split_whitespace().any(|c| c == "pids") => {
            std::fs::write(control, "-pids")
        }
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes empty call-out cgroups that flexd processes no longer running left behind (killed,
/// or helpers outlived them); ones still holding helpers are watched as leftovers. Other live
/// flexd processes (a `flexd volume` beside `flexd serve`) keep theirs.
fn sweep_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = owner_of(&name.to_string_lossy()) else {
            continue;
        };
        let alive =
            Pid::from_raw(owner).is_some_and(|pid| rustix::process::test_kill_process(pid).is_ok());
        if alive {
            continue;
        }
        let path = entry.path();
        if std::fs::remove_dir(&path).is_err() {
            leftovers::remember(path);
        }
    }
}

/// The hierarchy if it was already detected: a stop must not start detecting it.
pub fn detected() -> Option<&'static Hierarchy> {
    HIERARCHY.get().and_then(|found| found.as_ref().ok())
}

/// The call-out cgroups of this process (`call-<own pid>-<n>`) under `base`.
pub fn own_call_cgroups(base: &Path) -> Vec<PathBuf> {
    let me = i32::try_from(std::process::id()).ok();
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| owner_of(&entry.file_name().to_string_lossy()) == me)
        .map(|entry| entry.path())
        .collect()
}

/// The pid of the process that made the call-out cgroup `name` (`call-<pid>-<n>`).
fn owner_of(name: &str) -> Option<i32> {
    let (pid, n) = name.strip_prefix("call-")?.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_CGROUPS: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/a/b\n0::/\n";
    const HYBRID_MOUNTS: &str = "\
35 26 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
40 35 0:35 / /sys/fs/cgroup/pids rw,relatime shared:17 - cgroup cgroup rw,pids
45 35 0:40 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid_hosts_offer_v2_then_v1_pids() {
        assert_eq!(
            locate(HYBRID_CGROUPS, HYBRID_MOUNTS),
            vec![
                Candidate {
                    own: "/sys/fs/cgroup/unified".into(),
                    v2: true
                },
                Candidate {
                    own: "/sys/fs/cgroup/pids".into(),
                    v2: false
                },
            ]
        );
    }

    #[test]
    fn a_unified_host_offers_flexds_own_cgroup() {
        let cgroups = "0::/system.slice/flexd.service\n";
        let mounts = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            locate(cgroups, mounts),
            vec![Candidate {
                own: "/sys/fs/cgroup/system.slice/flexd.service".into(),
                v2: true
            }]
        );
    }

    #[test]
    fn a_v1_mount_of_a_subtree_is_followed_and_escapes_are_refused() {
        let mounts = "40 35 0:35 /kubepods /host/pids rw - cgroup cgroup rw,pids\n";
        assert_eq!(
            locate("3:pids:/kubepods/pod1/c1\n", mounts),
            vec![Candidate {
                own: "/host/pids/pod1/c1".into(),
                v2: false
            }]
        );
        assert!(locate("3:pids:/other/c1\n", mounts).is_empty());
        assert!(locate("3:pids:/kubepods/../x\n", mounts).is_empty());
    }

    #[test]
    fn hierarchies_without_pids_and_garbage_lines_are_ignored() {
        let mounts = "40 35 0:35 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\nnonsense\n";
        assert!(locate("4:memory:/\nbad line\n", mounts).is_empty());
        assert!(locate("", "").is_empty());
    }

    #[test]
    fn only_call_out_cgroups_name_an_owner() {
        assert_eq!(owner_of("call-123-7"), Some(123));
        assert_eq!(owner_of("call-123"), None);
        assert_eq!(owner_of("call-x-7"), None);
        assert_eq!(owner_of("call-1-x"), None);
        assert_eq!(owner_of("flexd-daemon"), None);
    }

    #[test]
    fn flexd_moves_itself_only_when_alone_in_its_cgroup() {
        assert!(holds_only("42\n", 42));
        assert!(!holds_only("42\n43\n", 42));
        assert!(!holds_only("43\n", 42));
        assert!(!holds_only("", 42));
        assert!(!holds_only("42\nx\n", 42));
    }
}
