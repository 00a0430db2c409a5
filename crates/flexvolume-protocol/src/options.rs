//! The options JSON a driver receives, built exactly the way kubelet builds it.
//!
//! Pure. Drivers expand this JSON unquoted (`$*`) in shell, so the serialised form must be
//! compact (no whitespace), with keys sorted and every value a string — byte-for-byte what
//! kubelet passes. Secret values live only inside [`Options`]; every printable form redacts them.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;

use crate::spec::{PodInfo, VolumeSpec};

pub const FS_TYPE: &str = "kubernetes.io/fsType";
pub const READ_WRITE: &str = "kubernetes.io/readwrite";
pub const PV_OR_VOLUME_NAME: &str = "kubernetes.io/pvOrVolumeName";
pub const POD_NAME: &str = "kubernetes.io/pod.name";
pub const POD_NAMESPACE: &str = "kubernetes.io/pod.namespace";
pub const POD_UID: &str = "kubernetes.io/pod.uid";
pub const SERVICE_ACCOUNT_NAME: &str = "kubernetes.io/serviceAccount.name";
pub const FS_GROUP: &str = "kubernetes.io/mounterArgs.FsGroup";
pub const SECRET_PREFIX: &str = "kubernetes.io/secret/";
/// `provision`: the requested size in bytes, and rounded up to whole MiB and GiB (the flex
/// provisioner's convention, so a shell driver need not do arithmetic).
pub const REQUEST_BYTES: &str = "requestBytes";
pub const REQUEST_MIB: &str = "requestMiB";
pub const REQUEST_GIB: &str = "requestGiB";

/// The prefix of every key the host itself sets (`kubernetes.io/fsType`,
/// `kubernetes.io/pvOrVolumeName`, the pod's fields, the secrets …).
pub const HOST_KEY_PREFIX: &str = "kubernetes.io/";

/// Whether `key` is one the host sets itself: a volume's own options (a StorageClass's
/// parameters, a CSI volume context) must not carry it, or they would rename the volume, fake
/// the requested size or pose as a secret — the volume's options are laid over the host's
/// keys, as kubelet lays a PV's options over its own.
pub fn is_host_key(key: &str) -> bool {
    key.starts_with(HOST_KEY_PREFIX) || matches!(key, REQUEST_BYTES | REQUEST_MIB | REQUEST_GIB)
}

/// What is shown in place of a secret value.
pub const REDACTED: &str = "<redacted>";

/// The options of one call-out. Construct with [`Options::for_volume`] (attach, waitforattach,
/// mountdevice, … — no pod info, no secrets) or [`Options::for_mount`].
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Options {
    map: BTreeMap<String, String>,
    /// Raw secret values, kept so that anything echoing them can be redacted.
    secret_values: Vec<String>,
}

impl Options {
    /// Options for every call-out but mount: defaults, then extra options, then the user's.
    pub fn for_volume(spec: &VolumeSpec) -> Self {
        Self::build(spec, BTreeMap::new())
    }

    /// Options for mount: adds pod information, the fsGroup and the secrets (base64).
    pub fn for_mount(spec: &VolumeSpec, pod: &PodInfo, fs_group: Option<u32>) -> Self {
        let mut extra = BTreeMap::new();
        let pod_fields = [
            (POD_NAME, &pod.name),
            (POD_NAMESPACE, &pod.namespace),
            (POD_UID, &pod.uid),
            (SERVICE_ACCOUNT_NAME, &pod.service_account),
        ];
        for (key, value) in pod_fields {
            extra.insert(key.to_owned(), value.clone());
        }
        if let Some(gid) = fs_group {
            extra.insert(FS_GROUP.to_owned(), gid.to_string());
        }
        Self::build_with_secrets(spec, extra)
    }

    /// Options for `provision` and `delete`: the volume's options (a StorageClass's parameters
    /// for provision), `kubernetes.io/pvOrVolumeName`, the requested size when there is one,
    /// and the secrets (base64, as mount gets them).
    pub fn for_provision(spec: &VolumeSpec, request_bytes: Option<u64>) -> Self {
        let mut extra = BTreeMap::new();
        if let Some(bytes) = request_bytes {
            extra.insert(REQUEST_BYTES.to_owned(), bytes.to_string());
            extra.insert(REQUEST_MIB.to_owned(), bytes.div_ceil(1 << 20).to_string());
            extra.insert(REQUEST_GIB.to_owned(), bytes.div_ceil(1 << 30).to_string());
        }
        Self::build_with_secrets(spec, extra)
    }

