//! On start: the state dir against the mount table. A crash (kill -9) mid-operation leaves
//! records that say "mounting"; once any driver orphaned by the crash has exited (the record's
//! lock waits for it), a CSI stage or publish whose mount never took effect is rolled back, so
//! the driver is not counted in use forever. Everything else is reported and left for the CO's
//! own retry or teardown, which the records make possible.

use std::path::PathBuf;

use super::{Lifecycle, LifecycleError};
use crate::state::{Progress, Role};

/// What reconciling found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReconcileReport {
    /// Recorded and mounted, as the record says.
    pub consistent: usize,
    /// Interrupted after the mount took effect (or a whole-flow mount that may have attached):
    /// kept, a retry finishes it, a teardown undoes it.
    pub interrupted: Vec<PathBuf>,
    /// Interrupted before any mount took effect: record and created directory removed.
    pub rolled_back: Vec<PathBuf>,
    /// A publish or stage recorded as mounted whose target is gone: torn down before a crash
    /// undid the record's removal, which is not synced (docs/lifecycle.md#unsynced-publish).
    /// Record removed.
    pub torn_down: Vec<PathBuf>,
    /// Recorded as mounted but not in the mount table (a reboot, an unmount behind flexd's
    /// back): kept for the CO's teardown (a whole-flow mount may still be attached).
    pub lost: Vec<PathBuf>,
    /// Records that cannot be read (reported by `flexd volume list`).
    pub unreadable: usize,
}

impl Lifecycle {
    /// The state dir against the mount table, after a restart (see [`ReconcileReport`]).
    pub fn reconcile(&self) -> Result<ReconcileReport, LifecycleError> {
        let lc = self;
        let mut report = ReconcileReport::default();
        for record in lc.state.list()? {
            let Ok(record) = record else {
                report.unreadable += 1;
                continue;
            };
            if record.role == Role::Attach {
                continue;
            }
            let target = record.target.clone();
            // Waits for an operation in progress, or a driver a crashed flexd left running.
            let _lock = lc.state.lock(&target)?;
            let Some(record) = lc.state.load(&target)? else {
                continue;
            };
            match (
                record.progress,
                flexvolume_os::mount::is_mount_point(&target)?,
            ) {
                (Progress::Mounted, true) => report.consistent += 1,
                // The teardown removed the target before the record: it ran to its end. Kept,
                // the record would wait for an unpublish the CO has already made.
                (Progress::Mounted, false)
                    if record.role.is_node_mount_only()
                        && matches!(std::fs::symlink_metadata(&target), Err(e) if e.kind() == std::io::ErrorKind::NotFound) =>
                {
                    lc.state.remove(&target)?;
                    tracing::info!(target = %target.display(), "torn down before a crash undid its record's removal; record removed");
                    report.torn_down.push(target);
                }
                (Progress::Mounted, false) => {
                    tracing::warn!(target = %target.display(), "recorded as mounted but not mounted");
                    report.lost.push(target);
                }
                (Progress::Mounting, true) => {
                    tracing::info!(target = %target.display(), "operation interrupted after its mount; a retry or teardown completes it");
                    report.interrupted.push(target);
                }
                // A whole-flow mount may have attached: its teardown detaches.
                (Progress::Mounting, false) if record.role == Role::Mount => {
                    report.interrupted.push(target)
                }
                (Progress::Mounting, false) => {
                    super::target::remove_created(&record);
                    lc.state.remove(&target)?;
                    tracing::info!(target = %target.display(), "operation interrupted before its mount; rolled back");
                    report.rolled_back.push(target);
                }
            }
        }
        Ok(report)
    }
}
