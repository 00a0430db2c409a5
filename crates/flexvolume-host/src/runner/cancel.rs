//! Stopping a call-out from another thread: the CSI controller's per-volume fence. A replica
//! that loses a volume's fence while that volume's driver runs must kill the driver before
//! another replica may act on the volume, so the kill must follow the cancel at once, not at
//! the next tick of some polling interval.
//!
//! The wake-up is an eventfd the supervision loop polls next to the driver's pipes and pidfd:
//! written once on the first cancel and never read, it stays readable, so every call-out
//! watching it (now or later) wakes at once.

use std::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rustix::event::{eventfd, EventfdFlags};

/// A cancellation every call-out run with it watches: once `cancel` is called, a running
/// call-out is killed as a timed-out one is, and one started later is not started.
///
/// Clones share one state: the fence keeps one, the configuration its call-outs run with
/// another (see [`RunnerConfig::cancelled_by`](super::RunnerConfig::cancelled_by)).
#[derive(Clone, Default)]
pub struct Cancel(Arc<Mutex<State>>);

#[derive(Default)]
struct State {
    /// Why, once cancelled; the first reason is kept (it is the one that stopped the driver).
    reason: Option<String>,
    /// Made by the first call-out that watches (a cancellation never watched costs no
    /// descriptor). `None` also when the kernel would not give one (out of descriptors): the
    /// watchers then look at `reason` at a short interval instead.
    wake: Option<Arc<OwnedFd>>,
}

impl Cancel {
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels: running call-outs are killed, later ones not started. Idempotent; the first
    /// reason is kept.
    pub fn cancel(&self, why: impl Into<String>) {
        let mut state = self.state();
        if state.reason.is_some() {
            return;
        }
        state.reason = Some(why.into());
        // Under the lock: a watcher that made the eventfd checked `reason` under this lock
        // too, so it either saw the reason or gets this write. One write in the eventfd's life:
        // its counter cannot overflow, so the write cannot block or fail for it.
        if let Some(fd) = &state.wake {
            let _ = rustix::io::write(fd.as_fd(), &1u64.to_ne_bytes());
        }
    }

    /// Why it was cancelled; `None` until it is.
    pub fn reason(&self) -> Option<String> {
        self.state().reason.clone()
    }

    /// What a call-out polls for the cancel, made on first use; `None` if no eventfd could be
    /// made (the caller then checks [`Cancel::reason`] at a short interval).
    pub(super) fn waker(&self) -> Option<Arc<OwnedFd>> {
        let mut state = self.state();
        if state.wake.is_none() {
            match eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK) {
                Ok(fd) => {
                    if state.reason.is_some() {
                        // Already cancelled: readable from the start, like one written then.
                        let _ = rustix::io::write(&fd, &1u64.to_ne_bytes());
                    }
                    state.wake = Some(Arc::new(fd));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no eventfd for a call-out's cancellation; checking it at an interval");
                }
            }
        }
        state.wake.clone()
    }

    /// The state even if a thread panicked holding it: it is two fields, each always valid.
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Cancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancel")
            .field("reason", &self.state().reason)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::event::{poll, PollFd, PollFlags, Timespec};

    fn readable(fd: &OwnedFd) -> bool {
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
    }

    #[test]
    fn the_first_reason_is_kept_and_clones_share_it() {
        let cancel = Cancel::new();
        let clone = cancel.clone();
        assert_eq!(cancel.reason(), None);
        clone.cancel("fence lost");
        cancel.cancel("again");
        assert_eq!(cancel.reason().as_deref(), Some("fence lost"));
        assert_eq!(clone.reason().as_deref(), Some("fence lost"));
    }

    #[test]
    fn the_waker_becomes_readable_on_cancel_and_stays_so() {
        let cancel = Cancel::new();
        let fd = cancel.waker().expect("an eventfd");
        assert!(!readable(&fd));
        cancel.cancel("fence lost");
        cancel.cancel("twice");
        assert!(readable(&fd));
        assert!(
            readable(&fd),
            "level-triggered: never read, so still readable"
        );
    }

    #[test]
    fn a_waker_made_after_the_cancel_is_readable_at_once() {
        let cancel = Cancel::new();
        cancel.cancel("early");
        let fd = cancel.waker().expect("an eventfd");
        assert!(readable(&fd));
    }
}
