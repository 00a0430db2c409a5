//! Telling someone (metrics) how each call-out went and how long it took.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use flexvolume_protocol::{CallOutKind, DriverName, Reply};

use super::error::CallError;

/// How a call-out ended, as metrics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    Success,
    Failure,
    NotSupported,
    Timeout,
    /// Stopped by a [`Cancel`](super::Cancel) (a lost fence), not by the driver or its timeout.
    Cancelled,
    Error,
}

impl CallOutcome {
    pub fn of(result: &Result<Reply, CallError>) -> Self {
        match result {
            Ok(_) => Self::Success,
            Err(CallError::Failure { .. }) => Self::Failure,
            Err(CallError::NotSupported { .. }) => Self::NotSupported,
            Err(CallError::Timeout { .. }) => Self::Timeout,
            Err(CallError::Cancelled { .. }) => Self::Cancelled,
            Err(_) => Self::Error,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "failure",
            Self::NotSupported => "not_supported",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::Error => "error",
        }
    }
}

/// Receives one record per executed call-out.
pub trait CallObserver: Send + Sync {
    fn call_finished(
        &self,
        driver: &DriverName,
        kind: CallOutKind,
        outcome: CallOutcome,
        elapsed: Duration,
    );
}

/// A shared [`CallObserver`].
#[derive(Clone)]
pub struct Observer(pub Arc<dyn CallObserver>);

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Observer")
    }
}
