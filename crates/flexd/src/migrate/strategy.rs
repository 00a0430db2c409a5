//! How each unit of a plan moves (docs/migration.md#strategies): pure, from the unit and the
//! cluster's objects listed for the plan.
//!
//! *Scale-down* stops the unit's workloads, swaps its PVs and templates and starts them again:
//! it works for any storage, and the unit is down meanwhile. *Rolling* swaps each PV under its
//! bound claim while the pods keep running (kubelet does not unmount a running pod's volume
//! when its PV object changes), then replaces the pods one at a time, so old FlexVolume mounts
//! and new CSI mounts of one volume coexist during the hand-over. That is safe only where two
//! pods may mount the volume at once, and it keeps the service up only where each workload
//! keeps a pod up while one is replaced; `auto` picks it exactly there.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};

use super::plan::{Inventory, Plan, Refused, Unit, WorkloadKind, WorkloadRef};

/// What `--strategy` asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Requested {
    /// Rolling where it is safe and keeps the workloads up, else scale-down.
    #[default]
    Auto,
    /// Rolling, or the unit is refused (not migrated) saying why it is not safe.
    Rolling,
    /// Every unit scaled down, as before rolling existed.
    ScaleDown,
}

/// How a unit moves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Scaled to zero, swapped, scaled back: down meanwhile. The default, so journals written
    /// before strategies existed read as what they did.
    #[default]
    ScaleDown,
    /// Swapped under its running pods, which are then replaced one at a time.
    Rolling,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ScaleDown => "scale-down",
            Self::Rolling => "rolling",
        }
    }
}

/// How a workload's controller replaces its pods, and so how many stay up meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rollout {
    /// A Deployment's RollingUpdate, its bounds resolved against its replicas.
    Deployment {
        max_unavailable: i32,
        max_surge: i32,
        paused: bool,
    },
    /// A Deployment's Recreate: every old pod stops before a new one starts.
    Recreate,
    /// A StatefulSet's RollingUpdate: pods from `partition` up take a new template.
    StatefulSet {
        max_unavailable: i32,
        partition: i32,
    },
    /// A StatefulSet's OnDelete: a pod takes the new template when it is deleted.
    OnDelete,
    /// A ReplicaSet of its own: no rollout, deleted pods are replaced.
    ReplicaSet,
}

/// What the choice needs to know of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadFacts {
    /// `spec.replicas` (1 when unset, as the API server defaults it).
    pub replicas: i32,
    pub rollout: Rollout,
}

/// The strategy of a unit, why, and what downtime remains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub strategy: Strategy,
    pub reason: String,
    pub downtime: String,
    /// Rolling: the workloads whose own rollout replaces their pods.
    pub rollouts: Vec<WorkloadRef>,
}

/// Why `--strategy rolling` cannot move a unit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--strategy rolling: {}; --strategy auto or scale-down migrates it with downtime",
    .reasons.join("; ")
)]
pub struct RollingRefused {
    pub reasons: Vec<String>,
}

/// `value` of `replicas` as a count: a percentage rounded up or down, as the controllers do.
fn resolve(value: Option<&IntOrString>, default: &str, replicas: i32, round_up: bool) -> i32 {
    let percent = |text: &str| -> Option<i32> {
        let p: i64 = text.strip_suffix('%')?.parse().ok()?;
        let scaled = p * i64::from(replicas.max(0));
        let count = if round_up {
            (scaled + 99) / 100
        } else {
            scaled / 100
        };
        i32::try_from(count).ok()
    };
    match value {
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(text)) => percent(text).unwrap_or(0),
        None => percent(default).unwrap_or(0),
    }
}

