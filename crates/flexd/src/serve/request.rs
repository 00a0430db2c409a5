//! CSI requests as FlexVolume volumes.
//!
//! The volume id is the volume's name (`kubernetes.io/pvOrVolumeName`); the volume context
//! (a static PV's `volumeAttributes`) is the flexVolume `options`, less the `csi.storage.k8s.io/*`
//! keys kubelet adds, which become the pod information mount receives; the mount capability's
//! `fs_type` is `fsType`; `readonly` or a read-only access mode is `readOnly`; the request's
//! secrets are the secret values (mount gets them as `kubernetes.io/secret/<key>`, base64).
//!
//! Everything a client sends is bounded and checked here, before any lock, record or exec:
//! CSI's general size limits (128 bytes for a string id, 192 for a node id, 4 KiB for a map:
//! volume context and secrets), `PATH_MAX` for paths, no NUL byte anywhere, and a volume id
//! that is safe as a name (see [`volume_id`]). Each violation is INVALID_ARGUMENT.

use std::collections::{BTreeMap, HashMap};

use flexvolume_host::{DriverName, PodInfo, VolumeSpec};
use flexvolume_protocol::options::is_host_key;
use tonic::{Request, Status};

use flexd::proto::csi::{self, volume_capability, VolumeCapability};

/// Keys kubelet adds to the volume context (podInfoOnMount), not the driver's options.
pub const K8S_CONTEXT_PREFIX: &str = "csi.storage.k8s.io/";

/// CSI's general limit for a string field (the volume id).
pub const MAX_ID_BYTES: usize = 128;
/// CSI's limit for a node id (raised from 128 in CSI 1.4).
pub const MAX_NODE_ID_BYTES: usize = 192;
/// CSI's general limit for a map field (volume context, secrets): keys and values together.
pub const MAX_MAP_BYTES: usize = 4096;

/// A CSI request about one volume: every such call starts by checking the id it names.
pub trait OneVolume {
    fn volume_id_field(&self) -> &str;
}

macro_rules! one_volume {
    ($($request:ident),* $(,)?) => {
        $(impl OneVolume for csi::$request {
            fn volume_id_field(&self) -> &str {
                &self.volume_id
            }
        })*
    };
}

one_volume!(
    ControllerPublishVolumeRequest,
    ControllerUnpublishVolumeRequest,
    ValidateVolumeCapabilitiesRequest,
    DeleteVolumeRequest,
    NodeStageVolumeRequest,
    NodeUnstageVolumeRequest,
    NodePublishVolumeRequest,
    NodeUnpublishVolumeRequest,
    NodeGetVolumeStatsRequest,
    NodeExpandVolumeRequest,
);

/// The request's message with its volume id checked (see [`volume_id`]), before anything
/// else of the request is looked at.
pub fn one_volume<R: OneVolume>(request: Request<R>) -> Result<(R, String), Status> {
    let req = request.into_inner();
    let volume_id = volume_id(req.volume_id_field())?.to_owned();
    Ok((req, volume_id))
}

/// The volume id, which becomes the volume's name (`kubernetes.io/pvOrVolumeName`) and so a
/// name the driver and flexd use in paths and commands. CSI calls it opaque, but a FlexVolume
/// volume name is a Kubernetes object name (a PV or pod volume name), which never holds `/` or
/// control characters and is never `.` or `..`; an id that does is refused here rather than
/// handed to a driver that would build `<dir>/../escape` from it. At most 128 bytes (CSI).
pub fn volume_id(value: &str) -> Result<&str, Status> {
    let value = required(value, "volume_id")?;
    let refuse = |why: &str| {
        Err(Status::invalid_argument(format!(
            "volume_id {}: {why}",
            shown(value)
        )))
    };
    if value.len() > MAX_ID_BYTES {
        return refuse(&format!(
            "is {} bytes; the limit is {MAX_ID_BYTES} (CSI's string field limit)",
            value.len()
        ));
    }
    if value.chars().any(char::is_control) {
        return refuse("contains a control character (or NUL)");
    }
    if value.contains('/') {
        return refuse("contains '/': a volume name is one path component");
    }
    if value == "." || value == ".." {
        return refuse("is not a name");
    }
    Ok(value)
}

/// The node id: at most 192 bytes (CSI 1.4+), no control characters.
pub fn node_id(value: &str) -> Result<&str, Status> {
    let value = required(value, "node_id")?;
    if value.len() > MAX_NODE_ID_BYTES || value.chars().any(char::is_control) {
        return Err(Status::invalid_argument(format!(
            "node_id {}: at most {MAX_NODE_ID_BYTES} bytes, no control characters",
            shown(value)
        )));
    }
    Ok(value)
}

/// A required path: absolute, no NUL byte, no `..`, at most `PATH_MAX` bytes. (CSI 1.4 lifted
/// the 128-byte limit from paths; the kernel's is the one that matters.)
pub fn path<'a>(value: &'a str, field: &str) -> Result<&'a str, Status> {
    let value = required(value, field)?;
    flexvolume_os::mount::safe_path::check(std::path::Path::new(value))
        .map_err(|e| Status::invalid_argument(format!("{field}: {e}")))?;
    Ok(value)
}

/// A map within CSI's 4 KiB (keys and values together).
fn bounded_map(map: &HashMap<String, String>, field: &str) -> Result<(), Status> {
    let size: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_MAP_BYTES {
        return Err(Status::invalid_argument(format!(
            "{field} is {size} bytes (keys and values); the limit is {MAX_MAP_BYTES} (CSI's map field limit)"
        )));
    }
    Ok(())
}

