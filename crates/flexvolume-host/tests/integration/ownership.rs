//! SetUp(fsGroup) ownership passes on real trees: exact groups and modes for every kind of
//! entry, both policies, read-only volumes, and that a second pass changes nothing. Changing
//! an entry's group to an arbitrary gid needs root; each test skips with a message otherwise.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use flexvolume_host::ownership::{self, Counters, OwnershipReport, OwnershipRequest, Policy};

const GID: u32 = 4321;

fn pass(root: &Path, policy: Policy, read_only: bool) -> OwnershipReport {
    let request = OwnershipRequest {
        root,
        gid: GID,
        policy,
        read_only,
        threads: 0,
    };
    ownership::apply(&request, &Counters::default()).expect("ownership pass")
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// group and permission bits of an entry, not following a symlink.
fn owner_mode(path: &Path) -> (u32, u32, u32) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    (meta.uid(), meta.gid(), meta.mode() & 0o7777)
}

/// A tree with every kind of entry, owned by uid 1000 / gid 0 so the uid can be checked.
fn build_tree(root: &Path) {
    std::fs::create_dir_all(root.join("dir/nested")).unwrap();
    std::fs::write(root.join("file"), b"data").unwrap();
    std::fs::write(root.join("dir/nested/deep"), b"data").unwrap();
    std::fs::write(root.join("exec"), b"#!/bin/sh\n").unwrap();
    std::os::unix::fs::symlink("file", root.join("link-to-file")).unwrap();
    std::os::unix::fs::symlink("dir", root.join("link-to-dir")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", root.join("dangling")).unwrap();
    test_support::make_fifo(&root.join("fifo"), 0o600);
    for (path, mode) in [
        ("", 0o755),
        ("dir", 0o700),
        ("dir/nested", 0o750),
        ("file", 0o600),
        ("dir/nested/deep", 0o644),
        ("exec", 0o4755),
    ] {
        set_mode(&root.join(path), mode);
    }
    for path in [
        "",
        "dir",
        "dir/nested",
        "file",
        "dir/nested/deep",
        "exec",
        "link-to-file",
        "link-to-dir",
        "dangling",
        "fifo",
    ] {
        std::os::unix::fs::lchown(root.join(path), Some(1000), Some(0)).unwrap();
    }
    // lchown cleared the setuid bit; put it back for the test of its preservation.
    set_mode(&root.join("exec"), 0o4755);
}

/// A temp dir holding `volume`, a tree built by `build_tree`.
fn built_tree() -> (tempfile::TempDir, std::path::PathBuf) {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().join("volume");
    build_tree(&root);
    (temp, root)
}

#[test]
fn every_kind_of_entry_gets_the_exact_group_and_mode_and_a_second_pass_changes_nothing() {
    test_support::require_root!("needs root to give entries an arbitrary group");
    let (_temp, root) = built_tree();
    let link_mode_before = owner_mode(&root.join("link-to-file")).2;

    let first = pass(&root, Policy::Always, false);
    assert_eq!(first.error_count, 0, "{:?}", first.errors);
    assert_eq!(first.entries, 10);
    assert_eq!(first.chowned, 10);
    // Every entry but the three symlinks needed a mode change.
    assert_eq!(first.chmodded, 7);

    let expected = [
        ("", 0o2775),
        ("dir", 0o2770),
        ("dir/nested", 0o2770),
        ("file", 0o660),
        ("dir/nested/deep", 0o664),
        // setuid kept across the group change, as Kubernetes' lchown-then-chmod keeps it.
        ("exec", 0o4775),
        ("fifo", 0o660),
    ];
    for (path, mode) in expected {
        assert_eq!(
            owner_mode(&root.join(path)),
            (1000, GID, mode),
            "{path:?}: uid kept, group and mode set"
        );
    }
    for link in ["link-to-file", "link-to-dir", "dangling"] {
        let (uid, gid, mode) = owner_mode(&root.join(link));
        assert_eq!(
            (uid, gid),
            (1000, GID),
            "{link}: the link itself gets the group"
        );
        assert_eq!(
            mode, link_mode_before,
            "{link}: a symlink is never chmod-ed"
        );
    }

    let second = pass(&root, Policy::Always, false);
    assert_eq!(second.entries, 10);
    assert_eq!(
        (second.chowned, second.chmodded, second.error_count),
        (0, 0, 0),
        "a second pass changes nothing"
    );
}

#[test]
fn a_read_only_volume_gets_group_read_but_not_write() {
    test_support::require_root!("needs root to give entries an arbitrary group");
    let (_temp, root) = built_tree();
    let report = pass(&root, Policy::Always, true);
    assert_eq!(report.error_count, 0, "{:?}", report.errors);
    assert_eq!(owner_mode(&root.join("file")), (1000, GID, 0o640));
    assert_eq!(owner_mode(&root.join("dir")), (1000, GID, 0o2750));
    assert_eq!(
        owner_mode(&root.join("dir/nested/deep")),
        (1000, GID, 0o644)
    );
    assert_eq!(owner_mode(&root), (1000, GID, 0o2755));
}

#[test]
fn on_root_mismatch_skips_only_a_root_with_group_mode_and_setgid_all_right() {
    test_support::require_root!("needs root to give entries an arbitrary group");
    for group_right in [false, true] {
        for mode_right in [false, true] {
            for setgid in [false, true] {
                let temp = tempfile::tempdir().unwrap();
                let root = temp.path().join("volume");
                std::fs::create_dir(&root).unwrap();
                // A child that is wrong: whether it gets fixed shows whether the walk ran.
                std::fs::write(root.join("child"), b"x").unwrap();
                set_mode(&root.join("child"), 0o600);
                let gid = if group_right { GID } else { 0 };
                std::os::unix::fs::lchown(&root, None, Some(gid)).unwrap();
                let mut mode = if mode_right { 0o775 } else { 0o755 };
                if setgid {
                    mode |= 0o2000;
                }
                set_mode(&root, mode);

                let report = pass(&root, Policy::OnRootMismatch, false);
                let should_skip = group_right && mode_right && setgid;
                let case = format!("group {group_right}, mode {mode_right}, setgid {setgid}");
                assert_eq!(report.skipped, should_skip, "{case}");
                let child = owner_mode(&root.join("child"));
                if should_skip {
                    assert_eq!(child.2, 0o600, "{case}: skipped, child untouched");
                } else {
                    assert_eq!((child.1, child.2), (GID, 0o660), "{case}: walked");
                    assert_eq!(owner_mode(&root).1, GID, "{case}");
                    assert_eq!(owner_mode(&root).2, 0o2775, "{case}");
                }
            }
        }
    }
}

#[test]
fn an_interrupted_pass_is_redone_because_the_root_is_done_last() {
    test_support::require_root!("needs root to give entries an arbitrary group");
    let (_temp, root) = built_tree();
    // What a pass killed before its end leaves: children done, the root still wrong.
    let child = root.join("dir");
    let report = pass(&child, Policy::Always, false);
    assert_eq!(report.error_count, 0);
    assert_ne!(owner_mode(&root).1, GID);
    let redo = pass(&root, Policy::OnRootMismatch, false);
    assert!(
        !redo.skipped,
        "a root left wrong makes OnRootMismatch walk again"
    );
    assert_eq!(owner_mode(&root.join("file")).1, GID);
    let after = pass(&root, Policy::OnRootMismatch, false);
    assert!(after.skipped, "once complete, OnRootMismatch skips");
}

#[test]
fn entries_that_cannot_be_changed_are_reported_and_do_not_stop_the_pass() {
    test_support::require_root!("needs root to give entries an arbitrary group");
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().join("volume");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("a"), b"x").unwrap();
    std::fs::write(root.join("immutable"), b"x").unwrap();
    std::fs::write(root.join("z"), b"x").unwrap();
    // An immutable file refuses chown even to root (ext4/xfs/tmpfs on new kernels support it).
    let status = std::process::Command::new("chattr")
        .arg("+i")
        .arg(root.join("immutable"))
        .status();
    if !matches!(status, Ok(s) if s.success()) {
        test_support::skip!("chattr +i is not supported on this filesystem");
    }
    struct Mutable<'a>(&'a Path);
    impl Drop for Mutable<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("chattr")
                .arg("-i")
                .arg(self.0)
                .status();
        }
    }
    let _guard = Mutable(&root.join("immutable"));
    let report = pass(&root, Policy::Always, false);
    assert_eq!(report.error_count, 1, "{:?}", report.errors);
    assert_eq!(report.errors[0].path, root.join("immutable"));
    assert_eq!(report.errors[0].operation, "chown");
    assert_eq!(owner_mode(&root.join("a")).1, GID);
    assert_eq!(owner_mode(&root.join("z")).1, GID);
    assert_eq!(owner_mode(&root).1, GID, "the root is still done");
}

