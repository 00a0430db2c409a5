//! SetUp: mount a volume on its target (the whole flow, or CSI's publish step).

use std::path::Path;

use super::attacher;
use super::target::{self, Found};
use super::{Lifecycle, LifecycleError, MountOutcome, MountRequest};
use crate::state::{Progress, Role, VolumeRecord};
use flexvolume_os::mount::{self, safe_path};
use flexvolume_protocol::options::Options;
use flexvolume_protocol::CallOut;

impl Lifecycle {
    /// Attach (when the driver attaches), mount the device, mount the target.
    pub fn mount(&self, request: &MountRequest<'_>) -> Result<MountOutcome, LifecycleError> {
        let target = &safe_path::check(request.target)?;
        let req = &MountRequest { target, ..*request };
        self.refuse_overlaps(target, &[], &[Role::Stage])?;
        let target_lock = self.state.lock(target)?;
        let lc = &self.holding(&[&target_lock]);
        let created_target = match target::find(lc, target, Role::Mount, req.spec, None)? {
            Found::Mounted(record) => {
                tracing::debug!(target = %target.display(), "already mounted");
                let (device, dir) = (record.device.clone(), record.staging.clone());
                return already_mounted(lc, req, &record, device, dir);
            }
            Found::Unmounted { created_target } => created_target,
        };
        let plugin = req.plugin;
        let spec = req.spec;
        let attachable = plugin.capabilities.attach;
        let mut record = target::new_record(lc, plugin, spec, target, Role::Mount, created_target)?;
        let device_dir = lc.device_staging(&spec.driver, &spec.volume_name)?;
        record.staging = attachable.then(|| device_dir.clone());
        // Written ahead of every effect (the target directory, the attach, the mounts): a crash
        // at any point from here leaves a record from which unmount undoes whatever was done.
        lc.state.save(&record)?;
        // Whether anything was done that teardown must undo (an attach, a mount).
        let mut side_effects = false;
        let result = (|| {
            target::create(target)?;
            let mut formatted = false;
            if attachable {
                let device_lock = lc.state.lock(&device_dir)?;
                let lc = &lc.holding(&[&device_lock]);
                attacher::get_volume_name(lc, plugin, spec)?;
                side_effects = true;
                let device = attacher::attach_and_wait(lc, plugin, spec)?;
                formatted = attacher::mount_device(lc, plugin, spec, &device, &device_dir)?;
                record.device = Some(device).filter(|d| !d.is_empty());
                lc.state.save(&record)?;
            }
            side_effects = true;
            mount_target(lc, req, &device_dir)?;
            // Before the record says Mounted: a pass cut short is redone by the next mount.
            let ownership = set_up_ownership(req)?;
            Ok((formatted, ownership))
        })();
        // An attached volume keeps its record so that unmount can detach it.
        let keep_for_detach = attachable && side_effects;
        let (formatted, ownership) = target::finish(lc, &mut record, result, keep_for_detach)?;
        Ok(MountOutcome {
            target: target.clone(),
            mounted_now: true,
            device: record.device,
            staging: record.staging,
            formatted,
            ownership,
        })
    }

