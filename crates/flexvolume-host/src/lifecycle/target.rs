//! What every operation checks about its path before it touches anything: the path itself
//! (checked and normalized, never through a symlink), that it does not overlap flexd's state
//! dir or another role's path, and that a path already in use holds this same volume.

use std::path::{Path, PathBuf};

use super::{Lifecycle, LifecycleError};
use crate::plugin::Plugin;
use crate::state::{Progress, Role, VolumeRecord};
use flexvolume_os::mount::{self, safe_path};
use flexvolume_protocol::spec::VolumeSpec;

/// What is at a path, found without following symlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AtPath {
    Absent,
    Directory,
    Mounted,
}

/// What is at `path`; a symlink anywhere in it, or a non-directory, is an error. Looked at, not
/// opened (see [`safe_path::look`]): a descriptor of a mounted target would hold it busy.
pub(super) fn inspect(path: &Path) -> Result<AtPath, LifecycleError> {
    match safe_path::look(path)? {
        None => Ok(AtPath::Absent),
        Some(entry) => {
            let mounted = entry
                .require_dir()?
                .is_mount_root()
                .map_err(super::io_err(path))?;
            Ok(if mounted {
                AtPath::Mounted
            } else {
                AtPath::Directory
            })
        }
    }
}

/// Creates the directory at `path` (a checked one) without following symlinks.
pub(super) fn create(path: &Path) -> Result<(), LifecycleError> {
    safe_path::create_dir(path)?;
    Ok(())
}

/// Removes the directory flexd created for a record, logging (not failing) when it cannot.
pub(super) fn remove_created(record: &VolumeRecord) {
    if record.created_target {
        if let Err(e) = safe_path::remove_dir(&record.target) {
            tracing::warn!(target = %record.target.display(), error = %e, "target directory left in place");
        }
    }
}

/// What a set-up (mount, publish, stage) finds at its checked, locked path.
pub(super) enum Found {
    /// This same volume is mounted there already (its record may not say so yet).
    Mounted(Box<VolumeRecord>),
    /// Nothing is mounted there; whether the directory is (or is to be) flexd's own.
    Unmounted { created_target: bool },
}

/// What is at `path` for a set-up of `spec` in `role`: a record there must be this same
/// volume's (see [`same_volume`]), and a mount there without a record is someone else's.
pub(super) fn find(
    lc: &Lifecycle,
    path: &Path,
    role: Role,
    spec: &VolumeSpec,
    staging: Option<Option<&Path>>,
) -> Result<Found, LifecycleError> {
    let existing = lc.state.load(path)?;
    if let Some(record) = &existing {
        same_volume(record, role, spec, staging)?;
    }
    let at = inspect(path)?;
    match existing {
        Some(record) if at == AtPath::Mounted => Ok(Found::Mounted(Box::new(record))),
        None if at == AtPath::Mounted => Err(LifecycleError::ForeignMount {
            target: path.to_owned(),
            volume: spec.volume_name.clone(),
        }),
        // A retry after a crash knows whether the first attempt created the directory.
        Some(record) => Ok(Found::Unmounted {
            created_target: record.created_target,
        }),
        None => Ok(Found::Unmounted {
            created_target: at == AtPath::Absent,
        }),
    }
}

/// The record a set-up writes ahead of its first effect: the volume's settings, this node, the
/// driver pinned for teardown, no device yet, stage Mounting. Callers override what their role
/// knows better (the device, the device mount dir, the detach name).
pub(super) fn new_record(
    lc: &Lifecycle,
    plugin: &Plugin,
    spec: &VolumeSpec,
    path: &Path,
    role: Role,
    created_target: bool,
) -> Result<VolumeRecord, LifecycleError> {
    let pinned = lc.state.pin(&spec.driver.dir_name(), &plugin.driver.path)?;
    Ok(VolumeRecord {
        target: path.to_owned(),
        driver: spec.driver.clone(),
        volume_name: spec.volume_name.clone(),
        fs_type: spec.fs_type.clone(),
        read_only: spec.read_only,
        options: spec.options.clone(),
        attachable: plugin.capabilities.attach,
        node: lc.node.clone(),
        device: None,
        staging: None,
        // What kubelet gives detach: the volume's own name (lifecycle.md#detach-name).
        detach_name: spec.volume_name.clone(),
        pinned: Some(pinned),
        created_target,
        progress: Progress::Mounting,
        role,
    })
}

/// Records a set-up as done, unless its record says so already.
pub(super) fn mark_mounted(lc: &Lifecycle, record: &VolumeRecord) -> Result<(), LifecycleError> {
    if record.progress != Progress::Mounted {
        lc.state.save(&VolumeRecord {
            progress: Progress::Mounted,
            ..record.clone()
        })?;
    }
    Ok(())
}

