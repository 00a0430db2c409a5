//! The rolling strategy's steps, pure (docs/migration.md#strategies): what a rolling unit does
//! next, from its journal record; which pods replace its FlexVolume ones; and, from the pods
//! observed, what replacing one of them waits for.
//!
//! Apply: `retained` (Retain), `swapping` (the old PVs and templates journaled), `swapped`
//! (each PV swapped under its bound claim while the pods run, templates rewritten, claims Bound
//! again, and what replaces the pods listed), then each replacement marked done in turn, then
//! `done`. Rollback: `rolling-back` (the apply's list dropped), `swapped-back` (the same swap,
//! back to FlexVolume, and a new list), each replacement, `rolled-back`. Every step is written
//! before what it allows is done and is safe to repeat, so `--resume` goes on from any.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::journal::{Operation, Step, UnitRecord};
use super::plan::{WorkloadKind, WorkloadRef};

/// A pod to replace: its name and the uid its eviction is preconditioned on. A StatefulSet's
/// replacement has the same name, and another uid.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PodRef {
    /// `namespace/name`.
    pub name: String,
    pub uid: String,
}

/// One thing that replaces pods of a rolling unit: a pod evicted (its controller starts the
/// replacement), or a workload's own rollout of its rewritten template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replacement {
    pub workload: WorkloadRef,
    /// The pod evicted; none: the workload's rollout replaces its pods.
    #[serde(default)]
    pub pod: Option<PodRef>,
    pub done: bool,
}

/// What a rolling unit does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Set the PVs' reclaim policy to Retain, then `retained`.
    Retain,
    /// Journal the old PVs and templates: `swapping`.
    Record,
    /// Swap the PVs under their claims and rewrite the templates, wait for the claims, list
    /// what replaces the pods: `swapped`.
    Swap,
    /// Drop the apply's list: `rolling-back`.
    BeginRollback,
    /// Swap back what was swapped, wait for the claims, list what replaces the pods:
    /// `swapped-back`.
    SwapBack,
    /// Replacement `i` of the list, then mark it done.
    Replace(usize),
    /// Apply: `done`. Rollback: reclaim policies back, `rolled-back`.
    Finish,
    /// Finished in this direction.
    Nothing,
}

/// What a rolling unit does next in a run of `operation`, from its journal record alone.
pub fn next(record: &UnitRecord, operation: Operation) -> Next {
    let pending = || {
        record
            .replacing
            .iter()
            .position(|r| !r.done)
            .map_or(Next::Finish, Next::Replace)
    };
    match (operation, record.step) {
        (Operation::Apply, Step::Planned) => Next::Retain,
        // The scale-down's steps are never a rolling unit's; as `retained`, recording is next.
        (
            Operation::Apply,
            Step::Retained | Step::ScalingDown | Step::ScaledDown | Step::Stopped,
        ) => Next::Record,
        (Operation::Apply, Step::Swapping) => Next::Swap,
        (Operation::Apply, Step::Swapped) => pending(),
        // Done, or a rollback's step: an apply does not act on it.
        (Operation::Apply, _) => Next::Nothing,
        // Nothing was changed: nothing to put back.
        (Operation::Rollback, Step::Planned) => Next::Finish,
        (Operation::Rollback, Step::RolledBack) => Next::Nothing,
        (Operation::Rollback, Step::RollingBack) => Next::SwapBack,
        (Operation::Rollback, Step::SwappedBack) => pending(),
        (Operation::Rollback, _) => Next::BeginRollback,
    }
}

/// The step a [`Next`] ends with when it is done, if it writes one.
pub fn step_after(next: Next, operation: Operation) -> Option<Step> {
    Some(match (next, operation) {
        (Next::Retain, _) => Step::Retained,
        (Next::Record, _) => Step::Swapping,
        (Next::Swap, _) => Step::Swapped,
        (Next::BeginRollback, _) => Step::RollingBack,
        (Next::SwapBack, _) => Step::SwappedBack,
        (Next::Finish, Operation::Apply) => Step::Done,
        (Next::Finish, Operation::Rollback) => Step::RolledBack,
        (Next::Replace(_) | Next::Nothing, _) => return None,
    })
}

