//! Calls on one volume are serialized (CSI's rule; the CO may repeat a call while the first is
//! still running). Different volumes proceed in parallel. The state dir's file locks serialize
//! each path too, across processes; this adds the volume id, across paths.

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
    pub async fn lock(&self, volume_id: &str) -> VolumeGuard {
        let mutex = {
            let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
            table.entry(volume_id.to_owned()).or_default().clone()
        };
        VolumeGuard {
            guard: Some(mutex.lock_owned().await),
            id: volume_id.to_owned(),
            table: self.table.clone(),
        }
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

    #[tokio::test]
    async fn one_volume_waits_others_do_not_and_entries_are_dropped() {
        let locks = VolumeLocks::default();
        let a = locks.lock("a").await;
        let again = tokio::time::timeout(std::time::Duration::from_millis(50), locks.lock("a"));
        assert!(again.await.is_err(), "a second call on a held volume waits");
        let b = locks.lock("b").await;
        drop(a);
        let a = locks.lock("a").await;
        drop((a, b));
        assert_eq!(locks.len(), 0);
    }
}
