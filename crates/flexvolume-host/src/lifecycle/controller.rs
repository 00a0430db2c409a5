//! CSI's controller side for an attaching driver: ControllerPublish = attach, recorded (with
//! the name detach will need, since ControllerUnpublish carries no volume context) in the
//! volume's controller record ([`crate::controller_records`]), under the volume's fence;
//! ControllerUnpublish = detach of that record. An attachment the driver's `isattached` finds
//! gone (CSI ListVolumes asks) goes back to the state of an attach that did not finish
//! ([`crate::controller_records::ControllerRecords::mark_detached`]), so that the CO's next
//! ControllerPublish attaches it again.

use super::attacher;
use super::{Lifecycle, LifecycleError};
use crate::state::{Progress, Role, VolumeRecord};

impl Lifecycle {
    /// The name the attach record of a volume on a node is locked (and, in the state dir,
    /// kept) under: a name under `<state-dir>/attachments/`, never a mount point.
    pub(super) fn attachment_key(
        &self,
        driver: &flexvolume_protocol::name::DriverName,
        volume_id: &str,
        node: &str,
    ) -> Result<std::path::PathBuf, LifecycleError> {
        Ok(crate::controller_records::attachment_path(
            &self.state.root,
            driver,
            volume_id,
            node,
        )?)
    }

    /// This lifecycle with its drivers also holding `locks` and stopped when `fence` is lost
    /// (controller_records::fence).
    pub(super) fn fenced(
        &self,
        locks: &[&crate::state::Lock],
        fence: &crate::controller_records::Fenced,
    ) -> Lifecycle {
        let mut lc = self.holding(locks);
        lc.runner = lc.runner.cancelled_by(fence.cancel());
        lc
    }

    /// CSI ControllerPublish: attach, under the volume's fence, recorded (with the name detach
    /// will need: ControllerUnpublish carries no volume context) before the driver runs, so that
    /// [`Lifecycle::controller_unpublish`] detaches it under the same name. A recorded
    /// attachment is not redone.
    pub fn controller_publish(
        &self,
        plugin: &crate::plugin::Plugin,
        spec: &flexvolume_protocol::spec::VolumeSpec,
        node: &str,
    ) -> Result<super::AttachOutcome, LifecycleError> {
        let records = &self.controller_records;
        let done = |record: &crate::controller_records::ControllerRecord| {
            record
                .attachments
                .get(node)
                .filter(|r| r.progress == Progress::Mounted)
                .map(|r| super::AttachOutcome {
                    device: r.device.clone().unwrap_or_default(),
                    attached_now: false,
                })
        };
        // Attached already, and no call in flight on the volume: answered from the record
        // alone, as it stood at that read.
        if let Some(stored) = records.read(&spec.driver, &spec.volume_name)? {
            if stored.record.fence.is_none() {
                if let Some(outcome) = done(&stored.record) {
                    return Ok(outcome);
                }
            }
        }
        let key = self.attachment_key(&spec.driver, &spec.volume_name, node)?;
        let key_lock = self.state.lock(&key)?;
        let lc = &self.holding(&[&key_lock]);
        // Read-only, unfenced: getvolumename changes nothing.
        attacher::get_volume_name(lc, plugin, spec)?;
        let mut record = VolumeRecord {
            attachable: true,
            node: node.to_owned(),
            ..super::target::new_record(lc, plugin, spec, &key, Role::Attach, false)?
        };
        // The attach record goes in with the fence, in one write, unless the attachment is done
        // already. A failed or interrupted attach keeps it: ControllerUnpublish then detaches.
        let fence = records.fence_with(
            &spec.driver,
            &spec.volume_name,
            &format!("attach to {node}"),
            &|r| {
                if done(r).is_none() {
                    r.attachments.insert(node.to_owned(), record.clone());
                }
            },
        )?;
        if let Some(outcome) = done(&fence.record()) {
            fence.release()?;
            return Ok(outcome);
        }
        let lc = &self.fenced(&[&key_lock], &fence);
        let device = match lc.attach(plugin, spec, node) {
            Ok(device) => device,
            // The driver named the volume or the node unknown: nothing is attached, so there
            // is nothing for a detach to undo.
            Err(LifecycleError::Call(e))
                if e.code() == Some(flexvolume_protocol::ErrorCode::NotFound) =>
            {
                fence.release_with(|r| {
                    r.attachments.remove(node);
                })?;
                return Err(e.into());
            }
            Err(e) => return Err(e),
        };
        record.device = Some(device.clone()).filter(|d| !d.is_empty());
        record.progress = Progress::Mounted;
        fence.release_with(|r| {
            r.attachments.insert(node.to_owned(), record);
        })?;
        Ok(super::AttachOutcome {
            device,
            attached_now: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::InstalledDriver;
    use crate::plugin::Plugin;
    use flexvolume_protocol::name::DriverName;
    use flexvolume_protocol::spec::VolumeSpec;
    use std::os::unix::fs::PermissionsExt as _;

    /// A driver that attaches (counting its attaches in `attaches` beside it) and whose
    /// isattached answers what the file `attached` beside it says.
    const DRIVER: &str = r#"#!/bin/sh
dir=$(dirname "$0")
case "$1" in
attach) echo x >> "$dir/attaches"; echo '{"status":"Success","device":"/dev/x"}' ;;
isattached) printf '{"status":"Success","attached":%s}\n' "$(cat "$dir/attached")" ;;
*) echo '{"status":"Not supported"}'; exit 1 ;;
esac
"#;

