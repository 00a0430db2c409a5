//! CSI requests as FlexVolume volumes.
//!
//! The volume id is the volume's name (`kubernetes.io/pvOrVolumeName`); the volume context
//! (a static PV's `volumeAttributes`) is the flexVolume `options`, less the `csi.storage.k8s.io/*`
//! keys kubelet adds, which become the pod information mount receives; the mount capability's
//! `fs_type` is `fsType`; `readonly` or a read-only access mode is `readOnly`; the request's
//! secrets are the secret values (mount gets them as `kubernetes.io/secret/<key>`, base64).

use std::collections::HashMap;

use flexvolume::{DriverName, PodInfo, VolumeSpec};
use tonic::Status;

use super::proto::csi::{volume_capability, VolumeCapability};

/// Keys kubelet adds to the volume context (podInfoOnMount), not the driver's options.
pub const K8S_CONTEXT_PREFIX: &str = "csi.storage.k8s.io/";

/// A required string field, or InvalidArgument naming it.
pub fn required<'a>(value: &'a str, field: &str) -> Result<&'a str, Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    Ok(value)
}

/// The capability, which must be given and must be a mount (FlexVolume drivers mount
/// filesystems; raw block is not theirs).
pub fn mount_capability(
    capability: Option<&VolumeCapability>,
) -> Result<(&VolumeCapability, &volume_capability::MountVolume), Status> {
    let capability =
        capability.ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
    match &capability.access_type {
        Some(volume_capability::AccessType::Mount(mount)) => Ok((capability, mount)),
        Some(volume_capability::AccessType::Block(_)) => Err(Status::invalid_argument(
            "volume_capability: block access is not supported (FlexVolume drivers mount filesystems)",
        )),
        None => Err(Status::invalid_argument(
            "volume_capability needs an access type (mount)",
        )),
    }
}

fn is_read_only_mode(capability: &VolumeCapability) -> bool {
    use volume_capability::access_mode::Mode;
    capability.access_mode.as_ref().is_some_and(|m| {
        m.mode == Mode::SingleNodeReaderOnly as i32 || m.mode == Mode::MultiNodeReaderOnly as i32
    })
}

/// The FlexVolume spec of a CSI volume.
pub fn spec(
    driver: &DriverName,
    volume_id: &str,
    capability: Option<&VolumeCapability>,
    readonly: bool,
    context: &HashMap<String, String>,
    secrets: &HashMap<String, String>,
) -> Result<VolumeSpec, Status> {
    let (capability, mount) = mount_capability(capability)?;
    let mut spec = VolumeSpec::new(volume_id.to_owned(), driver.clone());
    spec.fs_type = mount.fs_type.clone();
    spec.read_only = readonly || is_read_only_mode(capability);
    spec.options = context
        .iter()
        .filter(|(k, _)| !k.starts_with(K8S_CONTEXT_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    spec.secrets = secrets
        .iter()
        .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
        .collect();
    Ok(spec)
}

/// The pod, from the keys kubelet puts in the volume context (podInfoOnMount).
pub fn pod_info(context: &HashMap<String, String>) -> PodInfo {
    let get = |key: &str| {
        context
            .get(&format!("{K8S_CONTEXT_PREFIX}{key}"))
            .cloned()
            .unwrap_or_default()
    };
    PodInfo {
        name: get("pod.name"),
        namespace: get("pod.namespace"),
        uid: get("pod.uid"),
        service_account: get("serviceAccount.name"),
    }
}

/// The fsGroup: the capability's `volume_mount_group` (a numeric group id), or none.
pub fn fs_group(capability: Option<&VolumeCapability>) -> Result<Option<u32>, Status> {
    let group = match capability.and_then(|c| c.access_type.as_ref()) {
        Some(volume_capability::AccessType::Mount(m)) => m.volume_mount_group.as_str(),
        _ => "",
    };
    if group.is_empty() {
        return Ok(None);
    }
    let gid = group.parse().map_err(|_| {
        Status::invalid_argument(format!(
            "volume_mount_group {group:?} is not a numeric group id"
        ))
    })?;
    flexvolume::ownership::check_gid(gid)
        .map(Some)
        .map_err(|e| Status::invalid_argument(format!("volume_mount_group: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount_cap(group: &str) -> VolumeCapability {
        VolumeCapability {
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume {
                    fs_type: "ext4".into(),
                    mount_flags: vec![],
                    volume_mount_group: group.into(),
                },
            )),
            access_mode: Some(volume_capability::AccessMode {
                mode: volume_capability::access_mode::Mode::SingleNodeReaderOnly as i32,
            }),
        }
    }

    #[test]
    fn context_splits_into_options_and_pod_and_secrets_are_bytes() {
        let driver = DriverName::parse("acme/nfs").unwrap();
        let context: HashMap<String, String> = [
            ("server", "s1"),
            ("csi.storage.k8s.io/pod.name", "web-0"),
            ("csi.storage.k8s.io/serviceAccount.name", "sa"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let secrets = HashMap::from([("password".to_owned(), "hunter2".to_owned())]);
        let cap = mount_cap("2000");
        let spec = spec(&driver, "pv-1", Some(&cap), false, &context, &secrets).unwrap();
        assert_eq!(spec.volume_name, "pv-1");
        assert_eq!(spec.fs_type, "ext4");
        assert!(spec.read_only, "a reader-only access mode is read-only");
        assert_eq!(spec.options.len(), 1);
        assert_eq!(spec.secrets["password"], b"hunter2");
        assert!(!format!("{spec:?}").contains("hunter2"));
        let pod = pod_info(&context);
        assert_eq!(
            (pod.name.as_str(), pod.service_account.as_str()),
            ("web-0", "sa")
        );
        assert_eq!(fs_group(Some(&cap)).unwrap(), Some(2000));
        assert_eq!(fs_group(Some(&mount_cap(""))).unwrap(), None);
        assert_eq!(
            fs_group(Some(&mount_cap("wheel"))).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            fs_group(Some(&mount_cap("4294967295"))).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn missing_or_block_capabilities_are_invalid() {
        let driver = DriverName::parse("acme/nfs").unwrap();
        let none = HashMap::new();
        let err = spec(&driver, "v", None, false, &none, &none).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        let block = VolumeCapability {
            access_type: Some(volume_capability::AccessType::Block(
                volume_capability::BlockVolume {},
            )),
            access_mode: None,
        };
        let err = spec(&driver, "v", Some(&block), false, &none, &none).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            required("", "volume_id").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
