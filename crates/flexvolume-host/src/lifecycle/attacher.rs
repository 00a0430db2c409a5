//! Attach side: attach → waitforattach → mountdevice, and back: unmountdevice → detach.
//! Each with kubelet's default when the driver answers `Not supported`.

use std::path::Path;

use super::{Lifecycle, LifecycleError};
use crate::plugin::Plugin;
use crate::runner::CallError;
use flexvolume_os::mount;
use flexvolume_protocol::options::Options;
use flexvolume_protocol::spec::VolumeSpec;
use flexvolume_protocol::{CallOut, Reply};

impl Lifecycle {
    /// Attaches a volume to `node`, as the controller manager does; returns the device ("" when
    /// the driver does not know it yet, or does not attach: the default).
    pub fn attach(
        &self,
        plugin: &Plugin,
        spec: &VolumeSpec,
        node: &str,
    ) -> Result<String, LifecycleError> {
        let call = CallOut::attach(&Options::for_volume(spec), node);
        answer_or(self, plugin, &call, String::new(), |reply| {
            reply.device.unwrap_or_default()
        })
    }

    /// Whether a volume is attached to `node`. Default: attached (kubelet assumes so).
    pub fn is_attached(
        &self,
        plugin: &Plugin,
        spec: &VolumeSpec,
        node: &str,
    ) -> Result<bool, LifecycleError> {
        Ok(self.attached_answer(plugin, spec, node)?.unwrap_or(true))
    }

    /// What the driver's `isattached` answers for a volume on `node`, with no default: `None`
    /// when it answers `Not supported`, so that the caller can tell the driver's "attached"
    /// from Kubernetes' assumption (CSI ListVolumes keeps a recorded node either way, but only
    /// the driver's word makes an unfinished attachment published).
    pub fn attached_answer(
        &self,
        plugin: &Plugin,
        spec: &VolumeSpec,
        node: &str,
    ) -> Result<Option<bool>, LifecycleError> {
        let call = CallOut::is_attached(&Options::for_volume(spec), node);
        answer_or(self, plugin, &call, None, |reply| {
            Some(reply.attached.unwrap_or(false))
        })
    }

    /// Detaches a volume from `node` under the name kubelet gives detach: the volume's own
    /// ([`get_volume_name`] runs first). Returns that name and whether the driver's detach ran.
    pub fn detach(
        &self,
        plugin: &Plugin,
        spec: &VolumeSpec,
        node: &str,
    ) -> Result<(String, bool), LifecycleError> {
        get_volume_name(self, plugin, spec)?;
        let name = spec.volume_name.clone();
        let ran = detach(self, plugin, &name, node)?;
        Ok((name, ran))
    }
}

/// A call-out's answer, or what `default` does when the driver answers `Not supported`
/// (kubelet's rule for every call-out with a default).
pub(super) fn answer_or_else<T>(
    lc: &Lifecycle,
    plugin: &Plugin,
    call: &CallOut,
    default: impl FnOnce() -> Result<T, LifecycleError>,
    answer: impl FnOnce(Reply) -> T,
) -> Result<T, LifecycleError> {
    match plugin.call(&lc.runner, call) {
        Ok(reply) => Ok(answer(reply)),
        Err(e) if e.is_not_supported() => default(),
        Err(e) => Err(e.into()),
    }
}

/// [`answer_or_else`] with a default value.
fn answer_or<T>(
    lc: &Lifecycle,
    plugin: &Plugin,
    call: &CallOut,
    default: T,
    answer: impl FnOnce(Reply) -> T,
) -> Result<T, LifecycleError> {
    answer_or_else(lc, plugin, call, || Ok(default), answer)
}

/// Attaches the volume to this node and waits for its device. Defaults: attach → device "";
/// waitforattach → the device attach gave.
pub(crate) fn attach_and_wait(
    lc: &Lifecycle,
    plugin: &Plugin,
    spec: &VolumeSpec,
) -> Result<String, LifecycleError> {
    let device = lc.attach(plugin, spec, &lc.node)?;
    wait_for_attach(lc, plugin, spec, device)
}

