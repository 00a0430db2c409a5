//! What `flexd migrate --apply` moves, together, and what it refuses: pure, from the cluster's
//! objects listed once (docs/migration.md#apply).
//!
//! A PersistentVolume cannot change its source in place: it is deleted and created again, and
//! every pod of the workloads that use it must come to mount the new one: the PVs and
//! workloads linked through pods and templates form one *unit*, swapped together, stopped and
//! started again or rolled pod by pod ([`super::strategy`], chosen here last). A unit is
//! refused whole when anything in it cannot be stopped and started again by flexd (a bare Pod
//! without `--recreate-pods`, a DaemonSet, a Job), cannot be converted, or would have no flexd
//! to serve it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod, PodSpec,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::graph::{Graph, Member};
use super::strategy::{Requested, Strategy};
pub use super::workload::{WorkloadKind, WorkloadRef};
use crate::naming;

/// The cluster's objects a plan is made from.
#[derive(Debug, Default, Clone)]
pub struct Inventory {
    pub persistent_volumes: Vec<PersistentVolume>,
    /// The claims the FlexVolume PVs' `claimRef`s name (those that exist): a claim joins its
    /// PV's unit only when it is bound to that PV.
    pub persistent_volume_claims: Vec<PersistentVolumeClaim>,
    pub pods: Vec<Pod>,
    pub replica_sets: Vec<ReplicaSet>,
    pub deployments: Vec<Deployment>,
    pub stateful_sets: Vec<StatefulSet>,
    pub csi_drivers: Vec<CSIDriver>,
    pub csi_nodes: Vec<CSINode>,
}

/// One FlexVolume PV to swap for its CSI twin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PvMove {
    pub name: String,
    /// The FlexVolume driver, `vendor/driver`.
    pub driver: String,
    /// Its CSI name, which the migrated PV names.
    pub csi_driver: String,
    /// `namespace/name` of the claim bound to it: named by its `claimRef` and bound to it in
    /// return (the claim's `volumeName` and uid), else none (a Released PV's stale `claimRef`).
    pub claim: Option<String>,
    /// Whether the driver attaches (its CSIDriver's `attachRequired`): the swap then waits for
    /// kube-controller-manager's detach first.
    pub attaches: bool,
    /// The reclaim policy before the migration, restored by a rollback.
    pub reclaim_policy: Option<String>,
    /// The nodes whose pods mount it now.
    #[serde(default)]
    pub nodes: BTreeSet<String>,
    /// Its `accessModes`: whether old and new pods may mount it at once decides whether its
    /// unit may roll ([`super::strategy`]).
    #[serde(default)]
    pub access_modes: Vec<String>,
}

#[cfg(test)]
impl PvMove {
    /// The tests' PV: `name` of `driver`, bound to claim `shop/<name>`, reclaim policy Delete,
    /// mounted on no node.
    pub(crate) fn example(
        name: &str,
        driver: &str,
        attaches: bool,
        access_modes: &[&str],
    ) -> PvMove {
        PvMove {
            name: name.into(),
            driver: driver.into(),
            csi_driver: format!("flexvolume-{}", driver.replace('/', "--")),
            claim: Some(format!("shop/{name}")),
            attaches,
            reclaim_policy: Some("Delete".into()),
            nodes: Default::default(),
            access_modes: access_modes.iter().map(|mode| (*mode).to_owned()).collect(),
        }
    }
}

/// PVs and workloads swapped together: stopped and started again, or rolled pod by pod
/// ([`Unit::strategy`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unit {
    /// Scaled to zero and back, or their pods replaced one at a time.
    pub workloads: Vec<WorkloadRef>,
    pub pvs: Vec<PvMove>,
    /// Workloads whose pod template holds an inline `flexVolume`, rewritten to inline `csi`.
    pub templates: Vec<WorkloadRef>,
    /// The pods that restart (`namespace/name`).
    pub pods: Vec<String>,
    /// Bare Pods deleted and created again (`--recreate-pods`), `namespace/name`.
    #[serde(default)]
    pub bare_pods: Vec<String>,
    /// The uid of each object the unit acts on, by [`pv_key`], [`pod_key`] or the workload's
    /// `Kind namespace/name`: what every change is preconditioned on, so an object deleted and
    /// created again under the same name since the plan is refused, never touched.
    #[serde(default)]
    pub uids: BTreeMap<String, String>,
    /// How it moves, chosen by [`super::strategy::choose`].
    #[serde(default)]
    pub strategy: Strategy,
    /// Why that strategy, for the plan.
    #[serde(default)]
    pub strategy_reason: String,
    /// What downtime remains with it, for the plan.
    #[serde(default)]
    pub downtime: String,
    /// Rolling: the workloads whose own rollout of their rewritten template replaces their
    /// pods; the other workloads' pods are evicted one at a time.
    #[serde(default)]
    pub rollouts: Vec<WorkloadRef>,
}

