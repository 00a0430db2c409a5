//! The state dir's records, cache, locks and pins, on real directories.

use std::collections::BTreeMap;

use super::*;

fn record(target: &str) -> VolumeRecord {
    VolumeRecord {
        target: target.into(),
        driver: DriverName::parse("acme/drv").unwrap(),
        volume_name: "pv-1".into(),
        fs_type: "ext4".into(),
        read_only: false,
        options: BTreeMap::new(),
        attachable: true,
        node: "n1".into(),
        device: Some("/dev/loop0".into()),
        staging: Some("/s/devices/acme~drv/pv-1".into()),
        detach_name: "pv-1".into(),
        pinned: None,
        created_target: true,
        progress: Progress::Mounted,
        role: Role::Mount,
    }
}

/// The targets of a listing, which must hold only readable records.
fn listed_targets(state: &StateDir) -> Vec<PathBuf> {
    state
        .list()
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap().target)
        .collect()
}

/// The Rust names changed (progress, staging); the names on disk did not.
#[test]
fn records_keep_their_field_names_on_disk() {
    let json = serde_json::to_value(record("/t/a")).unwrap();
    assert_eq!(json["stage"], "mounted");
    assert_eq!(json["device_mount_dir"], "/s/devices/acme~drv/pv-1");
    assert_eq!(json["role"], "mount");
    assert!(json.get("progress").is_none() && json.get("staging").is_none());
}

#[test]
fn records_round_trip_and_list_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path());
    assert!(state.load(Path::new("/t/a")).unwrap().is_none());
    state.save(&record("/t/b")).unwrap();
    state.save(&record("/t/a")).unwrap();
    assert_eq!(state.load(Path::new("/t/a")).unwrap(), Some(record("/t/a")));
    assert_eq!(
        listed_targets(&state),
        vec![PathBuf::from("/t/a"), PathBuf::from("/t/b")]
    );
    state.remove(Path::new("/t/a")).unwrap();
    state.remove(Path::new("/t/a")).unwrap();
    assert_eq!(state.list().unwrap().len(), 1);
    // No temporary file is left behind.
    let names: Vec<_> = fs::read_dir(state.volumes())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names.len(), 1);
}

/// Every change made by anyone is in a watched listing, though no record file is stat'ed
/// unless an event names it.
#[test]
fn a_watched_listing_sees_every_change_made_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let here = StateDir::new(dir.path());
    here.watch_records();
    let elsewhere = StateDir::new(dir.path());
    let listed = |state: &StateDir| -> Vec<(PathBuf, Progress, Option<String>)> {
        state
            .list()
            .unwrap()
            .into_iter()
            .map(|r| r.map(|r| (r.target, r.progress, r.device)).unwrap())
            .collect()
    };
    let watching =
        |state: &StateDir| matches!(locked(&state.parsed).watching, Watching::Complete { .. });
    // No directory yet: nothing to watch, nothing listed, and no error.
    assert!(listed(&here).is_empty());
    assert!(!watching(&here));
    here.save(&record("/t/a")).unwrap();
    assert_eq!(listed(&here).len(), 1);
    assert!(watching(&here), "watched once the directory exists");
    // A new record, and a rewrite at the same size within the same tick.
    elsewhere.save(&record("/t/b")).unwrap();
    let with_device = |device: &str| VolumeRecord {
        device: Some(device.into()),
        progress: Progress::Mounting,
        ..record("/t/a")
    };
    elsewhere.save(&with_device("/dev/loop1")).unwrap();
    assert_eq!(
        listed(&here),
        [
            ("/t/a".into(), Progress::Mounting, Some("/dev/loop1".into())),
            ("/t/b".into(), Progress::Mounted, Some("/dev/loop0".into())),
        ]
    );
    // Written in place by hand, at the same size: seen, though no rename happened.
    let path = here.record_path(Path::new("/t/a"));
    let text = fs::read_to_string(&path).unwrap().replace("loop1", "loop7");
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    assert_eq!(listed(&here)[0].2.as_deref(), Some("/dev/loop7"));
    // A marker that finishes the operation, made elsewhere.
    elsewhere
        .save(&VolumeRecord {
            progress: Progress::Mounted,
            ..with_device("/dev/loop7")
        })
        .unwrap();
    assert!(elsewhere.marker_path(Path::new("/t/a")).exists());
    assert_eq!(listed(&here)[0].1, Progress::Mounted);
    // Broken, reported at every listing, and listed again once mended.
    fs::write(&path, "{not json").unwrap();
    for _ in 0..2 {
        let records = here.list().unwrap();
        assert_eq!(records.iter().filter(|r| r.is_err()).count(), 1);
        assert_eq!(records.iter().filter(|r| r.is_ok()).count(), 1);
    }
    elsewhere.save(&record("/t/a")).unwrap();
    assert_eq!(listed(&here).len(), 2);
    // Removed elsewhere.
    elsewhere.remove(Path::new("/t/b")).unwrap();
    assert_eq!(
        listed(&here),
        [("/t/a".into(), Progress::Mounted, Some("/dev/loop0".into()))]
    );
    // The whole directory swapped for another: listed afresh, and watched again.
    let volumes = here.volumes();
    fs::rename(&volumes, dir.path().join("old-volumes")).unwrap();
    elsewhere.save(&record("/t/c")).unwrap();
    assert_eq!(
        listed(&here),
        [("/t/c".into(), Progress::Mounted, Some("/dev/loop0".into()))]
    );
    assert!(watching(&here));
    elsewhere.save(&record("/t/d")).unwrap();
    assert_eq!(listed(&here).len(), 2);
}

