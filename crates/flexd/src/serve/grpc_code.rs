//! Library errors as gRPC (CSI) status codes: the one place this mapping lives. "Status" alone
//! means a driver's health elsewhere in flexd; here it is always the gRPC status.
//!
//! Messages are the errors' own text, which never holds a secret: driver messages are redacted
//! by the runner, and nothing here prints a spec's secret values.

use flexd::errors::message_of;
use flexvolume_host::controller_records::RecordsError;
use flexvolume_host::lifecycle::{LifecycleError, ProvisionError};
use flexvolume_host::runner::CallError;
use flexvolume_host::state::LookupError;
use flexvolume_host::ErrorCode;
use flexvolume_os::mount::safe_path::PathError;
use flexvolume_os::mount::MountError;
use tonic::{Code, Status};

/// The CSI code for a lifecycle error.
pub fn lifecycle_code(error: &LifecycleError) -> Code {
    match error {
        // The request itself is unusable: a malformed path or name, paths that overlap (a
        // target inside a staging path or flexd's state dir), arguments no exec can carry.
        LifecycleError::VolumeName(_)
        | LifecycleError::RelativeTarget { .. }
        | LifecycleError::Overlaps { .. }
        | LifecycleError::Call(CallError::Arguments { .. }) => Code::InvalidArgument,
        LifecycleError::Path(e) | LifecycleError::Mount(MountError::Path(e)) => path_code(e),
        // The same volume at the same path with other settings: CSI's incompatible republish.
        LifecycleError::Incompatible { .. } => Code::AlreadyExists,
        LifecycleError::NotManaged { .. } => Code::NotFound,
        LifecycleError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Code::NotFound
        }
        // The volume is not in the state the call needs: not staged, recorded by another
        // operation, its driver gone, or no device for a default to work on.
        // A path that holds someone else's mount or another volume, a staging path still
        // published: nothing in the request is wrong, the node is not in the state it needs.
        LifecycleError::NotStaged { .. }
        | LifecycleError::ForeignMount { .. }
        | LifecycleError::TargetInUse { .. }
        | LifecycleError::StagingInUse { .. }
        | LifecycleError::WrongRole { .. }
        | LifecycleError::NoDriver { .. }
        | LifecycleError::NoDevice { .. } => Code::FailedPrecondition,
        // A failure the driver named (`"code"` in its reply).
        LifecycleError::Call(e) if e.code().is_some() => match e.code() {
            Some(ErrorCode::NotFound) => Code::NotFound,
            Some(ErrorCode::AlreadyExists) => Code::AlreadyExists,
            Some(ErrorCode::OutOfCapacity) => Code::ResourceExhausted,
            Some(ErrorCode::InvalidArgument) => Code::InvalidArgument,
            Some(ErrorCode::OutOfRange) => Code::OutOfRange,
            None => Code::Internal,
        },
        LifecycleError::Call(CallError::Timeout { .. }) => Code::DeadlineExceeded,
        LifecycleError::Call(CallError::Cancelled { .. }) => Code::Aborted,
        LifecycleError::Records(e) => records_code(e),
        LifecycleError::Call(CallError::NotSupported { .. }) => Code::Unimplemented,
        // The driver failed or misbehaved, a mount or the state dir failed: the CO retries.
        LifecycleError::Call(_)
        | LifecycleError::Mount(_)
        | LifecycleError::State(_)
        | LifecycleError::Io { .. }
        | LifecycleError::Ownership { .. } => Code::Internal,
    }
}

/// The controller records: another replica's write in between is a retry (ABORTED, as CSI
/// says of an operation pending on the volume); a store out of reach is UNAVAILABLE.
fn records_code(error: &RecordsError) -> Code {
    match error {
        // Another replica's call in flight, a write in between, a fence lost: the CO retries.
        RecordsError::Conflict { .. }
        | RecordsError::Busy { .. }
        | RecordsError::FenceLost { .. }
        | RecordsError::Expired { .. } => Code::Aborted,
        RecordsError::Unavailable { .. } => Code::Unavailable,
        RecordsError::Name(_) => Code::InvalidArgument,
        RecordsError::State(_) | RecordsError::Corrupt { .. } => Code::Internal,
    }
}

