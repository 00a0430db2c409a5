//! How drivers are run: timeouts, kill grace, output cap, process cap, namespace, held locks.

use std::collections::BTreeMap;
use std::fs::File;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use flexvolume_protocol::CallOutKind;

use super::cancel::Cancel;
use super::namespace::MountNamespace;
use super::observer::Observer;

/// Kubernetes' timeout for waitforattach (volume manager's `waitForAttachTimeout`).
pub(crate) const DEFAULT_WAIT_FOR_ATTACH_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Ours for every other call-out; kubelet has none and hangs forever on a stuck driver.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2 * 60);
/// Between SIGTERM and SIGKILL to the driver's process group.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(3);
/// Kept per stream; a reply is a few hundred bytes, a chatty driver's log a few kilobytes.
pub const DEFAULT_OUTPUT_CAP: usize = 1024 * 1024;
/// Processes (threads included: the pids controller counts tasks) one call-out may have at once.
/// Drivers use a handful; a FUSE helper a few dozen threads. A fork bomb stops here.
pub const DEFAULT_MAX_PROCESSES: NonZeroU32 = match NonZeroU32::new(1024) {
    Some(n) => n,
    None => unreachable!(),
};

/// How driver processes are run. Cheap to clone; shared by every plugin.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    pub default_timeout: Duration,
    pub overrides: BTreeMap<CallOutKind, Duration>,
    pub kill_grace: Duration,
    pub output_cap: usize,
    /// Told about every finished call-out (metrics); `None` costs nothing.
    pub observer: Option<Observer>,
    /// Locks (flock-ed files) the driver process inherits, so they stay held while it runs even
    /// if flexd dies: a driver orphaned by a crashed flexd then still blocks the next operation
    /// on its volume until it finishes. Empty outside an operation.
    pub held_locks: Vec<Arc<File>>,
    /// The process cap of one call-out (cgroup `pids.max`); `None` runs drivers uncapped.
    pub max_processes: Option<NonZeroU32>,
    /// The mount namespace drivers run in; `None`: flexd's own (see `runner/namespace.rs`).
    pub mount_namespace: Option<MountNamespace>,
    /// Stops the call-outs run with this configuration from another thread (a lost fence);
    /// `None`: only their timeouts stop them.
    pub cancel: Option<Cancel>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        let mut overrides = BTreeMap::new();
        overrides.insert(CallOutKind::WaitForAttach, DEFAULT_WAIT_FOR_ATTACH_TIMEOUT);
        Self {
            default_timeout: DEFAULT_TIMEOUT,
            overrides,
            kill_grace: DEFAULT_KILL_GRACE,
            output_cap: DEFAULT_OUTPUT_CAP,
            observer: None,
            held_locks: Vec::new(),
            max_processes: Some(DEFAULT_MAX_PROCESSES),
            mount_namespace: None,
            cancel: None,
        }
    }
}

impl RunnerConfig {
    /// How long a call-out of `kind` may run before it is killed.
    pub fn timeout_for(&self, kind: CallOutKind) -> Duration {
        self.overrides
            .get(&kind)
            .copied()
            .unwrap_or(self.default_timeout)
    }

    /// This configuration, with drivers also holding `locks` (see [`RunnerConfig::held_locks`]).
    pub fn holding(&self, locks: &[Arc<File>]) -> Self {
        let mut config = self.clone();
        config.held_locks.extend(locks.iter().cloned());
        config
    }

    /// This configuration, with its call-outs stopped by `cancel` (see [`Cancel`]): the
    /// operation that must not outlive a fence runs its drivers with it.
    pub fn cancelled_by(&self, cancel: &Cancel) -> Self {
        let mut config = self.clone();
        config.cancel = Some(cancel.clone());
        config
    }

    /// Sets one timeout for every call-out (the `flexd call --timeout` case).
    pub fn with_timeout_for_all(mut self, timeout: Duration) -> Self {
        self.default_timeout = timeout;
        self.overrides.clear();
        self
    }
}
