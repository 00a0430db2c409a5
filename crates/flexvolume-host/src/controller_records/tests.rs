use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::state::{Progress, Role, StateDir};

fn driver() -> DriverName {
    DriverName::parse("acme/x").unwrap()
}

fn attachment(root: &Path, volume: &str, node: &str) -> VolumeRecord {
    VolumeRecord {
        target: state_dir::attachment_path(root, &driver(), volume, node).unwrap(),
        driver: driver(),
        volume_name: volume.into(),
        fs_type: String::new(),
        read_only: false,
        options: BTreeMap::from([("server".to_owned(), "s1".to_owned())]),
        attachable: true,
        node: node.into(),
        device: Some("/dev/x".into()),
        staging: None,
        detach_name: volume.into(),
        pinned: None,
        created_target: false,
        progress: Progress::Mounting,
        role: Role::Attach,
    }
}

fn provisioned(name: &str) -> ProvisionedVolume {
    ProvisionedVolume {
        name: name.into(),
        driver: "acme/x".into(),
        capacity_bytes: 1 << 20,
        fs_type: "ext4".into(),
        parameters: BTreeMap::new(),
        options: BTreeMap::from([("pool".to_owned(), "a".to_owned())]),
        done: false,
    }
}

fn is_conflict<T: std::fmt::Debug>(result: Result<T, RecordsError>) -> bool {
    matches!(result, Err(RecordsError::Conflict { .. }))
}

/// What every store must do: a write or delete decided on another version than the stored
/// one is refused, a stale one included; pages walk every record once.
fn keeps_versions(store: &dyn RecordStore, root: &Path) {
    let d = driver();
    assert!(store.read(&d, "pv-1").unwrap().is_none());
    let mut record = ControllerRecord::new(&d, "pv-1");
    record
        .attachments
        .insert("node-a".into(), attachment(root, "pv-1", "node-a"));
    let v1 = store.write(&record, None).unwrap();
    assert!(is_conflict(store.write(&record, None)), "created twice");
    let read = store.read(&d, "pv-1").unwrap().unwrap();
    assert_eq!(
        (read.version.clone(), read.record.clone()),
        (v1.clone(), record.clone())
    );
    record.provisioned = Some(provisioned("pv-1"));
    let v2 = store.write(&record, Some(&v1)).unwrap();
    assert_ne!(v1, v2);
    assert!(
        is_conflict(store.write(&record, Some(&v1))),
        "a write from a stale read"
    );
    assert!(
        is_conflict(store.delete(&d, "pv-1", &v1)),
        "a delete from a stale read"
    );
    assert_eq!(store.read(&d, "pv-1").unwrap().unwrap().record, record);
    store.delete(&d, "pv-1", &v2).unwrap();
    assert!(store.read(&d, "pv-1").unwrap().is_none());
    assert!(
        is_conflict(store.delete(&d, "pv-1", &v2)),
        "a delete of a record gone"
    );
    assert!(
        is_conflict(store.write(&record, Some(&v2))),
        "a write to a record gone"
    );

    // Pages: every record of the driver once, none of another driver.
    for i in 0..5 {
        store
            .write(&ControllerRecord::new(&d, &format!("pv-{i}")), None)
            .unwrap();
    }
    let other = DriverName::parse("acme/y").unwrap();
    store
        .write(&ControllerRecord::new(&other, "pv-9"), None)
        .unwrap();
    let mut seen = Vec::new();
    let mut from = None;
    loop {
        let page = store.page(&d, from.as_deref(), 2).unwrap();
        assert!(page.records.len() <= 2);
        seen.extend(page.records.into_iter().map(|r| r.unwrap().record.volume));
        match page.next {
            Some(next) => from = Some(next),
            None => break,
        }
    }
    seen.sort();
    assert_eq!(seen, ["pv-0", "pv-1", "pv-2", "pv-3", "pv-4"]);
}

#[test]
fn the_memory_store_keeps_versions() {
    keeps_versions(&MemoryStore::default(), Path::new("/s"));
}

#[test]
fn the_state_dir_store_keeps_versions() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateDirStore::new(StateDir::new(dir.path()));
    keeps_versions(&store, dir.path());
    // A record is not read from where another volume's record should be.
    let path = store.path(&driver(), "pv-x").unwrap();
    std::fs::copy(store.path(&driver(), "pv-2").unwrap(), &path).unwrap();
    let records = ControllerRecords::new(Arc::new(store.clone()), FenceSettings::default());
    assert!(matches!(
        records.read(&driver(), "pv-x"),
        Err(RecordsError::Corrupt { .. })
    ));
    assert!(
        matches!(
            records.fence(&driver(), "pv-x", "attach"),
            Err(RecordsError::Corrupt { .. })
        ),
        "never fenced, never overwritten"
    );
    let page = store.page(&driver(), None, 100).unwrap();
    assert_eq!(page.records.iter().filter(|r| r.is_err()).count(), 1);
}

