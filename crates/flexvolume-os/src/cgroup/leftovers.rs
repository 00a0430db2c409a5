//! Call-out cgroups where driver processes still ran when flexd last let go of them: helpers a
//! driver left running on purpose, helpers that outlived a kill, or the cgroups of a flexd that
//! died. Its own module so both the cgroup set-up ([`super`], which finds stale ones at start)
//! and the runner's per-call-out cgroups (which find them at run time) can record them while
//! depending only downwards: the runner's capped → cgroup → leftovers.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

static LEFTOVERS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// The list, locked. A panic elsewhere must not make leftovers unreachable, hence no poisoning.
pub fn lock() -> MutexGuard<'static, Vec<PathBuf>> {
    LEFTOVERS.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn remember(dir: PathBuf) {
    lock().push(dir);
}
