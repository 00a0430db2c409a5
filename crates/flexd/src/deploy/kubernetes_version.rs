//! Which Kubernetes minors flexd deploys to, and what differs between them for the objects
//! `flexd manifests` writes. Pure: a version in, sidecar images and notes out.
//!
//! Every minor from [`OLDEST_MINOR`] to [`NEWEST_TESTED_MINOR`] is run by the e2e
//! (`tests/e2e/matrix.sh`, results in docs/compatibility.md). The objects themselves use no field
//! newer than 1.29; what changes with the minor is which CSI sidecar release supports it
//! ([`DIFFERENCES`]).

use std::fmt;

use serde::Deserialize;

/// The oldest minor flexd deploys to: the oldest the e2e runs, and the oldest its users still run
/// in extended support (OpenShift 4.16 EUS is 1.29).
pub const OLDEST_MINOR: u32 = 29;
/// The newest minor the e2e has run. A newer one is deployed with the newest sidecars and a
/// warning.
pub const NEWEST_TESTED_MINOR: u32 = 38;

/// A Kubernetes 1.x minor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubernetesMinor(u32);

impl KubernetesMinor {
    /// The newest minor tested: what `flexd manifests` deploys for without `--kubernetes-version`.
    pub const NEWEST_TESTED: Self = Self(NEWEST_TESTED_MINOR);

    pub fn minor(self) -> u32 {
        self.0
    }

    /// Newer than any the e2e has run.
    pub fn is_untested(self) -> bool {
        self.0 > NEWEST_TESTED_MINOR
    }

    /// The sidecars for this minor: each one's newest release that supports it, with the flags
    /// that make it agree with the minor's feature gates.
    pub fn sidecars(self) -> Sidecars {
        let before_1_34 = self.0 < 34;
        Sidecars {
            attacher: ATTACHER_IMAGE,
            provisioner: if before_1_34 {
                PROVISIONER_IMAGE_BEFORE_1_34
            } else {
                PROVISIONER_IMAGE
            },
            resizer: if before_1_34 {
                RESIZER_IMAGE_BEFORE_1_34
            } else {
                RESIZER_IMAGE
            },
            // csi-resizer v1.14 assumes RecoverVolumeExpansionFailure (beta, on, from 1.32); an
            // API server without it drops the claim status fields that flow writes.
            resizer_flags: if self.0 < 32 {
                &["--feature-gates=RecoverVolumeExpansionFailure=false"]
            } else {
                &[]
            },
        }
    }
}

impl fmt::Display for KubernetesMinor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}", self.0)
    }
}

/// The sidecar releases, each pinned in tests/e2e/sidecars/ and run there by the e2e.
pub const ATTACHER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-attacher:v4.13.0";
pub const PROVISIONER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-provisioner:v6.4.0";
pub const PROVISIONER_IMAGE_BEFORE_1_34: &str =
    "registry.k8s.io/sig-storage/csi-provisioner:v5.3.0";
pub const RESIZER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-resizer:v2.3.0";
pub const RESIZER_IMAGE_BEFORE_1_34: &str = "registry.k8s.io/sig-storage/csi-resizer:v1.14.0";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sidecars {
    pub attacher: &'static str,
    pub provisioner: &'static str,
    pub resizer: &'static str,
    /// Flags for csi-resizer past flexd's own (which every minor gets).
    pub resizer_flags: &'static [&'static str],
}

/// Something a minor lacks that flexd would use, and what flexd does about it.
#[derive(Debug, Clone, Copy)]
pub struct Difference {
    /// The first minor that has it.
    pub since: u32,
    pub what: &'static str,
    /// What flexd deploys on the minors before it.
    pub before: &'static str,
}

