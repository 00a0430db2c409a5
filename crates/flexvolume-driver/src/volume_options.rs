//! The options JSON a call-out receives, typed: the well-known `kubernetes.io/*` keys, and
//! secrets base64-decoded behind a `Debug` that never shows them.

use std::fmt;

use flexvolume_protocol::options::{self, Options, OptionsError};
use flexvolume_protocol::PodInfo;

/// A secret value from the options. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// The decoded bytes. Do not log them.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(options::REDACTED)
    }
}

/// The options JSON of a call-out (docs/protocol.md#options), well-known keys typed. Checked when
/// parsed, so a handler never meets a malformed `readwrite`, fsGroup or secret.
#[derive(Clone, PartialEq, Eq)]
pub struct VolumeOptions {
    options: Options,
    read_only: bool,
    fs_group: Option<u32>,
}

impl VolumeOptions {
    pub fn parse(json: &str) -> Result<Self, OptionsArgError> {
        let options = Options::from_json(json)?;
        let read_only = match options.get(options::READ_WRITE) {
            None | Some("rw") | Some("") => false,
            Some("ro") => true,
            Some(other) => return Err(OptionsArgError::ReadWrite(other.to_owned())),
        };
        let fs_group = match options.get(options::FS_GROUP) {
            None | Some("") => None,
            Some(gid) => Some(
                gid.parse()
                    .map_err(|_| OptionsArgError::FsGroup(gid.to_owned()))?,
            ),
        };
        Ok(Self {
            options,
            read_only,
            fs_group,
        })
    }

    /// `kubernetes.io/fsType`; `None` when absent or empty (the driver picks its default).
    pub fn fs_type(&self) -> Option<&str> {
        self.options.get(options::FS_TYPE).filter(|t| !t.is_empty())
    }

    /// `kubernetes.io/readwrite` is `ro`.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// `kubernetes.io/pvOrVolumeName`: the PV's (or pod volume's) name.
    pub fn pv_or_volume_name(&self) -> Option<&str> {
        self.options
            .get(options::PV_OR_VOLUME_NAME)
            .filter(|n| !n.is_empty())
    }

    /// The pod the volume is mounted for (mount only; empty fields otherwise).
    pub fn pod(&self) -> PodInfo {
        let field = |key| self.options.get(key).unwrap_or_default().to_owned();
        PodInfo {
            name: field(options::POD_NAME),
            namespace: field(options::POD_NAMESPACE),
            uid: field(options::POD_UID),
            service_account: field(options::SERVICE_ACCOUNT_NAME),
        }
    }

    /// `kubernetes.io/mounterArgs.FsGroup` (mount only, when the pod sets one).
    pub fn fs_group(&self) -> Option<u32> {
        self.fs_group
    }

    /// `requestBytes` (provision only): the size asked for; `None` when the CO asked for none.
    pub fn request_bytes(&self) -> Option<u64> {
        self.options
            .get(options::REQUEST_BYTES)
            .and_then(|b| b.parse().ok())
    }

    /// Any option, e.g. one of the volume's own (`flexVolume.options`).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.options.get(key)
    }

    /// The decoded secret `key` (from `kubernetes.io/secret/<key>`; mount and unmount only).
    pub fn secret(&self, key: &str) -> Option<Secret> {
        // Every secret was decoded once in `parse`, so this cannot fail here.
        self.options.secret(key).and_then(Result::ok).map(Secret)
    }

    /// The host library's view of these options (redaction helpers, the exact JSON).
    pub fn options(&self) -> &Options {
        &self.options
    }
}

impl fmt::Debug for VolumeOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.options.to_redacted_json())
    }
}

/// Why the options argument is unusable. Never quotes a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsArgError {
    #[error(transparent)]
    Json(#[from] OptionsError),
    #[error("kubernetes.io/readwrite is {0:?}; expected \"ro\" or \"rw\"")]
    ReadWrite(String),
    #[error("kubernetes.io/mounterArgs.FsGroup is {0:?}; expected a group id")]
    FsGroup(String),
}
