//! The fence of a volume: at most one replica changes a volume at a time, and a replica that may
//! no longer be the one stops before another can start (docs/csi.md#fences).
//!
//! A lease is not a fence by itself: the old leader of a sidecar finishes its call after the
//! new leader has started one. So the fence is per volume, inside the volume's record, and taken
//! before any call that changes the volume (attach, detach, provision, delete):
//!
//! 1. **Take**: read the record; a fence held by another replica refuses the call
//!    ([`super::RecordsError::Busy`], ABORTED, which the CO retries). Otherwise write the record
//!    with this replica's fence, from the version read: two replicas racing for it, one write
//!    wins and the other conflicts.
//! 2. **Hold**: while the call runs, the fence is renewed every quarter lease; every write
//!    of the operation (the record before the driver runs, the record after) is made from the
//!    version of the last write, so it fails if anyone else wrote in between.
//! 3. **Release**: the last write of the operation removes the fence (or deletes the record,
//!    when nothing is left in it).
//!
//! **Takeover.** A replica that dies holding a fence stops renewing it. Another takes it over
//! once it has seen the record *unchanged* (same version) for a whole lease by its own clock:
//! no clock is compared across machines. It then finds the record as the dead replica left it,
//! written before its driver ran: an attach or a provision that did not finish, which the
//! next call completes or undoes as after any crash.
//!
//! **Stopping in time.** The holder counts its lease from when it *sent* its last successful
//! write, and stops at [`FenceSettings::stop_after`], a margin before the lease ends: it
//! cancels its driver's call ([`crate::runner::Cancel`]: killed as a timed-out one, helpers
//! and cgroup included) and writes nothing more. Another replica's lease is counted from when
//! it first *saw* that write, later than it was sent: the old holder's driver is dead before
//! anyone else may act. The margin covers the kill grace and clocks that run at slightly
//! different rates; it does not cover a holder whose whole process is frozen (not killed) for
//! longer than a lease: its driver, a child it can no longer kill, may still finish its call.

use std::collections::hash_map::Entry;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{key, ControllerRecord, ControllerRecords, Fence, RecordsError, Version};
use crate::runner::Cancel;
use flexvolume_protocol::name::DriverName;

/// How long fences hold, and when their holder stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceSettings {
    /// How long a fence holds without renewal.
    pub lease: Duration,
    /// When the holder stops its call without a successful renewal, counted from the last one
    /// sent: before `lease`, by at least the driver's kill grace.
    pub stop_after: Duration,
}

impl FenceSettings {
    /// Fences of `lease`, whose holders stop a quarter lease early, or early enough for the
    /// driver's `kill_grace` and a second more when that is longer.
    pub fn new(lease: Duration, kill_grace: Duration) -> Result<Self, String> {
        let margin = (lease / 4).max(kill_grace + Duration::from_secs(1));
        if lease < margin * 2 {
            return Err(format!(
                "a fence lease of {:?} is too short for a kill grace of {kill_grace:?}: it must be at least {:?}",
                lease,
                margin * 2
            ));
        }
        Ok(Self {
            lease,
            stop_after: lease - margin,
        })
    }

    /// How often the holder renews.
    pub fn renew_every(&self) -> Duration {
        self.lease / 4
    }
}

impl Default for FenceSettings {
    /// 20 s fences, stopped 5 s early: a dead replica's volumes wait 20 s for another.
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(20),
            stop_after: Duration::from_secs(15),
        }
    }
}

/// This process as a fence holder: the host name (a pod's name) and a number drawn at start.
pub fn holder_identity() -> String {
    let host = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{host}/{}-{nanos:08x}", std::process::id())
}

