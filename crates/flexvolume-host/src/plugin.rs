//! A plugin: a driver that answered `init`, with its capabilities and what it does not support.

use std::sync::atomic::{AtomicU16, Ordering};

use flexvolume_protocol::{CallOut, CallOutKind, Capabilities, Reply};

use crate::layout::InstalledDriver;
use crate::runner::{self, CallError, CallOutcome, RunnerConfig};

/// A loaded driver. One instance per successful `init`: a re-probe makes a new one, which also
/// forgets the call-outs the old version did not support (the driver may have learnt them).
#[derive(Debug)]
pub struct Plugin {
    pub driver: InstalledDriver,
    pub capabilities: Capabilities,
    unsupported: CallOutSet,
}

impl Plugin {
    /// Runs `init`. Any answer but `Success` (including `Not supported`) means the driver is not
    /// usable, as in kubelet; a reply without capabilities gets the defaults.
    pub fn init(driver: InstalledDriver, config: &RunnerConfig) -> Result<Self, CallError> {
        let reply = observed_call(config, &driver, &CallOut::init())?;
        Ok(Self::from_init_reply(driver, &reply))
    }

    /// A plugin from an `init` reply the caller obtained by running the driver itself (`flexd
    /// check` runs `init` raw to also judge its output). Never from an assumed reply: the
    /// capabilities decide what the lifecycle does (attach, fsGroup, …).
    pub fn from_init_reply(driver: InstalledDriver, reply: &Reply) -> Self {
        Self {
            driver,
            capabilities: reply.capabilities.unwrap_or_default(),
            unsupported: CallOutSet::default(),
        }
    }

    /// Runs a call-out. A call-out the driver answered `Not supported` to is not executed again:
    /// the error is returned straight away and the caller applies Kubernetes' default.
    pub fn call(&self, config: &RunnerConfig, call: &CallOut) -> Result<Reply, CallError> {
        if self.unsupported.contains(call.kind) {
            return Err(CallError::NotSupported {
                path: self.driver.path.clone(),
                kind: call.kind,
            });
        }
        let result = observed_call(config, &self.driver, call);
        if let Err(CallError::NotSupported { kind, .. }) = &result {
            tracing::debug!(driver = %self.driver.name, callout = %kind, "remembering Not supported");
            self.unsupported.insert(*kind);
        }
        result
    }

    /// Whether the driver said `Not supported` to this call-out.
    pub fn is_unsupported(&self, kind: CallOutKind) -> bool {
        self.unsupported.contains(kind)
    }
}

/// Runs a call-out and tells the configured observer how it went and how long it took.
fn observed_call(
    config: &RunnerConfig,
    driver: &InstalledDriver,
    call: &CallOut,
) -> Result<Reply, CallError> {
    let start = std::time::Instant::now();
    let result = runner::call(config, &driver.path, call);
    if let Some(observer) = &config.observer {
        observer.0.call_finished(
            &driver.name,
            call.kind,
            CallOutcome::of(&result),
            start.elapsed(),
        );
    }
    result
}

/// A set of call-outs, those a driver answered `Not supported` to. Lock-free so a plugin shared
/// by many operations can remember answers without a mutex. Runtime state, so it lives here and
/// not in the pure protocol crate.
#[derive(Debug, Default)]
struct CallOutSet(AtomicU16);

// One bit per call-out kind.
const _: () = assert!(CallOutKind::ALL.len() <= u16::BITS as usize);

impl CallOutSet {
    fn bit(kind: CallOutKind) -> u16 {
        1 << (kind as u16)
    }

    fn insert(&self, kind: CallOutKind) {
        self.0.fetch_or(Self::bit(kind), Ordering::Relaxed);
    }

    fn contains(&self, kind: CallOutKind) -> bool {
        self.0.load(Ordering::Relaxed) & Self::bit(kind) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_out_set_remembers() {
        let set = CallOutSet::default();
        set.insert(CallOutKind::Attach);
        set.insert(CallOutKind::ExpandFs);
        assert!(set.contains(CallOutKind::Attach) && set.contains(CallOutKind::ExpandFs));
        assert!(!set.contains(CallOutKind::Init) && !set.contains(CallOutKind::Mount));
    }
}
