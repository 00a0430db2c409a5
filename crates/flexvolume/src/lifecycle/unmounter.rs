//! TearDown: unmount a target, and when it was the device's last one, unmount the device and
//! detach.

use std::path::Path;

use super::attacher;
use super::{Lifecycle, LifecycleError, UnmountOutcome};
use crate::mount;
use crate::plugin::Plugin;
use crate::protocol::CallOut;
use crate::state::{Role, VolumeRecord};

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

/// Tears down what the record of `target` says was done; `expected` refuses a record of
/// another role (a CSI unpublish must not unstage).
pub fn teardown(
    lc: &Lifecycle,
    target: &Path,
    resolve: &dyn DriverResolver,
    expected: Option<Role>,
) -> Result<UnmountOutcome, LifecycleError> {
    let target_lock = lc.state.lock(target)?;
    let lc = &lc.holding(&[&target_lock]);
    let Some(record) = lc.state.load(target)? else {
        // Not ours: nothing to undo. A path that does not exist or is not mounted is fine.
        return Ok(UnmountOutcome {
            target: target.to_owned(),
            managed: false,
            unmounted_device: false,
            detached: false,
        });
    };
    if let Some(expected) = expected.filter(|e| *e != record.role) {
        return Err(LifecycleError::WrongRole {
            target: target.to_owned(),
            expected,
            found: record.role,
        });
    }
    let plugin = plugin_of(resolve, &record)?;
    let mut outcome = UnmountOutcome {
        target: target.to_owned(),
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
            remove_created_dir(&record);
            outcome.unmounted_device = true;
            lc.state.remove(target)?;
            return Ok(outcome);
        }
        Role::Attach => {
            outcome.detached = attacher::detach(lc, &plugin, &record.detach_name, &record.node)?;
            lc.state.remove(target)?;
            return Ok(outcome);
        }
    }
    unmount_target(lc, &plugin, &record)?;
    if let (true, Some(device_dir)) = (record.attachable, record.device_mount_dir.as_ref()) {
        let device_lock = lc.state.lock(device_dir)?;
        let lc = &lc.holding(&[&device_lock]);
        let others = lc
            .state
            .list()?
            .into_iter()
            .flatten()
            .filter(|r| {
                r.target != record.target && r.device_mount_dir.as_ref() == Some(device_dir)
            })
            .count();
        if others == 0 {
            attacher::unmount_device(lc, &plugin, device_dir)?;
            outcome.unmounted_device = true;
            outcome.detached = attacher::detach(lc, &plugin, &record.detach_name, &record.node)?;
        }
    }
    lc.state.remove(target)?;
    Ok(outcome)
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
    if target.exists() && mount::is_mount_point(target)? {
        match plugin.call(&lc.runner, &CallOut::unmount(target)) {
            Ok(_) => {}
            Err(e) if e.is_not_supported() => mount::unmount(target)?,
            Err(e) => return Err(e.into()),
        }
        if mount::is_mount_point(target)? {
            mount::unmount(target)?;
        }
    }
    remove_created_dir(record);
    Ok(())
}

fn remove_created_dir(record: &VolumeRecord) {
    if record.created_target {
        let target = &record.target;
        match std::fs::remove_dir(target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(target = %target.display(), error = %e, "target directory left in place")
            }
        }
    }
}
