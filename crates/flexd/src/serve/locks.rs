//! One call at a time per volume (CSI's rule; the CO may repeat a call while the first is still
//! running): a second call for a volume whose operation is in flight is refused at once with
//! ABORTED ("an operation is pending for this volume", as CSI asks), instead of waiting behind a
//! call-out that may take minutes until the client's deadline. Different volumes proceed in
//! parallel. The state dir's file locks serialize each path too, across processes; this adds
//! the volume id, across paths.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

type Table = Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>;

#[derive(Clone, Default)]
pub struct VolumeLocks {
    table: Table,
}

/// Held while one call on a volume runs; its table entry goes with the last holder.
pub struct VolumeGuard {
    guard: Option<OwnedMutexGuard<()>>,
    id: String,
    table: Table,
}

impl VolumeLocks {
    /// The volume's guard, or `None` while another call on it holds it.
    pub fn try_lock(&self, volume_id: &str) -> Option<VolumeGuard> {
        let mutex = {
            let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
            table.entry(volume_id.to_owned()).or_default().clone()
        };
        let guard = mutex.try_lock_owned().ok()?;
        Some(VolumeGuard {
            guard: Some(guard),
            id: volume_id.to_owned(),
            table: self.table.clone(),
        })
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.lock().map(|t| t.len()).unwrap_or(0)
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        // Only the table holds it: nobody holds or waits for this volume.
        if table
            .get(&self.id)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            table.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_volume_refuses_others_do_not_and_entries_are_dropped() {
        let locks = VolumeLocks::default();
        let a = locks.try_lock("a").unwrap();
        assert!(
            locks.try_lock("a").is_none(),
            "a second call on a held volume is refused"
        );
        let b = locks.try_lock("b").unwrap();
        drop(a);
        let a = locks.try_lock("a").unwrap();
        drop((a, b));
        assert_eq!(locks.len(), 0);
        assert!(locks.try_lock("a").is_some());
    }
}
