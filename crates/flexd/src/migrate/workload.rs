//! The workloads `flexd migrate` acts on, as plans, journals and flags name them
//! (`Kind namespace/name`, `--workload NAMESPACE/KIND/NAME`).

use serde::{Deserialize, Serialize};

/// The workloads flexd scales: their `scale` subresource stops and restarts their pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    ReplicaSet,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deployment => "Deployment",
            Self::StatefulSet => "StatefulSet",
            Self::ReplicaSet => "ReplicaSet",
        }
    }

    pub(crate) fn from_kind(kind: &str) -> Option<Self> {
        [Self::Deployment, Self::StatefulSet, Self::ReplicaSet]
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(kind))
    }
}

/// A workload, printed and journaled as `Kind namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkloadRef {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for WorkloadRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

impl WorkloadRef {
    /// `--workload NAMESPACE/KIND/NAME`, the kind in any case (`default/deployment/web`).
    pub fn parse_flag(text: &str) -> Result<Self, String> {
        let mut parts = text.splitn(3, '/');
        let (Some(namespace), Some(kind), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("{text:?} is not NAMESPACE/KIND/NAME"));
        };
        let kind = WorkloadKind::from_kind(kind).ok_or_else(|| {
            format!("{kind:?} is not a kind flexd scales (deployment, statefulset, replicaset)")
        })?;
        if namespace.is_empty() || name.is_empty() {
            return Err(format!("{text:?} is not NAMESPACE/KIND/NAME"));
        }
        Ok(Self {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl std::str::FromStr for WorkloadRef {
    type Err = String;

    /// The printed form, `Kind namespace/name`.
    fn from_str(text: &str) -> Result<Self, String> {
        let (kind, rest) = text
            .split_once(' ')
            .ok_or_else(|| format!("{text:?} is not `Kind namespace/name`"))?;
        let (namespace, name) = rest
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not `Kind namespace/name`"))?;
        Ok(Self {
            kind: WorkloadKind::from_kind(kind).ok_or_else(|| format!("unknown kind {kind:?}"))?,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl Serialize for WorkloadRef {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for WorkloadRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
