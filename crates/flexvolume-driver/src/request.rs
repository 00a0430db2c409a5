//! argv exactly as kubelet passes it (docs/protocol.md#call-outs): exact arity, paths that
//! need not be UTF-8, the options argument parsed as [`VolumeOptions`].

use std::ffi::OsString;
use std::path::PathBuf;

use flexvolume_protocol::CallOutKind;

use crate::volume_options::{OptionsArgError, VolumeOptions};

/// One call-out as kubelet invokes it, argv parsed (docs/protocol.md#call-outs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Init,
    GetVolumeName {
        options: VolumeOptions,
    },
    Attach {
        options: VolumeOptions,
        node: String,
    },
    WaitForAttach {
        device: String,
        options: VolumeOptions,
    },
    IsAttached {
        options: VolumeOptions,
        node: String,
    },
    MountDevice {
        dir: PathBuf,
        device: String,
        options: VolumeOptions,
    },
    Detach {
        volume_name: String,
        node: String,
    },
    UnmountDevice {
        dir: PathBuf,
    },
    Mount {
        target: PathBuf,
        options: VolumeOptions,
    },
    Unmount {
        target: PathBuf,
    },
    ExpandVolume {
        options: VolumeOptions,
        dir: PathBuf,
        new_bytes: u64,
        old_bytes: u64,
    },
    ExpandFs {
        options: VolumeOptions,
        device: String,
        dir: PathBuf,
        new_bytes: u64,
        old_bytes: u64,
    },
    Provision {
        options: VolumeOptions,
    },
    Delete {
        options: VolumeOptions,
    },
}

/// Why argv is not a call-out. An unknown call-out answers `Not supported` (so hosts newer
/// than the driver degrade safely); every other problem answers `Failure`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgvError {
    #[error("no call-out given; usage: <driver> <call-out> [arguments]")]
    Missing,
    #[error("unknown call-out {0:?}")]
    Unknown(String),
    #[error("{} takes {} argument(s) ({}), {given} given", kind, kind.arity(), kind.usage())]
    Arity { kind: CallOutKind, given: usize },
    #[error("{kind}: argument <{name}> is not UTF-8")]
    NotUtf8 {
        kind: CallOutKind,
        name: &'static str,
    },
    #[error("{kind}: <{name}> is {value:?}, not a number of bytes")]
    Bytes {
        kind: CallOutKind,
        name: &'static str,
        value: String,
    },
    #[error("{kind}: bad <json>: {source}")]
    Options {
        kind: CallOutKind,
        #[source]
        source: OptionsArgError,
    },
}

impl Request {
    /// Parses argv after the executable (`args[0]` is the call-out's name). The arity is
    /// exact: kubelet never passes more or fewer arguments, so anything else is a caller's bug.
    pub fn parse(args: &[OsString]) -> Result<Self, ArgvError> {
        let (name, rest) = args.split_first().ok_or(ArgvError::Missing)?;
        let name = name.to_string_lossy();
        let kind: CallOutKind = name
            .parse()
            .map_err(|_| ArgvError::Unknown(name.clone().into_owned()))?;
        if rest.len() != kind.arity() {
            return Err(ArgvError::Arity {
                kind,
                given: rest.len(),
            });
        }
        let text = |i: usize, name: &'static str| -> Result<String, ArgvError> {
            rest[i]
                .to_str()
                .map(str::to_owned)
                .ok_or(ArgvError::NotUtf8 { kind, name })
        };
        let options = |i: usize| -> Result<VolumeOptions, ArgvError> {
            VolumeOptions::parse(&text(i, "json")?)
                .map_err(|source| ArgvError::Options { kind, source })
        };
        let path = |i: usize| PathBuf::from(&rest[i]);
        let bytes = |i: usize, name: &'static str| -> Result<u64, ArgvError> {
            let value = text(i, name)?;
            value
                .parse()
                .map_err(|_| ArgvError::Bytes { kind, name, value })
        };
        Ok(match kind {
            CallOutKind::Init => Self::Init,
            CallOutKind::GetVolumeName => Self::GetVolumeName {
                options: options(0)?,
            },
            CallOutKind::Attach => Self::Attach {
                options: options(0)?,
                node: text(1, "node")?,
            },
            CallOutKind::WaitForAttach => Self::WaitForAttach {
                device: text(0, "device")?,
                options: options(1)?,
            },
            CallOutKind::IsAttached => Self::IsAttached {
                options: options(0)?,
                node: text(1, "node")?,
            },
            CallOutKind::MountDevice => Self::MountDevice {
                dir: path(0),
                device: text(1, "device")?,
                options: options(2)?,
            },
            CallOutKind::Detach => Self::Detach {
                volume_name: text(0, "volume-name")?,
                node: text(1, "node")?,
            },
            CallOutKind::UnmountDevice => Self::UnmountDevice { dir: path(0) },
            CallOutKind::Mount => Self::Mount {
                target: path(0),
                options: options(1)?,
            },
            CallOutKind::Unmount => Self::Unmount { target: path(0) },
            CallOutKind::ExpandVolume => Self::ExpandVolume {
                options: options(0)?,
                dir: path(1),
                new_bytes: bytes(2, "new-bytes")?,
                old_bytes: bytes(3, "old-bytes")?,
            },
            CallOutKind::ExpandFs => Self::ExpandFs {
                options: options(0)?,
                device: text(1, "device")?,
                dir: path(2),
                new_bytes: bytes(3, "new-bytes")?,
                old_bytes: bytes(4, "old-bytes")?,
            },
            CallOutKind::Provision => Self::Provision {
                options: options(0)?,
            },
            CallOutKind::Delete => Self::Delete {
                options: options(0)?,
            },
        })
    }

    pub fn kind(&self) -> CallOutKind {
        match self {
            Self::Init => CallOutKind::Init,
            Self::GetVolumeName { .. } => CallOutKind::GetVolumeName,
            Self::Attach { .. } => CallOutKind::Attach,
            Self::WaitForAttach { .. } => CallOutKind::WaitForAttach,
            Self::IsAttached { .. } => CallOutKind::IsAttached,
            Self::MountDevice { .. } => CallOutKind::MountDevice,
            Self::Detach { .. } => CallOutKind::Detach,
            Self::UnmountDevice { .. } => CallOutKind::UnmountDevice,
            Self::Mount { .. } => CallOutKind::Mount,
            Self::Unmount { .. } => CallOutKind::Unmount,
            Self::ExpandVolume { .. } => CallOutKind::ExpandVolume,
            Self::ExpandFs { .. } => CallOutKind::ExpandFs,
            Self::Provision { .. } => CallOutKind::Provision,
            Self::Delete { .. } => CallOutKind::Delete,
        }
    }

    pub(crate) fn options(&self) -> Option<&VolumeOptions> {
        match self {
            Self::GetVolumeName { options }
            | Self::Attach { options, .. }
            | Self::WaitForAttach { options, .. }
            | Self::IsAttached { options, .. }
            | Self::MountDevice { options, .. }
            | Self::Mount { options, .. }
            | Self::ExpandVolume { options, .. }
            | Self::ExpandFs { options, .. }
            | Self::Provision { options }
            | Self::Delete { options } => Some(options),
            Self::Init
            | Self::Detach { .. }
            | Self::UnmountDevice { .. }
            | Self::Unmount { .. } => None,
        }
    }
}
