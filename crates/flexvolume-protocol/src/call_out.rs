//! Call-outs: which ones the protocol has and the exact argv a driver receives for each.

use std::ffi::OsString;
use std::fmt;

use serde::Serialize;

use crate::error::ProtocolError;
use crate::options::Options;

/// Every call-out of the protocol. The string form is the `argv[1]` the driver receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CallOutKind {
    Init,
    GetVolumeName,
    Attach,
    WaitForAttach,
    IsAttached,
    MountDevice,
    Detach,
    UnmountDevice,
    Mount,
    Unmount,
    ExpandVolume,
    ExpandFs,
    /// Dynamic provisioning (the Kubernetes flex provisioner's convention; kubelet never
    /// calls it): create the volume a StorageClass describes.
    Provision,
    /// Dynamic provisioning: delete a volume `provision` created.
    Delete,
}

impl CallOutKind {
    pub const ALL: [CallOutKind; 14] = [
        Self::Init,
        Self::GetVolumeName,
        Self::Attach,
        Self::WaitForAttach,
        Self::IsAttached,
        Self::MountDevice,
        Self::Detach,
        Self::UnmountDevice,
        Self::Mount,
        Self::Unmount,
        Self::ExpandVolume,
        Self::ExpandFs,
        Self::Provision,
        Self::Delete,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Init => "init",
            Self::GetVolumeName => "getvolumename",
            Self::Attach => "attach",
            Self::WaitForAttach => "waitforattach",
            Self::IsAttached => "isattached",
            Self::MountDevice => "mountdevice",
            Self::Detach => "detach",
            Self::UnmountDevice => "unmountdevice",
            Self::Mount => "mount",
            Self::Unmount => "unmount",
            Self::ExpandVolume => "expandvolume",
            Self::ExpandFs => "expandfs",
            Self::Provision => "provision",
            Self::Delete => "delete",
        }
    }

    /// How many arguments follow the call-out name in argv.
    pub fn arity(self) -> usize {
        match self {
            Self::Init => 0,
            Self::GetVolumeName
            | Self::UnmountDevice
            | Self::Unmount
            | Self::Provision
            | Self::Delete => 1,
            Self::Attach | Self::WaitForAttach | Self::IsAttached | Self::Detach | Self::Mount => 2,
            Self::MountDevice => 3,
            Self::ExpandVolume => 4,
            Self::ExpandFs => 5,
        }
    }

    /// The usage line, for error messages and `flexd call --help`.
    pub fn usage(self) -> &'static str {
        match self {
            Self::Init => "init",
            Self::GetVolumeName => "getvolumename <json>",
            Self::Attach => "attach <json> <node>",
            Self::WaitForAttach => "waitforattach <device> <json>",
            Self::IsAttached => "isattached <json> <node>",
            Self::MountDevice => "mountdevice <device-mount-dir> <device> <json>",
            Self::Detach => "detach <volume-name> <node>",
            Self::UnmountDevice => "unmountdevice <device-mount-dir>",
            Self::Mount => "mount <target-dir> <json>",
            Self::Unmount => "unmount <target-dir>",
            Self::ExpandVolume => "expandvolume <json> <device-mount-dir> <new-bytes> <old-bytes>",
            Self::ExpandFs => "expandfs <json> <device> <device-mount-dir> <new-bytes> <old-bytes>",
            Self::Provision => "provision <json>",
            Self::Delete => "delete <json>",
        }
    }
}

impl fmt::Display for CallOutKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CallOutKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown call-out {s:?}"))
    }
}

/// One call-out, ready to run: its kind and the exact argv after the executable.
///
/// `<json>` is always one argv element. Values that must never be shown (secrets inside the
/// options) travel along so every message built from this call can redact them.
#[derive(Clone)]
pub struct CallOut {
    pub kind: CallOutKind,
    pub args: Vec<OsString>,
    sensitive: Vec<String>,
}

impl CallOut {
    /// A call-out from raw arguments (the `flexd call` front end); checks the arity only.
    pub fn from_raw(kind: CallOutKind, args: Vec<OsString>) -> Result<Self, ProtocolError> {
        if args.len() != kind.arity() {
            return Err(ProtocolError::Arity {
                kind,
                given: args.len(),
            });
        }
        Ok(Self {
            kind,
            args,
            sensitive: Vec::new(),
        })
    }

    fn new(kind: CallOutKind, args: Vec<OsString>, options: Option<&Options>) -> Self {
        let sensitive = options.map(Options::sensitive_values).unwrap_or_default();
        Self {
            kind,
            args,
            sensitive,
        }
    }

