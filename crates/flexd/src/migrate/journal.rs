//! The journal of `flexd migrate --apply`: how far each unit got, and everything needed to go
//! on or to go back, kept in the API server (a ConfigMap) so that a run killed at any step can
//! be resumed or rolled back by anyone, from anywhere (docs/migration.md#journal).
//!
//! A step is written *before* what it makes possible is done: `scaling-down` holds the replica
//! counts before any is set to zero, `swapping` holds the old PVs and templates before any is
//! deleted or rewritten. So whatever was lost with the process is in the journal.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::plan::{PvMove, Unit, WorkloadRef};

/// The ConfigMap's name, and its key.
pub const NAME: &str = "flexd-migration";
pub const KEY: &str = "journal.json";

/// How far a unit got. Apply goes down the list to `Done`; rollback from wherever it is to
/// `RolledBack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    /// Nothing done yet.
    Planned,
    /// Its PVs' reclaim policy is `Retain`: deleting a PV object cannot delete data.
    Retained,
    /// The replica counts are recorded; the workloads may be at zero.
    ScalingDown,
    /// Every workload is at zero.
    ScaledDown,
    /// No pod uses the volumes, and attaching drivers' volumes are detached.
    Stopped,
    /// The old PVs and templates are recorded; PVs may be missing or new.
    Swapping,
    /// Every PV and template is the CSI one.
    Swapped,
    /// Running again on CSI, Ready.
    Done,
    /// A rollback began; the PVs may be either.
    RollingBack,
    /// Back on FlexVolume, running as before.
    RolledBack,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Planned => "planned",
            Self::Retained => "retained",
            Self::ScalingDown => "scaling-down",
            Self::ScaledDown => "scaled-down",
            Self::Stopped => "stopped",
            Self::Swapping => "swapping",
            Self::Swapped => "swapped",
            Self::Done => "done",
            Self::RollingBack => "rolling-back",
            Self::RolledBack => "rolled-back",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    Apply,
    Rollback,
}

impl Operation {
    /// For messages: "a migration started … by …".
    pub fn in_words(self) -> &'static str {
        match self {
            Self::Apply => "a migration",
            Self::Rollback => "a rollback",
        }
    }
}

/// One unit's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnitRecord {
    pub workloads: Vec<WorkloadRef>,
    /// The PVs' names (their details are in `moves`).
    pub pvs: Vec<String>,
    pub templates: Vec<WorkloadRef>,
    pub moves: Vec<PvMove>,
    pub pods: Vec<String>,
    /// Bare Pods deleted and created again (`namespace/name`).
    #[serde(default)]
    pub bare_pods: Vec<String>,
    pub step: Step,
    /// The replica count of each workload before it was scaled down (by `Kind ns/name`).
    #[serde(default)]
    pub replicas: BTreeMap<String, i32>,
    /// Per node: the attaching drivers' volumes in its `status.volumesAttached` before the
    /// scale-down. kube-controller-manager names them by the driver's `getvolumename`, which
    /// flexd cannot ask, so the unit's are the ones that go.
    #[serde(default)]
    pub attached_before: BTreeMap<String, Vec<String>>,
    /// The PVs as they were before the swap, what a rollback creates again.
    #[serde(default)]
    pub old_pvs: BTreeMap<String, Value>,
    /// The workloads' pod templates before the swap.
    #[serde(default)]
    pub old_templates: BTreeMap<String, Value>,
    /// The bare Pods as they were before they were deleted, what is created again (converted
    /// by an apply, as they were by a rollback).
    #[serde(default)]
    pub old_pods: BTreeMap<String, Value>,
    /// When its pods began to stop (Unix seconds), for the downtime.
    #[serde(default)]
    pub down_since: Option<f64>,
    #[serde(default)]
    pub downtime_seconds: Option<f64>,
}

impl UnitRecord {
    pub fn new(unit: Unit) -> Self {
        Self {
            workloads: unit.workloads,
            pvs: unit.pvs.iter().map(|m| m.name.clone()).collect(),
            templates: unit.templates,
            moves: unit.pvs,
            pods: unit.pods,
            bare_pods: unit.bare_pods,
            step: Step::Planned,
            replicas: BTreeMap::new(),
            attached_before: BTreeMap::new(),
            old_pvs: BTreeMap::new(),
            old_templates: BTreeMap::new(),
            old_pods: BTreeMap::new(),
            down_since: None,
            downtime_seconds: None,
        }
    }

    pub fn title(&self) -> String {
        super::plan::title(&self.workloads, &self.bare_pods, self.pvs.iter())
    }

    /// How many of the unit's attaching volumes each node had attached.
    pub fn attached_counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for m in self.moves.iter().filter(|m| m.attaches) {
            for node in &m.nodes {
                *counts.entry(node.clone()).or_default() += 1;
            }
        }
        counts
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Journal {
    pub version: u32,
    pub operation: Operation,
    /// RFC 3339.
    pub started: String,
    /// Who ran it: user, host and process, for whoever finds it half done.
    pub by: String,
    pub finished: bool,
    pub units: Vec<UnitRecord>,
}

impl Journal {
    pub const VERSION: u32 = 1;

    pub fn new(units: Vec<Unit>, started: String, by: String) -> Self {
        Self {
            version: Self::VERSION,
            operation: Operation::Apply,
            started,
            by,
            finished: false,
            units: units.into_iter().map(UnitRecord::new).collect(),
        }
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let journal: Self = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if journal.version != Self::VERSION {
            return Err(format!(
                "journal version {} (this flexd reads {})",
                journal.version,
                Self::VERSION
            ));
        }
        Ok(journal)
    }

    pub fn to_text(&self) -> String {
        // A Journal is plain data: serialising it cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// How many volumes of `before` are gone from `now`: the unit's count of them is detached
/// when at least that many went.
pub fn detached(before: &[String], now: &[String]) -> usize {
    before.iter().filter(|v| !now.contains(v)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_serialise_as_the_docs_name_them_and_in_order() {
        let text = serde_json::to_string(&Step::ScalingDown).unwrap();
        assert_eq!(text, "\"scaling-down\"");
        assert_eq!(Step::ScalingDown.as_str(), "scaling-down");
        assert!(Step::Retained < Step::Swapping && Step::Swapping < Step::Done);
    }

    #[test]
    fn a_journal_reads_back_what_it_wrote_and_refuses_another_version() {
        let journal = Journal::new(
            vec![Unit {
                workloads: vec!["Deployment web/app".parse().unwrap()],
                ..Unit::default()
            }],
            "2026-11-27T00:00:00Z".into(),
            "root@node pid 1".into(),
        );
        let text = journal.to_text();
        assert_eq!(Journal::parse(&text).unwrap(), journal);
        assert!(text.contains("\"Deployment web/app\""), "{text}");
        let other = text.replace("\"version\": 1", "\"version\": 2");
        assert!(Journal::parse(&other).unwrap_err().contains("version 2"));
        assert!(Journal::parse("{").is_err());
    }

    #[test]
    fn detached_counts_the_volumes_that_went() {
        let before = vec!["flexvolume-a/b/x".to_owned(), "flexvolume-a/b/y".to_owned()];
        assert_eq!(detached(&before, &before), 0);
        assert_eq!(detached(&before, &before[..1]), 1);
        assert_eq!(detached(&before, &[]), 2);
    }
}