pub(super) fn acquire(
    records: &ControllerRecords,
    driver: &DriverName,
    volume: &str,
    operation: &str,
    prepare: &dyn Fn(&mut ControllerRecord),
) -> Result<Fenced, RecordsError> {
    let k = key(driver, volume);
    let busy_here = || RecordsError::Busy {
        volume: volume.to_owned(),
        holder: records.holder.clone(),
        operation: "another call of this replica".to_owned(),
    };
    if !records
        .held
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(k.clone())
    {
        return Err(busy_here());
    }
    // From here on, `unheld` undoes the insert on every early return.
    let unheld = |e: RecordsError| {
        records
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&k);
        e
    };
    // A conflict means another replica wrote between our read and our write: read again, once.
    for attempt in 0..2 {
        let stored = records.read(driver, volume).map_err(unheld)?;
        let (mut record, version) = match stored {
            Some(s) => (s.record, Some(s.version)),
            None => (ControllerRecord::new(driver, volume), None),
        };
        let taken_over = match &record.fence {
            None => None,
            // Left by this very replica (a release that could not be written): no call of ours
            // is in flight on it, `held` says so.
            Some(f) if f.holder == records.holder => None,
            Some(f) => match version.as_ref() {
                Some(v) if expired(records, &k, v, f) => Some(f.clone()),
                _ => {
                    return Err(unheld(RecordsError::Busy {
                        volume: volume.to_owned(),
                        holder: f.holder.clone(),
                        operation: f.operation.clone(),
                    }))
                }
            },
        };
        prepare(&mut record);
        record.fences += 1;
        record.fence = Some(Fence {
            holder: records.holder.clone(),
            token: record.fences,
            operation: operation.to_owned(),
            lease_seconds: records.settings.lease.as_secs().max(1),
            renewals: 0,
        });
        let sent = Instant::now();
        match records.store.write(&record, version.as_ref()) {
            Ok(version) => {
                records
                    .observed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&k);
                if let Some(old) = &taken_over {
                    tracing::warn!(driver = %driver, volume = %volume, holder = %old.holder, operation = %old.operation, token = old.token, "took over the fence of a replica that stopped renewing it: its call did not finish, and the record says what it may have done");
                }
                return Ok(Fenced::start(
                    records, driver, volume, operation, record, version, sent, taken_over,
                ));
            }
            Err(RecordsError::Conflict { .. }) if attempt == 0 => continue,
            Err(e) => return Err(unheld(e)),
        }
    }
    Err(unheld(RecordsError::Conflict {
        what: format!("volume {volume} of driver {driver}"),
    }))
}

/// Whether another replica's fence `fence`, in the record at `version`, has expired: this
/// replica has seen that very version for a whole lease (the fence's own).
fn expired(
    records: &ControllerRecords,
    k: &(String, String),
    version: &Version,
    fence: &Fence,
) -> bool {
    let lease = Duration::from_secs(fence.lease_seconds.max(1));
    let now = Instant::now();
    let mut observed = records.observed.lock().unwrap_or_else(|p| p.into_inner());
    if observed.len() >= super::OBSERVED_KEPT {
        observed.retain(|_, (_, seen)| now.duration_since(*seen) < lease * 10);
    }
    match observed.entry(k.clone()) {
        Entry::Occupied(seen) if seen.get().0 == *version => {
            now.duration_since(seen.get().1) >= lease
        }
        Entry::Occupied(mut seen) => {
            seen.insert((version.clone(), now));
            false
        }
        Entry::Vacant(v) => {
            v.insert((version.clone(), now));
            false
        }
    }
}

/// A fence held by this replica: the volume's record as this replica last wrote it, renewed in
/// the background until released. Dropped without [`Fenced::release`], it is released all the
/// same (errors logged).
pub struct Fenced {
    shared: Arc<Shared>,
    keeper: Option<std::thread::JoinHandle<()>>,
    taken_over: Option<Fence>,
    released: bool,
}

