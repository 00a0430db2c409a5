//! The FlexVolume call-out protocol: what we pass to a driver and how we read its answer.
//!
//! Pure: no process, no filesystem. The runner hands us the raw output and exit status.
//!
//! Real drivers are shell scripts written against kubelet's behaviour, so the parser is
//! deliberately more tolerant than kubelet's (which fails on all of these): capitalised keys,
//! log lines before the JSON, several JSON objects in a row, `-ne ` from dash's `echo`, junk
//! after the JSON, and JSON on stderr when stdout has none.

use std::ffi::OsString;
use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};

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

    fn bit(self) -> u16 {
        1 << (self as u16)
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

/// A set of call-outs, e.g. those a driver answered `Not supported` to. Lock-free so a plugin
/// shared by many operations can remember answers without a mutex.
#[derive(Debug, Default)]
pub struct CallOutSet(std::sync::atomic::AtomicU16);

impl CallOutSet {
    pub fn insert(&self, kind: CallOutKind) {
        self.0
            .fetch_or(kind.bit(), std::sync::atomic::Ordering::Relaxed);
    }
    pub fn contains(&self, kind: CallOutKind) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed) & kind.bit() != 0
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

/// The `status` field of a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Status {
    Success,
    Failure,
    #[serde(rename = "Not supported")]
    NotSupported,
}

impl Status {
    /// Kubelet compares exactly; we accept any case and spacing of the three words, since
    /// drivers have shipped `success`, `NotSupported` and `Not Supported`.
    fn parse(raw: &str) -> Option<Self> {
        let folded: String = raw
            .chars()
            .filter(|c| !c.is_whitespace() && *c != '_' && *c != '-')
            .flat_map(char::to_lowercase)
            .collect();
        match folded.as_str() {
            "success" => Some(Self::Success),
            "failure" => Some(Self::Failure),
            "notsupported" => Some(Self::NotSupported),
            _ => None,
        }
    }
}

/// What a driver can do, from `init`. Fields absent in the reply keep Kubernetes' defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    pub attach: bool,
    #[serde(rename = "selinuxRelabel")]
    pub selinux_relabel: bool,
    pub supports_metrics: bool,
    pub fs_group: bool,
    #[serde(rename = "requiresFSResize")]
    pub requires_fs_resize: bool,
    /// The driver answers `provision` and `delete` (flexd's extension; kubelet ignores
    /// capabilities it does not know). Off unless the driver says so, and left out of the JSON
    /// when off, so a non-provisioning driver's `init` reply is what it always was.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub provision: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            attach: true,
            selinux_relabel: true,
            supports_metrics: false,
            fs_group: true,
            requires_fs_resize: true,
            provision: false,
        }
    }
}

impl Capabilities {
    /// Whether a CSI controller has work for this driver: attaching (ControllerPublish) or
    /// provisioning (CreateVolume). One rule for everything that decides whether the driver
    /// gets a controller: the Identity's `CONTROLLER_SERVICE`, the Controller service itself,
    /// and the controller Deployment `flexd manifests` prints.
    pub fn has_controller_side(&self) -> bool {
        self.attach || self.provision
    }

    /// Merges a (possibly partial) capabilities object onto the defaults. Keys match
    /// case-insensitively; `"true"`/`"false"` strings are accepted; other values are ignored.
    fn merged_from(obj: &Map<String, Value>) -> Self {
        let mut caps = Self::default();
        for (key, value) in obj {
            let Some(flag) = as_bool(value) else { continue };
            match key.to_ascii_lowercase().as_str() {
                "attach" => caps.attach = flag,
                "selinuxrelabel" => caps.selinux_relabel = flag,
                "supportsmetrics" => caps.supports_metrics = flag,
                "fsgroup" => caps.fs_group = flag,
                "requiresfsresize" => caps.requires_fs_resize = flag,
                "provision" => caps.provision = flag,
                _ => {}
            }
        }
        caps
    }
}

