//! Library errors as CSI status codes: the one place this mapping lives.
//!
//! Messages are the errors' own text, which never holds a secret: driver messages are redacted
//! by the runner, and nothing here prints a spec's secret values.

use flexvolume::lifecycle::LifecycleError;
use flexvolume::runner::CallError;
use tonic::{Code, Status};

/// The CSI code for a lifecycle error.
pub fn code_of(error: &LifecycleError) -> Code {
    match error {
        LifecycleError::VolumeName(_) | LifecycleError::RelativeTarget { .. } => {
            Code::InvalidArgument
        }
        LifecycleError::NotManaged { .. } => Code::NotFound,
        LifecycleError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Code::NotFound
        }
        // The volume is not in the state the call needs: not staged, recorded by another
        // operation, its driver gone, or no device for a default to work on.
        LifecycleError::NotStaged { .. }
        | LifecycleError::WrongRole { .. }
        | LifecycleError::NoDriver { .. }
        | LifecycleError::NoDevice { .. } => Code::FailedPrecondition,
        LifecycleError::Call(CallError::Timeout { .. }) => Code::DeadlineExceeded,
        LifecycleError::Call(CallError::NotSupported { .. }) => Code::Unimplemented,
        // The driver failed or misbehaved, a mount or the state dir failed: the CO retries.
        LifecycleError::Call(_)
        | LifecycleError::Mount(_)
        | LifecycleError::State(_)
        | LifecycleError::Io { .. }
        | LifecycleError::Ownership { .. } => Code::Internal,
    }
}

/// The error with its causes, as one message.
pub fn message_of(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

pub fn from_lifecycle(error: &LifecycleError) -> Status {
    Status::new(code_of(error), message_of(error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn each_kind_of_error_has_its_csi_code() {
        let cases = [
            (
                LifecycleError::RelativeTarget {
                    target: PathBuf::from("x"),
                },
                Code::InvalidArgument,
            ),
            (
                LifecycleError::NotManaged {
                    target: PathBuf::from("/x"),
                },
                Code::NotFound,
            ),
            (
                LifecycleError::NotStaged {
                    staging: PathBuf::from("/s"),
                },
                Code::FailedPrecondition,
            ),
            (
                LifecycleError::Io {
                    path: PathBuf::from("/x"),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                },
                Code::NotFound,
            ),
            (
                LifecycleError::Io {
                    path: PathBuf::from("/x"),
                    source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
                },
                Code::Internal,
            ),
            (
                LifecycleError::Call(CallError::Timeout {
                    path: PathBuf::from("/d"),
                    kind: flexvolume::protocol::CallOutKind::Mount,
                    after: std::time::Duration::from_secs(1),
                }),
                Code::DeadlineExceeded,
            ),
            (
                LifecycleError::Call(CallError::Failure {
                    path: PathBuf::from("/d"),
                    kind: flexvolume::protocol::CallOutKind::Mount,
                    message: "no such share".into(),
                }),
                Code::Internal,
            ),
        ];
        for (error, code) in cases {
            let status = from_lifecycle(&error);
            assert_eq!(status.code(), code, "{error}");
            assert!(!status.message().is_empty());
        }
    }
}