/// How a PersistentVolume is named among a unit's uids (and in messages).
pub fn pv_key(name: &str) -> String {
    format!("PersistentVolume {name}")
}

/// How a bare Pod (`namespace/name`) is named among a unit's uids (and in messages).
pub fn pod_key(name: &str) -> String {
    format!("Pod {name}")
}

impl Unit {
    /// The unit in a line: its workloads, else its PVs.
    pub fn title(&self) -> String {
        title(
            &self.workloads,
            &self.bare_pods,
            self.pvs.iter().map(|pv| &pv.name),
        )
    }
}

/// A unit in a line, as plans, progress and summaries name it: its workloads, bare Pods and PVs.
pub(crate) fn title<'a>(
    workloads: &[WorkloadRef],
    bare_pods: &[String],
    pvs: impl Iterator<Item = &'a String>,
) -> String {
    let mut parts: Vec<String> = workloads.iter().map(ToString::to_string).collect();
    parts.extend(bare_pods.iter().map(|p| pod_key(p)));
    parts.extend(pvs.map(|pv| pv_key(pv)));
    parts.join(", ")
}

/// Something selected that is not migrated, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    pub what: String,
    pub reason: String,
}

/// Something the plan did that the operator should know of, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PlanNote {
    pub what: String,
    pub note: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub units: Vec<Unit>,
    pub refused: Vec<Refused>,
    /// About the selected units, e.g. a claim not joined to its PV's unit.
    #[serde(default)]
    pub notes: Vec<PlanNote>,
}

/// What to migrate: everything, or the units that hold any of these.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub all: bool,
    /// Bare Pods are deleted and created again rather than refused.
    pub recreate_pods: bool,
    pub pvs: BTreeSet<String>,
    pub namespaces: BTreeSet<String>,
    pub workloads: BTreeSet<WorkloadRef>,
    /// How the units move (`--strategy`).
    pub strategy: Requested,
}

/// Whether a PV's `claimRef` joins its claim (and so the claim's pods and workloads) to the
/// PV's unit: only when the claim is bound to this PV in return. A Released PV keeps the
/// `claimRef` of a claim since deleted, or bound to another PV, and that claim's workloads are
/// none of this PV's business.
fn claim_link(
    pv: &str,
    claim_ref: &ObjectReference,
    claims: &BTreeMap<(String, String), &PersistentVolumeClaim>,
) -> Result<String, (String, String)> {
    let (namespace, name) = (
        claim_ref.namespace.clone().unwrap_or_default(),
        claim_ref.name.clone().unwrap_or_default(),
    );
    let key = format!("{namespace}/{name}");
    let why = match claims.get(&(namespace, name)) {
        None => format!("its claimRef names claim {key}, which does not exist"),
        Some(claim) => {
            let bound_to = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref());
            let uid = claim.metadata.uid.as_deref();
            match (bound_to.filter(|v| !v.is_empty()), claim_ref.uid.as_deref()) {
                (None, _) => format!("its claimRef names claim {key}, which is not bound to it"),
                (Some(v), _) if v != pv => {
                    format!(
                        "its claimRef names claim {key}, which is bound to PersistentVolume {v}"
                    )
                }
                (Some(_), Some(recorded)) if uid != Some(recorded) => format!(
                    "its claimRef names claim {key} with uid {recorded}, and the claim of that \
                     name has uid {} (deleted and created again)",
                    uid.unwrap_or("(none)")
                ),
                (Some(_), _) => return Ok(key),
            }
        }
    };
    Err((key, why))
}

