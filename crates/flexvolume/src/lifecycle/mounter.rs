//! SetUp: mount a volume on its target (the whole flow, or CSI's publish step).

use std::path::Path;

use super::attacher;
use super::target::{self, AtPath};
use super::{Lifecycle, LifecycleError, MountOutcome, MountRequest};
use crate::mount::{self, safe_path};
use crate::options::Options;
use crate::protocol::CallOut;
use crate::state::{Role, Stage, VolumeRecord};

impl Lifecycle {
    /// Attach (when the driver attaches), mount the device, mount the target.
    pub fn mount(&self, request: &MountRequest<'_>) -> Result<MountOutcome, LifecycleError> {
        let target = &safe_path::check(request.target)?;
        let req = &MountRequest { target, ..*request };
        self.refuse_overlaps(target, &[], &[Role::Stage])?;
        let target_lock = self.state.lock(target)?;
        let lc = &self.holding(&[&target_lock]);
        let existing = lc.state.load(target)?;
        if let Some(record) = &existing {
            target::same_volume(record, Role::Mount, req.spec, None)?;
        }
        let at = target::inspect(target)?;
        if at == AtPath::Mounted {
            let Some(record) = existing else {
                return Err(LifecycleError::ForeignMount {
                    target: target.clone(),
                    volume: req.spec.volume_name.clone(),
                });
            };
            tracing::debug!(target = %target.display(), "already mounted");
            let ownership = finish_set_up(lc, req, &record)?;
            return Ok(MountOutcome {
                target: target.clone(),
                mounted_now: false,
                device: record.device,
                device_mount_dir: record.device_mount_dir,
                formatted: false,
                ownership,
            });
        }
        let plugin = req.plugin;
        let spec = req.spec;
        let attachable = plugin.capabilities.attach;
        // A retry after a crash knows whether the first attempt created the target.
        let created_target = match &existing {
            Some(record) => record.created_target,
            None => at == AtPath::Absent,
        };
        let pinned = lc.state.pin(&spec.driver.dir_name(), &plugin.driver.path)?;
        let device_dir = lc.device_mount_dir(&spec.driver, &spec.volume_name)?;
        let mut record = VolumeRecord {
            target: target.clone(),
            driver: spec.driver.clone(),
            volume_name: spec.volume_name.clone(),
            fs_type: spec.fs_type.clone(),
            read_only: spec.read_only,
            options: spec.options.clone(),
            attachable,
            node: lc.node.clone(),
            device: None,
            device_mount_dir: attachable.then(|| device_dir.clone()),
            detach_name: spec.volume_name.replace('/', "~"),
            pinned: Some(pinned),
            created_target,
            stage: Stage::Mounting,
            role: Role::Mount,
        };
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
                let detach_name = attacher::detach_name(lc, plugin, spec)?;
                if detach_name != record.detach_name {
                    record.detach_name = detach_name;
                    lc.state.save(&record)?;
                }
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
        match result {
            Ok((formatted, ownership)) => {
                record.stage = Stage::Mounted;
                lc.state.save(&record)?;
                Ok(MountOutcome {
                    target: target.clone(),
                    mounted_now: true,
                    device: record.device,
                    device_mount_dir: record.device_mount_dir,
                    formatted,
                    ownership,
                })
            }
            Err(e) => {
                let target_mounted = target::still_mounted(target);
                // An attached volume keeps its record so that unmount can detach it; a plain
                // one that the failed mount left unmounted has nothing to undo.
                let keep_for_detach = attachable && side_effects;
                if !target_mounted && !keep_for_detach {
                    let _ = lc.state.remove(target);
                }
                if !target_mounted {
                    target::remove_created(&record);
                }
                Err(e)
            }
        }
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
        let existing = lc.state.load(target)?;
        if let Some(record) = &existing {
            target::same_volume(record, Role::Publish, req.spec, Some(staging))?;
        }
        let staged_device = || {
            staging
                .and_then(|s| lc.state.load(s).ok().flatten())
                .and_then(|r| r.device)
        };
        let at = target::inspect(target)?;
        if at == AtPath::Mounted {
            let Some(record) = existing else {
                return Err(LifecycleError::ForeignMount {
                    target: target.clone(),
                    volume: req.spec.volume_name.clone(),
                });
            };
            tracing::debug!(target = %target.display(), "already published");
            let ownership = finish_set_up(lc, req, &record)?;
            return Ok(MountOutcome {
                target: target.clone(),
                mounted_now: false,
                device: staged_device(),
                device_mount_dir: staging.map(Path::to_owned),
                formatted: false,
                ownership,
            });
        }
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
        let created_target = match &existing {
            Some(record) => record.created_target,
            None => at == AtPath::Absent,
        };
        let pinned = lc.state.pin(&spec.driver.dir_name(), &plugin.driver.path)?;
        let mut record = VolumeRecord {
            target: target.clone(),
            driver: spec.driver.clone(),
            volume_name: spec.volume_name.clone(),
            fs_type: spec.fs_type.clone(),
            read_only: spec.read_only,
            options: spec.options.clone(),
            attachable: plugin.capabilities.attach,
            node: lc.node.clone(),
            device: staged_device(),
            device_mount_dir: staging.map(Path::to_owned),
            detach_name: spec.volume_name.replace('/', "~"),
            pinned: Some(pinned),
            created_target,
            stage: Stage::Mounting,
            role: Role::Publish,
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
        match result {
            Ok(ownership) => {
                record.stage = Stage::Mounted;
                lc.state.save(&record)?;
                Ok(MountOutcome {
                    target: target.clone(),
                    mounted_now: true,
                    device: record.device,
                    device_mount_dir: record.device_mount_dir,
                    formatted: false,
                    ownership,
                })
            }
            Err(e) => {
                // A mounted target (e.g. a failed ownership pass) keeps its record: a retry
                // finishes it, an unpublish undoes it.
                if !target::still_mounted(target) {
                    let _ = lc.state.remove(target);
                    target::remove_created(&record);
                }
                Err(e)
            }
        }
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
    match req
        .plugin
        .call(&lc.runner, &CallOut::mount(req.target, &options))
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_supported() => {
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
        }
        Err(e) => Err(e.into()),
    }
}

/// SetUp(fsGroup): after a successful read-write mount, and when the driver's capabilities
/// allow it, the volume is made group-owned by the pod's fsGroup (as kubelet does for
/// FlexVolume; a read-only mount is left alone). The driver also gets the fsGroup as
/// `kubernetes.io/mounterArgs.FsGroup`, for drivers that apply it themselves with
/// `fsGroup: false`.
/// For a target that is already mounted: a crash (or a failed ownership pass) between the
/// mount and its last record leaves the stage behind; finish SetUp, then record it.
fn finish_set_up(
    lc: &Lifecycle,
    req: &MountRequest<'_>,
    record: &VolumeRecord,
) -> Result<Option<crate::ownership::OwnershipReport>, LifecycleError> {
    if record.stage == Stage::Mounted {
        return Ok(None);
    }
    let ownership = set_up_ownership(req)?;
    lc.state.save(&VolumeRecord {
        stage: Stage::Mounted,
        ..record.clone()
    })?;
    Ok(ownership)
}

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