    /// [`Options::build`] with the spec's secrets too, base64 under their prefix, their values
    /// kept so that everything shown can redact them.
    fn build_with_secrets(spec: &VolumeSpec, mut extra: BTreeMap<String, String>) -> Self {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut secret_values = Vec::new();
        for (key, value) in &spec.secrets {
            extra.insert(format!("{SECRET_PREFIX}{key}"), b64.encode(value));
            secret_values.push(String::from_utf8_lossy(value).into_owned());
        }
        let mut options = Self::build(spec, extra);
        options.secret_values = secret_values;
        options
    }

    fn build(spec: &VolumeSpec, extra: BTreeMap<String, String>) -> Self {
        let mut map = BTreeMap::new();
        map.insert(FS_TYPE.to_owned(), spec.fs_type.clone());
        let rw = if spec.read_only { "ro" } else { "rw" };
        map.insert(READ_WRITE.to_owned(), rw.to_owned());
        map.insert(PV_OR_VOLUME_NAME.to_owned(), spec.volume_name.clone());
        map.extend(extra);
        map.extend(spec.options.iter().map(|(k, v)| (k.clone(), v.clone())));
        Self {
            map,
            secret_values: Vec::new(),
        }
    }

    /// The exact argv element: compact, sorted keys, string values.
    pub fn to_json(&self) -> String {
        // Serialising a map of strings cannot fail.
        serde_json::to_string(&self.map).unwrap_or_default()
    }

    /// The same JSON with every `kubernetes.io/secret/*` value replaced, for logs and output.
    pub fn to_redacted_json(&self) -> String {
        let shown: BTreeMap<&str, &str> = self
            .map
            .iter()
            .map(|(k, v)| {
                let v = if k.starts_with(SECRET_PREFIX) {
                    REDACTED
                } else {
                    v.as_str()
                };
                (k.as_str(), v)
            })
            .collect();
        serde_json::to_string(&shown).unwrap_or_default()
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.map.get(key).map(String::as_str)
    }

    /// Every value that must never be shown: raw secrets and the base64 forms we pass.
    pub fn sensitive_values(&self) -> Vec<String> {
        let encoded = self
            .map
            .iter()
            .filter(|(k, _)| k.starts_with(SECRET_PREFIX))
            .map(|(_, v)| v.clone());
        self.secret_values
            .iter()
            .cloned()
            .chain(encoded)
            .filter(|v| !v.is_empty())
            .collect()
    }
}

/// Why an options JSON received by a driver could not be read. Never quotes a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("the options are not a JSON object of strings: {0}")]
    NotAnObject(String),
    #[error("option {key:?} is not a string (kubelet passes only strings)")]
    NotAString { key: String },
    #[error("secret option {key:?} is not valid base64")]
    BadSecret { key: String },
}

