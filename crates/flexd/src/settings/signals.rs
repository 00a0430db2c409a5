//! Waiting for the end: SIGTERM (kubelet stopping a container) or SIGINT (a person's Ctrl-C).

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// SIGTERM/SIGINT caught from the moment this is made, so a signal that arrives before
/// [`Termination::wait`] is called is not lost (nor does it kill the process).
pub struct Termination(Signals);

impl Termination {
    pub fn catch() -> anyhow::Result<Self> {
        Ok(Self(Signals::new([SIGTERM, SIGINT])?))
    }

    /// Blocks until SIGTERM or SIGINT arrives; returns the signal's number.
    pub fn wait(mut self) -> i32 {
        self.0.forever().next().unwrap_or(SIGTERM)
    }
}