struct Shared {
    store: Arc<dyn super::RecordStore>,
    held: Arc<Mutex<std::collections::HashSet<(String, String)>>>,
    driver: DriverName,
    volume: String,
    operation: String,
    settings: super::FenceSettings,
    /// The record and its version as last written; locked across each write, so the holder's
    /// writes and renewals go one at a time.
    current: Mutex<(ControllerRecord, Version)>,
    timing: Mutex<Timing>,
    wake: Condvar,
    cancel: Cancel,
}

struct Timing {
    /// Stop at this instant without a successful write before it.
    stop_at: Instant,
    renew_at: Instant,
    renewing: bool,
    lost: Option<String>,
    released: bool,
}

impl Shared {
    fn timing(&self) -> std::sync::MutexGuard<'_, Timing> {
        self.timing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fence is gone: the call in flight is killed, nothing more is written.
    fn lose(&self, why: String) {
        let mut timing = self.timing();
        if timing.lost.is_none() {
            tracing::warn!(driver = %self.driver, volume = %self.volume, operation = %self.operation, why = %why, "lost the volume's fence: its call is stopped");
            self.cancel.cancel(format!(
                "the fence of volume {} was lost: {why}",
                self.volume
            ));
            timing.lost = Some(why);
        }
        self.wake.notify_all();
    }

    fn lost_error(&self, why: String) -> RecordsError {
        RecordsError::FenceLost {
            volume: self.volume.clone(),
            operation: self.operation.clone(),
            why,
        }
    }

    /// Writes `next` (or deletes the record, `delete`) from the last written version, if the
    /// fence is still held; a success moves the stop time on.
    fn write(&self, next: ControllerRecord, delete: bool) -> Result<(), RecordsError> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = self.timing().lost.clone() {
            return Err(self.lost_error(why));
        }
        let sent = Instant::now();
        let result = if delete {
            self.store
                .delete(&self.driver, &self.volume, &current.1)
                .map(|()| None)
        } else {
            self.store.write(&next, Some(&current.1)).map(Some)
        };
        match result {
            Ok(version) => {
                let mut timing = self.timing();
                if timing.lost.is_none() {
                    timing.stop_at = sent + self.settings.stop_after;
                    timing.renew_at = sent + self.settings.renew_every();
                }
                if let Some(version) = version {
                    *current = (next, version);
                }
                Ok(())
            }
            Err(RecordsError::Conflict { .. }) => {
                drop(current);
                let why = "another replica wrote the record: it took the fence over".to_owned();
                self.lose(why.clone());
                Err(self.lost_error(why))
            }
            Err(e) => Err(e),
        }
    }

    fn renew(&self) {
        let next = {
            let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
            let mut next = current.0.clone();
            if let Some(f) = next.fence.as_mut() {
                f.renewals += 1;
            }
            next
        };
        let result = self.write(next, false);
        let mut timing = self.timing();
        timing.renewing = false;
        if let Err(e) = result {
            if timing.lost.is_none() {
                tracing::warn!(driver = %self.driver, volume = %self.volume, error = %e, "could not renew the volume's fence: trying again");
                timing.renew_at = Instant::now() + self.settings.renew_every() / 4;
            }
        }
        self.wake.notify_all();
    }
}

