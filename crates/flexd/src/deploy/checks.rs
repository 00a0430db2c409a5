//! `flexd manifests`' flag values checked as Kubernetes checks the fields they end up in, at
//! parse time (clap value parsers: a bad one is bad usage, exit status 2, with the rule). The
//! objects themselves are serialized by serde from k8s-openapi types, so no value can change
//! the YAML's structure; these checks make sure every value is one the API server takes, and
//! that the header comment, printed as text, quotes only checked values.

use std::path::{Component, Path, PathBuf};

use flexvolume_host::{Capabilities, DriverName};

/// Kubernetes' longest DNS-1123 label (namespace names).
pub(crate) const MAX_LABEL_LEN: usize = 63;
/// Kubernetes' longest DNS-1123 subdomain (StorageClass names).
pub(crate) const MAX_SUBDOMAIN_LEN: usize = 253;

/// A namespace name: a DNS-1123 label.
pub fn dns_label(text: &str) -> Result<String, String> {
    if text.len() <= MAX_LABEL_LEN && is_label(text) {
        return Ok(text.to_owned());
    }
    Err(format!(
        "{text:?} is not a DNS-1123 label (at most {MAX_LABEL_LEN} characters: lowercase \
         letters, digits and '-', starting and ending with a letter or digit)"
    ))
}

/// A StorageClass name: a DNS-1123 subdomain.
pub fn dns_subdomain(text: &str) -> Result<String, String> {
    if text.len() <= MAX_SUBDOMAIN_LEN && text.split('.').all(is_label) {
        return Ok(text.to_owned());
    }
    Err(format!(
        "{text:?} is not a DNS-1123 subdomain (at most {MAX_SUBDOMAIN_LEN} characters: \
         '.'-separated labels of lowercase letters, digits and '-', each starting and ending \
         with a letter or digit)"
    ))
}

fn is_label(text: &str) -> bool {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    text.starts_with(alphanumeric)
        && text.ends_with(alphanumeric)
        && text.chars().all(|c| alphanumeric(c) || c == '-')
}

/// An image reference: `NAME[:TAG][@DIGEST]`, so an operator can pin any image by digest
/// (`registry.example/flexd@sha256:<64 hex digits>`). Kubernetes refuses one with surrounding
/// whitespace; a reference never holds whitespace or control characters anywhere, so those
/// are refused too, and a digest must be one a registry could answer (`sha256:` and 64
/// lowercase hex digits, `sha512:` and 128).
pub fn image(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("an image reference cannot be empty".to_owned());
    }
    if let Some(c) = text.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{text:?} is not an image reference: it holds {c:?} (no whitespace or control \
             characters)"
        ));
    }
    let (name, digest) = match text.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (text, None),
    };
    if name.is_empty() {
        return Err(format!(
            "{text:?} is not an image reference: no name before '@'"
        ));
    }
    if let Some(digest) = digest {
        let hex_len = match digest.split_once(':') {
            Some(("sha256", hex)) => Some((hex, 64)),
            Some(("sha512", hex)) => Some((hex, 128)),
            _ => None,
        };
        let valid = hex_len.is_some_and(|(hex, len)| {
            hex.len() == len
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if !valid {
            return Err(format!(
                "{text:?}: the digest {digest:?} is not sha256:<64 hex digits> or \
                 sha512:<128 hex digits>"
            ));
        }
    }
    Ok(text.to_owned())
}

/// World-writable directories where any local user can create a path before root does: a
/// hostPath there would hand that user what flexd's privileged pods put in it.
const TEMPORARY_DIRS: &[&str] = &["/tmp", "/var/tmp", "/dev/shm", "/run/user", "/run/shm"];

/// A path on the nodes, mounted at the same path in the pods (a hostPath and a mountPath):
/// absolute, UTF-8 (printed as it is, never lossily), no control characters, and no `..`
/// (Kubernetes refuses a hostPath that backs up).
pub fn node_path(text: &str) -> Result<PathBuf, String> {
    check_node_path(Path::new(text)).map(Path::to_path_buf)
}

/// [`node_path`] for a path already parsed (the global `--plugin-dir` and `--state-dir`).
pub fn check_node_path(path: &Path) -> Result<&Path, String> {
    let Some(text) = path.to_str() else {
        return Err(format!("{path:?} is not UTF-8"));
    };
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(format!("{text:?} holds the control character {c:?}"));
    }
    if !path.is_absolute() {
        return Err(format!("{text:?} is not an absolute path"));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "{text:?} holds '..' (Kubernetes refuses such a hostPath)"
        ));
    }
    if let Some(temporary) = TEMPORARY_DIRS.iter().find(|dir| path.starts_with(dir)) {
        return Err(format!(
            "{text:?} is under {temporary}, where any local user of a node can create it \
             first; flexd's privileged pods are never given a temporary directory"
        ));
    }
    Ok(path)
}