/// Keeps the first uid learnt for an object: its own `metadata.uid` is learnt before any
/// owner reference's.
fn learn_uid(uids: &mut BTreeMap<String, String>, key: String, uid: Option<&str>) {
    if let Some(uid) = uid.filter(|u| !u.is_empty()) {
        uids.entry(key).or_insert_with(|| uid.to_owned());
    }
}

pub(crate) fn name_of(meta: &ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The controller's kind, name and uid.
fn controller_of(meta: &ObjectMeta) -> Option<(String, String, String)> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind.clone(), o.name.clone(), o.uid.clone()))
}

fn template_spec(
    spec: Option<&PodSpec>,
) -> impl Iterator<Item = &k8s_openapi::api::core::v1::Volume> {
    spec.and_then(|s| s.volumes.as_ref()).into_iter().flatten()
}

/// Converts one object with [`super::migrate`], the refusals as text.
fn conversion_refusals(object: &impl Serialize, attaches: &BTreeMap<String, bool>) -> Vec<String> {
    let text = match serde_json::to_string(object) {
        Ok(text) => text,
        Err(e) => return vec![e.to_string()],
    };
    let mut ask = |driver: &flexvolume_host::DriverName| {
        let csi = naming::csi_name(driver).map_err(|e| e.to_string())?;
        attaches
            .get(&csi)
            .copied()
            .ok_or_else(|| format!("no CSIDriver {csi}"))
    };
    match super::migrate(&text, &mut ask) {
        Ok(_) => Vec::new(),
        Err(refusals) => refusals.iter().map(|r| r.reason.to_string()).collect(),
    }
}

/// Why a workload's template cannot be converted, when it holds an inline flexVolume.
fn inline_refusals(
    object: &impl Serialize,
    spec: Option<&PodSpec>,
    attaches: &BTreeMap<String, bool>,
) -> Vec<String> {
    if template_spec(spec).any(|v| v.flex_volume.is_some()) {
        conversion_refusals(object, attaches)
    } else {
        Vec::new()
    }
}

