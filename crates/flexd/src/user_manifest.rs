//! Kubernetes manifests users already have, read as volume specs and secrets: a
//! PersistentVolume or pod Volume with a `flexVolume` source, and a Secret (`flexd volume
//! --file`, `--secret-file`). Not the manifests flexd deploys with: those are `deploy`'s.
//!
//! Pure text in, typed values or a clear error out (no files), so the fuzzer and the CLI share
//! one parser. Errors about a Secret never quote its content.

use std::collections::BTreeMap;

use flexvolume_host::{DriverName, VolumeSpec};
use k8s_openapi::api::core::v1::{PersistentVolume, Secret, Volume};

/// Secret key → raw value.
pub type SecretValues = BTreeMap<String, Vec<u8>>;

#[derive(Debug, thiserror::Error)]
pub enum UserManifestError {
    #[error("is not YAML or JSON: {0}")]
    NotYaml(String),
    #[error("is not a valid PersistentVolume: {0}")]
    InvalidPersistentVolume(String),
    #[error("is neither a PersistentVolume nor a pod Volume: {0}")]
    NotAVolume(String),
    #[error("the PersistentVolume has no metadata.name")]
    NoName,
    #[error("the PersistentVolume has no spec.flexVolume")]
    NoPersistentFlexVolume,
    #[error("the Volume has no flexVolume source")]
    NoFlexVolume,
    #[error("flexVolume.driver {driver:?}: {reason}")]
    Driver { driver: String, reason: String },
    #[error("is not YAML or JSON")]
    SecretNotYaml,
    #[error("is not a Kubernetes Secret (kind: Secret)")]
    NotASecret,
    #[error("is not a valid Secret (data values must be base64)")]
    InvalidSecret,
    #[error("has no data")]
    EmptySecret,
}

/// The flexVolume source of a PersistentVolume or pod Volume, as a spec, with the name of the
/// Secret it refers to.
pub fn volume_spec(text: &str) -> Result<(VolumeSpec, Option<String>), UserManifestError> {
    let value: serde_json::Value =
        serde_yaml_ng::from_str(text).map_err(|e| UserManifestError::NotYaml(e.to_string()))?;
    let is_pv = value.get("kind").and_then(|k| k.as_str()) == Some("PersistentVolume");
    let (volume_name, flex, secret_ref) = if is_pv {
        let pv: PersistentVolume = serde_json::from_value(value)
            .map_err(|e| UserManifestError::InvalidPersistentVolume(e.to_string()))?;
        let name = pv.metadata.name.ok_or(UserManifestError::NoName)?;
        let flex = pv
            .spec
            .and_then(|s| s.flex_volume)
            .ok_or(UserManifestError::NoPersistentFlexVolume)?;
        let secret_ref = flex.secret_ref.as_ref().and_then(|s| s.name.clone());
        let flex = (flex.driver, flex.fs_type, flex.read_only, flex.options);
        (name, flex, secret_ref)
    } else {
        let volume: Volume = serde_json::from_value(value)
            .map_err(|e| UserManifestError::NotAVolume(e.to_string()))?;
        let flex = volume.flex_volume.ok_or(UserManifestError::NoFlexVolume)?;
        let secret_ref = flex.secret_ref.as_ref().map(|s| s.name.clone());
        let flex = (flex.driver, flex.fs_type, flex.read_only, flex.options);
        (volume.name, flex, secret_ref)
    };
    let (driver, fs_type, read_only, options) = flex;
    let name = DriverName::parse(&driver).map_err(|e| UserManifestError::Driver {
        reason: e.to_string(),
        driver,
    })?;
    let mut spec = VolumeSpec::new(volume_name, name);
    spec.fs_type = fs_type.unwrap_or_default();
    spec.read_only = read_only.unwrap_or(false);
    spec.options = options.unwrap_or_default();
    Ok((spec, secret_ref))
}

/// A Secret manifest's name and values (`data`, base64, and `stringData`).
pub fn secret(text: &str) -> Result<(Option<String>, SecretValues), UserManifestError> {
    // The parsers' messages could quote a value: only say what is wrong.
    let value: serde_json::Value =
        serde_yaml_ng::from_str(text).map_err(|_| UserManifestError::SecretNotYaml)?;
    if value.get("kind").and_then(|k| k.as_str()) != Some("Secret") {
        return Err(UserManifestError::NotASecret);
    }
    let secret: Secret =
        serde_json::from_value(value).map_err(|_| UserManifestError::InvalidSecret)?;
    let mut values: SecretValues = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    for (key, value) in secret.string_data.unwrap_or_default() {
        values.insert(key, value.into_bytes());
    }
    if values.is_empty() {
        return Err(UserManifestError::EmptySecret);
    }
    Ok((secret.metadata.name, values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_volume_becomes_a_spec_with_its_secret_ref() {
        let (spec, secret_ref) = volume_spec(
            "name: data\nflexVolume:\n  driver: acme/nfs\n  fsType: ext4\n  readOnly: true\n  secretRef: {name: creds}\n  options: {server: s1}\n",
        )
        .unwrap();
        assert_eq!(spec.volume_name, "data");
        assert_eq!(spec.driver.to_string(), "acme/nfs");
        assert!(spec.read_only);
        assert_eq!(spec.options.get("server").map(String::as_str), Some("s1"));
        assert_eq!(secret_ref.as_deref(), Some("creds"));
    }

    #[test]
    fn secret_errors_never_quote_the_content() {
        let text = "kind: Secret\ndata:\n  password: \"not base64 hunter2!\"\n";
        let error = secret(text).unwrap_err().to_string();
        assert!(!error.contains("hunter2"), "{error}");
    }
}