/// What went wrong, when a driver can name it: the optional `code` of a `Failure` reply
/// (flexd's extension; kubelet ignores fields it does not know). flexd answers CSI with the
/// matching code instead of `INTERNAL`, and does not retry what cannot succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ErrorCode {
    /// The volume (or the node) does not exist.
    NotFound,
    /// A volume of that name exists and is not the one asked for.
    AlreadyExists,
    /// The storage has no room for the volume.
    OutOfCapacity,
    /// The request cannot be served as written (an option refused, a name or path not
    /// allowed): retrying it unchanged fails again.
    InvalidArgument,
    /// A size outside what the storage can hold at all.
    OutOfRange,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 5] = [
        Self::NotFound,
        Self::AlreadyExists,
        Self::OutOfCapacity,
        Self::InvalidArgument,
        Self::OutOfRange,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "NotFound",
            Self::AlreadyExists => "AlreadyExists",
            Self::OutOfCapacity => "OutOfCapacity",
            Self::InvalidArgument => "InvalidArgument",
            Self::OutOfRange => "OutOfRange",
        }
    }

    /// Any case and spacing (`NotFound`, `not_found`, `Not found`); unknown codes are `None`,
    /// so a driver newer than flexd degrades to a plain `Failure`.
    pub fn parse(raw: &str) -> Option<Self> {
        let folded: String = raw
            .chars()
            .filter(|c| !c.is_whitespace() && *c != '_' && *c != '-')
            .flat_map(char::to_lowercase)
            .collect();
        Self::ALL
            .into_iter()
            .find(|c| c.as_str().to_ascii_lowercase() == folded)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A parsed reply. Only `status` is required; everything else is optional in the protocol.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reply {
    pub status: Status,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attached: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_new_size: Option<u64>,
    /// A `Failure` the driver names (see [`ErrorCode`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
    /// `provision`: options the new volume carries besides the StorageClass parameters (what
    /// attach and mount need to find it again), as the flexVolume `options` of its PV.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<std::collections::BTreeMap<String, String>>,
}

impl Reply {
    /// Reads a reply from one JSON object, or `None` if it has no recognisable `status`.
    fn from_object(obj: &Map<String, Value>) -> Option<Self> {
        let get = |name: &str| {
            obj.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v)
        };
        let status = Status::parse(get("status")?.as_str()?)?;
        let text = |name: &str| get(name).and_then(|v| v.as_str()).map(str::to_owned);
        Some(Self {
            status,
            message: text("message").unwrap_or_default(),
            device: text("device"),
            volume_name: text("volumeName"),
            attached: get("attached").and_then(as_bool),
            capabilities: get("capabilities")
                .and_then(Value::as_object)
                .map(Capabilities::merged_from),
            volume_new_size: get("volumeNewSize").and_then(as_u64),
            code: get("code")
                .and_then(Value::as_str)
                .and_then(ErrorCode::parse),
            options: get("options").and_then(Value::as_object).map(|o| {
                o.iter()
                    .filter_map(|(k, v)| match v {
                        Value::String(s) => Some((k.clone(), s.clone())),
                        Value::Number(_) | Value::Bool(_) => Some((k.clone(), v.to_string())),
                        _ => None,
                    })
                    .collect()
            }),
        })
    }
}

fn as_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) if s.eq_ignore_ascii_case("true") => Some(true),
        Value::String(s) if s.eq_ignore_ascii_case("false") => Some(false),
        _ => None,
    }
}

fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// How many `{` positions the scanner tries before giving up. Bounds the work on hostile
/// output (a megabyte of `{"a":"{"a":"…` would otherwise cost quadratic time).
const MAX_PARSE_ATTEMPTS: usize = 256;

/// Finds the reply in a driver's output: the first JSON object, anywhere in the text, that has a
/// recognisable `status`. Objects without one (log records in JSON, say) are skipped.
pub fn find_reply(output: &[u8]) -> Option<Reply> {
    let text = String::from_utf8_lossy(output);
    let mut attempts = 0;
    let mut pos = 0;
    while let Some(offset) = text[pos..].find('{') {
        attempts += 1;
        if attempts > MAX_PARSE_ATTEMPTS {
            return None;
        }
        let start = pos + offset;
        let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        let mut parsed_any = false;
        // Consecutive objects (`{…}{…}` or `{…}\n{…}`) are read in one go.
        while let Some(Ok(value)) = stream.next() {
            parsed_any = true;
            if let Some(reply) = value.as_object().and_then(Reply::from_object) {
                return Some(reply);
            }
        }
        pos = if parsed_any {
            start + stream.byte_offset().max(1)
        } else {
            start + 1
        };
    }
    None
}

/// How a driver process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Code(c) => write!(f, "exit status {c}"),
            Self::Signal(s) => write!(f, "killed by signal {s}"),
        }
    }
}

/// Errors of the protocol layer: a reply that is not one, or an answer that breaks the rules.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    #[error("call-out {kind} takes {} argument(s) ({}), {given} given", kind.arity(), kind.usage())]
    Arity { kind: CallOutKind, given: usize },
    #[error("driver gave no parsable reply to {kind} ({exit}); output: {output:?}")]
    NoReply {
        kind: CallOutKind,
        exit: ExitStatus,
        /// Redacted and truncated.
        output: String,
    },
    #[error("driver bug: {kind} answered Success but ended with {exit}")]
    SuccessWithBadExit { kind: CallOutKind, exit: ExitStatus },
}

/// Longest excerpt of driver output quoted in an error message.
pub const QUOTE_LIMIT: usize = 512;

/// Applies the exit-status rules: the JSON status decides, except that `Success` together with a
/// failing exit is a driver bug. `quote` turns raw output into a redacted excerpt for errors.
pub fn interpret(
    kind: CallOutKind,
    exit: ExitStatus,
    stdout: &[u8],
    stderr: &[u8],
    quote: impl Fn(&[u8]) -> String,
) -> Result<Reply, ProtocolError> {
    // A reply on stdout wins; stderr is read only when stdout has none (some drivers log to
    // stdout and answer on stderr, or print everything to stderr).
    let reply = find_reply(stdout).or_else(|| find_reply(stderr));
    match reply {
        Some(reply) if reply.status == Status::Success && exit != ExitStatus::Code(0) => {
            Err(ProtocolError::SuccessWithBadExit { kind, exit })
        }
        Some(reply) => Ok(reply),
        None => {
            let shown = if stdout.iter().all(u8::is_ascii_whitespace) {
                stderr
            } else {
                stdout
            };
            Err(ProtocolError::NoReply {
                kind,
                exit,
                output: quote(shown),
            })
        }
    }
}

/// A lossy, truncated excerpt of output, for error messages. Redaction is the caller's job.
pub fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    if text.len() <= QUOTE_LIMIT {
        return text.to_owned();
    }
    let mut end = QUOTE_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], bytes.len())
}

#[cfg(test)]
mod tests;