/// One `--driver NAME[=CAPABILITIES]`.
#[derive(Debug, Clone)]
pub struct DriverArg {
    pub name: DriverName,
    /// Given on the command line; `None`: from the driver's `init`.
    pub capabilities: Option<Capabilities>,
}

/// `NAME` or `NAME=JSON`: a driver name with a CSI name (what its CSIDriver is called), and
/// capabilities parsed by the rules the driver's own `init` reply is parsed with.
pub fn driver(text: &str) -> Result<DriverArg, String> {
    let (name, json) = match text.split_once('=') {
        Some((name, json)) => (name, Some(json)),
        None => (text, None),
    };
    let name = DriverName::parse(name).map_err(|e| e.to_string())?;
    crate::naming::csi_name(&name).map_err(|e| e.to_string())?;
    let capabilities = json
        .map(capabilities_from_json)
        .transpose()
        .map_err(|e| format!("driver {name}: capabilities: {e}"))?;
    Ok(DriverArg { name, capabilities })
}

/// Parses capabilities by the rules the driver's own `init` reply is parsed with.
fn capabilities_from_json(json: &str) -> Result<Capabilities, String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    if !value.is_object() {
        return Err("not a JSON object".to_owned());
    }
    let reply = serde_json::json!({ "status": "Success", "capabilities": value });
    flexvolume_protocol::find_reply(reply.to_string().as_bytes())
        .and_then(|r| r.capabilities)
        .ok_or_else(|| "not a capabilities object".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_kubernetes_rules() {
        for good in ["flexd-system", "a", "0", &"a".repeat(63)] {
            assert!(dns_label(good).is_ok(), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a\n---", &"a".repeat(64)] {
            assert!(dns_label(bad).is_err(), "{bad}");
        }
        assert!(dns_subdomain("fast.ssd-1").is_ok());
        for bad in ["", ".a", "a..b", "a.", "A", "a b"] {
            assert!(dns_subdomain(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn images_and_paths_hold_no_line_breaks_or_controls() {
        let digest = format!("sha256:{}", "0a".repeat(32));
        for good in [
            "flexd".to_owned(),
            "registry.example:5000/flexd:0.1.0".to_owned(),
            format!("registry.example/flexd@{digest}"),
            format!("registry.example/flexd:0.1.0@{digest}"),
            format!("flexd@sha512:{}", "f".repeat(128)),
        ] {
            assert!(image(&good).is_ok(), "{good}");
        }
        for bad in [
            "",
            " x",
            "x\n---",
            "x\u{1b}[2J",
            "x\u{85}",
            "flexd@sha256:00",
            &format!("flexd@sha256:{}", "A".repeat(64)),
            &format!("flexd@md5:{}", "0".repeat(32)),
            &format!("@{digest}"),
        ] {
            assert!(image(bad).is_err(), "{bad:?}");
        }
        assert!(node_path("/var/lib/kubelet").is_ok());
        assert!(
            node_path("/var/tmpfs").is_ok(),
            "a name that only starts like one"
        );
        for bad in [
            "var/lib",
            "/a\nb",
            "/a/../b",
            "/a\u{7f}",
            "/tmp/p",
            "/tmp",
            "/var/tmp/flexd-e2e/plugins",
            "/dev/shm/x",
        ] {
            assert!(node_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn capabilities_are_read_as_an_init_reply_is() {
        let caps = capabilities_from_json(r#"{"attach":"false","FSGroup":false}"#).unwrap();
        assert!(!caps.attach && !caps.fs_group && caps.requires_fs_resize);
        assert!(capabilities_from_json("[]").is_err());
        assert!(capabilities_from_json("{").is_err());
        assert!(driver("acme/a.={}").is_err(), "a name with no CSI form");
    }
}
