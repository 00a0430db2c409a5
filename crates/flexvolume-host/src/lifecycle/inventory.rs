//! What flexd's records know of one driver's volumes, for CSI ListVolumes: the volumes it
//! provisioned and the volumes it attached (both in the controller records,
//! [`crate::controller_records`]), one entry per volume id, sorted by id. Reading the records is
//! [`Lifecycle::known_volumes`]; putting them together is `merge`, which does no I/O.

use std::collections::BTreeMap;

use super::{Lifecycle, LifecycleError, ProvisionedVolume};
use crate::controller_records::RecordsError;
use crate::state::{Role, VolumeRecord};
use flexvolume_protocol::name::DriverName;

/// One volume of a driver, as flexd's records know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownVolume {
    /// The CSI volume id: the CreateVolume name, or the id ControllerPublish was given.
    pub id: String,
    /// Its provisioning record, when flexd provisioned it (and `provision` finished).
    pub provisioned: Option<ProvisionedVolume>,
    /// Its attach records (CSI ControllerPublish), one per node, sorted by node.
    pub attachments: Vec<VolumeRecord>,
}

impl KnownVolume {
    /// The size the volume was provisioned with; 0 (unknown) for a static volume.
    pub fn capacity_bytes(&self) -> u64 {
        self.provisioned.as_ref().map_or(0, |v| v.capacity_bytes)
    }

    /// Its options (CSI: its volume context): a provisioned volume's (parameters and what
    /// `provision` replied), else those its first attachment was made with. Never secrets:
    /// neither record holds any.
    pub fn options(&self) -> BTreeMap<String, String> {
        match (&self.provisioned, self.attachments.first()) {
            (Some(volume), _) => volume.options.clone(),
            (None, Some(attachment)) => attachment.options.clone(),
            (None, None) => BTreeMap::new(),
        }
    }
}

/// The volumes of `driver` that the records know, one per id, sorted by id (byte order): the
/// provisioned volumes whose `provision` finished, and the volumes of its attach records.
/// Records of other drivers and of other roles are left out.
fn merge(
    driver: &DriverName,
    provisioned: Vec<ProvisionedVolume>,
    records: Vec<VolumeRecord>,
) -> Vec<KnownVolume> {
    let mut volumes: BTreeMap<String, KnownVolume> = BTreeMap::new();
    fn entry<'a>(volumes: &'a mut BTreeMap<String, KnownVolume>, id: &str) -> &'a mut KnownVolume {
        volumes.entry(id.to_owned()).or_insert_with(|| KnownVolume {
            id: id.to_owned(),
            provisioned: None,
            attachments: Vec::new(),
        })
    }
    for volume in provisioned {
        if volume.done && volume.driver == driver.as_str() {
            let id = volume.name.clone();
            entry(&mut volumes, &id).provisioned = Some(volume);
        }
    }
    for record in records {
        if record.role == Role::Attach && record.driver == *driver {
            let id = record.volume_name.clone();
            entry(&mut volumes, &id).attachments.push(record);
        }
    }
    let mut volumes: Vec<KnownVolume> = volumes.into_values().collect();
    for volume in &mut volumes {
        volume.attachments.sort_by(|a, b| a.node.cmp(&b.node));
    }
    volumes
}

/// What [`Lifecycle::known_volumes`] read.
#[derive(Debug, Default)]
pub struct Inventory {
    /// One per volume id, sorted by id (byte order): the provisioned volumes whose `provision`
    /// finished, and the volumes of the driver's attach records.
    pub volumes: Vec<KnownVolume>,
    /// Records that could not be read or do not belong where they are: left out of
    /// `volumes`, for the caller to report.
    pub unreadable: Vec<RecordsError>,
}