/// A listing forgets the records it did not find, but not one saved while it read the
/// directory: in a burst of publishes such a record was read and parsed again by every
/// listing for a second (until settled).
#[test]
fn records_saved_during_a_listing_stay_cached() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path());
    let savers: Vec<_> = (0..4)
        .map(|t| {
            let state = state.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    state.save(&record(&format!("/t/{t}/{i}"))).unwrap();
                    state.targets().unwrap();
                }
            })
        })
        .collect();
    savers.into_iter().for_each(|s| s.join().unwrap());
    let cached = locked(&state.parsed).records.len();
    assert_eq!(cached, 200, "every record this process saved is cached");
}

#[test]
fn a_corrupt_record_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path());
    fs::create_dir_all(state.volumes()).unwrap();
    fs::write(state.record_path(Path::new("/t/x")), "{not json").unwrap();
    assert!(matches!(
        state.load(Path::new("/t/x")),
        Err(StateError::Corrupt { .. })
    ));
    assert!(state.list().unwrap()[0].is_err());
}

/// The syncs each save and removal costs (docs/lifecycle.md#unsynced-publish): none for a fresh
/// publish or stage record or its removal; a record and its directory for a fresh record of any
/// other role, and for any record that replaces another, whatever its role; the directory for the
/// removal of any other record.
#[test]
fn only_what_a_kernel_crash_would_not_take_anyway_is_synced() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path());
    let mut counted = state.syncs();
    let mut costs = |what: &str, syncs: u64| {
        assert_eq!(state.syncs() - counted, syncs, "{what}");
        counted = state.syncs();
    };
    for role in [Role::Publish, Role::Stage] {
        let fresh = VolumeRecord {
            role,
            progress: Progress::Mounting,
            ..record(&format!("/t/{role:?}"))
        };
        state.save(&fresh).unwrap();
        costs(&format!("a fresh {role:?} record"), 0);
        // Mounted: only its marker, never synced.
        state
            .save(&VolumeRecord {
                progress: Progress::Mounted,
                ..fresh.clone()
            })
            .unwrap();
        costs(&format!("{role:?}'s marker"), 0);
        state
            .save(&VolumeRecord {
                device: Some("/dev/loop9".into()),
                ..fresh.clone()
            })
            .unwrap();
        costs(&format!("a {role:?} record replaced"), 2);
        assert_eq!(
            state
                .load(&fresh.target)
                .unwrap()
                .unwrap()
                .device
                .as_deref(),
            Some("/dev/loop9")
        );
        state.remove(&fresh.target).unwrap();
        costs(&format!("a {role:?} record removed"), 0);
    }
    for role in [Role::Mount, Role::Attach] {
        let target = format!("/t/{role:?}");
        state
            .save(&VolumeRecord {
                role,
                progress: Progress::Mounting,
                ..record(&target)
            })
            .unwrap();
        costs(&format!("a fresh {role:?} record"), 2);
        state.remove(Path::new(&target)).unwrap();
        costs(&format!("a {role:?} record removed"), 1);
    }
    // A record this process never read: its removal is synced, whatever it was.
    let other = StateDir::new(dir.path());
    state
        .save(&VolumeRecord {
            role: Role::Publish,
            ..record("/t/elsewhere")
        })
        .unwrap();
    let before = other.syncs();
    other.remove(Path::new("/t/elsewhere")).unwrap();
    assert_eq!(
        other.syncs() - before,
        1,
        "a removal of a record of unknown role"
    );
}