/// The facts of every Deployment, StatefulSet and ReplicaSet listed.
pub fn facts(inventory: &Inventory) -> BTreeMap<WorkloadRef, WorkloadFacts> {
    let reference = |kind, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        let (namespace, name) = super::plan::name_of(meta);
        WorkloadRef {
            kind,
            namespace,
            name,
        }
    };
    let mut out = BTreeMap::new();
    for d in &inventory.deployments {
        let spec = d.spec.as_ref();
        let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
        let strategy = spec.and_then(|s| s.strategy.as_ref());
        let rollout = if strategy.and_then(|s| s.type_.as_deref()) == Some("Recreate") {
            Rollout::Recreate
        } else {
            let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
            let max_surge = resolve(
                rolling.and_then(|r| r.max_surge.as_ref()),
                "25%",
                replicas,
                true,
            );
            let mut max_unavailable = resolve(
                rolling.and_then(|r| r.max_unavailable.as_ref()),
                "25%",
                replicas,
                false,
            );
            // The Deployment controller's rule: both zero would never progress.
            if max_surge == 0 && max_unavailable == 0 {
                max_unavailable = 1;
            }
            Rollout::Deployment {
                max_unavailable,
                max_surge,
                paused: spec.and_then(|s| s.paused).unwrap_or(false),
            }
        };
        let facts = WorkloadFacts { replicas, rollout };
        out.insert(reference(WorkloadKind::Deployment, &d.metadata), facts);
    }
    for s in &inventory.stateful_sets {
        let spec = s.spec.as_ref();
        let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
        let strategy = spec.and_then(|s| s.update_strategy.as_ref());
        let rollout = if strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete") {
            Rollout::OnDelete
        } else {
            let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
            Rollout::StatefulSet {
                max_unavailable: resolve(
                    rolling.and_then(|r| r.max_unavailable.as_ref()),
                    "1",
                    replicas,
                    true,
                )
                .max(1),
                partition: rolling.and_then(|r| r.partition).unwrap_or(0),
            }
        };
        let facts = WorkloadFacts { replicas, rollout };
        out.insert(reference(WorkloadKind::StatefulSet, &s.metadata), facts);
    }
    for r in &inventory.replica_sets {
        let replicas = r.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let facts = WorkloadFacts {
            replicas,
            rollout: Rollout::ReplicaSet,
        };
        out.insert(reference(WorkloadKind::ReplicaSet, &r.metadata), facts);
    }
    out
}