impl Lifecycle {
    /// Every volume of `driver` that the records know (see [`Inventory`]). Takes no lock: a
    /// listing is a snapshot that an operation running meanwhile may make stale, as CSI allows.
    pub fn known_volumes(&self, driver: &DriverName) -> Result<Inventory, LifecycleError> {
        let records = &self.controller_records;
        let mut unreadable = Vec::new();
        let (provisioned, bad): (Vec<_>, Vec<_>) = records
            .all_provisioned(driver)?
            .into_iter()
            .partition(Result::is_ok);
        unreadable.extend(bad.into_iter().filter_map(Result::err));
        let (attachments, bad): (Vec<_>, Vec<_>) = records
            .attachments(driver)?
            .into_iter()
            .partition(Result::is_ok);
        unreadable.extend(bad.into_iter().filter_map(Result::err));
        let provisioned = provisioned.into_iter().flatten().collect();
        let attachments = attachments.into_iter().flatten().collect();
        Ok(Inventory {
            volumes: merge(driver, provisioned, attachments),
            unreadable,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Progress;
    use std::path::PathBuf;

    fn driver() -> DriverName {
        DriverName::parse("acme/x").unwrap()
    }

    fn provisioned(name: &str, done: bool) -> ProvisionedVolume {
        ProvisionedVolume {
            name: name.into(),
            driver: "acme/x".into(),
            capacity_bytes: 1 << 20,
            fs_type: String::new(),
            parameters: BTreeMap::new(),
            options: BTreeMap::from([("from".to_owned(), "provision".to_owned())]),
            done,
        }
    }

    fn record(volume: &str, node: &str, role: Role, driver: &str) -> VolumeRecord {
        VolumeRecord {
            target: PathBuf::from(format!("/s/attachments/{volume}/{node}")),
            driver: DriverName::parse(driver).unwrap(),
            volume_name: volume.into(),
            fs_type: String::new(),
            read_only: false,
            options: BTreeMap::from([("from".to_owned(), format!("attach-{node}"))]),
            attachable: true,
            node: node.into(),
            device: None,
            staging: None,
            detach_name: volume.into(),
            pinned: None,
            created_target: false,
            progress: Progress::Mounted,
            role,
        }
    }

    #[test]
    fn one_entry_per_id_sorted_with_its_attachments_by_node() {
        let volumes = merge(
            &driver(),
            vec![
                provisioned("pvc-b", true),
                provisioned("pvc-a", true),
                provisioned("pvc-half", false),
            ],
            vec![
                record("pvc-b", "node-2", Role::Attach, "acme/x"),
                record("pvc-b", "node-1", Role::Attach, "acme/x"),
                record("static", "node-1", Role::Attach, "acme/x"),
                record("static", "node-1", Role::Stage, "acme/x"),
                record("other", "node-1", Role::Attach, "acme/y"),
            ],
        );
        let ids: Vec<&str> = volumes.iter().map(|v| v.id.as_str()).collect();
        assert_eq!(
            ids,
            ["pvc-a", "pvc-b", "static"],
            "no half-made, other driver or role"
        );
        let b = &volumes[1];
        let nodes: Vec<&str> = b.attachments.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(nodes, ["node-1", "node-2"]);
        assert_eq!(b.capacity_bytes(), 1 << 20);
        assert_eq!(
            b.options()["from"],
            "provision",
            "the provisioned options win"
        );
        let s = &volumes[2];
        assert_eq!(s.capacity_bytes(), 0);
        assert_eq!(s.options()["from"], "attach-node-1");
        assert_eq!(
            s.attachments.len(),
            1,
            "the stage record is not an attachment"
        );
        assert!(volumes[0].attachments.is_empty());
    }

    #[test]
    fn provisioned_records_are_read_and_strays_reported() {
        let dir = tempfile::tempdir().unwrap();
        let lc = Lifecycle::new(
            Default::default(),
            crate::state::StateDir::new(dir.path()),
            "n".into(),
        );
        assert!(lc.known_volumes(&driver()).unwrap().volumes.is_empty());
        let write = |name: &str, volume: &ProvisionedVolume| {
            let path = lc.provisioned_path(&driver(), name).unwrap();
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, serde_json::to_vec(volume).unwrap()).unwrap();
            path
        };
        write("pvc-1", &provisioned("pvc-1", true));
        // A copy under another name is not that volume's record.
        write("pvc-2", &provisioned("pvc-1", true));
        let corrupt = write("pvc-3", &provisioned("pvc-3", true));
        std::fs::write(&corrupt, b"{").unwrap();
        let temp = corrupt.with_file_name(".pvc-4.json.1.tmp");
        std::fs::write(temp, b"{").unwrap();
        let inventory = lc.known_volumes(&driver()).unwrap();
        let ids: Vec<&str> = inventory.volumes.iter().map(|v| v.id.as_str()).collect();
        assert_eq!(ids, ["pvc-1"]);
        assert_eq!(inventory.unreadable.len(), 2, "{:?}", inventory.unreadable);
    }
}
