//! The journal of `flexd migrate --apply`: how far each unit got, and everything needed to go
//! on or to go back, kept in the API server (a ConfigMap) so that a run killed at any step can
//! be resumed or rolled back by anyone, from anywhere (docs/migration.md#journal).
//!
//! A step is written *before* what it makes possible is done: `scaling-down` holds the replica
//! counts before any is set to zero, `swapping` holds the old PVs and templates before any is
//! deleted or rewritten. So whatever was lost with the process is in the journal.
//!
//! The journal also holds the uid of every object it acts on, and a digest of all of it: a
//! journal changed by anything but `flexd migrate` is refused rather than followed, and so is
//! one whose objects are no longer those it recorded ([`super::guard`]).
//!
//! A rolling unit ([`super::strategy`]) skips the scale-down's steps: `swapped` holds the pods
//! (and rollouts) that replace its FlexVolume pods one at a time, each marked as it is done,
//! and a rollback goes `rolling-back`, `swapped-back` (the same, back) to `rolled-back`
//! ([`super::rolling`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::plan::{PvMove, Unit, WorkloadRef};
use super::rolling::Replacement;
use super::strategy::Strategy;

/// The ConfigMap's name, and its key.
pub const NAME: &str = "flexd-migration";
pub const KEY: &str = "journal.json";

/// How far a unit got. Apply goes down the list to `Done` (a rolling unit skips from `Swapping`
/// to `Swapped`); rollback from wherever it is to `RolledBack`.
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
    /// Rolling: the PVs and templates are FlexVolume again, the pods being replaced.
    SwappedBack,
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
            Self::SwappedBack => "swapped-back",
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
    /// The uid of each object the unit acts on, by [`super::plan::pv_key`],
    /// [`super::plan::pod_key`] or the workload's `Kind namespace/name`: from the plan, then
    /// the uid of each object flexd creates in place of one, as soon as it is created.
    #[serde(default)]
    pub uids: BTreeMap<String, String>,
    /// When its pods began to stop (Unix seconds), for the downtime.
    #[serde(default)]
    pub down_since: Option<f64>,
    #[serde(default)]
    pub downtime_seconds: Option<f64>,
    /// How it moves; a journal written before strategies holds scale-down units only.
    #[serde(default)]
    pub strategy: Strategy,
    /// Rolling: the workloads whose own rollout replaces their pods.
    #[serde(default)]
    pub rollouts: Vec<WorkloadRef>,
    /// Rolling: what replaces the pods of the direction under way, in order, each marked done
    /// when it is; listed after the swap (or the swap back).
    #[serde(default)]
    pub replacing: Vec<Replacement>,
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
            uids: unit.uids,
            strategy: unit.strategy,
            rollouts: unit.rollouts,
            replacing: Vec::new(),
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
    /// `sha256:` and the hex digest of everything else in the journal, as [`Journal::to_text`]
    /// wrote it (none in a version 1 journal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// Why a journal is not followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    #[error("it is not a journal: {0}")]
    Unreadable(String),
    #[error(
        "it is journal version {found}, and this flexd reads versions 1 to {}",
        Journal::VERSION
    )]
    Version { found: u64 },
    #[error("it has no digest, and a journal of version 2 or later always has one")]
    NoDigest,
    #[error(
        "its digest is {recorded} and its contents' is {computed}: something other than flexd \
         migrate changed it"
    )]
    DigestMismatch { recorded: String, computed: String },
    #[error(
        "it is journal version 1, written by a flexd before journals had a digest and the uids \
         of the objects they act on, so flexd cannot tell its objects are still those it \
         recorded; go on with the flexd that wrote it, or by hand (docs/migration.md#rollback)"
    )]
    Unsealed,
}

impl Journal {
    /// 2: a digest, and the uids of the objects acted on. 3: rolling units, which a flexd that
    /// reads version 2 would take for scale-down ones (and scale to the replicas it never
    /// recorded, zero).
    pub const VERSION: u32 = 3;