/// At most this much of a hostile value goes into an error message.
fn shown(value: &str) -> String {
    let cut: String = value.chars().take(64).collect();
    let tail = if cut.len() < value.len() { "…" } else { "" };
    format!("{:?}{tail}", cut)
}

/// The volume context key kubelet sets to "true" on a CSI inline ephemeral volume's publish
/// (with podInfoOnMount): no stage, a `csi-<hash>` volume id, the context is all there is.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";

/// Whether the publish is of an inline ephemeral volume. kubelet writes the key as a Go bool;
/// anything else is refused rather than guessed at.
pub fn is_ephemeral(context: &HashMap<String, String>) -> Result<bool, Status> {
    match context.get(EPHEMERAL_KEY).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(Status::invalid_argument(format!(
            "volume_context {EPHEMERAL_KEY}: {other:?} is neither \"true\" nor \"false\""
        ))),
    }
}

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
        // Kubernetes refuses mountOptions for flexVolume (the plugin supports none, and its
        // default mountdevice and bind use none), so flexd refuses them rather than drop them.
        Some(volume_capability::AccessType::Mount(mount)) if !mount.mount_flags.is_empty() => {
            Err(Status::invalid_argument(format!(
                "volume_capability.mount_flags {:?}: FlexVolume drivers take no mount options (Kubernetes refuses mountOptions for flexVolume too); give them to the driver through its own options",
                mount.mount_flags
            )))
        }
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
    let volume_id = self::volume_id(volume_id)?;
    bounded_map(context, "volume_context")?;
    bounded_map(secrets, "secrets")?;
    // The context becomes the driver's options, laid over flexd's own: it must not rename
    // the volume, fake a size or pose as a secret or the pod.
    if let Some(key) = context.keys().find(|k| is_host_key(k)) {
        return Err(Status::invalid_argument(format!(
            "volume_context key {key:?} is flexd's own option (the volume's name, size or fsType, the pod, a secret); a volume's attributes cannot set it"
        )));
    }
    let (capability, mount) = mount_capability(capability)?;
    let mut spec = VolumeSpec::new(volume_id.to_owned(), driver.clone());
    spec.fs_type = mount.fs_type.clone();
    spec.read_only = readonly || is_read_only_mode(capability);
    spec.options = context
        .iter()
        .filter(|(k, _)| !k.starts_with(K8S_CONTEXT_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    spec.secrets = self::secrets(secrets);
    Ok(spec)
}

/// A request's secrets as the call-outs take them.
pub fn secrets(secrets: &HashMap<String, String>) -> BTreeMap<String, Vec<u8>> {
    secrets
        .iter()
        .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
        .collect()
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
    flexvolume_host::ownership::check_gid(gid)
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
    fn ephemeral_is_kubelets_bool_or_absent() {
        let context = |v: &str| HashMap::from([(EPHEMERAL_KEY.to_owned(), v.to_owned())]);
        assert!(!is_ephemeral(&HashMap::new()).unwrap());
        assert!(!is_ephemeral(&context("false")).unwrap());
        assert!(is_ephemeral(&context("true")).unwrap());
        assert_eq!(
            is_ephemeral(&context("True")).unwrap_err().code(),
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
        let mut flagged = mount_cap("");
        if let Some(volume_capability::AccessType::Mount(m)) = &mut flagged.access_type {
            m.mount_flags = vec!["noatime".into()];
        }
        let err = spec(&driver, "v", Some(&flagged), false, &none, &none).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("noatime"), "{}", err.message());
        assert_eq!(
            required("", "volume_id").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn ids_paths_and_maps_are_bounded() {
        let bad = tonic::Code::InvalidArgument;
        for id in ["../escape", "a/b", ".", "..", "nul\0x", "tab\tx"] {
            assert_eq!(volume_id(id).unwrap_err().code(), bad, "{id:?}");
        }
        assert_eq!(volume_id(&"v".repeat(129)).unwrap_err().code(), bad);
        assert_eq!(volume_id(&"v".repeat(128)).unwrap(), "v".repeat(128));
        assert_eq!(volume_id("pvc-1.a_b~c").unwrap(), "pvc-1.a_b~c");
        let huge = "x".repeat(1 << 20);
        let err = volume_id(&huge).unwrap_err();
        assert!(
            err.message().len() < 300,
            "a hostile id is not echoed whole"
        );
        assert_eq!(node_id(&"n".repeat(193)).unwrap_err().code(), bad);
        for p in ["rel/x", "/a/\0/b", "/a/../b"] {
            assert_eq!(path(p, "target_path").unwrap_err().code(), bad, "{p:?}");
        }
        assert_eq!(
            path(&format!("/{}", "x".repeat(5000)), "t")
                .unwrap_err()
                .code(),
            bad
        );
        let driver = DriverName::parse("acme/nfs").unwrap();
        let cap = mount_cap("");
        let none = HashMap::new();
        let big = HashMap::from([("k".to_owned(), "v".repeat(4096))]);
        for (context, secrets) in [(&big, &none), (&none, &big)] {
            let err = spec(&driver, "v", Some(&cap), false, context, secrets).unwrap_err();
            assert_eq!(err.code(), bad);
            assert!(!err.message().contains("vvvv"), "values are not echoed");
        }
    }
}
