//! Replacing a rolling unit's pods one at a time (docs/migration.md#strategies): a pod is
//! evicted through the Eviction API (policy/v1), preconditioned on its journaled uid, so a
//! PodDisruptionBudget decides when it may go (429 until it allows: asked again until the
//! deadline), and its controller's replacement is waited for before the next; a workload whose
//! template was rewritten is replaced by its own rollout, waited for. What each wait does next
//! is decided by [`flexd::migrate::rolling::pod_next`] from the pods observed.

use std::time::Instant;

use anyhow::{anyhow, bail, Context as _};
use flexd::migrate::guard;
use flexd::migrate::journal::UnitRecord;
use flexd::migrate::plan::{WorkloadKind, WorkloadRef};
use flexd::migrate::rolling::{self, PodNext, PodRef, PodSeen, RolloutSeen};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{json, Value};

use super::apply::{status_code, Migrator};
use super::objects::recorded;
use super::waits::POLL;

/// What the API server answered an eviction.
enum Eviction {
    /// Evicted, or nothing of that uid left to evict.
    Done,
    /// Not now (429): a PodDisruptionBudget allows no disruption; its message.
    NotNow(String),
}

impl Migrator {
    /// Replacement `i` of the unit's list: a pod evicted and its replacement Ready, or a
    /// workload's rollout complete.
    pub(super) async fn replace(&self, record: &UnitRecord, i: usize) -> anyhow::Result<()> {
        let r = record
            .replacing
            .get(i)
            .ok_or_else(|| anyhow!("the journal lost replacement {i}"))?;
        match &r.pod {
            Some(pod) => self.replace_pod(record, &r.workload, pod).await,
            None => self.wait_rollout(record, &r.workload).await,
        }
    }

    /// The pods of workload `w` now (by its journaled uid), whatever their state.
    pub(super) async fn workload_pods(
        &self,
        record: &UnitRecord,
        w: &WorkloadRef,
    ) -> anyhow::Result<Vec<PodSeen>> {
        Ok(self.observe(record, w).await?.0)
    }

    /// `w`'s pods, every pod of its namespace, and its replicas now.
    async fn observe(
        &self,
        record: &UnitRecord,
        w: &WorkloadRef,
    ) -> anyhow::Result<(Vec<PodSeen>, Vec<Pod>, i32)> {
        let key = w.to_string();
        let uid = recorded(record, &key)?;
        let object = self.workload(w).await?;
        guard::same(
            &key,
            Some(uid),
            object.as_ref().and_then(|o| o["metadata"]["uid"].as_str()),
        )?;
        let desired = object
            .as_ref()
            .and_then(|o| o.pointer("/spec/replicas"))
            .and_then(Value::as_i64)
            .map_or(1, |r| i32::try_from(r).unwrap_or(i32::MAX));
        let lp = ListParams::default();
        let pods = Api::<Pod>::namespaced(self.client.clone(), &w.namespace)
            .list(&lp)
            .await
            .with_context(|| format!("listing the pods of namespace {}", w.namespace))?
            .items;
        let replica_sets = if w.kind == WorkloadKind::Deployment {
            Api::<ReplicaSet>::namespaced(self.client.clone(), &w.namespace)
                .list(&lp)
                .await
                .with_context(|| format!("listing the ReplicaSets of namespace {}", w.namespace))?
                .items
        } else {
            Vec::new()
        };
        let seen = rolling::pods_of(w, uid, &pods, &replica_sets);
        Ok((seen, pods, desired))
    }

    /// Evicts `pod` once the rest of `w` is up, then waits until it is gone and `w` has its
    /// pods Ready again; within `--wait-timeout`, else stops naming what it waited for.
    async fn replace_pod(
        &self,
        record: &UnitRecord,
        w: &WorkloadRef,
        pod: &PodRef,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + self.wait_timeout;
        let mut not_now: Option<String> = None;
        let mut last_seen: Option<PodNext> = None;
        loop {
            let last_error = match self.observe(record, w).await {
                Err(e) => Some(e),
                Ok((seen, pods, desired)) => {
                    // By uid: a StatefulSet's replacement has the same name.
                    let target = pods
                        .iter()
                        .map(PodSeen::of)
                        .find(|p| p.uid == pod.uid && p.name == pod.name);
                    let next = rolling::pod_next(target.as_ref(), &seen, desired);
                    last_seen = Some(next.clone());
                    match next {
                        PodNext::Replaced => return Ok(()),
                        PodNext::Evict => {
                            let remaining = deadline.saturating_duration_since(Instant::now());
                            // Bounded: the client itself retries a 429 for a while.
                            match tokio::time::timeout(remaining, self.evict(pod)).await {
                                Ok(Ok(Eviction::Done)) => {
                                    not_now = None;
                                    continue;
                                }
                                Ok(Ok(Eviction::NotNow(why))) => not_now = Some(why),
                                Ok(Err(e)) => return Err(e),
                                Err(_) => {}
                            }
                        }
                        _ => {}
                    }
                    None
                }
            };
            if Instant::now() >= deadline {
                let mut what = match &last_seen {
                    Some(next) => next.waiting_for(&pod.name, w),
                    None => format!("Pod {} to be replaced", pod.name),
                };
                if let Some(why) = not_now {
                    what = format!("{what}; the last answer: {why}");
                }
                if let Some(e) = last_error {
                    what = format!("{what} (last error: {e:#})");
                }
                bail!(
                    "waited {} for {what}",
                    humantime::format_duration(self.wait_timeout)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// One eviction of `pod`, preconditioned on its journaled uid.
    async fn evict(&self, pod: &PodRef) -> anyhow::Result<Eviction> {
        let (api, name) = self.pod_api(&pod.name)?;
        let namespace = pod.name.split_once('/').map(|(ns, _)| ns).unwrap_or("");
        let body = json!({
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": pod.uid}},
        });
        let answer = api
            .create_subresource::<_, Value>("eviction", &name, &PostParams::default(), &body)
            .await;
        match answer {
            Ok(_) => Ok(Eviction::Done),
            Err(e) => match (status_code(&e), &e) {
                (Some(429), kube::Error::Api(status)) => Ok(Eviction::NotNow(format!(
                    "429 Too Many Requests: {}",
                    status.message
                ))),
                // Gone, or its name is another pod's now (the uid precondition failed): the
                // next look decides.
                (Some(404 | 409), _) => Ok(Eviction::Done),
                _ => Err(anyhow!(e).context(format!("evicting Pod {}", pod.name))),
            },
        }
    }

    /// Until `w`'s own rollout of its rewritten template is complete.
    async fn wait_rollout(&self, record: &UnitRecord, w: &WorkloadRef) -> anyhow::Result<()> {
        let key = w.to_string();
        let uid = recorded(record, &key)?;
        let what = format!("{w}'s rollout of its new pod template");
        self.wait_seen(&what, || async {
            let object = self.workload(w).await?;
            let found = object.as_ref().and_then(|o| o["metadata"]["uid"].as_str());
            guard::same(&key, Some(uid), found)?;
            Ok(RolloutSeen::of(&object.unwrap_or_default()).progress())
        })
        .await
    }
}