/// What replaces the pods of `record` after its swap (or swap back), in order: each workload's
/// own rollout where its template was rewritten and its controller rolls it, else each of its
/// pods (`pods`, as listed after the swap) evicted in turn. A rollback that swapped nothing back
/// replaces nothing.
pub fn to_replace(
    record: &UnitRecord,
    operation: Operation,
    pods: &BTreeMap<WorkloadRef, Vec<PodRef>>,
) -> Vec<Replacement> {
    let rollback = operation == Operation::Rollback;
    if rollback && record.old_pvs.is_empty() && record.old_templates.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for w in &record.workloads {
        let rewritten = !rollback || record.old_templates.contains_key(&w.to_string());
        if record.rollouts.contains(w) && rewritten {
            out.push(Replacement {
                workload: w.clone(),
                pod: None,
                done: false,
            });
            continue;
        }
        let mut listed: Vec<&PodRef> = pods.get(w).into_iter().flatten().collect();
        listed.sort();
        out.extend(listed.into_iter().map(|p| Replacement {
            workload: w.clone(),
            pod: Some(p.clone()),
            done: false,
        }));
    }
    out
}

/// A pod as a replacement's wait sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSeen {
    /// `namespace/name`.
    pub name: String,
    pub uid: String,
    /// Being deleted (its deletionTimestamp set).
    pub terminating: bool,
    /// Its Ready condition is True.
    pub ready: bool,
}

impl PodSeen {
    pub fn of(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        let status = pod.status.as_ref();
        Self {
            name: format!(
                "{}/{}",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            ),
            uid: meta.uid.clone().unwrap_or_default(),
            terminating: meta.deletion_timestamp.is_some(),
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True"),
        }
    }
}

/// The controller reference's uid, if its kind is `kind`.
fn controller_uid<'a>(
    meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    kind: &str,
) -> Option<&'a str> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == kind)
        .map(|o| o.uid.as_str())
}

/// The pods of workload `w` of uid `uid` among `pods` (those that have not ended), by their
/// controller's uid: a Deployment's through its ReplicaSets. By uid, so a workload created
/// again under the name is not taken for it.
pub fn pods_of(
    w: &WorkloadRef,
    uid: &str,
    pods: &[Pod],
    replica_sets: &[ReplicaSet],
) -> Vec<PodSeen> {
    let owners: BTreeSet<&str> = match w.kind {
        WorkloadKind::Deployment => replica_sets
            .iter()
            .filter(|rs| controller_uid(&rs.metadata, "Deployment") == Some(uid))
            .filter_map(|rs| rs.metadata.uid.as_deref())
            .collect(),
        WorkloadKind::StatefulSet | WorkloadKind::ReplicaSet => BTreeSet::from([uid]),
    };
    let owner_kind = match w.kind {
        WorkloadKind::StatefulSet => "StatefulSet",
        WorkloadKind::Deployment | WorkloadKind::ReplicaSet => "ReplicaSet",
    };
    pods.iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(w.namespace.as_str()))
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter(|p| controller_uid(&p.metadata, owner_kind).is_some_and(|o| owners.contains(o)))
        .map(PodSeen::of)
        .collect()
}

/// What replacing one pod waits for, or does, now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodNext {
    /// Another pod of the workload is not Ready (a replacement not yet Ready, a pod restarting):
    /// evicting this one now would leave fewer up than planned.
    WaitWhole { ready: usize, desired: usize },
    /// Evict it, preconditioned on its uid.
    Evict,
    /// Evicted: until kubelet has stopped it (its volumes unmounted) and it is gone.
    WaitGone,
    /// Gone: until the workload has its pods Ready again, the replacement among them.
    WaitReplacement { ready: usize, desired: usize },
    /// Replaced.
    Replaced,
}