/// Every difference between the supported minors that changes what flexd deploys or how it
/// runs, oldest first. docs/compatibility.md carries them as [`markdown_table`] prints them.
pub const DIFFERENCES: &[Difference] = &[
    Difference {
        since: 32,
        what: "RecoverVolumeExpansionFailure on by default (beta), which csi-resizer v1.14 assumes",
        before: "csi-resizer with the gate off, as the API server has it",
    },
    Difference {
        since: 34,
        what: "storage.k8s.io/v1 VolumeAttributesClass, which csi-provisioner v6 reads",
        before: "csi-provisioner v5.3.0",
    },
    Difference {
        since: 34,
        what: "RecoverVolumeExpansionFailure GA, which csi-resizer v2 assumes: on 1.29 a claim \
               waiting for node expansion kept `Resizing` as its first condition, and \
               Kubernetes' own storage suite failed",
        before: "csi-resizer v1.14.0",
    },
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VersionError {
    #[error(
        "{0:?} is not a Kubernetes version: give the cluster's minor (1.29), its version \
         (v1.29.15), or `kubectl version -o json`'s output"
    )]
    Unparsable(String),
    #[error("`kubectl version -o json` printed no server version: is the cluster reachable?")]
    NoServerVersion,
    #[error(
        "Kubernetes {0} is older than flexd supports: the oldest is 1.{OLDEST_MINOR}. Its CSI \
         sidecars and the API fields flexd's objects use are not tested there; upgrade the \
         cluster to 1.{OLDEST_MINOR} or newer first (docs/compatibility.md)"
    )]
    TooOld(String),
}

/// A version as an operator has it: `1.29`, `v1.29.15`, a distribution's `v1.29.15-gke.1200`
/// or `v1.29.15+k3s1`, or the JSON `kubectl version -o json` prints (its server version).
pub fn parse(text: &str) -> Result<KubernetesMinor, VersionError> {
    let text = text.trim();
    if text.starts_with('{') {
        return from_kubectl_json(text);
    }
    let unparsable = || VersionError::Unparsable(text.to_owned());
    let version = text.strip_prefix('v').unwrap_or(text);
    let mut parts = version.splitn(3, '.');
    let major = parts.next().ok_or_else(unparsable)?;
    let minor = parts.next().ok_or_else(unparsable)?;
    if let Some(patch) = parts.next() {
        // A patch release, maybe with a distribution's suffix: digits first.
        if !patch.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(unparsable());
        }
    }
    from_parts(major, minor, text)
}

/// `kubectl version -o json`: `serverVersion.major` and `.minor`, where managed clusters write
/// the minor as `29+`.
fn from_kubectl_json(text: &str) -> Result<KubernetesMinor, VersionError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Output {
        server_version: Option<Info>,
    }
    #[derive(Deserialize)]
    struct Info {
        major: String,
        minor: String,
    }
    let output: Output = serde_json::from_str(text).map_err(|_| {
        VersionError::Unparsable("the JSON given is not `kubectl version -o json`'s".to_owned())
    })?;
    let info = output.server_version.ok_or(VersionError::NoServerVersion)?;
    let minor = info.minor.trim_end_matches('+');
    from_parts(
        &info.major,
        minor,
        &format!("{}.{}", info.major, info.minor),
    )
}

fn from_parts(major: &str, minor: &str, text: &str) -> Result<KubernetesMinor, VersionError> {
    let unparsable = || VersionError::Unparsable(text.to_owned());
    let minor_digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
    // After the minor's digits only a distribution's mark may follow (`29+`, `29-gke`).
    if minor_digits.is_empty()
        || !matches!(
            minor[minor_digits.len()..].chars().next(),
            None | Some('+' | '-')
        )
    {
        return Err(unparsable());
    }
    let major: u32 = major.parse().map_err(|_| unparsable())?;
    let minor: u32 = minor_digits.parse().map_err(|_| unparsable())?;
    if major != 1 {
        return Err(unparsable());
    }
    if minor < OLDEST_MINOR {
        return Err(VersionError::TooOld(format!("1.{minor}")));
    }
    Ok(KubernetesMinor(minor))
}