    pub fn init() -> Self {
        Self::new(CallOutKind::Init, vec![], None)
    }
    pub fn get_volume_name(options: &Options) -> Self {
        Self::new(
            CallOutKind::GetVolumeName,
            vec![options.to_json().into()],
            Some(options),
        )
    }
    pub fn attach(options: &Options, node: &str) -> Self {
        let args = vec![options.to_json().into(), node.into()];
        Self::new(CallOutKind::Attach, args, Some(options))
    }
    pub fn wait_for_attach(device: &str, options: &Options) -> Self {
        let args = vec![device.into(), options.to_json().into()];
        Self::new(CallOutKind::WaitForAttach, args, Some(options))
    }
    pub fn is_attached(options: &Options, node: &str) -> Self {
        let args = vec![options.to_json().into(), node.into()];
        Self::new(CallOutKind::IsAttached, args, Some(options))
    }
    pub fn mount_device(
        device_mount_dir: &std::path::Path,
        device: &str,
        options: &Options,
    ) -> Self {
        let args = vec![
            device_mount_dir.into(),
            device.into(),
            options.to_json().into(),
        ];
        Self::new(CallOutKind::MountDevice, args, Some(options))
    }
    pub fn detach(volume_name: &str, node: &str) -> Self {
        Self::new(
            CallOutKind::Detach,
            vec![volume_name.into(), node.into()],
            None,
        )
    }
    pub fn unmount_device(device_mount_dir: &std::path::Path) -> Self {
        Self::new(
            CallOutKind::UnmountDevice,
            vec![device_mount_dir.into()],
            None,
        )
    }
    pub fn mount(target: &std::path::Path, options: &Options) -> Self {
        let args = vec![target.into(), options.to_json().into()];
        Self::new(CallOutKind::Mount, args, Some(options))
    }
    pub fn unmount(target: &std::path::Path) -> Self {
        Self::new(CallOutKind::Unmount, vec![target.into()], None)
    }
    pub fn expand_volume(
        options: &Options,
        device_mount_dir: &std::path::Path,
        new_bytes: u64,
        old_bytes: u64,
    ) -> Self {
        let paths = [device_mount_dir.into()];
        Self::expand(
            CallOutKind::ExpandVolume,
            options,
            paths,
            new_bytes,
            old_bytes,
        )
    }
    pub fn expand_fs(
        options: &Options,
        device: &str,
        device_mount_dir: &std::path::Path,
        new_bytes: u64,
        old_bytes: u64,
    ) -> Self {
        let paths = [device.into(), device_mount_dir.into()];
        Self::expand(CallOutKind::ExpandFs, options, paths, new_bytes, old_bytes)
    }
    /// Both expansions take the options, then their paths, then the new and old sizes in bytes.
    fn expand<const N: usize>(
        kind: CallOutKind,
        options: &Options,
        paths: [OsString; N],
        new_bytes: u64,
        old_bytes: u64,
    ) -> Self {
        let mut args = vec![options.to_json().into()];
        args.extend(paths);
        args.extend([new_bytes.to_string().into(), old_bytes.to_string().into()]);
        Self::new(kind, args, Some(options))
    }

    /// `provision <json>`: the StorageClass parameters, `kubernetes.io/pvOrVolumeName` and the
    /// requested size (see [`crate::options`]'s `REQUEST_*` keys).
    pub fn provision(options: &Options) -> Self {
        Self::new(
            CallOutKind::Provision,
            vec![options.to_json().into()],
            Some(options),
        )
    }
    /// `delete <json>`: the provisioned volume's options.
    pub fn delete(options: &Options) -> Self {
        Self::new(
            CallOutKind::Delete,
            vec![options.to_json().into()],
            Some(options),
        )
    }

    /// Secret values (and their base64 forms) that must be redacted from anything shown.
    pub fn sensitive_values(&self) -> &[String] {
        &self.sensitive
    }

    /// Replaces every sensitive value in `text` by `<redacted>`.
    pub fn redact(&self, text: &str) -> String {
        crate::options::redact_values(text, &self.sensitive)
    }
}

impl fmt::Debug for CallOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args: Vec<String> = self
            .args
            .iter()
            .map(|a| self.redact(&a.to_string_lossy()))
            .collect();
        f.debug_struct("CallOut")
            .field("kind", &self.kind)
            .field("args", &args)
            .finish()
    }
}
