//! Volume expansion: `expandvolume` (grow the volume on the storage side) then `expandfs` (grow
//! the filesystem on the node), each with Kubernetes' default when the driver does not support
//! it: expandvolume answers the requested size, expandfs grows the filesystem on the device
//! (`resize2fs` / `xfs_growfs`).

use std::path::Path;

use super::attacher::answer_or_else;
use super::{Lifecycle, LifecycleError};
use crate::plugin::Plugin;
use crate::state::VolumeRecord;
use flexvolume_os::mount;
use flexvolume_protocol::options::Options;
use flexvolume_protocol::CallOut;

/// What an expansion did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ExpandOutcome {
    pub target: std::path::PathBuf,
    pub old_bytes: u64,
    /// The size the volume has now, as expandvolume reported it (or the requested size).
    pub new_bytes: u64,
    /// Whether the driver's expandfs ran (false: the default grew the filesystem).
    pub driver_expanded_fs: bool,
}

/// The size of the filesystem mounted at `dir`, as the old size the call-outs receive.
pub(crate) fn filesystem_bytes(dir: &Path) -> Result<u64, LifecycleError> {
    let stat = rustix::fs::statvfs(dir).map_err(|e| LifecycleError::Io {
        path: dir.to_owned(),
        source: e.into(),
    })?;
    Ok(stat.f_blocks.saturating_mul(stat.f_frsize))
}

/// How much of an expansion flexd does: FlexVolume has one call for both steps, CSI splits
/// them between the controller (the volume) and the node (the filesystem).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expansion {
    /// expandvolume, then expandfs (`flexd volume expand`).
    VolumeThenFilesystem,
    /// expandfs only: CSI NodeExpandVolume, whose controller side grew the volume already.
    FilesystemOnly,
}

impl Lifecycle {
    /// Grows the volume recorded at `target` (a mounted target, a staging path or a published
    /// target) to `new_bytes`: the steps `expansion` names, each with its default.
    pub fn expand(
        &self,
        target: &Path,
        new_bytes: u64,
        expansion: Expansion,
        resolve: &dyn super::DriverResolver,
    ) -> Result<ExpandOutcome, LifecycleError> {
        self.with_managed(target, resolve, |lc, plugin, record| {
            grow(lc, plugin, record, new_bytes, expansion)
        })
    }
}

/// The steps of `expansion` on the device mount dir of an attachable volume, the target itself
/// otherwise.
fn grow(
    lc: &Lifecycle,
    plugin: &Plugin,
    record: &VolumeRecord,
    new_bytes: u64,
    expansion: Expansion,
) -> Result<ExpandOutcome, LifecycleError> {
    let options = match expansion {
        Expansion::FilesystemOnly => None,
        Expansion::VolumeThenFilesystem => Some(Options::for_volume(&record.spec()?)),
    };
    let dir = record
        .staging
        .clone()
        .unwrap_or_else(|| record.target.clone());
    let old_bytes = filesystem_bytes(&dir)?;
    let new_bytes = match options {
        None => new_bytes,
        Some(options) => {
            let call = CallOut::expand_volume(&options, &dir, new_bytes, old_bytes);
            answer_or_else(
                lc,
                plugin,
                &call,
                || Ok(new_bytes),
                |reply| reply.volume_new_size.unwrap_or(new_bytes),
            )?
        }
    };
    let driver_expanded_fs = expand_fs(lc, plugin, record, &dir, new_bytes, old_bytes)?;
    Ok(ExpandOutcome {
        target: record.target.clone(),
        old_bytes,
        new_bytes,
        driver_expanded_fs,
    })
}

/// The driver's expandfs; default: grow the filesystem on the device. Returns whether the
/// driver did it.
fn expand_fs(
    lc: &Lifecycle,
    plugin: &Plugin,
    record: &VolumeRecord,
    dir: &Path,
    new_bytes: u64,
    old_bytes: u64,
) -> Result<bool, LifecycleError> {
    let options = Options::for_volume(&record.spec()?);
    let device = record.device.clone().unwrap_or_default();
    let call = CallOut::expand_fs(&options, &device, dir, new_bytes, old_bytes);
    let default = || {
        if device.is_empty() {
            return Err(LifecycleError::NoDevice {
                volume: record.volume_name.clone(),
            });
        }
        mount::grow_filesystem(Path::new(&device), dir)?;
        Ok(false)
    };
    answer_or_else(lc, plugin, &call, default, |_| true)
}