    pub fn new(units: Vec<Unit>, started: String, by: String) -> Self {
        Self {
            version: Self::VERSION,
            operation: Operation::Apply,
            started,
            by,
            finished: false,
            units: units.into_iter().map(UnitRecord::new).collect(),
            digest: None,
        }
    }

    /// Reads a journal, its digest checked. A version 1 journal (no digest) is read as it is:
    /// [`Journal::require_sealed`] says whether it may be acted on.
    pub fn parse(text: &str) -> Result<Self, JournalError> {
        let unreadable = |e: serde_json::Error| JournalError::Unreadable(e.to_string());
        let mut value: Value = serde_json::from_str(text).map_err(unreadable)?;
        let Some(map) = value.as_object_mut() else {
            return Err(JournalError::Unreadable("not a JSON object".to_owned()));
        };
        let recorded = map.remove("digest");
        let version = map.get("version").and_then(Value::as_u64);
        match version {
            Some(1) => {}
            // Version 2 is version 3 without rolling units (the fields default to scale-down).
            Some(v) if (2..=u64::from(Self::VERSION)).contains(&v) => {
                let recorded = match recorded {
                    Some(Value::String(digest)) => digest,
                    _ => return Err(JournalError::NoDigest),
                };
                let computed = digest_of(&value);
                if recorded != computed {
                    return Err(JournalError::DigestMismatch { recorded, computed });
                }
                if let Some(map) = value.as_object_mut() {
                    map.insert("digest".to_owned(), Value::String(recorded));
                }
            }
            Some(found) => return Err(JournalError::Version { found }),
            None => return Err(JournalError::Unreadable("no version".to_owned())),
        }
        serde_json::from_value(value).map_err(unreadable)
    }

    /// Whether the journal may be acted on (`--resume`, `--rollback`): only one with a digest
    /// and uids.
    pub fn require_sealed(&self) -> Result<(), JournalError> {
        if self.version < 2 {
            return Err(JournalError::Unsealed);
        }
        Ok(())
    }

    /// The journal as stored, with the digest of its contents.
    pub fn to_text(&self) -> String {
        // A Journal is plain data: serialising it cannot fail.
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.remove("digest");
            let digest = digest_of(&Value::Object(map.clone()));
            map.insert("digest".to_owned(), Value::String(digest));
        }
        serde_json::to_string_pretty(&value).unwrap_or_default()
    }
}