/// The driver's side: reading the options JSON that kubelet (or flexd) passed.
impl Options {
    /// Parses the `<json>` argument. Numbers and booleans (hand-written test calls) are taken as
    /// their JSON text; nested values are refused. Secret values are decoded once, so that
    /// anything built from these options can redact them.
    pub fn from_json(text: &str) -> Result<Self, OptionsError> {
        let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text)
            // serde's message names a position, never the content.
            .map_err(|e| OptionsError::NotAnObject(e.to_string()))?;
        let mut map = BTreeMap::new();
        for (key, value) in object {
            let value = match value {
                serde_json::Value::String(s) => s,
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                _ => return Err(OptionsError::NotAString { key }),
            };
            map.insert(key, value);
        }
        let mut options = Self {
            map,
            secret_values: Vec::new(),
        };
        let mut secret_values = Vec::new();
        for (key, _) in options.secrets() {
            let raw = options.secret(key).unwrap_or(Ok(Vec::new()))?;
            secret_values.push(String::from_utf8_lossy(&raw).into_owned());
        }
        options.secret_values = secret_values;
        Ok(options)
    }

    /// Every option, keys sorted. Secret values are included (base64): do not print them.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The `kubernetes.io/secret/<key>` options, as (key without the prefix, base64 value).
    pub fn secrets(&self) -> impl Iterator<Item = (&str, &str)> {
        self.iter()
            .filter_map(|(k, v)| k.strip_prefix(SECRET_PREFIX).map(|k| (k, v)))
    }

    /// The decoded value of secret `key` (without the `kubernetes.io/secret/` prefix).
    pub fn secret(&self, key: &str) -> Option<Result<Vec<u8>, OptionsError>> {
        let encoded = self.map.get(&format!("{SECRET_PREFIX}{key}"))?;
        let b64 = base64::engine::general_purpose::STANDARD;
        Some(b64.decode(encoded).map_err(|_| OptionsError::BadSecret {
            key: key.to_owned(),
        }))
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_redacted_json())
    }
}