/// A malformed path (relative, NUL, `..`, too long) is the request's fault: INVALID_ARGUMENT.
/// A well-formed path that leads through a symlink or a non-directory is refused as the state
/// of the node, not of the request: FAILED_PRECONDITION (a CO retry cannot fix it; whoever
/// planted the symlink must remove it).
fn path_code(error: &PathError) -> Code {
    if error.is_malformed() {
        Code::InvalidArgument
    } else if let PathError::Io { source, .. } = error {
        if source.kind() == std::io::ErrorKind::NotFound {
            Code::NotFound
        } else {
            Code::Internal
        }
    } else {
        Code::FailedPrecondition
    }
}

pub fn from_lifecycle(error: &LifecycleError) -> Status {
    Status::new(lifecycle_code(error), message_of(error))
}

pub fn from_provision(error: &ProvisionError) -> Status {
    match error {
        ProvisionError::Lifecycle(e) => from_lifecycle(e),
        ProvisionError::Conflict { .. } => Status::already_exists(error.to_string()),
        ProvisionError::InUse { .. } => Status::failed_precondition(error.to_string()),
        ProvisionError::HostKey { .. } => Status::invalid_argument(error.to_string()),
    }
}

/// Where a volume is, for NodeGetVolumeStats and NodeExpandVolume: their `volume_path` names a
/// place to look the volume up, so a volume or path flexd has no record of is NOT_FOUND (a
/// relative path included: no volume can be there), and only a path that could never name
/// anything (NUL, `..`, over PATH_MAX) is INVALID_ARGUMENT.
pub fn from_lookup(error: &LookupError) -> Status {
    match error {
        LookupError::NotHere { .. }
        | LookupError::Relative { .. }
        | LookupError::Elsewhere { .. } => Status::not_found(error.to_string()),
        LookupError::Malformed(e) => Status::invalid_argument(format!("volume_path: {e}")),
        LookupError::State(e) => Status::internal(format!("cannot read the state dir: {e}")),
    }
}

/// An error a volume call can end in, as its CSI status.
pub trait ToGrpcStatus {
    fn to_grpc_status(&self) -> Status;
}

impl ToGrpcStatus for LifecycleError {
    fn to_grpc_status(&self) -> Status {
        from_lifecycle(self)
    }
}

impl ToGrpcStatus for ProvisionError {
    fn to_grpc_status(&self) -> Status {
        from_provision(self)
    }
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
                    kind: flexvolume_protocol::CallOutKind::Mount,
                    after: std::time::Duration::from_secs(1),
                }),
                Code::DeadlineExceeded,
            ),
            (
                LifecycleError::Call(CallError::Failure {
                    path: PathBuf::from("/d"),
                    kind: flexvolume_protocol::CallOutKind::Mount,
                    message: "no such share".into(),
                    code: None,
                }),
                Code::Internal,
            ),
            (
                LifecycleError::Call(CallError::Failure {
                    path: PathBuf::from("/d"),
                    kind: flexvolume_protocol::CallOutKind::Attach,
                    message: "no such volume".into(),
                    code: Some(ErrorCode::NotFound),
                }),
                Code::NotFound,
            ),
            (
                LifecycleError::Call(CallError::Failure {
                    path: PathBuf::from("/d"),
                    kind: flexvolume_protocol::CallOutKind::Provision,
                    message: "pool full".into(),
                    code: Some(ErrorCode::OutOfCapacity),
                }),
                Code::ResourceExhausted,
            ),
        ];
        let more = [
            (
                LifecycleError::Path(PathError::Symlink {
                    path: PathBuf::from("/t/l"),
                    component: PathBuf::from("/t/l"),
                }),
                Code::FailedPrecondition,
            ),
            (
                LifecycleError::Mount(MountError::Path(PathError::DotDot {
                    path: "/a/..".into(),
                })),
                Code::InvalidArgument,
            ),
            (
                LifecycleError::ForeignMount {
                    target: PathBuf::from("/t"),
                    volume: "v".into(),
                },
                Code::FailedPrecondition,
            ),
            (
                LifecycleError::Incompatible {
                    target: PathBuf::from("/t"),
                    volume: "v".into(),
                    what: "access",
                    found: "read-write".into(),
                    requested: "read-only".into(),
                },
                Code::AlreadyExists,
            ),
            (
                LifecycleError::Call(CallError::Arguments {
                    path: PathBuf::from("/d"),
                    kind: flexvolume_protocol::CallOutKind::Mount,
                    reason: "too long".into(),
                }),
                Code::InvalidArgument,
            ),
        ];
        for (error, code) in cases.into_iter().chain(more) {
            let status = from_lifecycle(&error);
            assert_eq!(status.code(), code, "{error}");
            assert!(!status.message().is_empty());
        }
    }
}