/// What replacing pod `uid` does next: `target` is the pod of that uid if it is still there,
/// `pods` the workload's pods now, `desired` its replicas now.
pub fn pod_next(target: Option<&PodSeen>, pods: &[PodSeen], desired: i32) -> PodNext {
    let desired = usize::try_from(desired).unwrap_or(0);
    let ready = pods.iter().filter(|p| p.ready && !p.terminating).count();
    match target {
        Some(t) if t.terminating => PodNext::WaitGone,
        Some(t) => {
            // The others must all be up; the pod itself counts only if it is Ready.
            if ready + usize::from(!t.ready) >= desired {
                PodNext::Evict
            } else {
                PodNext::WaitWhole { ready, desired }
            }
        }
        None if ready >= desired => PodNext::Replaced,
        None => PodNext::WaitReplacement { ready, desired },
    }
}

impl PodNext {
    /// What it waits for, for messages: `pod` the one being replaced, `w` its workload.
    pub fn waiting_for(&self, pod: &str, w: &WorkloadRef) -> String {
        match self {
            Self::WaitWhole { ready, desired } => format!(
                "{w} to have its {desired} pods Ready before Pod {pod} is evicted ({ready} Ready)"
            ),
            Self::Evict => format!(
                "the eviction of Pod {pod} to be allowed (the API server answers 429 Too Many \
                 Requests while a PodDisruptionBudget allows no disruption)"
            ),
            Self::WaitGone => format!("Pod {pod}, evicted, to stop and be gone"),
            Self::WaitReplacement { ready, desired } => format!(
                "the replacement of Pod {pod} to be Ready: {w} has {ready} of {desired} pods Ready"
            ),
            Self::Replaced => format!("nothing: Pod {pod} is replaced"),
        }
    }
}

/// A workload's rollout as its object says it: complete when the controller has seen the
/// latest template and every pod is of it and Ready, no old pod left.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RolloutSeen {
    pub generation: i64,
    pub observed_generation: i64,
    pub desired: i64,
    pub updated: i64,
    pub ready: i64,
    pub total: i64,
    /// A Deployment's `Progressing` condition when it is `False` (its
    /// `progressDeadlineSeconds` passed): reason and message, for the operator.
    pub stalled: Option<String>,
}

impl RolloutSeen {
    /// From a Deployment or StatefulSet as the API server returns it.
    pub fn of(object: &Value) -> Self {
        let int = |pointer: &str| object.pointer(pointer).and_then(Value::as_i64);
        Self {
            generation: int("/metadata/generation").unwrap_or(0),
            observed_generation: int("/status/observedGeneration").unwrap_or(0),
            desired: int("/spec/replicas").unwrap_or(1),
            updated: int("/status/updatedReplicas").unwrap_or(0),
            ready: int("/status/readyReplicas").unwrap_or(0),
            total: int("/status/replicas").unwrap_or(0),
            stalled: (object
                .pointer("/status/conditions")
                .and_then(Value::as_array))
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Progressing" && c["status"] == "False")
            .map(|c| {
                let text = |key: &str| c[key].as_str().unwrap_or_default().to_owned();
                format!("{}: {}", text("reason"), text("message"))
            }),
        }
    }

    /// None when complete, else where it is.
    pub fn progress(&self) -> Option<String> {
        let Self {
            generation,
            observed_generation,
            desired,
            updated,
            ready,
            total,
            ref stalled,
        } = *self;
        if observed_generation < generation {
            return Some(format!(
                "its controller has not seen the new template yet (generation {generation}, \
                 observed {observed_generation})"
            ));
        }
        if updated == desired && ready == desired && total == desired {
            return None;
        }
        let stalled = stalled
            .as_ref()
            .map(|s| format!("; its controller says {s}"))
            .unwrap_or_default();
        Some(format!(
            "{updated} of {desired} pods updated, {ready} Ready, {total} in all{stalled}"
        ))
    }
}

#[cfg(test)]
#[path = "rolling_tests.rs"]
mod tests;
