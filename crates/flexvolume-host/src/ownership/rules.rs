//! What SetUp(fsGroup) wants of one entry: pure decisions, no I/O, so every rule is unit-tested.
//!
//! The rules (docs/lifecycle.md#fsgroup-rules): Kubernetes' `SetVolumeOwnership`, group bits only:
//! every entry gets the group (lchown: uid unchanged, symlinks not followed); non-symlinks get
//! `g+rw` (`g+r` on a read-only volume); directories also `g+x` and setgid, so files created
//! later inherit the group.

/// When a pass runs (`fsGroupChangePolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Every SetUp walks the whole volume (Kubernetes' default).
    #[default]
    Always,
    /// Skip the walk when the root already has the group, the mode bits and setgid.
    OnRootMismatch,
}

const S_IFMT: u32 = 0o170_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFLNK: u32 = 0o120_000;
const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const GROUP_READ: u32 = 0o040;
const GROUP_WRITE: u32 = 0o020;
const GROUP_EXEC: u32 = 0o010;
const PERMISSION_BITS: u32 = 0o7777;

/// The group bits every non-symlink entry must have.
fn group_bits(read_only: bool) -> u32 {
    if read_only {
        GROUP_READ
    } else {
        GROUP_READ | GROUP_WRITE
    }
}

/// The permission bits (`st_mode & 0o7777`) an entry of type and mode `st_mode` must end with.
pub fn wanted_mode(st_mode: u32, read_only: bool) -> u32 {
    let mut mode = (st_mode & PERMISSION_BITS) | group_bits(read_only);
    if st_mode & S_IFMT == S_IFDIR {
        mode |= GROUP_EXEC | S_ISGID;
    }
    mode
}

/// The changes one entry needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Set the group (lchown, uid unchanged).
    pub chown: bool,
    /// Set these permission bits (never for a symlink).
    pub chmod: Option<u32>,
}

impl Plan {
    /// No change: what the tests expect for an entry that is already right.
    #[cfg(test)]
    pub(crate) const NOTHING: Plan = Plan {
        chown: false,
        chmod: None,
    };
}

/// The changes an entry with `st_mode` and `st_gid` needs to belong to `gid`.
///
/// An entry that is already right gets no call at all: that is what makes a second pass (and
/// every SetUp of an unchanged volume) read-only. One subtlety: the kernel clears setuid (and
/// setgid with group-exec) when it changes a non-directory's group, even for root, so such an
/// entry gets its mode written back after the chown, as Kubernetes' lchown-then-chmod does.
pub fn plan(st_mode: u32, st_gid: u32, gid: u32, read_only: bool) -> Plan {
    let chown = st_gid != gid;
    if st_mode & S_IFMT == S_IFLNK {
        return Plan { chown, chmod: None };
    }
    let current = st_mode & PERMISSION_BITS;
    let wanted = wanted_mode(st_mode, read_only);
    let is_dir = st_mode & S_IFMT == S_IFDIR;
    let cleared_by_chown = chown && !is_dir && current & (S_ISUID | S_ISGID) != 0;
    let chmod = (wanted != current || cleared_by_chown).then_some(wanted);
    Plan { chown, chmod }
}

/// Whether `OnRootMismatch` may skip the pass: the root is a directory with the group, at least
/// the wanted group bits (with `g+x`) and setgid. Anything else, a root that is not a directory
/// included, means a pass (an interrupted pass left the root for last, so it is redone).
pub fn root_is_right(st_mode: u32, st_gid: u32, gid: u32, read_only: bool) -> bool {
    let wanted = group_bits(read_only) | GROUP_EXEC;
    st_gid == gid
        && st_mode & S_IFMT == S_IFDIR
        && st_mode & wanted == wanted
        && st_mode & S_ISGID != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: u32 = 0o100_000;
    const DIR: u32 = S_IFDIR;
    const LINK: u32 = S_IFLNK;
    const FIFO: u32 = 0o010_000;

    #[test]
    fn files_get_group_read_write_and_keep_other_bits() {
        assert_eq!(wanted_mode(FILE | 0o600, false), 0o660);
        assert_eq!(wanted_mode(FILE | 0o755, false), 0o775);
        assert_eq!(wanted_mode(FILE | 0o600, true), 0o640);
        assert_eq!(wanted_mode(FIFO | 0o600, false), 0o660);
    }

    #[test]
    fn directories_also_get_group_exec_and_setgid() {
        assert_eq!(wanted_mode(DIR | 0o700, false), 0o2770);
        assert_eq!(wanted_mode(DIR | 0o700, true), 0o2750);
        assert_eq!(wanted_mode(DIR | 0o1777, false), 0o3777);
    }

    #[test]
    fn an_entry_already_right_needs_nothing() {
        assert_eq!(plan(FILE | 0o664, 1234, 1234, false), Plan::NOTHING);
        assert_eq!(plan(DIR | 0o2775, 1234, 1234, false), Plan::NOTHING);
        assert_eq!(plan(FILE | 0o644, 1234, 1234, true), Plan::NOTHING);
        assert_eq!(plan(LINK | 0o777, 1234, 1234, false), Plan::NOTHING);
    }

    #[test]
    fn symlinks_get_the_group_and_never_a_mode() {
        assert_eq!(
            plan(LINK | 0o777, 0, 1234, false),
            Plan {
                chown: true,
                chmod: None
            }
        );
    }

    #[test]
    fn group_and_mode_are_changed_separately() {
        assert_eq!(
            plan(FILE | 0o664, 0, 1234, false),
            Plan {
                chown: true,
                chmod: None
            }
        );
        assert_eq!(
            plan(FILE | 0o644, 1234, 1234, false),
            Plan {
                chown: false,
                chmod: Some(0o664)
            }
        );
        assert_eq!(
            plan(DIR | 0o755, 0, 1234, false),
            Plan {
                chown: true,
                chmod: Some(0o2775)
            }
        );
    }

    #[test]
    fn setuid_cleared_by_the_chown_is_written_back() {
        assert_eq!(
            plan(FILE | 0o4775, 0, 1234, false),
            Plan {
                chown: true,
                chmod: Some(0o4775)
            }
        );
        // Same group: no chown, so nothing is cleared and nothing is written.
        assert_eq!(plan(FILE | 0o4775, 1234, 1234, false), Plan::NOTHING);
        // Directories keep setgid through a chown.
        assert_eq!(
            plan(DIR | 0o2775, 0, 1234, false).chmod,
            None,
            "a directory's setgid survives chown"
        );
    }

    #[test]
    fn on_root_mismatch_skips_only_when_group_mode_and_setgid_are_all_right() {
        // All 8 combinations of (group right, mode right, setgid set).
        for group_right in [false, true] {
            for mode_right in [false, true] {
                for setgid in [false, true] {
                    let gid = if group_right { 1234 } else { 0 };
                    let mut mode = DIR | if mode_right { 0o775 } else { 0o755 };
                    if setgid {
                        mode |= S_ISGID;
                    }
                    assert_eq!(
                        root_is_right(mode, gid, 1234, false),
                        group_right && mode_right && setgid,
                        "group right {group_right}, mode right {mode_right}, setgid {setgid}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_read_only_root_needs_only_group_read_and_a_file_root_always_runs() {
        assert!(root_is_right(DIR | 0o2750, 1234, 1234, true));
        assert!(!root_is_right(DIR | 0o2750, 1234, 1234, false));
        assert!(!root_is_right(FILE | 0o2775, 1234, 1234, false));
    }
}
