//! Why a call-out did not produce a usable reply.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use flexvolume_protocol::{CallOutKind, ErrorCode, ProtocolError};

/// Why a call-out did not produce a usable reply.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("cannot execute driver {path}: {source}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("driver {path}: {kind} timed out after {after:?}; its process group was killed")]
    Timeout {
        path: PathBuf,
        kind: CallOutKind,
        after: Duration,
    },
    /// Stopped by its configuration's [`Cancel`](super::Cancel): killed as a timed-out one is
    /// if it was running, not started if it was not.
    #[error("driver {path}: {kind} was stopped: {why}")]
    Cancelled {
        path: PathBuf,
        kind: CallOutKind,
        why: String,
    },
    #[error("driver {path}: {kind}: i/o error while running it: {source}")]
    Io {
        path: PathBuf,
        kind: CallOutKind,
        #[source]
        source: io::Error,
    },
    #[error("driver {path}: {source}")]
    Protocol {
        path: PathBuf,
        #[source]
        source: ProtocolError,
    },
    #[error("driver {path}: {kind} failed: {message}{}", code.map(|c| format!(" ({c})")).unwrap_or_default())]
    Failure {
        path: PathBuf,
        kind: CallOutKind,
        /// The driver's message, redacted.
        message: String,
        /// What went wrong, when the driver names it.
        code: Option<ErrorCode>,
    },
    #[error("driver {path}: {kind} is not supported")]
    NotSupported { path: PathBuf, kind: CallOutKind },
    /// The call-out's arguments cannot be passed to a process at all (found before any exec).
    #[error("driver {path}: {kind} not run: {reason}")]
    Arguments {
        path: PathBuf,
        kind: CallOutKind,
        reason: String,
    },
}

impl CallError {
    pub fn is_not_supported(&self) -> bool {
        matches!(self, Self::NotSupported { .. })
    }

    /// The code of a `Failure` the driver named.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Failure { code, .. } => *code,
            _ => None,
        }
    }
}
