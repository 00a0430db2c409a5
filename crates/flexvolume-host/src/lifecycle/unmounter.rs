//! TearDown: unmount a target, and when it was the device's last one, unmount the device and
//! detach; CSI's unpublish, unstage and controller unpublish, each by its record's role.

use std::path::Path;

use super::attacher;
use super::target;
use super::{Lifecycle, LifecycleError, UnmountOutcome};
use crate::plugin::Plugin;
use crate::state::{Role, VolumeRecord};
use flexvolume_os::mount::safe_path;
use flexvolume_protocol::name::DriverName;
use flexvolume_protocol::CallOut;

/// Finds the plugin to tear a volume down with: the installed driver when it is there (a
/// replaced driver's new version is used), else the copy pinned at mount time.
pub trait DriverResolver {
    /// Shared, so a long-lived server can hand out the plugin it serves (with what it learnt
    /// the driver does not support).
    fn resolve(&self, record: &VolumeRecord) -> Option<std::sync::Arc<Plugin>>;
}

/// The plugin that tears down or changes a recorded volume, or why there is none.
pub(crate) fn plugin_of(
    resolve: &dyn DriverResolver,
    record: &VolumeRecord,
) -> Result<std::sync::Arc<Plugin>, LifecycleError> {
    resolve
        .resolve(record)
        .ok_or_else(|| LifecycleError::NoDriver {
            driver: record.driver.to_string(),
            target: record.target.clone(),
        })
}

/// What a teardown must find recorded at its path.
#[derive(Clone, Copy)]
struct Expect<'a> {
    /// Refuses a record of another role (a CSI unpublish must not unstage).
    role: Option<Role>,
    /// Refuses a record of another volume (an unpublish naming B never unmounts A).
    volume: Option<&'a str>,
}

impl<'a> Expect<'a> {
    /// A record of `role` for `volume` only.
    fn volume(role: Role, volume: &'a str) -> Self {
        Expect {
            role: Some(role),
            volume: Some(volume),
        }
    }
}

impl Lifecycle {
    /// Tears down exactly what was done for `target`, whichever operation did it
    /// ([`Lifecycle::mount`], [`Lifecycle::stage`], [`Lifecycle::publish`]).
    pub fn unmount(
        &self,
        target: &Path,
        resolve: &dyn DriverResolver,
    ) -> Result<UnmountOutcome, LifecycleError> {
        self.teardown(
            target,
            resolve,
            Expect {
                role: None,
                volume: None,
            },
        )
    }

    /// CSI NodeUnstage (`Role::Stage`: unmountdevice of the staging path; no detach, that is
    /// the controller's) and NodeUnpublish (`Role::Publish`: the driver's unmount of the target,
    /// default plain unmount), which differ only in the role of the record they tear down. A
    /// path flexd has no record of is left alone (success); one recorded for another role or
    /// another volume is refused, naming what is there.
    pub fn unmount_role(
        &self,
        role: Role,
        volume: &str,
        path: &Path,
        resolve: &dyn DriverResolver,
    ) -> Result<UnmountOutcome, LifecycleError> {
        self.teardown(path, resolve, Expect::volume(role, volume))
    }

    /// CSI ControllerUnpublish: detach what [`Lifecycle::controller_publish`] attached to
    /// `node` (`None`: to every node, as CSI says of an empty node id), under the volume's
    /// fence; each attachment's record goes once its detach succeeded. An attachment flexd has
    /// no record of is not detached again (success). Returns how many were detached.
    pub fn controller_unpublish(
        &self,
        driver: &DriverName,
        volume_id: &str,
        node: Option<&str>,
        resolve: &dyn DriverResolver,
    ) -> Result<usize, LifecycleError> {
        let records = &self.controller_records;
        let attached = |record: &crate::controller_records::ControllerRecord| -> Vec<String> {
            match node {
                Some(node) if record.attachments.contains_key(node) => vec![node.to_owned()],
                Some(_) => Vec::new(),
                None => record.attachments.keys().cloned().collect(),
            }
        };
        // Nothing recorded and no call in flight: nothing of ours to undo, as of this read.
        match records.read(driver, volume_id)? {
            None => return Ok(0),
            Some(stored)
                if stored.record.fence.is_none() && attached(&stored.record).is_empty() =>
            {
                return Ok(0)
            }
            Some(_) => {}
        }
        let operation = match node {
            Some(node) => format!("detach from {node}"),
            None => "detach from every node".to_owned(),
        };
        let fence = records.fence(driver, volume_id, &operation)?;
        let mut detached = 0;
        for node in attached(&fence.record()) {
            let key = self.attachment_key(driver, volume_id, &node)?;
            let key_lock = self.state.lock(&key)?;
            let lc = &self.fenced(&[&key_lock], &fence);
            let Some(record) = fence.record().attachments.get(&node).cloned() else {
                continue;
            };
            if record.role != Role::Attach {
                return Err(LifecycleError::WrongRole {
                    target: key,
                    expected: Role::Attach,
                    found: record.role,
                });
            }
            let plugin = plugin_of(resolve, &record)?;
            attacher::detach(lc, &plugin, &record.detach_name, &record.node)?;
            detached += 1;
            // The last detach's record goes with the fence, in one write.
            if fence.record().attachments.len() > 1 {
                fence.update(|r| {
                    r.attachments.remove(&node);
                })?;
            } else {
                return fence
                    .release_with(|r| {
                        r.attachments.remove(&node);
                    })
                    .map(|()| detached)
                    .map_err(Into::into);
            }
        }
        fence.release()?;
        Ok(detached)
    }