/// docs/compatibility.md's tables: the sidecars `flexd manifests` chooses for each supported
/// minor, then what the older minors lack.
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| Kubernetes | csi-attacher | csi-provisioner | csi-resizer | csi-resizer's flags |\n\
         |---|---|---|---|---|\n",
    );
    let tag = |image: &str| image.rsplit(':').next().unwrap_or(image).to_owned();
    for minor in OLDEST_MINOR..=NEWEST_TESTED_MINOR {
        let sidecars = KubernetesMinor(minor).sidecars();
        let flags: Vec<String> = sidecars
            .resizer_flags
            .iter()
            .map(|f| format!("`{f}`"))
            .collect();
        out.push_str(&format!(
            "| 1.{minor} | {} | {} | {} | {} |\n",
            tag(sidecars.attacher),
            tag(sidecars.provisioner),
            tag(sidecars.resizer),
            if flags.is_empty() {
                "–".to_owned()
            } else {
                flags.join(" ")
            }
        ));
    }
    out.push_str("\n| missing before | what | so flexd deploys there |\n|---|---|---|\n");
    for d in DIFFERENCES {
        out.push_str(&format!("| 1.{} | {} | {} |\n", d.since, d.what, d.before));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_as_operators_have_them() {
        for (text, minor) in [
            ("1.29", 29),
            ("v1.29", 29),
            ("v1.29.15", 29),
            ("1.33.2", 33),
            ("v1.30.14-gke.1200", 30),
            ("v1.31.4+k3s1", 31),
            ("v1.38.0-beta.0", 38),
            ("1.40", 40),
            ("  v1.34.4\n", 34),
        ] {
            assert_eq!(parse(text).map(KubernetesMinor::minor), Ok(minor), "{text}");
        }
    }

    #[test]
    fn kubectl_version_json_with_a_managed_clusters_minor() {
        let json = r#"{"clientVersion":{"major":"1","minor":"37"},
            "serverVersion":{"major":"1","minor":"29+","gitVersion":"v1.29.15-eks-1234"}}"#;
        assert_eq!(parse(json).map(KubernetesMinor::minor), Ok(29));
        assert_eq!(
            parse(r#"{"clientVersion":{"major":"1","minor":"37"}}"#),
            Err(VersionError::NoServerVersion)
        );
        assert!(matches!(
            parse(r#"{"serverVersion": 3}"#),
            Err(VersionError::Unparsable(_))
        ));
    }

    #[test]
    fn below_the_minimum_is_refused_and_says_the_minimum() {
        let error = parse("v1.28.9").unwrap_err();
        assert_eq!(error, VersionError::TooOld("1.28".to_owned()));
        assert!(error.to_string().contains("the oldest is 1.29"), "{error}");
    }

    #[test]
    fn not_a_version() {
        for text in [
            "", "1", "latest", "2.1", "v1.x", "1.29a", "1.29.x", "v1..3", "1.-1",
        ] {
            assert!(
                matches!(parse(text), Err(VersionError::Unparsable(_))),
                "{text:?}: {:?}",
                parse(text)
            );
        }
    }

    #[test]
    fn resizer_v2_only_where_recovery_from_expansion_failure_is_ga() {
        let sidecars = |v: &str| parse(v).unwrap().sidecars();
        assert_eq!(sidecars("1.29").resizer, RESIZER_IMAGE_BEFORE_1_34);
        assert_eq!(
            sidecars("1.31").resizer_flags,
            ["--feature-gates=RecoverVolumeExpansionFailure=false"]
        );
        assert_eq!(sidecars("1.32").resizer, RESIZER_IMAGE_BEFORE_1_34);
        assert!(sidecars("1.32").resizer_flags.is_empty());
        assert_eq!(sidecars("1.34").resizer, RESIZER_IMAGE);
        assert!(sidecars("1.34").resizer_flags.is_empty());
    }

    #[test]
    fn provisioner_v6_only_where_volume_attributes_class_v1_is() {
        assert_eq!(
            parse("1.33").unwrap().sidecars().provisioner,
            PROVISIONER_IMAGE_BEFORE_1_34
        );
        assert_eq!(
            parse("1.34").unwrap().sidecars().provisioner,
            PROVISIONER_IMAGE
        );
        assert_eq!(
            KubernetesMinor::NEWEST_TESTED.sidecars().provisioner,
            PROVISIONER_IMAGE
        );
        assert!(parse("1.39").unwrap().is_untested());
        assert!(!KubernetesMinor::NEWEST_TESTED.is_untested());
    }

    #[test]
    fn the_table_has_a_row_per_supported_minor_and_difference() {
        let table = markdown_table();
        let minors = (NEWEST_TESTED_MINOR - OLDEST_MINOR + 1) as usize;
        assert_eq!(
            table.lines().filter(|l| l.starts_with("| 1.")).count(),
            minors + DIFFERENCES.len()
        );
        assert!(table.contains(
            "| 1.31 | v4.13.0 | v5.3.0 | v1.14.0 | `--feature-gates=RecoverVolumeExpansionFailure=false` |"
        ));
        assert!(table.contains("| 1.33 | v4.13.0 | v5.3.0 | v1.14.0 | – |"));
        assert!(table.contains("| 1.34 | v4.13.0 | v6.4.0 | v2.3.0 | – |"));
    }
}