/// What a crash can leave of a fresh record renamed into place before its sync (nothing,
/// zeros, the JSON cut short) is no record, for loads and listings, watched or not; a save at
/// its name replaces it. Garbage that is not a cut-short record stays corrupt.
#[test]
fn a_torn_fresh_record_is_no_record_and_is_replaced() {
    let whole = serde_json::to_vec_pretty(&record("/t/x")).unwrap();
    let torn: [&[u8]; 3] = [b"", &[0u8; 300], &whole[..whole.len() / 2]];
    for (i, bytes) in torn.into_iter().enumerate() {
        for watched in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let state = StateDir::new(dir.path());
            if watched {
                state.watch_records();
                assert!(state.list().unwrap().is_empty());
            }
            state.save(&record("/t/a")).unwrap();
            fs::write(state.record_path(Path::new("/t/x")), bytes).unwrap();
            let what = format!("torn record {i}, watched {watched}");
            assert_eq!(state.load(Path::new("/t/x")).unwrap(), None, "{what}");
            assert_eq!(listed_targets(&state), [PathBuf::from("/t/a")], "{what}");
            state.save(&record("/t/x")).unwrap();
            assert_eq!(
                state.load(Path::new("/t/x")).unwrap(),
                Some(record("/t/x")),
                "{what}"
            );
            assert_eq!(state.list().unwrap().len(), 2, "{what}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path());
    fs::create_dir_all(state.volumes()).unwrap();
    let mut garbage = whole[..whole.len() / 2].to_vec();
    garbage.extend_from_slice(&[0u8; 64]);
    fs::write(state.record_path(Path::new("/t/x")), garbage).unwrap();
    assert!(matches!(
        state.load(Path::new("/t/x")),
        Err(StateError::Corrupt { .. })
    ));
}

fn mkfifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
}

fn not_a_record(result: &Result<VolumeRecord, StateError>) -> Option<EntryKind> {
    match result {
        Err(StateError::NotARecord { kind, .. }) => Some(*kind),
        _ => None,
    }
}

/// A FIFO named like a record blocked the reader in open(2); a link to /dev/zero was read
/// until memory ran out. Both are reported at every listing, by load too, and skipped:
/// the rest of the state works around them. A hang here is the bug.
#[test]
fn entries_that_are_not_record_files_are_reported_and_never_waited_on_or_followed() {
    for watched in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        if watched {
            state.watch_records();
        }
        state.save(&record("/t/a")).unwrap();
        assert_eq!(state.list().unwrap().len(), 1);
        mkfifo(&state.record_path(Path::new("/t/fifo")));
        std::os::unix::fs::symlink("/dev/zero", state.record_path(Path::new("/t/zero"))).unwrap();
        fs::create_dir(state.record_path(Path::new("/t/dir"))).unwrap();
        File::create(state.record_path(Path::new("/t/big")))
            .unwrap()
            .set_len(MAX_RECORD_BYTES + 1)
            .unwrap();
        for _ in 0..2 {
            let listed = state.list().unwrap();
            let mut kinds: Vec<&str> = listed
                .iter()
                .filter_map(not_a_record)
                .map(|k| k.as_str())
                .collect();
            kinds.sort();
            assert_eq!(kinds, ["directory", "fifo", "oversized", "symlink"]);
            assert_eq!(listed.iter().filter(|r| r.is_ok()).count(), 1);
            assert_eq!(state.targets().unwrap(), [("/t/a".into(), Role::Mount)]);
        }
        for (target, kind) in [
            ("/t/fifo", EntryKind::Fifo),
            ("/t/zero", EntryKind::Symlink),
        ] {
            assert_eq!(
                not_a_record(&state.load(Path::new(target)).map(|r| r.unwrap())),
                Some(kind)
            );
        }
        // Saving the volume puts a record in the FIFO's place; a FIFO as a marker fails
        // that save alone, at once.
        state.save(&record("/t/fifo")).unwrap();
        assert_eq!(
            state.load(Path::new("/t/fifo")).unwrap(),
            Some(record("/t/fifo"))
        );
        let mounting = VolumeRecord {
            progress: Progress::Mounting,
            ..record("/t/b")
        };
        state.save(&mounting).unwrap();
        mkfifo(&state.marker_path(Path::new("/t/b")));
        assert!(matches!(
            state.save(&record("/t/b")),
            Err(StateError::NotARecord {
                kind: EntryKind::Fifo,
                ..
            })
        ));
        // The name is escaped in what is said about it.
        let odd = state.volumes().join("line\nbreak.json");
        mkfifo(&odd);
        let said = state
            .list()
            .unwrap()
            .into_iter()
            .filter_map(Result::err)
            .map(|e| e.to_string())
            .find(|e| e.contains("break"))
            .unwrap();
        assert!(said.contains("line\\nbreak.json"), "{said}");
    }
}

