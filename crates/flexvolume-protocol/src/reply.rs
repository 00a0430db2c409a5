//! Replies: what a driver answers, and how each field is read from its JSON object.
//!
//! Real drivers are shell scripts written against kubelet's behaviour, so the reading is
//! deliberately more tolerant than kubelet's (which fails on all of these): capitalised keys,
//! any case and spacing of the status words, `"true"` strings for booleans.

use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};

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
    pub(crate) fn from_object(obj: &Map<String, Value>) -> Option<Self> {
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