/// Replaces every occurrence of each value in `text` (longest first, so a value that contains
/// another is removed whole).
pub fn redact_values(text: &str, values: &[String]) -> String {
    if values.is_empty() {
        return text.to_owned();
    }
    let mut sorted: Vec<&String> = values.iter().filter(|v| !v.is_empty()).collect();
    sorted.sort_by_key(|v| std::cmp::Reverse(v.len()));
    let mut out = text.to_owned();
    for value in sorted {
        if out.contains(value.as_str()) {
            out = out.replace(value.as_str(), REDACTED);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_own_keys_are_known_and_a_drivers_are_not() {
        for key in [
            PV_OR_VOLUME_NAME,
            FS_TYPE,
            READ_WRITE,
            POD_UID,
            "kubernetes.io/secret/token",
            "kubernetes.io/anything-later",
            REQUEST_BYTES,
            REQUEST_MIB,
            REQUEST_GIB,
        ] {
            assert!(is_host_key(key), "{key}");
        }
        for key in [
            "volumeID",
            "imageDir",
            "size",
            "requestbytes",
            "csi.storage.k8s.io/pod.name",
        ] {
            assert!(!is_host_key(key), "{key}");
        }
    }

    fn spec() -> VolumeSpec {
        let mut spec = VolumeSpec::new("vol-1".into(), crate::DriverName::parse("v/d").unwrap());
        spec.fs_type = "ext4".into();
        spec
    }

    #[test]
    fn volume_options_are_compact_sorted_strings() {
        let mut spec = spec();
        spec.options.insert("zeta".into(), "z z".into());
        spec.options.insert("alpha".into(), "1".into());
        let json = Options::for_volume(&spec).to_json();
        assert_eq!(
            json,
            r#"{"alpha":"1","kubernetes.io/fsType":"ext4","kubernetes.io/pvOrVolumeName":"vol-1","kubernetes.io/readwrite":"rw","zeta":"z z"}"#
        );
        assert!(!json.contains(": ") && !json.contains(", "));
    }

    #[test]
    fn read_only_and_empty_fs_type() {
        let mut spec = spec();
        spec.read_only = true;
        spec.fs_type.clear();
        let o = Options::for_volume(&spec);
        assert_eq!(o.get(READ_WRITE), Some("ro"));
        assert_eq!(o.get(FS_TYPE), Some(""));
    }

    #[test]
    fn user_options_win_over_defaults_and_extras() {
        let mut spec = spec();
        spec.options.insert(FS_TYPE.into(), "xfs".into());
        spec.options.insert(POD_NAME.into(), "override".into());
        let pod = PodInfo {
            name: "p".into(),
            ..PodInfo::default()
        };
        let o = Options::for_mount(&spec, &pod, None);
        assert_eq!(o.get(FS_TYPE), Some("xfs"));
        assert_eq!(o.get(POD_NAME), Some("override"));
    }

    #[test]
    fn mount_options_carry_pod_fs_group_and_base64_secrets() {
        let mut spec = spec();
        spec.secrets.insert("password".into(), b"hunter2".to_vec());
        let pod = PodInfo {
            name: "web-0".into(),
            namespace: "prod".into(),
            uid: "1234-5678".into(),
            service_account: "default".into(),
        };
        let o = Options::for_mount(&spec, &pod, Some(2000));
        assert_eq!(o.get(POD_NAME), Some("web-0"));
        assert_eq!(o.get(POD_NAMESPACE), Some("prod"));
        assert_eq!(o.get(POD_UID), Some("1234-5678"));
        assert_eq!(o.get(SERVICE_ACCOUNT_NAME), Some("default"));
        assert_eq!(o.get(FS_GROUP), Some("2000"));
        assert_eq!(o.get("kubernetes.io/secret/password"), Some("aHVudGVyMg=="));
        assert!(Options::for_mount(&spec, &pod, None)
            .get(FS_GROUP)
            .is_none());
        // Non-mount options never see secrets or pod info.
        let v = Options::for_volume(&spec);
        assert!(v.get("kubernetes.io/secret/password").is_none());
        assert!(v.get(POD_NAME).is_none());
    }

    #[test]
    fn secrets_are_redacted_everywhere_they_are_shown() {
        let mut spec = spec();
        spec.secrets.insert("password".into(), b"hunter2".to_vec());
        let o = Options::for_mount(&spec, &PodInfo::default(), None);
        for shown in [o.to_redacted_json(), format!("{o:?}")] {
            assert!(
                !shown.contains("hunter2") && !shown.contains("aHVudGVyMg=="),
                "{shown}"
            );
            assert!(shown.contains(REDACTED));
        }
        let echoed = format!("driver said: pw=hunter2 json={}", o.to_json());
        let clean = redact_values(&echoed, &o.sensitive_values());
        assert!(
            !clean.contains("hunter2") && !clean.contains("aHVudGVyMg=="),
            "{clean}"
        );
    }

    #[test]
    fn a_driver_reads_back_exactly_what_the_host_sent() {
        let mut spec = spec();
        spec.options.insert("size".into(), "1Gi".into());
        spec.secrets.insert("password".into(), b"hunter2".to_vec());
        let sent = Options::for_mount(&spec, &PodInfo::default(), Some(7));
        let read = Options::from_json(&sent.to_json()).unwrap();
        assert_eq!(read.to_json(), sent.to_json());
        assert_eq!(read.get("size"), Some("1Gi"));
        assert_eq!(read.secret("password"), Some(Ok(b"hunter2".to_vec())));
        assert_eq!(read.secret("absent"), None);
        assert_eq!(read.secrets().count(), 1);
        // The decoded value is known, so it is redacted wherever it is echoed.
        let echoed = redact_values("pw=hunter2", &read.sensitive_values());
        assert_eq!(echoed, "pw=<redacted>");
        assert!(!format!("{read:?}").contains("aHVudGVyMg=="));
    }

    #[test]
    fn bad_options_json_is_refused_without_quoting_values() {
        let numbers = Options::from_json(r#"{"n":3,"b":true}"#).unwrap();
        assert_eq!(
            (numbers.get("n"), numbers.get("b")),
            (Some("3"), Some("true"))
        );
        for bad in ["", "[]", "{", r#""x""#] {
            assert!(
                matches!(Options::from_json(bad), Err(OptionsError::NotAnObject(_))),
                "{bad:?}"
            );
        }
        assert_eq!(
            Options::from_json(r#"{"k":{"a":"b"}}"#),
            Err(OptionsError::NotAString { key: "k".into() })
        );
        let err =
            Options::from_json(r#"{"kubernetes.io/secret/pw":"not base64 s3cret!"}"#).unwrap_err();
        assert_eq!(err, OptionsError::BadSecret { key: "pw".into() });
        assert!(!err.to_string().contains("s3cret"));
    }

    #[test]
    fn redaction_prefers_the_longest_value() {
        let values = vec!["abc".to_owned(), "abcdef".to_owned(), String::new()];
        assert_eq!(
            redact_values("x abcdef y abc", &values),
            "x <redacted> y <redacted>"
        );
        assert_eq!(redact_values("nothing", &[]), "nothing");
    }
}