/// Short fences for tests, yet renewed with seconds to spare on a loaded machine (or in an
/// emulated VM): 6 s, renewed every 1.5 s, stopped at 3 s without a renewal.
fn short() -> FenceSettings {
    FenceSettings {
        lease: Duration::from_secs(6),
        stop_after: Duration::from_secs(3),
    }
}

fn replica(store: &Arc<dyn RecordStore>, name: &str) -> ControllerRecords {
    ControllerRecords::new(store.clone(), short()).with_holder(name)
}

fn busy_holder<T>(result: Result<T, RecordsError>) -> Option<String> {
    match result {
        Err(RecordsError::Busy { holder, .. }) => Some(holder),
        _ => None,
    }
}

#[test]
fn a_fence_refuses_the_other_replica_until_released_and_an_empty_record_goes() {
    let store: Arc<dyn RecordStore> = Arc::new(MemoryStore::default());
    let (a, b) = (replica(&store, "a"), replica(&store, "b"));
    let fence = a.fence(&driver(), "pv-1", "attach to node-1").unwrap();
    assert_eq!(
        busy_holder(b.fence(&driver(), "pv-1", "detach")).as_deref(),
        Some("a")
    );
    assert!(
        busy_holder(a.fence(&driver(), "pv-1", "detach")).is_some(),
        "nor a second call of the same replica"
    );
    let record = a.read(&driver(), "pv-1").unwrap().unwrap().record;
    let held = record.fence.unwrap();
    assert_eq!((held.holder.as_str(), held.token), ("a", 1));
    fence.release().unwrap();
    assert!(
        a.read(&driver(), "pv-1").unwrap().is_none(),
        "nothing left: deleted"
    );
    let fence = b.fence(&driver(), "pv-1", "detach").unwrap();
    assert_eq!(
        fence.record().fence.unwrap().token,
        1,
        "a new record starts again"
    );
    fence
        .update(|r| r.provisioned = Some(provisioned("pv-1")))
        .unwrap();
    drop(fence);
    let record = a.read(&driver(), "pv-1").unwrap().unwrap().record;
    assert!(record.fence.is_none(), "released on drop");
    assert!(record.provisioned.is_some());
    let fence = a.fence(&driver(), "pv-1", "delete").unwrap();
    assert_eq!(fence.record().fence.unwrap().token, 2);
}