/// A lock file goes with the last guard once its volume's record is gone, and lockers
/// racing with that removal never hold the lock at the same time: one that locked the
/// unlinked file notices and locks the new one.
#[test]
fn lock_files_of_removed_volumes_go_and_concurrent_lockers_never_overlap() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path());
    let locks = || fs::read_dir(dir.path().join("locks")).unwrap().count();
    let target = Path::new("/t/a");
    // Recorded: the lock file stays; removed: it goes with the guard held over the removal.
    let guard = state.lock(target).unwrap();
    state.save(&record("/t/a")).unwrap();
    drop(guard);
    assert_eq!(locks(), 1);
    let guard = state.lock(target).unwrap();
    state.remove(target).unwrap();
    drop(guard);
    assert_eq!(locks(), 0, "the removed volume's lock file is gone");
    // A guard whose file a driver still shares keeps it.
    let guard = state.lock(target).unwrap();
    let shared = guard.share();
    drop(guard);
    assert_eq!(locks(), 1);
    drop(shared);

    // Each locker its own StateDir and open file, as separate processes would have.
    let inside = Arc::new(AtomicBool::new(false));
    let entered = Arc::new(AtomicUsize::new(0));
    let lockers: Vec<_> = (0..4)
        .map(|_| {
            let (inside, entered) = (inside.clone(), entered.clone());
            let state = StateDir::new(dir.path());
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let _guard = state.lock(target).unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    std::thread::yield_now();
                    inside.store(false, Ordering::SeqCst);
                    entered.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    lockers.into_iter().for_each(|l| l.join().unwrap());
    assert_eq!(entered.load(Ordering::SeqCst), 800);
    assert_eq!(locks(), 0);
}

#[test]
fn the_driver_name_is_stored_as_its_string_and_an_invalid_one_is_corrupt() {
    let json = serde_json::to_value(record("/t/a")).unwrap();
    assert_eq!(json["driver"], "acme/drv");
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path());
    let mut bad = json.clone();
    bad["driver"] = "../../etc".into();
    fs::create_dir_all(state.volumes()).unwrap();
    fs::write(
        state.record_path(Path::new("/t/a")),
        serde_json::to_vec(&bad).unwrap(),
    )
    .unwrap();
    match state.load(Path::new("/t/a")) {
        Err(e @ StateError::Corrupt { .. }) => {
            assert!(e.to_string().contains("driver name \"../../etc\""), "{e}")
        }
        other => panic!("expected a corrupt record, got {other:?}"),
    }
}