/// `sha256:` and the hex digest of `value` as compact JSON: serde_json's maps are sorted, so
/// the same contents give the same digest however the text was laid out.
fn digest_of(value: &Value) -> String {
    use std::fmt::Write as _;
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    let mut text = String::from("sha256:");
    for byte in digest.as_ref() {
        let _ = write!(text, "{byte:02x}");
    }
    text
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

    fn journal() -> Journal {
        Journal::new(
            vec![Unit {
                workloads: vec!["Deployment web/app".parse().unwrap()],
                uids: BTreeMap::from([("Deployment web/app".to_owned(), "uid-app".to_owned())]),
                ..Unit::default()
            }],
            "2026-11-27T00:00:00Z".into(),
            "root@node pid 1".into(),
        )
    }

    #[test]
    fn a_journal_reads_back_what_it_wrote_and_refuses_another_version() {
        let journal = journal();
        let text = journal.to_text();
        let read = Journal::parse(&text).unwrap();
        assert!(read.digest.as_deref().unwrap().starts_with("sha256:"));
        assert_eq!(
            Journal {
                digest: None,
                ..read
            },
            journal
        );
        assert!(text.contains("\"Deployment web/app\""), "{text}");
        assert!(text.contains("\"uid-app\""), "{text}");
        let other = text.replace("\"version\": 3", "\"version\": 4");
        assert_eq!(
            Journal::parse(&other).unwrap_err(),
            JournalError::Version { found: 4 }
        );
        assert!(matches!(
            Journal::parse("{"),
            Err(JournalError::Unreadable(_))
        ));
    }

    #[test]
    fn the_digest_ignores_the_layout_and_written_again_follows_the_contents() {
        let mut journal = journal();
        let text = journal.to_text();
        let compact =
            serde_json::to_string(&serde_json::from_str::<Value>(&text).unwrap()).unwrap();
        assert_eq!(
            Journal::parse(&compact).unwrap(),
            Journal::parse(&text).unwrap()
        );
        journal.units[0].step = Step::Done;
        let again = Journal::parse(&journal.to_text()).unwrap();
        assert_eq!(again.units[0].step, Step::Done);
        assert_ne!(again.digest, Journal::parse(&text).unwrap().digest);
    }

    #[test]
    fn a_journal_with_times_and_downtimes_reads_back_whatever_their_digits() {
        // Times are f64 seconds with up to 17 significant digits: the digest is computed over
        // them as read back, so reading must give back exactly the float that was written
        // (serde_json's float_roundtrip; without it one float in a few hundred came back one
        // unit in the last place off, and a journal flexd itself wrote was refused).
        let mut journal = journal();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let seconds = 1.7e9 + (x % 100_000_000) as f64 / 7.0;
            journal.units[0].down_since = Some(seconds);
            journal.units[0].downtime_seconds = Some((x % 1_000_000) as f64 / 3.0e4);
            let text = journal.to_text();
            let read =
                Journal::parse(&text).unwrap_or_else(|e| panic!("{e}: {seconds} in\n{text}"));
            assert_eq!(read.units[0].down_since, Some(seconds));
        }
    }

    #[test]
    fn the_digest_is_sha256_of_the_compact_json() {
        // `printf '{}' | sha256sum`
        assert_eq!(
            digest_of(&serde_json::json!({})),
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn a_journal_changed_by_anything_else_is_refused_with_both_digests() {
        let text = journal().to_text();
        let recorded = Journal::parse(&text).unwrap().digest.unwrap();
        // Another object to act on, or another uid: what someone steering the next run edits.
        for (from, to) in [
            (
                "\"Deployment web/app\"",
                "\"Deployment kube-system/coredns\"",
            ),
            ("\"uid-app\"", "\"uid-other\""),
            ("\"finished\": false", "\"finished\": true"),
        ] {
            let tampered = text.replace(from, to);
            assert_ne!(tampered, text);
            match Journal::parse(&tampered) {
                Err(JournalError::DigestMismatch {
                    recorded: r,
                    computed,
                }) => {
                    assert_eq!(r, recorded);
                    assert_ne!(computed, recorded);
                    let message = JournalError::DigestMismatch {
                        recorded: r,
                        computed: computed.clone(),
                    }
                    .to_string();
                    assert!(message.contains(&recorded) && message.contains(&computed));
                }
                other => panic!("{from} → {to}: {other:?}"),
            }
        }
        let mut value: Value = serde_json::from_str(&text).unwrap();
        value.as_object_mut().unwrap().remove("digest");
        assert_eq!(
            Journal::parse(&value.to_string()).unwrap_err(),
            JournalError::NoDigest
        );
    }

    #[test]
    fn a_version_1_journal_is_read_but_not_acted_on() {
        let mut value: Value = serde_json::from_str(&journal().to_text()).unwrap();
        let map = value.as_object_mut().unwrap();
        map.remove("digest");
        map.insert("version".into(), 1.into());
        for unit in map["units"].as_array_mut().unwrap() {
            unit.as_object_mut().unwrap().remove("uids");
        }
        let old = Journal::parse(&value.to_string()).unwrap();
        assert_eq!(old.version, 1);
        assert!(!old.finished);
        assert_eq!(old.require_sealed(), Err(JournalError::Unsealed));
        assert!(JournalError::Unsealed.to_string().contains("by hand"));
        assert_eq!(
            Journal::parse(&journal().to_text())
                .unwrap()
                .require_sealed(),
            Ok(())
        );
    }

    #[test]
    fn detached_counts_the_volumes_that_went() {
        let before = vec!["flexvolume-a/b/x".to_owned(), "flexvolume-a/b/y".to_owned()];
        assert_eq!(detached(&before, &before), 0);
        assert_eq!(detached(&before, &before[..1]), 1);
        assert_eq!(detached(&before, &[]), 2);
    }
}