    #[test]
    fn an_attachment_found_gone_is_attached_again_by_the_next_publish() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("x");
        std::fs::write(&exe, DRIVER).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let driver = InstalledDriver {
            name: DriverName::parse("acme/x").unwrap(),
            dir: dir.path().to_owned(),
            path: exe,
        };
        let reply = flexvolume_protocol::find_reply(
            br#"{"status":"Success","capabilities":{"attach":true}}"#,
        )
        .unwrap();
        let plugin = Plugin::from_init_reply(driver, &reply);
        let lc = Lifecycle::new(
            crate::runner::RunnerConfig {
                max_processes: None,
                ..Default::default()
            },
            crate::state::StateDir::new(dir.path().join("state")),
            "controller".into(),
        );
        let spec = VolumeSpec::new("pv-1".into(), plugin.driver.name.clone());
        let attaches = || {
            std::fs::read_to_string(dir.path().join("attaches"))
                .unwrap_or_default()
                .lines()
                .count()
        };
        lc.controller_publish(&plugin, &spec, "node-1").unwrap();
        let records = &lc.controller_records;
        let seen = records.read(&plugin.driver.name, "pv-1").unwrap().unwrap();
        std::fs::write(dir.path().join("attached"), "false").unwrap();
        let attachment = &seen.record.attachments["node-1"];
        assert_eq!(
            lc.attached_answer(&plugin, &attachment.spec().unwrap(), "node-1")
                .unwrap(),
            Some(false)
        );

        // A record that changed since it was seen is left alone.
        let stale = crate::controller_records::Stored {
            version: crate::controller_records::Version("0".into()),
            ..seen.clone()
        };
        assert!(!records
            .mark_detached(&stale, &["node-1".to_owned()])
            .unwrap());
        assert!(records
            .mark_detached(&seen, &["node-1".to_owned()])
            .unwrap());
        let progress = || {
            records
                .attachment(&plugin.driver.name, "pv-1", "node-1")
                .unwrap()
                .unwrap()
                .progress
        };
        assert_eq!(progress(), Progress::Mounting);
        assert!(
            !records
                .mark_detached(&seen, &["node-1".to_owned()])
                .unwrap(),
            "marked once"
        );

        assert_eq!(attaches(), 1);
        lc.controller_publish(&plugin, &spec, "node-1").unwrap();
        assert_eq!(attaches(), 2, "the publish after it attaches again");
        lc.controller_publish(&plugin, &spec, "node-1").unwrap();
        assert_eq!(
            attaches(),
            2,
            "and the one after that answers from the record"
        );
        assert_eq!(progress(), Progress::Mounted);
    }
}