#[test]
fn records_written_before_roles_are_whole_flow_mounts() {
    let mut json = serde_json::to_value(record("/t/old")).unwrap();
    json.as_object_mut().unwrap().remove("role");
    let old: VolumeRecord = serde_json::from_value(json).unwrap();
    assert_eq!(old.role, Role::Mount);
}

#[test]
fn a_record_saved_here_is_listed_from_the_cache_and_a_rewrite_elsewhere_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let here = StateDir::new(dir.path());
    let elsewhere = StateDir::new(dir.path()); // another flexd: its own cache
    let with_device = |device: &str| VolumeRecord {
        device: Some(device.into()),
        ..record("/t/a")
    };
    here.save(&with_device("/dev/loop0")).unwrap();
    let listed = |state: &StateDir| -> Vec<Option<String>> {
        state
            .list()
            .unwrap()
            .into_iter()
            .map(|r| r.unwrap().device)
            .collect()
    };
    // Trusted at once, though just written: this process wrote it.
    let cached = locked(&here.parsed).records.values().all(|p| p.saved_here);
    assert!(cached);
    assert_eq!(listed(&here), [Some("/dev/loop0".into())]);
    // Rewritten by another process, at the same size, maybe within the same tick and with
    // an inode reused: the cache must not answer the old record.
    let mtime = || {
        fs::metadata(here.record_path(Path::new("/t/a")))
            .unwrap()
            .modified()
            .unwrap()
    };
    let mut mtimes = vec![mtime()];
    for device in ["/dev/loop1", "/dev/loop0", "/dev/loop2"] {
        elsewhere.save(&with_device(device)).unwrap();
        mtimes.push(mtime());
    }
    assert_eq!(listed(&here), [Some("/dev/loop2".into())]);
    // Loading it agrees: the cached copy answers only for the file this process wrote.
    let loaded = here.load(Path::new("/t/a")).unwrap().unwrap();
    assert_eq!(loaded.device.as_deref(), Some("/dev/loop2"));
    // What makes that hold when all else matches: each save has an mtime of its own.
    mtimes.sort();
    mtimes.dedup();
    assert_eq!(mtimes.len(), 4);
}

#[test]
fn only_identities_of_files_unchanged_for_a_second_are_trusted_by_the_caches() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    fs::write(&file, "v1").unwrap();
    let fresh = FileIdentity::of(&fs::metadata(&file).unwrap());
    // Just written: a same-size rewrite within the same tick would look identical.
    assert!(!fresh.settled());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let aged = |secs: i64| FileIdentity {
        mtime: (now - secs, 0),
        ctime: (now - secs, 0),
        ..fresh
    };
    assert!(aged(2).settled());
    assert!(
        !FileIdentity {
            ctime: (now + 1, 0),
            ..aged(2)
        }
        .settled(),
        "a recent ctime (a write, chmod or rename) is not settled"
    );
}

#[test]
fn pinned_versions_go_once_no_record_uses_them_and_the_grace_passed() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path().join("state"));
    let exe = dir.path().join("drv");
    let pin = |content: &str| {
        fs::write(&exe, content).unwrap();
        state.pin("acme~drv", &exe).unwrap()
    };
    let (v1, v2, v3) = (pin("v1"), pin("v2"), pin("v3"));
    let mut used = record("/t/a");
    used.pinned = Some(v2.clone());
    state.save(&used).unwrap();

    let zero = std::time::Duration::ZERO;
    let hour = std::time::Duration::from_secs(3600);
    assert_eq!(state.collect_pins(hour).unwrap(), 0, "all pinned lately");
    // v3 is pinned again just now: it is kept even with no grace left for the others.
    let old = std::time::SystemTime::now() - hour;
    for v in [&v1, &v2, &v3] {
        File::open(v.parent().unwrap())
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    fs::write(&exe, "v3").unwrap();
    state.pin("acme~drv", &exe).unwrap();
    assert_eq!(
        state
            .collect_pins(std::time::Duration::from_secs(60))
            .unwrap(),
        1
    );
    assert!(!v1.exists() && v2.exists() && v3.exists());

    // A corrupt record could reference anything: nothing is collected.
    fs::write(state.record_path(Path::new("/t/bad")), "{not json").unwrap();
    assert_eq!(state.collect_pins(zero).unwrap(), 0);
    fs::remove_file(state.record_path(Path::new("/t/bad"))).unwrap();

    // The last user goes: its version (pinned an hour ago) is collected with the record.
    state.remove(Path::new("/t/a")).unwrap();
    assert!(!v2.exists() && v3.exists());
    assert_eq!(state.collect_pins(zero).unwrap(), 1);
    assert!(!dir.path().join("state/pinned/acme~drv").exists());
}