    /// CSI NodePublish: the driver's mount onto the target or, when it does not support mount,
    /// a bind of the staging path (an attachable driver's device mount); then the ownership
    /// pass. Recorded ahead of every effect; a mounted target of this volume is not mounted
    /// again.
    pub fn publish(
        &self,
        request: &MountRequest<'_>,
        staging: Option<&Path>,
    ) -> Result<MountOutcome, LifecycleError> {
        let target = &safe_path::check(request.target)?;
        let staging = staging.map(safe_path::check).transpose()?;
        let staging = staging.as_deref();
        let req = &MountRequest { target, ..*request };
        let others: Vec<_> = staging
            .map(|s| ("the staging path", s))
            .into_iter()
            .collect();
        self.refuse_overlaps(target, &others, &[Role::Stage])?;
        let target_lock = self.state.lock(target)?;
        let lc = &self.holding(&[&target_lock]);
        let staged_device = || {
            staging
                .and_then(|s| lc.state.load(s).ok().flatten())
                .and_then(|r| r.device)
        };
        let found = target::find(lc, target, Role::Publish, req.spec, Some(staging))?;
        let created_target = match found {
            Found::Mounted(record) => {
                tracing::debug!(target = %target.display(), "already published");
                let dir = staging.map(Path::to_owned);
                return already_mounted(lc, req, &record, staged_device(), dir);
            }
            Found::Unmounted { created_target } => created_target,
        };
        if let Some(staging) = staging {
            // Binding a staging path nothing was staged on would publish an empty directory.
            if lc
                .state
                .load(staging)?
                .is_none_or(|r| r.role != Role::Stage)
            {
                return Err(LifecycleError::NotStaged {
                    staging: staging.to_owned(),
                });
            }
        }
        let plugin = req.plugin;
        let spec = req.spec;
        let mut record = VolumeRecord {
            device: staged_device(),
            staging: staging.map(Path::to_owned),
            ..target::new_record(lc, plugin, spec, target, Role::Publish, created_target)?
        };
        // Written ahead of the target directory and the mount: a crash from here on leaves a
        // record from which unpublish undoes whatever was done.
        lc.state.save(&record)?;
        let result = (|| {
            target::create(target)?;
            // No staging path: the default (a bind) has nothing to bind, and says so.
            mount_target(lc, req, staging.unwrap_or(Path::new("")))?;
            set_up_ownership(req)
        })();
        // A mounted target (e.g. a failed ownership pass) keeps its record.
        let ownership = target::finish(lc, &mut record, result, false)?;
        Ok(MountOutcome {
            target: target.clone(),
            mounted_now: true,
            device: record.device,
            staging: record.staging,
            formatted: false,
            ownership,
        })
    }
}

/// The driver's mount; default: bind mount of the device mount dir (read-only bind for a
/// read-only volume).
fn mount_target(
    lc: &Lifecycle,
    req: &MountRequest<'_>,
    device_dir: &Path,
) -> Result<(), LifecycleError> {
    let options = Options::for_mount(req.spec, req.pod, req.fs_group);
    let default = || {
        if safe_path::open_dir(device_dir).ok().flatten().is_none() {
            return Err(LifecycleError::NoDevice {
                volume: req.spec.volume_name.clone(),
            });
        }
        Ok(mount::bind_mount(
            device_dir,
            req.target,
            req.spec.read_only,
        )?)
    };
    let call = CallOut::mount(req.target, &options);
    attacher::answer_or_else(lc, req.plugin, &call, default, |_| ())
}

/// A target already mounted with this volume is not mounted again; but a crash (or a failed
/// ownership pass) between the mount and its last record leaves the stage behind: SetUp is
/// finished, then recorded.
fn already_mounted(
    lc: &Lifecycle,
    req: &MountRequest<'_>,
    record: &VolumeRecord,
    device: Option<String>,
    staging: Option<std::path::PathBuf>,
) -> Result<MountOutcome, LifecycleError> {
    let ownership = match record.progress {
        Progress::Mounted => None,
        _ => {
            let ownership = set_up_ownership(req)?;
            target::mark_mounted(lc, record)?;
            ownership
        }
    };
    Ok(MountOutcome {
        target: req.target.to_owned(),
        mounted_now: false,
        device,
        staging,
        formatted: false,
        ownership,
    })
}

/// SetUp(fsGroup): after a successful read-write mount, and when the driver's capabilities
/// allow it, the volume is made group-owned by the pod's fsGroup (as kubelet does for
/// FlexVolume; a read-only mount is left alone). The driver also gets the fsGroup as
/// `kubernetes.io/mounterArgs.FsGroup`, for drivers that apply it themselves with
/// `fsGroup: false`.
fn set_up_ownership(
    req: &MountRequest<'_>,
) -> Result<Option<crate::ownership::OwnershipReport>, LifecycleError> {
    let Some(gid) = req.fs_group else {
        return Ok(None);
    };
    if req.spec.read_only || !req.plugin.capabilities.fs_group {
        return Ok(None);
    }
    let request = crate::ownership::OwnershipRequest {
        root: req.target,
        gid,
        policy: req.fs_group_policy,
        read_only: false,
        threads: 0,
    };
    crate::ownership::apply(&request, &crate::ownership::Counters::default())
        .map(Some)
        .map_err(|source| LifecycleError::Ownership {
            target: req.target.to_owned(),
            source,
        })
}