#[test]
fn a_wide_and_deep_tree_is_complete_with_many_threads() {
    test_support::require_root!("needs root to give entries an arbitrary group");
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().join("volume");
    let mut expected = 1u64;
    for a in 0..20 {
        let mut dir = root.join(format!("a{a}"));
        for depth in 0..5 {
            dir.push(format!("d{depth}"));
        }
        std::fs::create_dir_all(&dir).unwrap();
        expected += 5;
        for f in 0..30 {
            std::fs::write(dir.join(format!("f{f}")), b"").unwrap();
        }
        expected += 30;
        expected += 1; // a{a}
    }
    let request = OwnershipRequest {
        root: &root,
        gid: GID,
        policy: Policy::Always,
        read_only: false,
        threads: 8,
    };
    let report = ownership::apply(&request, &Counters::default()).unwrap();
    assert_eq!(report.entries, expected);
    assert_eq!(report.chowned, expected);
    let unchanged = walkdir_count_not_owned(&root);
    assert_eq!(unchanged, 0, "entries left without the group");
}

fn walkdir_count_not_owned(dir: &Path) -> usize {
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = entry.path().symlink_metadata().unwrap();
        if meta.gid() != GID {
            count += 1;
        }
        if meta.is_dir() {
            count += walkdir_count_not_owned(&entry.path());
        }
    }
    count
}