/// Waits for the device attach gave (CSI: the one in the publish context) to appear on this
/// node. Default: that device.
pub fn wait_for_attach(
    lc: &Lifecycle,
    plugin: &Plugin,
    spec: &VolumeSpec,
    device: String,
) -> Result<String, LifecycleError> {
    let call = CallOut::wait_for_attach(&device, &Options::for_volume(spec));
    answer_or(lc, plugin, &call, device.clone(), |reply| {
        reply.device.filter(|d| !d.is_empty()).unwrap_or(device)
    })
}

/// Mounts the device on the device mount dir unless it is mounted already. Default: nothing
/// for an empty device; else format-if-unformatted and mount. Returns whether it formatted.
pub fn mount_device(
    lc: &Lifecycle,
    plugin: &Plugin,
    spec: &VolumeSpec,
    device: &str,
    dir: &Path,
) -> Result<bool, LifecycleError> {
    super::target::create(dir)?;
    if mount::is_mount_point(dir)? {
        return Ok(false);
    }
    let call = CallOut::mount_device(dir, device, &Options::for_volume(spec));
    let default = || {
        if device.is_empty() {
            return Ok(false);
        }
        let fs_type = &spec.fs_type;
        Ok(mount::format_and_mount(
            Path::new(device),
            dir,
            fs_type,
            spec.read_only,
        )?)
    };
    answer_or_else(lc, plugin, &call, default, |_| false)
}

/// Runs getvolumename, as kubelet does before it attaches or detaches: a failure fails the
/// operation, the answer is not used. kubelet ignores it ("GetVolumeName is not supported yet",
/// pkg/volume/flexvolume since v1.8) and gives detach the volume's own name (the PV's), and so
/// does flexd: drivers in the field were written against that (`docs/lifecycle.md#detach-name`,
/// found by the e2e oracle scenario, docs/oracle.md).
pub fn get_volume_name(
    lc: &Lifecycle,
    plugin: &Plugin,
    spec: &VolumeSpec,
) -> Result<(), LifecycleError> {
    let call = CallOut::get_volume_name(&Options::for_volume(spec));
    answer_or(lc, plugin, &call, (), |_| ())
}

/// Unmounts the device mount dir (default: plain unmount) and removes it.
pub fn unmount_device(lc: &Lifecycle, plugin: &Plugin, dir: &Path) -> Result<(), LifecycleError> {
    unmount_device_keep_dir(lc, plugin, dir)?;
    flexvolume_os::mount::safe_path::remove_dir(dir)?;
    Ok(())
}

/// Unmounts the device mount dir (default: plain unmount), leaving the directory: a CSI
/// staging path belongs to the CO unless flexd created it.
pub(crate) fn unmount_device_keep_dir(
    lc: &Lifecycle,
    plugin: &Plugin,
    dir: &Path,
) -> Result<(), LifecycleError> {
    unmount_with(lc, plugin, dir, &CallOut::unmount_device(dir))
}

/// The driver's `call` (unmount or unmountdevice) of what is mounted at `path`, default: plain
/// unmount. A driver that said Success but left it mounted is not trusted blindly: the mount
/// is unmounted then.
pub(super) fn unmount_with(
    lc: &Lifecycle,
    plugin: &Plugin,
    path: &Path,
    call: &CallOut,
) -> Result<(), LifecycleError> {
    if mount::is_mount_point(path)? {
        answer_or_else(lc, plugin, call, || Ok(mount::unmount(path)?), |_| ())?;
        if mount::is_mount_point(path)? {
            mount::unmount(path)?;
        }
    }
    Ok(())
}

/// Detaches the volume (by its detach name) from `node`. Default: success. Returns whether the
/// driver's detach ran.
pub fn detach(
    lc: &Lifecycle,
    plugin: &Plugin,
    name: &str,
    node: &str,
) -> Result<bool, LifecycleError> {
    match plugin.call(&lc.runner, &CallOut::detach(name, node)) {
        Ok(_) => Ok(true),
        Err(CallError::NotSupported { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