/// Ends a set-up whose record was saved before its effects: done, the record says Mounted;
/// failed, a path the failure left unmounted loses its record (unless `keep_record`: an
/// attached volume's, which unmount needs to detach) and the directory flexd created, while a
/// mounted one keeps both (a retry finishes it, a teardown undoes it).
pub(super) fn finish<T>(
    lc: &Lifecycle,
    record: &mut VolumeRecord,
    result: Result<T, LifecycleError>,
    keep_record: bool,
) -> Result<T, LifecycleError> {
    match result {
        Ok(done) => {
            record.progress = Progress::Mounted;
            lc.state.save(record)?;
            Ok(done)
        }
        Err(e) => {
            if !still_mounted(&record.target) {
                if !keep_record {
                    let _ = lc.state.remove(&record.target);
                }
                remove_created(record);
            }
            Err(e)
        }
    }
}

/// Whether a mount is (still) at `path`; anything unreadable counts as mounted, so that a
/// failure's clean-up never removes a record or directory of a live mount.
pub(super) fn still_mounted(path: &Path) -> bool {
    mount::is_mount_point(path).unwrap_or(true)
}

/// Whether one path is the other or lies beneath it (both checked, so lexical is exact).
fn overlap(a: &Path, b: &Path) -> Option<&'static str> {
    if a == b {
        Some("the same path as")
    } else if a.starts_with(b) {
        Some("inside")
    } else if b.starts_with(a) {
        Some("above")
    } else {
        None
    }
}

impl Lifecycle {
    /// Refuses a volume path that overlaps flexd's state dir, `others` (the request's own other
    /// paths), or a recorded path of one of `roles`: publishing inside a staging path would
    /// bury the staged device under the pod's volume, and a mount over the state dir would hide
    /// the records that undo everything.
    pub(super) fn refuse_overlaps(
        &self,
        path: &Path,
        others: &[(&'static str, &Path)],
        roles: &[Role],
    ) -> Result<(), LifecycleError> {
        let state_root =
            safe_path::check(&self.state.root).unwrap_or_else(|_| self.state.root.clone());
        let mut checks: Vec<(&'static str, PathBuf)> = vec![("flexd's state dir", state_root)];
        checks.extend(others.iter().map(|(what, p)| (*what, p.to_path_buf())));
        if !roles.is_empty() {
            for (target, role) in self.state.targets()? {
                if roles.contains(&role) && target != path {
                    let what = match role {
                        Role::Stage => "the staging path",
                        _ => "the volume target",
                    };
                    checks.push((what, target));
                }
            }
        }
        for (what, other) in checks {
            if let Some(relation) = overlap(path, &other) {
                return Err(LifecycleError::Overlaps {
                    path: path.to_owned(),
                    relation,
                    what,
                    other,
                });
            }
        }
        Ok(())
    }
}

/// A path recorded by an operation of `role` holds exactly this volume with these settings, or
/// the repeat is refused: another volume's path is a precondition failure (and names the volume
/// that is there); the same volume with other settings is CSI's "already exists".
pub(super) fn same_volume(
    record: &VolumeRecord,
    role: Role,
    spec: &VolumeSpec,
    staging: Option<Option<&Path>>,
) -> Result<(), LifecycleError> {
    if record.role != role {
        return Err(LifecycleError::WrongRole {
            target: record.target.clone(),
            expected: role,
            found: record.role,
        });
    }
    if record.volume_name != spec.volume_name {
        return Err(LifecycleError::TargetInUse {
            target: record.target.clone(),
            found: record.volume_name.clone(),
            requested: spec.volume_name.clone(),
        });
    }
    let incompatible = |what, found: String, requested: String| LifecycleError::Incompatible {
        target: record.target.clone(),
        volume: record.volume_name.clone(),
        what,
        found,
        requested,
    };
    let access = |ro: bool| if ro { "read-only" } else { "read-write" }.to_owned();
    if record.driver != spec.driver {
        return Err(incompatible(
            "driver",
            record.driver.to_string(),
            spec.driver.to_string(),
        ));
    }
    if record.read_only != spec.read_only {
        return Err(incompatible(
            "access",
            access(record.read_only),
            access(spec.read_only),
        ));
    }
    if record.fs_type != spec.fs_type {
        return Err(incompatible(
            "filesystem type",
            format!("{:?}", record.fs_type),
            format!("{:?}", spec.fs_type),
        ));
    }
    if record.options != spec.options {
        // Keys only: option values may be sensitive enough not to echo.
        let keys = |m: &std::collections::BTreeMap<String, String>| {
            m.keys().cloned().collect::<Vec<_>>().join(",")
        };
        return Err(incompatible(
            "volume context",
            format!("keys [{}]", keys(&record.options)),
            format!("keys [{}] (or other values)", keys(&spec.options)),
        ));
    }
    if let Some(staging) = staging {
        if record.staging.as_deref() != staging {
            let show = |p: Option<&Path>| p.map(|p| p.display().to_string()).unwrap_or_default();
            return Err(incompatible(
                "staging path",
                show(record.staging.as_deref()),
                show(staging),
            ));
        }
    }
    Ok(())
}