fn plural(n: i32, one: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// How one workload of a rolling unit is replaced: by its own rollout or by evictions; how many
/// of its pods stay up meanwhile (`Ok`), or why none may (`Err`, the unit cannot roll at all)
/// or why one moment has none up (`Ok` with a gap).
struct Replaced {
    by_rollout: bool,
    /// Why it stays up, or what moment it is down.
    text: String,
    /// Whether a moment has none of its pods up.
    gap: bool,
}

fn replaced(w: &WorkloadRef, facts: &WorkloadFacts, template: bool) -> Result<Replaced, String> {
    let r = facts.replicas;
    let evicted = |r: i32| Replaced {
        by_rollout: false,
        text: if r >= 2 {
            format!(
                "{w} keeps {} of its {} up (evicted one at a time)",
                r - 1,
                plural(r, "pod")
            )
        } else {
            format!("{w} has 1 replica: it is down while its pod is replaced")
        },
        gap: r == 1,
    };
    if r <= 0 {
        return Ok(Replaced {
            by_rollout: false,
            text: format!("{w} has 0 replicas: no pod to replace"),
            gap: false,
        });
    }
    if !template {
        return Ok(evicted(r));
    }
    // Its template is rewritten: its controller decides how its pods take it.
    match facts.rollout {
        Rollout::Deployment { paused: true, .. } => Err(format!(
            "{w} is paused: the rollout of its rewritten template would not progress"
        )),
        Rollout::Deployment {
            max_unavailable,
            max_surge,
            ..
        } => {
            let up = (r - max_unavailable).max(0);
            Ok(Replaced {
                by_rollout: true,
                text: if up >= 1 {
                    format!(
                        "{w} keeps {up} of its {} up through its own rollout (maxUnavailable \
                         {max_unavailable}, maxSurge {max_surge})",
                        plural(r, "pod")
                    )
                } else {
                    format!(
                        "{w}'s rollout may stop all its {} at once (maxUnavailable \
                         {max_unavailable} of {r} replicas)",
                        plural(r, "pod")
                    )
                },
                gap: up < 1,
            })
        }
        Rollout::Recreate => Ok(Replaced {
            by_rollout: true,
            text: format!(
                "{w}'s strategy is Recreate: its rollout stops every pod before a new one starts"
            ),
            gap: true,
        }),
        Rollout::StatefulSet { partition, .. } if partition > 0 => Err(format!(
            "{w}'s rollingUpdate.partition is {partition}: its pods below ordinal {partition} \
             would keep the FlexVolume template"
        )),
        Rollout::StatefulSet {
            max_unavailable, ..
        } => {
            let up = (r - max_unavailable).max(0);
            Ok(Replaced {
                by_rollout: true,
                text: if up >= 1 {
                    format!(
                        "{w} keeps {up} of its {} up through its own rolling update",
                        plural(r, "pod")
                    )
                } else {
                    format!(
                        "{w} has {}: its rolling update stops it",
                        plural(r, "replica")
                    )
                },
                gap: up < 1,
            })
        }
        // The template is rewritten, and each evicted pod comes back with it.
        Rollout::OnDelete | Rollout::ReplicaSet => Ok(evicted(r)),
    }
}

/// What remains down with scale-down.
fn scale_down_downtime(unit: &Unit) -> String {
    if unit.workloads.is_empty() && unit.bare_pods.is_empty() {
        return "none: no pod uses it".to_owned();
    }
    let detach = if unit.pvs.iter().any(|m| m.attaches) {
        ", the detach of its FlexVolume volumes included"
    } else {
        ""
    };
    format!("its pods, from the scale-down until they are Ready again on CSI{detach}")
}

/// Whether two pods may mount a PV at once during the hand-over, or why not.
fn shared(m: &super::plan::PvMove) -> Result<String, String> {
    let pv = &m.name;
    if m.attaches {
        return Err(format!(
            "PersistentVolume {pv}: driver {} attaches, so the FlexVolume and the CSI \
             attachment would attach one volume twice, and the old pods' detach would pull it \
             from under the new ones",
            m.driver
        ));
    }
    let modes = &m.access_modes;
    match modes
        .iter()
        .find(|a| matches!(a.as_str(), "ReadWriteMany" | "ReadOnlyMany"))
    {
        Some(mode) => Ok(format!(
            "PersistentVolume {pv} is {mode} and driver {} does not attach: old and new pods \
             mount it at once",
            m.driver
        )),
        None => Err(format!(
            "PersistentVolume {pv} is {}: two pods on different nodes may not mount it at once",
            if modes.is_empty() {
                "without accessModes".to_owned()
            } else {
                modes.join(", ")
            }
        )),
    }
}

/// The strategy of `unit`: what `requested` asks, where it is safe.
pub fn choose(
    unit: &Unit,
    facts: &BTreeMap<WorkloadRef, WorkloadFacts>,
    requested: Requested,
) -> Result<Choice, RollingRefused> {
    let scale_down = |reason: String| Choice {
        strategy: Strategy::ScaleDown,
        reason,
        downtime: scale_down_downtime(unit),
        rollouts: Vec::new(),
    };
    if requested == Requested::ScaleDown {
        return Ok(scale_down("--strategy scale-down".to_owned()));
    }
    // Why rolling would not be safe, and why it would be.
    let mut unsafe_ = Vec::new();
    let mut why = Vec::new();
    for p in &unit.bare_pods {
        unsafe_.push(format!(
            "Pod {p} is a bare Pod: no controller starts a replacement, so it is deleted and \
             created again"
        ));
    }
    for m in &unit.pvs {
        match shared(m) {
            Ok(text) => why.push(text),
            Err(text) => unsafe_.push(text),
        }
    }
    if !unit.templates.is_empty() {
        // The plan refuses an inline volume of an attaching driver (CSIDriver attachRequired).
        why.push("its inline volumes' drivers do not attach".to_owned());
    }
    let mut gaps = Vec::new();
    let mut rollouts = Vec::new();
    for w in &unit.workloads {
        let Some(f) = facts.get(w) else {
            unsafe_.push(format!("{w} was not listed: its replicas are unknown"));
            continue;
        };
        match replaced(w, f, unit.templates.contains(w)) {
            Err(text) => unsafe_.push(text),
            Ok(r) => {
                if r.by_rollout {
                    rollouts.push(w.clone());
                }
                if r.gap {
                    gaps.push(r.text);
                } else {
                    why.push(r.text);
                }
            }
        }
    }
    if !unsafe_.is_empty() {
        return match requested {
            Requested::Rolling => Err(RollingRefused { reasons: unsafe_ }),
            _ => Ok(scale_down(unsafe_.join("; "))),
        };
    }
    if unit.workloads.is_empty() {
        // Nothing runs on it: nothing to keep up, and nothing stops either way.
        let reason = "no pod uses it: swapped alone".to_owned();
        return Ok(match requested {
            Requested::Rolling => Choice {
                strategy: Strategy::Rolling,
                reason,
                downtime: "none: no pod uses it".to_owned(),
                rollouts,
            },
            _ => scale_down(reason),
        });
    }
    if !gaps.is_empty() && requested == Requested::Auto {
        return Ok(scale_down(format!(
            "{}: rolling would not keep it up either",
            gaps.join("; ")
        )));
    }
    let downtime = if gaps.is_empty() {
        "none: a pod of each workload stays up throughout".to_owned()
    } else {
        gaps.join("; ")
    };
    why.extend(gaps);
    Ok(Choice {
        strategy: Strategy::Rolling,
        reason: why.join("; "),
        downtime,
        rollouts,
    })
}

/// Chooses the strategy of every unit of `plan`; a unit `--strategy rolling` cannot move is
/// refused (moved to `plan.refused`), the rest keep their order.
pub fn assign(plan: &mut Plan, inventory: &Inventory, requested: Requested) {
    let facts = facts(inventory);
    let units = std::mem::take(&mut plan.units);
    for mut unit in units {
        match choose(&unit, &facts, requested) {
            Ok(choice) => {
                unit.strategy = choice.strategy;
                unit.strategy_reason = choice.reason;
                unit.downtime = choice.downtime;
                unit.rollouts = choice.rollouts;
                plan.units.push(unit);
            }
            Err(refused) => plan.refused.push(Refused {
                what: unit.title(),
                reason: refused.to_string(),
            }),
        }
    }
    plan.refused
        .sort_by(|a, b| (&a.what, &a.reason).cmp(&(&b.what, &b.reason)));
}

/// The namespaces whose pods a rolling unit evicts: those of its workloads not rolled out by
/// their controller.
pub fn evicts_in(unit: &Unit) -> impl Iterator<Item = &str> {
    (unit.workloads.iter())
        .filter(|w| unit.strategy == Strategy::Rolling && !unit.rollouts.contains(w))
        .map(|w| w.namespace.as_str())
}

/// Where the identity running flexd may not evict pods (`create` on `pods/eviction`), a
/// rolling unit that would is scaled down instead (`auto`), or refused (`rolling`).
pub fn without_evictions(plan: &mut Plan, denied: &BTreeSet<String>, requested: Requested) {
    let units = std::mem::take(&mut plan.units);
    for mut unit in units {
        let namespaces: BTreeSet<&str> =
            evicts_in(&unit).filter(|ns| denied.contains(*ns)).collect();
        if namespaces.is_empty() {
            plan.units.push(unit);
            continue;
        }
        let why = format!(
            "this identity may not evict pods in namespace {} (create on pods/eviction)",
            namespaces.into_iter().collect::<Vec<_>>().join(", ")
        );
        if requested == Requested::Rolling {
            plan.refused.push(Refused {
                what: unit.title(),
                reason: RollingRefused { reasons: vec![why] }.to_string(),
            });
            continue;
        }
        unit.strategy = Strategy::ScaleDown;
        unit.strategy_reason = why;
        unit.downtime = scale_down_downtime(&unit);
        unit.rollouts.clear();
        plan.units.push(unit);
    }
    plan.refused
        .sort_by(|a, b| (&a.what, &a.reason).cmp(&(&b.what, &b.reason)));
}

#[cfg(test)]
#[path = "strategy_tests.rs"]
mod tests;