#[test]
fn a_renewed_fence_is_never_taken_over() {
    let store: Arc<dyn RecordStore> = Arc::new(MemoryStore::default());
    let (a, b) = (replica(&store, "a"), replica(&store, "b"));
    let fence = a.fence(&driver(), "pv-1", "attach to node-1").unwrap();
    // Two leases of the other replica retrying.
    let until = Instant::now() + short().lease * 2;
    while Instant::now() < until {
        assert_eq!(
            busy_holder(b.fence(&driver(), "pv-1", "detach")).as_deref(),
            Some("a")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(fence.cancel().reason().is_none(), "the holder kept it");
    fence
        .update(|r| r.provisioned = Some(provisioned("pv-1")))
        .unwrap();
    let renewals = fence.record().fence.unwrap().renewals;
    assert!(renewals >= 1, "renewed: {renewals}");
    fence.release().unwrap();
}

#[test]
fn a_fence_left_by_a_dead_replica_is_taken_over_after_a_whole_lease() {
    let store: Arc<dyn RecordStore> = Arc::new(MemoryStore::default());
    let mut left = ControllerRecord::new(&driver(), "pv-1");
    left.fence = Some(Fence {
        holder: "dead".into(),
        token: 7,
        operation: "attach to node-1".into(),
        lease_seconds: 6,
        renewals: 3,
    });
    left.fences = 7;
    left.attachments.insert(
        "node-1".into(),
        attachment(Path::new("/s"), "pv-1", "node-1"),
    );
    store.write(&left, None).unwrap();
    let b = replica(&store, "b");
    let first_refused = Instant::now();
    assert_eq!(
        busy_holder(b.fence(&driver(), "pv-1", "detach")).as_deref(),
        Some("dead")
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let fence = loop {
        match b.fence(&driver(), "pv-1", "detach") {
            Ok(fence) => break fence,
            Err(RecordsError::Busy { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("not taken over: {e}"),
        }
    };
    assert!(
        first_refused.elapsed() >= Duration::from_secs(6),
        "taken over before a whole lease of it was seen"
    );
    assert_eq!(fence.taken_over().map(|f| f.holder.as_str()), Some("dead"));
    let record = fence.record();
    assert_eq!(record.fence.as_ref().map(|f| f.token), Some(8));
    assert!(
        record.attachments.contains_key("node-1"),
        "the dead replica's record is there to be undone"
    );
}

/// A store whose writes can be made to fail, as an API server out of reach.
#[derive(Debug)]
struct Flaky {
    inner: MemoryStore,
    down: AtomicBool,
}

impl RecordStore for Flaky {
    fn describe(&self) -> String {
        "flaky".into()
    }
    fn read(&self, driver: &DriverName, volume: &str) -> Result<Option<Stored>, RecordsError> {
        self.inner.read(driver, volume)
    }
    fn write(
        &self,
        record: &ControllerRecord,
        expected: Option<&Version>,
    ) -> Result<Version, RecordsError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(RecordsError::Unavailable {
                store: "flaky".into(),
                message: "down".into(),
            });
        }
        self.inner.write(record, expected)
    }
    fn delete(
        &self,
        driver: &DriverName,
        volume: &str,
        expected: &Version,
    ) -> Result<(), RecordsError> {
        self.inner.delete(driver, volume, expected)
    }
    fn page(
        &self,
        driver: &DriverName,
        from: Option<&str>,
        limit: usize,
    ) -> Result<Page, RecordsError> {
        self.inner.page(driver, from, limit)
    }
}

#[test]
fn a_holder_that_cannot_renew_stops_its_call_before_another_may_take_over() {
    let flaky = Arc::new(Flaky {
        inner: MemoryStore::default(),
        down: AtomicBool::new(false),
    });
    let store: Arc<dyn RecordStore> = flaky.clone();
    let (a, b) = (replica(&store, "a"), replica(&store, "b"));
    let fence = a.fence(&driver(), "pv-1", "attach to node-1").unwrap();
    flaky.down.store(true, Ordering::SeqCst);
    // The other replica starts counting the lease now, from the last renewal it sees.
    assert!(busy_holder(b.fence(&driver(), "pv-1", "detach")).is_some());
    let deadline = Instant::now() + Duration::from_secs(60);
    while fence.cancel().reason().is_none() {
        assert!(Instant::now() < deadline, "the holder never stopped");
        // Until the holder stopped, the other replica is refused.
        assert!(
            busy_holder(b.fence(&driver(), "pv-1", "detach")).is_some(),
            "taken over while the holder's call may still run"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    flaky.down.store(false, Ordering::SeqCst);
    assert!(matches!(
        fence.update(|r| r.provisioned = None),
        Err(RecordsError::FenceLost { .. })
    ));
    drop(fence);
    let deadline = Instant::now() + Duration::from_secs(60);
    while b.fence(&driver(), "pv-1", "detach").is_err() {
        assert!(Instant::now() < deadline, "never taken over");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_holder_whose_fence_was_taken_writes_nothing_more_and_stops_its_call() {
    let store: Arc<dyn RecordStore> = Arc::new(MemoryStore::default());
    let a = replica(&store, "a");
    let fence = a.fence(&driver(), "pv-1", "attach to node-1").unwrap();
    // Another replica's write (a takeover) in between.
    let stored = store.read(&driver(), "pv-1").unwrap().unwrap();
    let mut theirs = stored.record.clone();
    theirs.fence.as_mut().unwrap().holder = "b".into();
    store.write(&theirs, Some(&stored.version)).unwrap();
    let result = fence.update(|r| {
        r.attachments.insert(
            "node-1".into(),
            attachment(Path::new("/s"), "pv-1", "node-1"),
        );
    });
    assert!(
        matches!(result, Err(RecordsError::FenceLost { .. })),
        "{result:?}"
    );
    assert!(
        fence.cancel().reason().is_some(),
        "its driver call is stopped"
    );
    assert!(fence.release().is_err());
    let now = store.read(&driver(), "pv-1").unwrap().unwrap().record;
    assert_eq!(now, theirs, "the other replica's record is untouched");
}

#[test]
fn a_listing_marks_an_attachment_detached_only_from_what_it_saw() {
    let store: Arc<dyn RecordStore> = Arc::new(MemoryStore::default());
    let a = replica(&store, "a");
    let mut record = ControllerRecord::new(&driver(), "pv-1");
    let mut attached = attachment(Path::new("/s"), "pv-1", "node-1");
    attached.progress = Progress::Mounted;
    record.attachments.insert("node-1".into(), attached);
    store.write(&record, None).unwrap();
    let seen = a
        .page(&driver(), None, 10)
        .unwrap()
        .records
        .remove(0)
        .unwrap();
    // A call takes the fence after the listing read the record: the mark is left to it.
    let fence = a.fence(&driver(), "pv-1", "detach from node-1").unwrap();
    assert!(!a.mark_detached(&seen, &["node-1".to_owned()]).unwrap());
    fence.release().unwrap();
    let seen = a
        .page(&driver(), None, 10)
        .unwrap()
        .records
        .remove(0)
        .unwrap();
    assert!(a.mark_detached(&seen, &["node-1".to_owned()]).unwrap());
    assert_eq!(
        a.attachment(&driver(), "pv-1", "node-1")
            .unwrap()
            .unwrap()
            .progress,
        Progress::Mounting
    );
}

#[test]
fn an_older_flexds_records_are_adopted_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path());
    let old = attachment(dir.path(), "pv-1", "node-a");
    state.save(&old).unwrap();
    let path = provisioned_path(dir.path(), &driver(), "pv-1").unwrap();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut volume = provisioned("pv-1");
    volume.done = true;
    std::fs::write(&path, serde_json::to_vec(&volume).unwrap()).unwrap();

    let legacy = legacy_records(&state).unwrap();
    assert_eq!(legacy.len(), 1, "one record per volume");
    let store = StateDirStore::new(state.clone());
    assert_eq!(store.drivers().unwrap(), [driver()]);
    assert_eq!(store.adopt_legacy().unwrap(), 1);
    let record = store.read(&driver(), "pv-1").unwrap().unwrap().record;
    assert_eq!(record.attachments["node-a"], old);
    assert_eq!(record.provisioned, Some(volume));
    assert!(!path.exists());
    assert!(state.load(&old.target).unwrap().is_none());
    assert_eq!(store.adopt_legacy().unwrap(), 0, "once");
}

/// The whole of "stopping in time", with a real driver: a replica whose store goes out of reach
/// while its driver's attach runs kills that attach before its lease ends, and leaves the
/// record written before the attach, which the other replica finds after taking over.
#[test]
fn an_attach_whose_fence_cannot_be_renewed_is_killed_and_its_record_kept() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("x");
    std::fs::write(
        &exe,
        "#!/bin/sh\ncase \"$1\" in\nattach) echo $$ > \"$(dirname \"$0\")/attach.pid\"; exec sleep 60 ;;\n*) echo '{\"status\":\"Not supported\"}'; exit 1 ;;\nesac\n",
    )
    .unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let installed = crate::layout::InstalledDriver {
        name: driver(),
        dir: dir.path().to_owned(),
        path: exe,
    };
    let reply =
        flexvolume_protocol::find_reply(br#"{"status":"Success","capabilities":{"attach":true}}"#)
            .unwrap();
    let plugin = crate::plugin::Plugin::from_init_reply(installed, &reply);
    let flaky = Arc::new(Flaky {
        inner: MemoryStore::default(),
        down: AtomicBool::new(false),
    });
    let store: Arc<dyn RecordStore> = flaky.clone();
    let mut lc = crate::lifecycle::Lifecycle::new(
        crate::runner::RunnerConfig {
            max_processes: None,
            kill_grace: Duration::from_millis(500),
            ..Default::default()
        },
        StateDir::new(dir.path().join("state")),
        "controller".into(),
    );
    lc.controller_records = Arc::new(replica(&store, "a"));
    let spec = flexvolume_protocol::spec::VolumeSpec::new("pv-1".into(), driver());
    let attaching = std::thread::spawn(move || lc.controller_publish(&plugin, &spec, "node-1"));
    let pid_file = dir.path().join("attach.pid");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pid_file.exists() {
        assert!(Instant::now() < deadline, "attach never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    flaky.down.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !attaching.is_finished() {
        assert!(Instant::now() < deadline, "the attach was never stopped");
        std::thread::sleep(Duration::from_millis(50));
    }
    let result = attaching.join().unwrap();
    assert!(
        matches!(
            result,
            Err(crate::lifecycle::LifecycleError::Call(
                crate::runner::CallError::Cancelled { .. }
            ))
        ),
        "{result:?}"
    );
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    assert!(
        !Path::new(&format!("/proc/{}", pid.trim())).exists(),
        "the driver was killed and reaped"
    );
    flaky.down.store(false, Ordering::SeqCst);
    let stored = store.read(&driver(), "pv-1").unwrap().unwrap().record;
    assert_eq!(
        stored.attachments["node-1"].progress,
        Progress::Mounting,
        "the attach that did not finish is recorded, for a detach to undo"
    );
    assert_eq!(stored.fence.map(|f| f.holder).as_deref(), Some("a"));
}
