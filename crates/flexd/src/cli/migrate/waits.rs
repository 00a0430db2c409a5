//! The waits of `flexd migrate --apply` and `--rollback`: until the unit's pods are gone, its
//! volumes detached, its claims bound again and its workloads Ready, each bounded by
//! `--wait-timeout` (the journal keeps where a run that timed out stopped).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::bail;
use flexd::migrate::journal::{self, UnitRecord};
use flexd::migrate::plan::{WorkloadKind, WorkloadRef};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams};

use super::apply::Migrator;

/// How often a wait looks again.
pub(super) const POLL: Duration = Duration::from_secs(1);

/// How long a FlexVolume volume must stay out of its node's status before its detach is taken
/// as done (see `wait_flex_detached`): the driver's `detach` runs right after the status drops,
/// and a failed one puts the volume back.
const DETACH_SETTLE: Duration = Duration::from_secs(10);

impl Migrator {
    pub(super) async fn wait_pod_ready(&self, name: &str) -> anyhow::Result<()> {
        let (api, pod) = self.pod_api(name)?;
        self.wait(
            &format!("Pod {name} to be Ready (or Succeeded)"),
            || async {
                let Some(pod) = api.get_opt(&pod).await? else {
                    return Ok(false);
                };
                let status = pod.status.unwrap_or_default();
                let ready = status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                Ok(ready || status.phase.as_deref() == Some("Succeeded"))
            },
        )
        .await
    }

    pub(super) async fn wait<F, Fut>(&self, what: &str, mut done: F) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<bool>>,
    {
        self.wait_seen(what, || {
            let done = done();
            async move { Ok((!done.await?).then(String::new)) }
        })
        .await
    }

