use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::state_dir::provisioned_path;
use super::*;
use crate::state::{Progress, Role};

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

/// What every backend must do: what is saved is read back, listed by driver, replaced by the
/// next save and gone after removal.
fn behaves_as_a_store(records: &dyn ControllerRecords, root: &Path) {
    let d = driver();
    let other = DriverName::parse("acme/y").unwrap();
    assert_eq!(records.attachment(&d, "pv-1", "node-a").unwrap(), None);
    let mut a = attachment(root, "pv-1", "node-a");
    records.save_attachment(&a).unwrap();
    records
        .save_attachment(&attachment(root, "pv-1", "node-b"))
        .unwrap();
    assert_eq!(
        records.attachment(&d, "pv-1", "node-a").unwrap(),
        Some(a.clone())
    );
    a.progress = Progress::Mounted;
    records.save_attachment(&a).unwrap();
    assert_eq!(
        records
            .attachment(&d, "pv-1", "node-a")
            .unwrap()
            .unwrap()
            .progress,
        Progress::Mounted
    );
    let mut nodes: Vec<String> = records
        .attachments(&d)
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap().node)
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["node-a", "node-b"]);
    assert!(records.attachments(&other).unwrap().is_empty());
    records.remove_attachment(&d, "pv-1", "node-a").unwrap();
    records.remove_attachment(&d, "pv-1", "node-a").unwrap();
    assert_eq!(records.attachment(&d, "pv-1", "node-a").unwrap(), None);
    assert_eq!(records.attachments(&d).unwrap().len(), 1);

    assert_eq!(records.provisioned(&d, "pvc-1").unwrap(), None);
    let mut v = provisioned("pvc-1");
    records.save_provisioned(&d, &v).unwrap();
    v.done = true;
    records.save_provisioned(&d, &v).unwrap();
    records.save_provisioned(&d, &provisioned("pvc-2")).unwrap();
    assert_eq!(records.provisioned(&d, "pvc-1").unwrap(), Some(v));
    assert_eq!(records.provisioned(&other, "pvc-1").unwrap(), None);
    let mut names: Vec<String> = records
        .all_provisioned(&d)
        .unwrap()
        .into_iter()
        .map(|v| v.unwrap().name)
        .collect();
    names.sort();
    assert_eq!(names, ["pvc-1", "pvc-2"]);
    records.remove_provisioned(&d, "pvc-1").unwrap();
    records.remove_provisioned(&d, "pvc-1").unwrap();
    assert_eq!(records.provisioned(&d, "pvc-1").unwrap(), None);
    assert_eq!(records.all_provisioned(&d).unwrap().len(), 1);
}

#[test]
fn the_state_dir_is_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let records = StateDirRecords::new(crate::state::StateDir::new(dir.path()));
    behaves_as_a_store(&records, dir.path());
}

#[test]
fn memory_is_a_store_shared_by_its_clones() {
    let records = MemoryRecords::default();
    behaves_as_a_store(&records, Path::new("/s"));
    let twin = records.clone();
    twin.save_provisioned(&driver(), &provisioned("pvc-9"))
        .unwrap();
    assert!(records.provisioned(&driver(), "pvc-9").unwrap().is_some());
}

#[test]
fn record_names_are_safe_and_long_names_are_hashed() {
    let root = PathBuf::from("/s");
    let short = provisioned_path(&root, &driver(), "pvc-1").unwrap();
    assert_eq!(short, Path::new("/s/provisioned/acme~x/pvc-1.json"));
    let hostile = provisioned_path(&root, &driver(), "../../etc/passwd").unwrap();
    assert!(hostile.starts_with("/s/provisioned/acme~x/"));
    assert_eq!(hostile.components().count(), short.components().count());
    let long = provisioned_path(&root, &driver(), &"é".repeat(128)).unwrap();
    let file = long.file_name().unwrap().to_string_lossy().into_owned();
    assert!(file.starts_with("%h") && file.len() < 40, "{file}");
    assert!(provisioned_path(&root, &driver(), "").is_err());
}

#[test]
fn a_provisioned_record_copied_under_another_name_is_reported_not_listed() {
    let dir = tempfile::tempdir().unwrap();
    let records = StateDirRecords::new(crate::state::StateDir::new(dir.path()));
    records
        .save_provisioned(&driver(), &provisioned("pvc-1"))
        .unwrap();
    let home = provisioned_path(dir.path(), &driver(), "pvc-1").unwrap();
    std::fs::copy(&home, home.with_file_name("pvc-2.json")).unwrap();
    std::fs::write(home.with_file_name("pvc-3.json"), b"{").unwrap();
    std::fs::write(home.with_file_name(".pvc-4.json.1.tmp"), b"{").unwrap();
    let listed = records.all_provisioned(&driver()).unwrap();
    let names: Vec<&str> = listed
        .iter()
        .filter_map(|v| v.as_ref().ok())
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(names, ["pvc-1"]);
    assert_eq!(
        listed.iter().filter(|v| v.is_err()).count(),
        2,
        "{listed:?}"
    );
    assert_eq!(records.provisioned(&driver(), "pvc-2").unwrap(), None);
}