/// The plan for `selection`: every selected unit, or why it is refused.
pub fn plan(inventory: &Inventory, selection: &Selection) -> Plan {
    let attaches: BTreeMap<String, bool> = inventory
        .csi_drivers
        .iter()
        .filter_map(|d| {
            let name = d.metadata.name.clone()?;
            Some((name, d.spec.attach_required.unwrap_or(true)))
        })
        .collect();
    let served: BTreeMap<String, BTreeSet<String>> = inventory
        .csi_nodes
        .iter()
        .filter_map(|n| {
            let drivers = n.spec.drivers.iter().map(|d| d.name.clone()).collect();
            Some((n.metadata.name.clone()?, drivers))
        })
        .collect();
    let bound: BTreeMap<(String, String), &PersistentVolumeClaim> = inventory
        .persistent_volume_claims
        .iter()
        .map(|c| (name_of(&c.metadata), c))
        .collect();
    let mut graph = Graph::default();
    let mut moves: BTreeMap<String, PvMove> = BTreeMap::new();
    // `namespace/claim` → the FlexVolume PV bound to it.
    let mut claims: BTreeMap<String, String> = BTreeMap::new();
    let mut templates: BTreeSet<WorkloadRef> = BTreeSet::new();
    // Each object's uid by its key ([`pv_key`], [`pod_key`], `Kind namespace/name`).
    let mut uids: BTreeMap<String, String> = BTreeMap::new();
    let listed = (inventory.deployments.iter())
        .map(|d| (WorkloadKind::Deployment, &d.metadata))
        .chain((inventory.stateful_sets.iter()).map(|s| (WorkloadKind::StatefulSet, &s.metadata)))
        .chain((inventory.replica_sets.iter()).map(|r| (WorkloadKind::ReplicaSet, &r.metadata)));
    for (kind, meta) in listed {
        let (namespace, name) = name_of(meta);
        let key = WorkloadRef {
            kind,
            namespace,
            name,
        };
        learn_uid(&mut uids, key.to_string(), meta.uid.as_deref());
    }

    for pv in &inventory.persistent_volumes {
        let Some(spec) = &pv.spec else { continue };
        let Some(flex) = &spec.flex_volume else {
            continue;
        };
        let name = pv.metadata.name.clone().unwrap_or_default();
        let i = graph.add(Member::Pv(name.clone()));
        let what = pv_key(&name);
        learn_uid(&mut uids, what.clone(), pv.metadata.uid.as_deref());
        for reason in conversion_refusals(pv, &attaches) {
            graph.refuse(i, &what, reason);
        }
        let csi_driver = flexvolume_host::DriverName::parse(&flex.driver)
            .ok()
            .and_then(|d| naming::csi_name(&d).ok())
            .unwrap_or_default();
        if !csi_driver.is_empty() && !attaches.contains_key(&csi_driver) {
            graph.refuse(
                i,
                &what,
                format!(
                    "no CSIDriver {csi_driver}: flexd does not serve driver {} (apply `flexd \
                     manifests` first)",
                    flex.driver
                ),
            );
        }
        let claim_ref = spec
            .claim_ref
            .as_ref()
            .filter(|c| c.namespace.is_some() && c.name.is_some());
        let claim = match claim_ref.map(|c| claim_link(&name, c, &bound)) {
            None => None,
            Some(Ok(claim)) => {
                claims.insert(claim.clone(), name.clone());
                Some(claim)
            }
            Some(Err((claim, why))) => {
                graph.notes[i].push(PlanNote {
                    what: what.clone(),
                    note: format!(
                        "{why}: planned without claim {claim} (its pods and workloads are not \
                         stopped with it)"
                    ),
                });
                None
            }
        };
        moves.insert(
            name.clone(),
            PvMove {
                name,
                driver: flex.driver.clone(),
                attaches: attaches.get(&csi_driver).copied().unwrap_or(false),
                csi_driver,
                claim,
                reclaim_policy: spec.persistent_volume_reclaim_policy.clone(),
                nodes: BTreeSet::new(),
                access_modes: spec.access_modes.clone().unwrap_or_default(),
            },
        );
    }

    // The workloads' own templates: inline flexVolumes, and claims of FlexVolume PVs (a
    // workload scaled to zero has no pods to link it).
    let mut workload = |graph: &mut Graph,
                        kind: WorkloadKind,
                        meta: &ObjectMeta,
                        spec: Option<&PodSpec>,
                        refusals: Vec<String>| {
        let (namespace, name) = name_of(meta);
        let reference = WorkloadRef {
            kind,
            namespace: namespace.clone(),
            name,
        };
        let mut linked = Vec::new();
        let mut inline = false;
        for volume in template_spec(spec) {
            inline |= volume.flex_volume.is_some();
            if let Some(claim) = &volume.persistent_volume_claim {
                if let Some(pv) = claims.get(&format!("{namespace}/{}", claim.claim_name)) {
                    linked.push(pv.clone());
                }
            }
        }
        if !inline && linked.is_empty() {
            return;
        }
        let i = graph.add(Member::Workload(reference.clone()));
        if inline {
            templates.insert(reference.clone());
            for reason in refusals {
                graph.refuse(i, reference.to_string(), reason);
            }
        }
        for pv in linked {
            let j = graph.add(Member::Pv(pv));
            graph.join(i, j);
        }
    };
    for d in &inventory.deployments {
        let spec = d.spec.as_ref().and_then(|s| s.template.spec.as_ref());
        let refusals = inline_refusals(d, spec, &attaches);
        workload(
            &mut graph,
            WorkloadKind::Deployment,
            &d.metadata,
            spec,
            refusals,
        );
    }
    for s in &inventory.stateful_sets {
        let spec = s.spec.as_ref().and_then(|s| s.template.spec.as_ref());
        let refusals = inline_refusals(s, spec, &attaches);
        workload(
            &mut graph,
            WorkloadKind::StatefulSet,
            &s.metadata,
            spec,
            refusals,
        );
    }
    // A ReplicaSet of a Deployment is scaled through its Deployment.
    let mut replica_set_owner: BTreeMap<(String, String), WorkloadRef> = BTreeMap::new();
    for rs in &inventory.replica_sets {
        let (namespace, name) = name_of(&rs.metadata);
        let owner = match controller_of(&rs.metadata) {
            Some((kind, owner, uid)) if kind == "Deployment" => {
                let owner = WorkloadRef {
                    kind: WorkloadKind::Deployment,
                    namespace: namespace.clone(),
                    name: owner,
                };
                learn_uid(&mut uids, owner.to_string(), Some(&uid));
                owner
            }
            Some(_) => continue,
            None => {
                let spec = rs
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.as_ref()?.spec.as_ref());
                // flexd migrate converts no ReplicaSet template (a Deployment's is the one to
                // convert), so an inline flexVolume in one of its own is refused.
                let refusals = if template_spec(spec).any(|v| v.flex_volume.is_some()) {
                    vec![
                        "holds an inline flexVolume in a ReplicaSet of its own; make it a \
                          Deployment or convert it by hand"
                            .to_owned(),
                    ]
                } else {
                    Vec::new()
                };
                let reference = WorkloadRef {
                    kind: WorkloadKind::ReplicaSet,
                    namespace: namespace.clone(),
                    name: name.clone(),
                };
                workload(
                    &mut graph,
                    WorkloadKind::ReplicaSet,
                    &rs.metadata,
                    spec,
                    refusals,
                );
                reference
            }
        };
        replica_set_owner.insert((namespace, name), owner);
    }

    for pod in &inventory.pods {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let (namespace, name) = name_of(&pod.metadata);
        let spec = pod.spec.as_ref();
        let node = spec.and_then(|s| s.node_name.clone());
        let mut pvs = Vec::new();
        let mut inline_drivers = Vec::new();
        for volume in template_spec(spec) {
            if let Some(flex) = &volume.flex_volume {
                inline_drivers.push(flex.driver.clone());
            }
            if let Some(claim) = &volume.persistent_volume_claim {
                if let Some(pv) = claims.get(&format!("{namespace}/{}", claim.claim_name)) {
                    pvs.push(pv.clone());
                }
            }
        }
        if pvs.is_empty() && inline_drivers.is_empty() {
            continue;
        }
        let what = format!("Pod {namespace}/{name}");
        // Whose pod it is: the workload flexd scales, or a refusal.
        let owner = match controller_of(&pod.metadata) {
            Some((kind, owner, _)) if kind == "ReplicaSet" => replica_set_owner
                .get(&(namespace.clone(), owner.clone()))
                .cloned()
                .map(Member::Workload)
                .ok_or(format!(
                    "its ReplicaSet {owner} is owned by something flexd does not scale"
                )),
            Some((kind, owner, uid)) if kind == "StatefulSet" => {
                let owner = WorkloadRef {
                    kind: WorkloadKind::StatefulSet,
                    namespace: namespace.clone(),
                    name: owner,
                };
                learn_uid(&mut uids, owner.to_string(), Some(&uid));
                Ok(Member::Workload(owner))
            }
            Some((kind, owner, _)) => Err(format!(
                "belongs to {kind} {owner}, which flexd cannot stop and start again (only \
                 Deployments, StatefulSets and ReplicaSets); stop it yourself first"
            )),
            None if selection.recreate_pods => {
                let bare = format!("{namespace}/{name}");
                learn_uid(&mut uids, pod_key(&bare), pod.metadata.uid.as_deref());
                Ok(Member::Pod(bare))
            }
            None => Err(
                "is a bare Pod: nothing would start it again; --recreate-pods deletes \
                         it and creates it again after the swap (inline volumes converted)"
                    .to_owned(),
            ),
        };
        let mut members: Vec<usize> = pvs
            .iter()
            .map(|pv| graph.add(Member::Pv(pv.clone())))
            .collect();
        match owner {
            Ok(owner) => {
                let bare = matches!(owner, Member::Pod(_));
                let i = graph.add(owner);
                if bare && !inline_drivers.is_empty() {
                    for reason in conversion_refusals(pod, &attaches) {
                        graph.refuse(i, &what, reason);
                    }
                }
                members.push(i);
            }
            Err(reason) => {
                // Refused with its unit; a pod with inline volumes only is a unit of its own.
                let i = match members.first() {
                    Some(&first) => first,
                    None => graph.add(Member::Pod(format!("{namespace}/{name}"))),
                };
                graph.refuse(i, &what, reason);
                members.push(i);
            }
        }
        for pair in members.windows(2) {
            graph.join(pair[0], pair[1]);
        }
        if let Some(&first) = members.first() {
            graph.pods[first].insert(format!("{namespace}/{name}"));
        }
        // flexd must serve the drivers where the pods run.
        let mut drivers: Vec<(String, String)> = pvs
            .iter()
            .filter_map(|pv| moves.get(pv))
            .map(|m| (m.driver.clone(), m.csi_driver.clone()))
            .collect();
        drivers.extend(inline_drivers.iter().filter_map(|d| {
            let name = flexvolume_host::DriverName::parse(d).ok()?;
            Some((d.clone(), naming::csi_name(&name).ok()?))
        }));
        if let Some(node) = &node {
            for pv in &pvs {
                if let Some(m) = moves.get_mut(pv) {
                    m.nodes.insert(node.clone());
                }
            }
            for (driver, csi) in drivers {
                let listed = served.get(node).is_some_and(|d| d.contains(&csi));
                if !listed && !csi.is_empty() {
                    graph.refuse(
                        members[0],
                        &what,
                        format!(
                            "runs on node {node}, where flexd does not serve driver {driver} \
                             (CSINode {node} does not list {csi}): its pods could not mount \
                             the migrated volume there"
                        ),
                    );
                }
            }
        }
    }

    // The connected parts, selected or not.
    let mut parts: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..graph.members.len() {
        let root = graph.root(i);
        parts.entry(root).or_default().push(i);
    }
    let mut result = Plan::default();
    for members in parts.into_values() {
        let mut unit = Unit::default();
        let mut refused = Vec::new();
        let mut notes = Vec::new();
        let mut missing = Vec::new();
        for &i in &members {
            refused.extend(graph.refusals[i].iter().cloned());
            notes.extend(graph.notes[i].iter().cloned());
            unit.pods.extend(graph.pods[i].iter().cloned());
            let key = match &graph.members[i] {
                Member::Pv(name) => {
                    if let Some(m) = moves.get(name) {
                        unit.pvs.push(m.clone());
                    }
                    pv_key(name)
                }
                Member::Pod(p) => {
                    unit.bare_pods.push(p.clone());
                    pod_key(p)
                }
                Member::Workload(w) => {
                    if templates.contains(w) {
                        unit.templates.push(w.clone());
                    }
                    unit.workloads.push(w.clone());
                    w.to_string()
                }
            };
            match uids.get(&key) {
                Some(uid) => {
                    unit.uids.insert(key, uid.clone());
                }
                None => missing.push(key),
            }
        }
        if !selected(&unit, selection) {
            continue;
        }
        // Only a unit otherwise migrated needs them (the API server gives every object one).
        if refused.is_empty() {
            refused.extend(missing.into_iter().map(|what| {
                Refused {
                    what,
                    reason: "has no uid: flexd could not tell it from an object created later \
                         under the same name"
                        .to_owned(),
                }
            }));
        }
        result.notes.extend(notes);
        unit.workloads.sort();
        unit.templates.sort();
        unit.pvs.sort_by(|a, b| a.name.cmp(&b.name));
        unit.pods.sort();
        unit.bare_pods.sort();
        if refused.is_empty() {
            result.units.push(unit);
        } else {
            result.refused.extend(refused);
        }
    }
    result.units.sort_by_key(Unit::title);
    result
        .refused
        .sort_by(|a, b| (&a.what, &a.reason).cmp(&(&b.what, &b.reason)));
    result.refused.dedup();
    result.notes.sort();
    result.notes.dedup();
    super::strategy::assign(&mut result, inventory, selection.strategy);
    result
}

fn selected(unit: &Unit, selection: &Selection) -> bool {
    selection.all
        || unit.pvs.iter().any(|pv| {
            selection.pvs.contains(&pv.name)
                || pv
                    .claim
                    .as_deref()
                    .and_then(|c| c.split_once('/'))
                    .is_some_and(|(ns, _)| selection.namespaces.contains(ns))
        })
        || unit
            .workloads
            .iter()
            .any(|w| selection.workloads.contains(w) || selection.namespaces.contains(&w.namespace))
        || unit.pods.iter().any(|p| {
            p.split_once('/')
                .is_some_and(|(ns, _)| selection.namespaces.contains(ns))
        })
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