    /// Until `progress` says done (`None`); else where it is (`Some`), which the message of a
    /// wait that times out ends with.
    pub(super) async fn wait_seen<F, Fut>(&self, what: &str, mut progress: F) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<Option<String>>>,
    {
        let deadline = Instant::now() + self.wait_timeout;
        let mut seen = String::new();
        loop {
            let last_error = match progress().await {
                Ok(None) => return Ok(()),
                Ok(Some(now)) => {
                    seen = now;
                    None
                }
                Err(e) => Some(e),
            };
            if Instant::now() >= deadline {
                let seen = if seen.is_empty() {
                    String::new()
                } else {
                    format!(" (last seen: {seen})")
                };
                let why = last_error
                    .map(|e| format!(" (last error: {e:#})"))
                    .unwrap_or_default();
                bail!(
                    "waited {} for {what}{seen}{why}",
                    humantime::format_duration(self.wait_timeout)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The unit's pods: those using its claims, or of its workloads.
    async fn unit_pods(&self, record: &UnitRecord) -> anyhow::Result<Vec<String>> {
        let claims: BTreeSet<&str> = record
            .moves
            .iter()
            .filter_map(|m| m.claim.as_deref())
            .collect();
        let workloads: BTreeSet<&WorkloadRef> = record.workloads.iter().collect();
        let mut namespaces: BTreeSet<&str> = record
            .workloads
            .iter()
            .map(|w| w.namespace.as_str())
            .collect();
        namespaces.extend(
            claims
                .iter()
                .filter_map(|c| c.split_once('/').map(|(ns, _)| ns)),
        );
        namespaces.extend(
            record
                .bare_pods
                .iter()
                .filter_map(|p| p.split_once('/').map(|(ns, _)| ns)),
        );
        let mut found = Vec::new();
        for ns in namespaces {
            let pods = Api::<Pod>::namespaced(self.client.clone(), ns)
                .list(&ListParams::default())
                .await?;
            let replica_sets = Api::<ReplicaSet>::namespaced(self.client.clone(), ns)
                .list(&ListParams::default())
                .await?;
            for pod in pods.items {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let uses_claim = pod
                    .spec
                    .iter()
                    .flat_map(|s| s.volumes.iter().flatten())
                    .any(|v| {
                        v.persistent_volume_claim.as_ref().is_some_and(|c| {
                            claims.contains(format!("{ns}/{}", c.claim_name).as_str())
                        })
                    });
                let owner = pod
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|o| o.controller == Some(true));
                let of_workload = owner.is_some_and(|o| {
                    let (kind, name) = match o.kind.as_str() {
                        "ReplicaSet" => replica_sets
                            .items
                            .iter()
                            .find(|rs| rs.metadata.name.as_deref() == Some(o.name.as_str()))
                            .and_then(|rs| {
                                rs.metadata
                                    .owner_references
                                    .iter()
                                    .flatten()
                                    .find(|r| r.controller == Some(true))
                            })
                            .map(|d| (WorkloadKind::Deployment, d.name.clone()))
                            .unwrap_or((WorkloadKind::ReplicaSet, o.name.clone())),
                        "StatefulSet" => (WorkloadKind::StatefulSet, o.name.clone()),
                        _ => return false,
                    };
                    workloads.contains(&WorkloadRef {
                        kind,
                        namespace: ns.to_owned(),
                        name,
                    })
                });
                let bare = record.bare_pods.contains(&format!("{ns}/{name}"));
                if uses_claim || of_workload || bare {
                    found.push(format!("{ns}/{name}"));
                }
            }
        }
        Ok(found)
    }

    /// Until no pod of the unit is left: kubelet removes a pod only once its volumes are
    /// unmounted.
    pub(super) async fn wait_stopped(&self, record: &UnitRecord) -> anyhow::Result<()> {
        let what = format!("the pods of {} to stop (still there: pods that do not stop, or that something else starts)", record.title());
        self.wait(&what, || async {
            Ok(self.unit_pods(record).await?.is_empty())
        })
        .await
    }

    /// The FlexVolume volumes the unit's attaching drivers have attached, per node it used:
    /// kube-controller-manager names them `vendor/driver/<getvolumename's answer>`.
    pub(super) async fn attached_now(
        &self,
        record: &UnitRecord,
    ) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
        let prefixes: BTreeSet<String> = record
            .moves
            .iter()
            .filter(|m| m.attaches)
            .map(|m| format!("{}/", m.driver))
            .collect();
        let mut attached = BTreeMap::new();
        for node in record.attached_counts().into_keys() {
            let Some(node_object) = Api::<Node>::all(self.client.clone()).get_opt(&node).await?
            else {
                continue;
            };
            let names = node_object
                .status
                .and_then(|s| s.volumes_attached)
                .into_iter()
                .flatten()
                .map(|v| v.name)
                .filter(|name| prefixes.iter().any(|p| name.starts_with(p.as_str())))
                .collect();
            attached.insert(node, names);
        }
        Ok(attached)
    }

    /// Until kube-controller-manager has detached the unit's FlexVolume volumes: on each node,
    /// as many of the volumes attached before the scale-down are gone as the unit had there,
    /// and they stay gone for [`DETACH_SETTLE`]. kube-controller-manager drops a volume from the
    /// node's status just *before* it runs the driver's `detach`, and puts it back if that
    /// fails; a CSI attach that overtook the detach could have its claim released under it.
    pub(super) async fn wait_flex_detached(&self, record: &UnitRecord) -> anyhow::Result<()> {
        let counts = record.attached_counts();
        if counts.is_empty() {
            return Ok(());
        }
        let what = format!(
            "kube-controller-manager to detach the volumes of {} (gone from the nodes' status \
             for {} s)",
            record.title(),
            DETACH_SETTLE.as_secs()
        );
        let gone_since = std::cell::Cell::new(None::<Instant>);
        self.wait(&what, || async {
            let now = self.attached_now(record).await?;
            let gone = counts.iter().all(|(node, &count)| {
                let before = record
                    .attached_before
                    .get(node)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                let gone =
                    journal::detached(before, now.get(node).map(Vec::as_slice).unwrap_or_default());
                gone >= count.min(before.len())
            });
            if !gone {
                gone_since.set(None);
                return Ok(false);
            }
            let since = gone_since.get().unwrap_or_else(Instant::now);
            gone_since.set(Some(since));
            Ok(since.elapsed() >= DETACH_SETTLE)
        })
        .await
    }

    /// Until no VolumeAttachment names the unit's PVs (CSI, before a rollback's swap).
    pub(super) async fn wait_csi_detached(&self, record: &UnitRecord) -> anyhow::Result<()> {
        let pvs: BTreeSet<&str> = record.pvs.iter().map(String::as_str).collect();
        let what = format!(
            "the CSI volumes of {} to be detached (VolumeAttachments gone)",
            record.title()
        );
        self.wait(&what, || async {
            let attachments = Api::<VolumeAttachment>::all(self.client.clone())
                .list(&ListParams::default())
                .await?;
            Ok(!attachments.items.iter().any(|a| {
                a.spec
                    .source
                    .persistent_volume_name
                    .as_deref()
                    .is_some_and(|pv| pvs.contains(pv))
            }))
        })
        .await
    }

    pub(super) async fn wait_claims_bound(&self, record: &UnitRecord) -> anyhow::Result<()> {
        for claim in record.moves.iter().filter_map(|m| m.claim.as_deref()) {
            let Some((ns, name)) = claim.split_once('/') else {
                continue;
            };
            let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns);
            self.wait(&format!("claim {claim} to be Bound again"), || async {
                Ok(match api.get_opt(name).await? {
                    // A claim deleted meanwhile binds nothing; its PV is there, Retain.
                    None => true,
                    Some(pvc) => pvc.status.and_then(|s| s.phase).as_deref() == Some("Bound"),
                })
            })
            .await?;
        }
        Ok(())
    }

    pub(super) async fn wait_ready(&self, w: &WorkloadRef, replicas: i32) -> anyhow::Result<()> {
        self.wait(&format!("{w} to have {replicas} Ready pods"), || async {
            let (generation, observed, ready, updated, total) = match w.kind {
                WorkloadKind::Deployment => {
                    let d = self.api::<Deployment>(w).get(&w.name).await?;
                    let s = d.status.unwrap_or_default();
                    (
                        d.metadata.generation,
                        s.observed_generation,
                        s.ready_replicas,
                        s.updated_replicas,
                        s.replicas,
                    )
                }
                WorkloadKind::StatefulSet => {
                    let d = self.api::<StatefulSet>(w).get(&w.name).await?;
                    let s = d.status.unwrap_or_default();
                    (
                        d.metadata.generation,
                        s.observed_generation,
                        s.ready_replicas,
                        s.updated_replicas,
                        Some(s.replicas),
                    )
                }
                WorkloadKind::ReplicaSet => {
                    let d = self.api::<ReplicaSet>(w).get(&w.name).await?;
                    let s = d.status.unwrap_or_default();
                    (
                        d.metadata.generation,
                        s.observed_generation,
                        s.ready_replicas,
                        Some(s.replicas),
                        Some(s.replicas),
                    )
                }
            };
            Ok(observed >= generation
                && ready.unwrap_or(0) == replicas
                && updated.unwrap_or(0) == replicas
                && total.unwrap_or(0) == replicas)
        })
        .await
    }
}