/// The keeper of one fence: renews it on time and stops the call when it cannot. A renewal runs
/// on a thread of its own, so a store that hangs cannot keep the keeper from stopping the call.
fn keep(shared: Arc<Shared>) {
    let mut timing = shared.timing();
    loop {
        if timing.released || timing.lost.is_some() {
            return;
        }
        let now = Instant::now();
        if now >= timing.stop_at {
            drop(timing);
            shared.lose(format!(
                "no renewal succeeded for {:?}",
                shared.settings.stop_after
            ));
            return;
        }
        if now >= timing.renew_at && !timing.renewing {
            timing.renewing = true;
            let renewing = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("fence-renew".to_owned())
                .spawn(move || renewing.renew());
            if spawned.is_err() {
                timing.renewing = false;
                timing.renew_at = now + shared.settings.renew_every() / 4;
            }
            continue;
        }
        let until = if timing.renewing {
            timing.stop_at
        } else {
            timing.renew_at.min(timing.stop_at)
        };
        timing = shared
            .wake
            .wait_timeout(timing, until.saturating_duration_since(now))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

impl Fenced {
    #[allow(clippy::too_many_arguments)]
    fn start(
        records: &ControllerRecords,
        driver: &DriverName,
        volume: &str,
        operation: &str,
        record: ControllerRecord,
        version: Version,
        sent: Instant,
        taken_over: Option<Fence>,
    ) -> Self {
        let settings = records.settings;
        let shared = Arc::new(Shared {
            store: records.store.clone(),
            held: records.held.clone(),
            driver: driver.clone(),
            volume: volume.to_owned(),
            operation: operation.to_owned(),
            settings,
            current: Mutex::new((record, version)),
            timing: Mutex::new(Timing {
                stop_at: sent + settings.stop_after,
                renew_at: sent + settings.renew_every(),
                renewing: false,
                lost: None,
                released: false,
            }),
            wake: Condvar::new(),
            cancel: Cancel::new(),
        });
        let keeper = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("fence-keeper".to_owned())
                .spawn(move || keep(shared))
        };
        let keeper = match keeper {
            Ok(handle) => Some(handle),
            Err(e) => {
                // Without a keeper nothing renews: the call must not run on a fence that will
                // expire under it.
                shared.lose(format!("no thread to keep the fence: {e}"));
                None
            }
        };
        Fenced {
            shared,
            keeper,
            taken_over,
            released: false,
        }
    }

    /// The volume's record as this replica last wrote it.
    pub fn record(&self) -> ControllerRecord {
        self.shared
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone()
    }

    /// Changes the record (the fence kept) with one write from the last written version.
    pub fn update(&self, change: impl FnOnce(&mut ControllerRecord)) -> Result<(), RecordsError> {
        let mut next = self.record();
        change(&mut next);
        self.shared.write(next, false)
    }

    /// What every driver call made under the fence is run with: cancelled when the fence is
    /// lost.
    pub fn cancel(&self) -> &Cancel {
        &self.shared.cancel
    }

    /// The fence this one took over from a replica that stopped renewing it, if any.
    pub fn taken_over(&self) -> Option<&Fence> {
        self.taken_over.as_ref()
    }

    /// Releases the fence with the record as it is now: one write without the fence, or a
    /// delete when nothing else is left in it.
    pub fn release(self) -> Result<(), RecordsError> {
        self.release_with(|_| {})
    }

    /// Changes the record and releases the fence in one write: an operation's last.
    pub fn release_with(
        mut self,
        change: impl FnOnce(&mut ControllerRecord),
    ) -> Result<(), RecordsError> {
        self.released = true;
        self.finish(change)
    }

    fn finish(&mut self, change: impl FnOnce(&mut ControllerRecord)) -> Result<(), RecordsError> {
        {
            let mut timing = self.shared.timing();
            timing.released = true;
            self.shared.wake.notify_all();
        }
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.join();
        }
        let mut next = self.record();
        change(&mut next);
        next.fence = None;
        let result = self.shared.write(next.clone(), next.is_empty());
        self.shared
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(self.shared.driver.to_string(), self.shared.volume.clone()));
        result
    }
}

impl Drop for Fenced {
    fn drop(&mut self) {
        if !self.released {
            self.released = true;
            if let Err(e) = self.finish(|_| {}) {
                tracing::warn!(driver = %self.shared.driver, volume = %self.shared.volume, error = %e, "could not release the volume's fence: it is taken over when its lease ends");
            }
        }
    }
}

impl std::fmt::Debug for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fenced")
            .field("driver", &self.shared.driver)
            .field("volume", &self.shared.volume)
            .field("operation", &self.shared.operation)
            .finish()
    }
}
