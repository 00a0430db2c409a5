//! What flexd's records know of one driver's volumes, for CSI ListVolumes: the volumes it
//! provisioned and the volumes it attached ([`crate::controller_records`]), a page at a time, one
//! entry per volume. Reading a page is [`Lifecycle::volume_page`]; what a record lists as is
//! [`KnownVolume::of`], which does no I/O.

use std::collections::BTreeMap;

use super::{Lifecycle, LifecycleError, ProvisionedVolume};
use crate::controller_records::{RecordsError, Stored};
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
    /// The record as read, with its version: what a change decided on this listing is made
    /// from ([`crate::controller_records::ControllerRecords::mark_detached`]).
    pub seen: Stored,
}

impl KnownVolume {
    /// What a stored record lists as: `None` for a record with nothing to list (a provision
    /// that did not finish, a fence alone) or of another driver.
    pub fn of(driver: &DriverName, stored: Stored) -> Option<Self> {
        let record = &stored.record;
        if record.driver != driver.as_str() {
            return None;
        }
        let provisioned = record.provisioned.clone().filter(|v| v.done);
        let attachments: Vec<VolumeRecord> = record
            .attachments
            .values()
            .filter(|r| r.role == Role::Attach && r.driver == *driver)
            .cloned()
            .collect();
        if provisioned.is_none() && attachments.is_empty() {
            return None;
        }
        Some(Self {
            id: record.volume.clone(),
            provisioned,
            attachments,
            seen: stored,
        })
    }

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

/// What [`Lifecycle::volume_page`] read.
#[derive(Debug, Default)]
pub struct VolumePage {
    /// One per volume, in the store's order.
    pub volumes: Vec<KnownVolume>,
    /// Where the next page starts; `None` on the last.
    pub next: Option<String>,
    /// Records that could not be read or do not belong where they are: left out of
    /// `volumes`, for the caller to report.
    pub unreadable: Vec<RecordsError>,
}

impl Lifecycle {
    /// One page of the volumes of `driver` that the records know (see [`VolumePage`]), at
    /// most `limit` records read. Takes no lock: a listing is a snapshot that an operation
    /// running meanwhile may make stale, as CSI allows. A page may hold fewer volumes than
    /// records read (records with nothing to list), none even, and still have a next.
    pub fn volume_page(
        &self,
        driver: &DriverName,
        from: Option<&str>,
        limit: usize,
    ) -> Result<VolumePage, LifecycleError> {
        let page = self.controller_records.page(driver, from, limit)?;
        let mut listed = VolumePage {
            next: page.next,
            ..Default::default()
        };
        for record in page.records {
            match record {
                Ok(stored) => listed.volumes.extend(KnownVolume::of(driver, stored)),
                Err(e) => listed.unreadable.push(e),
            }
        }
        Ok(listed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller_records::{ControllerRecord, Version};
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

    fn record(volume: &str, node: &str, role: Role) -> VolumeRecord {
        VolumeRecord {
            target: PathBuf::from(format!("/s/attachments/{volume}/{node}")),
            driver: driver(),
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

    fn stored(record: ControllerRecord) -> Stored {
        Stored {
            version: Version("1".into()),
            record,
        }
    }

    #[test]
    fn a_record_lists_its_finished_provision_and_its_attachments_by_node() {
        let mut b = ControllerRecord::new(&driver(), "pvc-b");
        b.provisioned = Some(provisioned("pvc-b", true));
        for node in ["node-2", "node-1"] {
            b.attachments
                .insert(node.into(), record("pvc-b", node, Role::Attach));
        }
        let b = KnownVolume::of(&driver(), stored(b)).unwrap();
        let nodes: Vec<&str> = b.attachments.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(nodes, ["node-1", "node-2"]);
        assert_eq!(b.capacity_bytes(), 1 << 20);
        assert_eq!(
            b.options()["from"],
            "provision",
            "the provisioned options win"
        );

        let mut s = ControllerRecord::new(&driver(), "static");
        s.attachments
            .insert("node-1".into(), record("static", "node-1", Role::Attach));
        let s = KnownVolume::of(&driver(), stored(s)).unwrap();
        assert_eq!(s.capacity_bytes(), 0);
        assert_eq!(s.options()["from"], "attach-node-1");

        let mut half = ControllerRecord::new(&driver(), "pvc-half");
        half.provisioned = Some(provisioned("pvc-half", false));
        assert_eq!(KnownVolume::of(&driver(), stored(half)), None, "half-made");
        let mut other = ControllerRecord::new(&DriverName::parse("acme/y").unwrap(), "o");
        other
            .attachments
            .insert("node-1".into(), record("o", "node-1", Role::Attach));
        assert_eq!(
            KnownVolume::of(&driver(), stored(other)),
            None,
            "another driver"
        );
        let mut stage = ControllerRecord::new(&driver(), "staged");
        stage
            .attachments
            .insert("node-1".into(), record("staged", "node-1", Role::Stage));
        assert_eq!(
            KnownVolume::of(&driver(), stored(stage)),
            None,
            "not an attach record"
        );
    }
}