    /// Tears down what the record of `target` says was done.
    fn teardown(
        &self,
        target: &Path,
        resolve: &dyn DriverResolver,
        expect: Expect<'_>,
    ) -> Result<UnmountOutcome, LifecycleError> {
        let target = &safe_path::check(target)?;
        let target_lock = self.state.lock(target)?;
        let lc = &self.holding(&[&target_lock]);
        let Some(record) = lc.state.load(target)? else {
            // Not ours: nothing to undo. A path that does not exist or is not mounted is fine.
            return Ok(UnmountOutcome {
                target: target.clone(),
                managed: false,
                unmounted_device: false,
                detached: false,
            });
        };
        if let Some(expected) = expect.role.filter(|e| *e != record.role) {
            return Err(LifecycleError::WrongRole {
                target: target.clone(),
                expected,
                found: record.role,
            });
        }
        if let Some(requested) = expect.volume.filter(|v| *v != record.volume_name) {
            return Err(LifecycleError::TargetInUse {
                target: target.clone(),
                found: record.volume_name.clone(),
                requested: requested.to_owned(),
            });
        }
        if record.role != Role::Attach {
            // A path that became a symlink (or a file) is not where flexd mounted: refused, the
            // record kept, rather than unmounting or removing whatever it now leads to.
            safe_path::look(target)?;
        }
        if record.role == Role::Stage {
            let users: Vec<_> = lc
                .state
                .list()?
                .into_iter()
                .flatten()
                .filter(|r| r.role == Role::Publish && r.staging.as_deref() == Some(target))
                .map(|r| r.target)
                .collect();
            if !users.is_empty() {
                return Err(LifecycleError::StagingInUse {
                    staging: target.clone(),
                    targets: users,
                });
            }
        }
        let plugin = plugin_of(resolve, &record)?;
        let mut outcome = UnmountOutcome {
            target: target.clone(),
            managed: true,
            unmounted_device: false,
            detached: false,
        };
        match record.role {
            Role::Mount => {}
            Role::Publish => {
                unmount_target(lc, &plugin, &record)?;
                lc.state.remove(target)?;
                return Ok(outcome);
            }
            Role::Stage => {
                attacher::unmount_device_keep_dir(lc, &plugin, target)?;
                target::remove_created(&record);
                outcome.unmounted_device = true;
                lc.state.remove(target)?;
                return Ok(outcome);
            }
            Role::Attach => {
                outcome.detached =
                    attacher::detach(lc, &plugin, &record.detach_name, &record.node)?;
                lc.state.remove(target)?;
                return Ok(outcome);
            }
        }
        unmount_target(lc, &plugin, &record)?;
        if let (true, Some(device_dir)) = (record.attachable, record.staging.as_ref()) {
            let device_lock = lc.state.lock(device_dir)?;
            let lc = &lc.holding(&[&device_lock]);
            let others = lc
                .state
                .list()?
                .into_iter()
                .flatten()
                .filter(|r| r.target != record.target && r.staging.as_ref() == Some(device_dir))
                .count();
            if others == 0 {
                attacher::unmount_device(lc, &plugin, device_dir)?;
                outcome.unmounted_device = true;
                outcome.detached =
                    attacher::detach(lc, &plugin, &record.detach_name, &record.node)?;
            }
        }
        lc.state.remove(target)?;
        Ok(outcome)
    }
}

/// The driver's unmount of the record's target (default: plain unmount), then the directory
/// flexd created. Whatever the stage: a crash after the mount but before its last record must
/// not leak it.
fn unmount_target(
    lc: &Lifecycle,
    plugin: &Plugin,
    record: &VolumeRecord,
) -> Result<(), LifecycleError> {
    let target = record.target.as_path();
    attacher::unmount_with(lc, plugin, target, &CallOut::unmount(target))?;
    target::remove_created(record);
    Ok(())
}