#[test]
fn finishing_an_operation_is_a_marker_and_the_record_stays_as_synced() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path());
    let target = Path::new("/t/a");
    let mut rec = record("/t/a");
    rec.progress = Progress::Mounting;
    state.save(&rec).unwrap();
    assert_eq!(
        state.list().unwrap()[0].as_ref().unwrap().progress,
        Progress::Mounting
    );
    rec.progress = Progress::Mounted;
    state.save(&rec).unwrap();
    assert!(state.marker_path(target).exists());
    assert_eq!(
        state.load_record(target).unwrap().unwrap().progress,
        Progress::Mounting
    );
    assert_eq!(state.load(target).unwrap(), Some(rec.clone()));
    assert_eq!(state.list().unwrap()[0].as_ref().unwrap(), &rec);
    // Anything else changed: a full write, which says its own stage; the marker goes.
    rec.device = Some("/dev/loop9".into());
    state.save(&rec).unwrap();
    assert!(!state.marker_path(target).exists());
    assert_eq!(state.load_record(target).unwrap(), Some(rec.clone()));
    assert_eq!(state.list().unwrap()[0].as_ref().unwrap(), &rec);
    // A new operation's Mounting record is not overridden by an older marker.
    rec.progress = Progress::Mounting;
    state.save(&rec).unwrap();
    rec.progress = Progress::Mounted;
    state.save(&rec).unwrap();
    rec.progress = Progress::Mounting;
    state.save(&rec).unwrap();
    assert_eq!(
        state.load(target).unwrap().unwrap().progress,
        Progress::Mounting
    );
    state.remove(target).unwrap();
    assert_eq!(fs::read_dir(state.volumes()).unwrap().count(), 0);
}

#[test]
fn a_changed_executable_is_hashed_again_when_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path().join("state"));
    let exe = dir.path().join("drv");
    fs::write(&exe, "v1").unwrap();
    let v1 = state.pin("acme~drv", &exe).unwrap();
    assert_eq!(state.pin("acme~drv", &exe).unwrap(), v1);
    // Rewritten in place with the same size: another version all the same.
    std::thread::sleep(std::time::Duration::from_millis(10));
    fs::write(&exe, "v2").unwrap();
    let v2 = state.pin("acme~drv", &exe).unwrap();
    assert_ne!(v1, v2);
    assert_eq!(fs::read(&v2).unwrap(), b"v2");
}

#[test]
fn stable_hash_is_fnv1a() {
    assert_eq!(stable_hash(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(stable_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    // A file hashes as its content in one piece, across read boundaries.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("exe");
    let content: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(&path, &content).unwrap();
    assert_eq!(hash_file(&path).unwrap(), stable_hash(&content));
}

/// Every change is covered by a sync that began after it, whoever ran it; a burst shares them.
#[test]
fn concurrent_changes_share_directory_syncs_and_each_waits_for_one_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Arc::new(SharedSync::default());
    let threads: Vec<_> = (0..32)
        .map(|_| {
            let (shared, dir) = (shared.clone(), dir.path().to_owned());
            std::thread::spawn(move || {
                for _ in 0..20 {
                    let n = shared.changed();
                    shared.sync(&dir, n).unwrap();
                    assert!(locked(&shared.state).synced >= n);
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(locked(&shared.state).synced, 640);
    // A directory that cannot be synced fails the change that needed it, and the next.
    let gone = dir.path().join("gone");
    let n = shared.changed();
    assert!(shared.sync(&gone, n).is_err());
    assert!(shared.sync(&gone, n).is_err());
}
