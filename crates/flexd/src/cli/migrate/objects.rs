//! Reading the cluster's objects for `flexd migrate`: the inventory a plan is made from, and
//! each object a step acts on, checked against the uid the journal recorded for it
//! ([`flexd::migrate::guard`]); scaling, preconditioned on that uid.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{anyhow, bail, Context as _};
use flexd::migrate::guard::{self, Observed};
use flexd::migrate::journal::UnitRecord;
use flexd::migrate::plan::{pod_key, pv_key, Inventory, WorkloadKind, WorkloadRef};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{json, Value};

use super::apply::{status_code, Migrator};

/// How many claims are read at once for the plan (one `get` each: the migrator may not list
/// claims).
const CLAIM_READS: usize = 16;

/// The uid the journal recorded for `key`, or why there is none.
pub(super) fn recorded<'a>(record: &'a UnitRecord, key: &str) -> anyhow::Result<&'a str> {
    record.uids.get(key).map(String::as_str).ok_or_else(|| {
        guard::Changed::NotRecorded {
            object: key.to_owned(),
        }
        .into()
    })
}

impl Migrator {
    pub(super) async fn inventory(&self) -> anyhow::Result<Inventory> {
        let lp = ListParams::default();
        let c = &self.client;
        let (pv_api, pod_api, rs_api, deployment_api, sts_api, driver_api, node_api) = (
            Api::<PersistentVolume>::all(c.clone()),
            Api::<Pod>::all(c.clone()),
            Api::<ReplicaSet>::all(c.clone()),
            Api::<Deployment>::all(c.clone()),
            Api::<StatefulSet>::all(c.clone()),
            Api::<CSIDriver>::all(c.clone()),
            Api::<CSINode>::all(c.clone()),
        );
        let (pvs, pods, rs, deployments, sts, drivers, nodes) = tokio::try_join!(
            pv_api.list(&lp),
            pod_api.list(&lp),
            rs_api.list(&lp),
            deployment_api.list(&lp),
            sts_api.list(&lp),
            driver_api.list(&lp),
            node_api.list(&lp),
        )
        .context(
            "listing the cluster's PersistentVolumes, pods, workloads, CSIDrivers and CSINodes",
        )?;
        let claims = self.claims_of(&pvs.items).await?;
        Ok(Inventory {
            persistent_volumes: pvs.items,
            persistent_volume_claims: claims,
            pods: pods.items,
            replica_sets: rs.items,
            deployments: deployments.items,
            stateful_sets: sts.items,
            csi_drivers: drivers.items,
            csi_nodes: nodes.items,
        })
    }

    /// The claims the FlexVolume PVs' `claimRef`s name, those that exist: whether each is
    /// bound to its PV in return decides whether it joins the PV's unit.
    async fn claims_of(
        &self,
        pvs: &[PersistentVolume],
    ) -> anyhow::Result<Vec<PersistentVolumeClaim>> {
        let named: BTreeSet<(String, String)> = pvs
            .iter()
            .filter_map(|pv| pv.spec.as_ref())
            .filter(|spec| spec.flex_volume.is_some())
            .filter_map(|spec| spec.claim_ref.as_ref())
            .filter_map(|r| Some((r.namespace.clone()?, r.name.clone()?)))
            .collect();
        let named: Vec<_> = named.into_iter().collect();
        let mut claims = Vec::new();
        for batch in named.chunks(CLAIM_READS) {
            let mut reads = tokio::task::JoinSet::new();
            for (ns, name) in batch {
                let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns);
                let (ns, name) = (ns.clone(), name.clone());
                reads.spawn(async move {
                    (api.get_opt(&name).await).with_context(|| format!("reading claim {ns}/{name}"))
                });
            }
            while let Some(read) = reads.join_next().await {
                claims.extend(read.context("reading a claim")??);
            }
        }
        Ok(claims)
    }

    pub(super) fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    pub(super) fn api<K>(&self, w: &WorkloadRef) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &w.namespace)
    }

    pub(super) fn pod_api(&self, name: &str) -> anyhow::Result<(Api<Pod>, String)> {
        let (ns, pod) = name
            .split_once('/')
            .ok_or_else(|| anyhow!("{name:?} is not namespace/name"))?;
        Ok((Api::namespaced(self.client.clone(), ns), pod.to_owned()))
    }

    /// PersistentVolume `name` as it is now, if there.
    pub(super) async fn observed_pv(&self, name: &str) -> anyhow::Result<Option<Observed>> {
        let pv = (self.pvs().get_opt(name).await)
            .with_context(|| format!("reading PersistentVolume {name}"))?;
        pv.map(|pv| Ok(Observed::of(&serde_json::to_value(pv)?, "/spec")))
            .transpose()
    }

    /// A workload as the API server returns it (JSON), if there.
    pub(super) async fn workload(&self, w: &WorkloadRef) -> anyhow::Result<Option<Value>> {
        let object = match w.kind {
            WorkloadKind::Deployment => (self.api::<Deployment>(w).get_opt(&w.name).await)
                .map(|o| o.map(serde_json::to_value)),
            WorkloadKind::StatefulSet => (self.api::<StatefulSet>(w).get_opt(&w.name).await)
                .map(|o| o.map(serde_json::to_value)),
            WorkloadKind::ReplicaSet => (self.api::<ReplicaSet>(w).get_opt(&w.name).await)
                .map(|o| o.map(serde_json::to_value)),
        }
        .with_context(|| format!("reading {w}"))?;
        Ok(object.transpose()?)
    }

    /// A workload as it is now, its pod template the part flexd writes.
    pub(super) async fn observed_workload(
        &self,
        w: &WorkloadRef,
    ) -> anyhow::Result<Option<Observed>> {
        Ok(self
            .workload(w)
            .await?
            .map(|o| Observed::of(&o, "/spec/template")))
    }

    /// A bare Pod (`namespace/name`) as it is now, if there.
    pub(super) async fn observed_pod(&self, name: &str) -> anyhow::Result<Option<Observed>> {
        let (api, pod) = self.pod_api(name)?;
        let found = (api.get_opt(&pod).await).with_context(|| format!("reading Pod {name}"))?;
        found
            .map(|p| Ok(Observed::of(&serde_json::to_value(p)?, "")))
            .transpose()
    }

    /// The FlexVolume PV the journal recorded, as it is before the swap: what the swap
    /// converts and a rollback creates again.
    pub(super) async fn flex_pv(&self, record: &UnitRecord, name: &str) -> anyhow::Result<Value> {
        let key = pv_key(name);
        let pv = (self.pvs().get_opt(name).await)
            .with_context(|| format!("reading PersistentVolume {name}"))?;
        guard::same(
            &key,
            Some(recorded(record, &key)?),
            pv.as_ref().and_then(|p| p.metadata.uid.as_deref()),
        )?;
        let pv = pv.ok_or_else(|| anyhow!("PersistentVolume {name} is gone"))?;
        if pv
            .spec
            .as_ref()
            .and_then(|s| s.flex_volume.as_ref())
            .is_none()
        {
            bail!("PersistentVolume {name} has no flexVolume any more: changed by someone else; the journal has no FlexVolume object for it");
        }
        Ok(serde_json::to_value(&pv)?)
    }

    /// A workload's pod template, the workload checked against the journal's uid.
    pub(super) async fn template(
        &self,
        record: &UnitRecord,
        w: &WorkloadRef,
    ) -> anyhow::Result<Value> {
        let key = w.to_string();
        let object = self.workload(w).await?;
        guard::same(
            &key,
            Some(recorded(record, &key)?),
            object.as_ref().and_then(|o| o["metadata"]["uid"].as_str()),
        )?;
        Ok(object
            .map(|o| o["spec"]["template"].clone())
            .unwrap_or_default())
    }

    /// The unit's bare Pods as they are now, what is created again.
    pub(super) async fn bare_pods(
        &self,
        record: &UnitRecord,
    ) -> anyhow::Result<BTreeMap<String, Value>> {
        let mut pods = BTreeMap::new();
        for name in &record.bare_pods {
            let (api, pod) = self.pod_api(name)?;
            // One gone already (deleted by someone else) has nothing to be created from.
            if let Some(object) = api
                .get_opt(&pod)
                .await
                .with_context(|| format!("reading Pod {name}"))?
            {
                let key = pod_key(name);
                let uid = object.metadata.uid.as_deref();
                guard::same(&key, Some(recorded(record, &key)?), uid)?;
                pods.insert(name.clone(), serde_json::to_value(&object)?);
            }
        }
        Ok(pods)
    }

    pub(super) async fn replicas(
        &self,
        record: &UnitRecord,
        w: &WorkloadRef,
    ) -> anyhow::Result<i32> {
        let scale = match w.kind {
            WorkloadKind::Deployment => self.api::<Deployment>(w).get_scale(&w.name).await,
            WorkloadKind::StatefulSet => self.api::<StatefulSet>(w).get_scale(&w.name).await,
            WorkloadKind::ReplicaSet => self.api::<ReplicaSet>(w).get_scale(&w.name).await,
        }
        .with_context(|| format!("reading {w}'s replicas"))?;
        let key = w.to_string();
        let uid = scale.metadata.uid.as_deref();
        guard::same(&key, Some(recorded(record, &key)?), uid)?;
        Ok(scale.spec.and_then(|s| s.replicas).unwrap_or(0))
    }

    /// Scales `w`, preconditioned on its recorded uid (the `scale` subresource checks a uid
    /// given in the patch): a workload of the same name created since is not scaled.
    pub(super) async fn scale(
        &self,
        record: &UnitRecord,
        w: &WorkloadRef,
        replicas: i32,
    ) -> anyhow::Result<()> {
        let key = w.to_string();
        let uid = recorded(record, &key)?;
        let patch = Patch::Merge(json!({"metadata": {"uid": uid}, "spec": {"replicas": replicas}}));
        let pp = PatchParams::default();
        let scaled = match w.kind {
            WorkloadKind::Deployment => {
                (self.api::<Deployment>(w).patch_scale(&w.name, &pp, &patch)).await
            }
            WorkloadKind::StatefulSet => {
                (self.api::<StatefulSet>(w).patch_scale(&w.name, &pp, &patch)).await
            }
            WorkloadKind::ReplicaSet => {
                (self.api::<ReplicaSet>(w).patch_scale(&w.name, &pp, &patch)).await
            }
        };
        match scaled {
            Ok(_) => Ok(()),
            // Refused: say whether it is another object or none.
            Err(e) if matches!(status_code(&e), Some(404 | 409)) => {
                let found = self.workload(w).await?;
                let found = found.as_ref().and_then(|o| o["metadata"]["uid"].as_str());
                guard::same(&key, Some(uid), found)?;
                Err(anyhow!(e).context(format!("scaling {w} to {replicas}")))
            }
            Err(e) => Err(anyhow!(e).context(format!("scaling {w} to {replicas}"))),
        }
    }
}
