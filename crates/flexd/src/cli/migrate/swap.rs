//! Changing the objects the journal names: each change decided by [`flexd::migrate::guard`]
//! from the uid the journal recorded and the object read just before, then sent with that uid
//! and the resourceVersion read as its precondition. A conflict (the object changed in
//! between) reads and decides again; an object that is not the recorded one is refused.

use anyhow::{anyhow, bail, Context as _};
use flexd::migrate::guard::{self, Delete, Observed, Swap};
use flexd::migrate::journal::{Journal, UnitRecord};
use flexd::migrate::plan::{pod_key, pv_key, WorkloadKind, WorkloadRef};
use flexd::migrate::twin;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{json, Value};

use super::apply::{status_code, Migrator};
use super::objects::recorded;

/// How often a change is tried again after a conflict (the object changed between the read
/// and the write, e.g. its status) before the run stops.
const CONFLICT_RETRIES: usize = 5;

fn conflict(e: &kube::Error) -> bool {
    status_code(e) == Some(409)
}

/// Delete options preconditioned on the object's uid and the resourceVersion read.
fn preconditioned(uid: &str, resource_version: Option<String>) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version,
        }),
        ..DeleteParams::default()
    }
}

impl Migrator {
    /// Sets PV `pv`'s reclaim policy, if it is the PV the journal recorded.
    pub(super) async fn set_reclaim(
        &self,
        record: &UnitRecord,
        pv: &str,
        policy: &str,
    ) -> anyhow::Result<()> {
        let key = pv_key(pv);
        let uid = recorded(record, &key)?;
        for _ in 0..CONFLICT_RETRIES {
            let current = (self.pvs().get_opt(pv).await)
                .with_context(|| format!("reading PersistentVolume {pv}"))?;
            let found = current.as_ref().and_then(|p| p.metadata.uid.as_deref());
            guard::same(&key, Some(uid), found)?;
            let version = current.and_then(|p| p.metadata.resource_version);
            let patch = json!({
                "metadata": {"uid": uid, "resourceVersion": version},
                "spec": {"persistentVolumeReclaimPolicy": policy},
            });
            match (self.pvs())
                .patch(pv, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if conflict(&e) => continue,
                Err(e) => {
                    return Err(anyhow!(e).context(format!(
                        "setting PersistentVolume {pv}'s reclaim policy to {policy}"
                    )))
                }
            }
        }
        bail!("PersistentVolume {pv} kept changing while its reclaim policy was set")
    }

    /// Replaces PersistentVolume `name` by `new`, unless it already is what the swap makes
    /// (CSI when `to_csi`, else FlexVolume). The PV there must be the one the journal recorded
    /// and its spec still `replaced_spec` (what flexd wrote or found); it is deleted with its
    /// uid and resourceVersion as preconditions (its pv-protection finalizer removed: its pods
    /// are stopped, or, rolling, keep their mounts, which kubelet does not undo when the PV
    /// object goes); `new` is created with the same name and claimRef, marked with the old
    /// uid, and its uid journaled at once.
    pub(super) async fn swap_pv(
        &mut self,
        journal: &mut Journal,
        unit: usize,
        name: &str,
        to_csi: bool,
        new: Value,
        replaced_spec: &Value,
    ) -> anyhow::Result<()> {
        let api = self.pvs();
        let key = pv_key(name);
        for _ in 0..CONFLICT_RETRIES {
            let uid = recorded(&journal.units[unit], &key)?.to_owned();
            let current = (api.get_opt(name).await)
                .with_context(|| format!("reading PersistentVolume {name}"))?;
            let found = current
                .as_ref()
                .map(|pv| serde_json::to_value(pv).map(|v| Observed::of(&v, "/spec")))
                .transpose()?;
            let is_target =
                found
                    .as_ref()
                    .is_some_and(|f| if to_csi { f.is_csi() } else { f.is_flex() });
            match guard::swap(&key, Some(&uid), found.as_ref(), is_target)? {
                Swap::Done => return Ok(()),
                Swap::Adopt(made) => return self.record_uid(journal, unit, &key, made).await,
                Swap::Create => {}
                Swap::Replace => {
                    let content = found.map(|f| f.content).unwrap_or_default();
                    guard::unchanged(&key, &[replaced_spec], &content)?;
                    let version = current.and_then(|pv| pv.metadata.resource_version);
                    match api.delete(name, &preconditioned(&uid, version)).await {
                        Ok(_) => {}
                        Err(e) if status_code(&e) == Some(404) => {}
                        Err(e) if conflict(&e) => continue,
                        Err(e) => {
                            return Err(anyhow!(e).context(format!("deleting {key}")));
                        }
                    }
                    self.strip_finalizers(name, &uid).await?;
                    self.wait(&format!("{key} to be deleted"), || async {
                        let pv = api.get_opt(name).await?;
                        Ok(pv.is_none_or(|pv| pv.metadata.uid.as_deref() != Some(uid.as_str())))
                    })
                    .await?;
                    test_kill_point("pv-deleted");
                }
            }
            let mut body = new.clone();
            twin::mark_replacing(&mut body, &uid);
            let pv: PersistentVolume =
                serde_json::from_value(body).with_context(|| format!("{key} from the journal"))?;
            match api.create(&PostParams::default(), &pv).await {
                Ok(created) => {
                    let made = created.metadata.uid.unwrap_or_default();
                    return self.record_uid(journal, unit, &key, made).await;
                }
                // Something is under the name again: decide again what it is.
                Err(e) if conflict(&e) => continue,
                Err(e) => return Err(anyhow!(e).context(format!("creating {key}"))),
            }
        }
        bail!("{key} kept changing while it was swapped")
    }

    /// Removes the pv-protection finalizer of PV `name` being deleted, if it is still the
    /// object of uid `uid`.
    async fn strip_finalizers(&self, name: &str, uid: &str) -> anyhow::Result<()> {
        let api = self.pvs();
        for _ in 0..CONFLICT_RETRIES {
            let Some(current) = (api.get_opt(name).await)
                .with_context(|| format!("reading PersistentVolume {name}"))?
            else {
                return Ok(());
            };
            if current.metadata.uid.as_deref() != Some(uid) {
                return Ok(()); // gone; what is there now is decided by the create
            }
            let patch = json!({"metadata": {
                "finalizers": null, "uid": uid,
                "resourceVersion": current.metadata.resource_version,
            }});
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if status_code(&e) == Some(404) => return Ok(()),
                Err(e) if conflict(&e) => continue,
                Err(e) => {
                    return Err(anyhow!(e)
                        .context(format!("removing PersistentVolume {name}'s finalizers")))
                }
            }
        }
        bail!("PersistentVolume {name} kept changing while its finalizers were removed")
    }

    /// Rewrites `w`'s pod template to `template`, if `w` is the workload the journal recorded
    /// and its template is still one of `accepted` (before or after the swap): a template
    /// changed by someone since is named, never overwritten.
    pub(super) async fn set_template(
        &self,
        record: &UnitRecord,
        w: &WorkloadRef,
        template: &Value,
        accepted: &[&Value],
    ) -> anyhow::Result<()> {
        let key = w.to_string();
        let uid = recorded(record, &key)?;
        for _ in 0..CONFLICT_RETRIES {
            let object = self.workload(w).await?;
            let found = object.as_ref().and_then(|o| o["metadata"]["uid"].as_str());
            guard::same(&key, Some(uid), found)?;
            let object = object.unwrap_or_default();
            let current = &object["spec"]["template"];
            guard::unchanged(&key, accepted, current)?;
            if guard::differences(template, current).is_empty() {
                return Ok(());
            }
            // A merge patch replaces lists whole: the volumes become exactly the template's.
            let patch = Patch::Merge(json!({
                "metadata": {"uid": uid, "resourceVersion": object["metadata"]["resourceVersion"]},
                "spec": {"template": template},
            }));
            let pp = PatchParams::default();
            let patched = match w.kind {
                WorkloadKind::Deployment => (self.api::<Deployment>(w).patch(&w.name, &pp, &patch))
                    .await
                    .map(drop),
                WorkloadKind::StatefulSet => (self.api::<StatefulSet>(w))
                    .patch(&w.name, &pp, &patch)
                    .await
                    .map(drop),
                WorkloadKind::ReplicaSet => (self.api::<ReplicaSet>(w).patch(&w.name, &pp, &patch))
                    .await
                    .map(drop),
            };
            match patched {
                Ok(()) => return Ok(()),
                Err(e) if conflict(&e) => continue,
                Err(e) => return Err(anyhow!(e).context(format!("rewriting {w}'s pod template"))),
            }
        }
        bail!("{w} kept changing while its pod template was rewritten")
    }

    /// Deletes the unit's bare Pods: each the one the journal recorded (or flexd created in its
    /// place), preconditioned on its uid.
    pub(super) async fn delete_bare_pods(&self, record: &UnitRecord) -> anyhow::Result<()> {
        'pods: for name in &record.bare_pods {
            let key = pod_key(name);
            let (api, pod) = self.pod_api(name)?;
            for _ in 0..CONFLICT_RETRIES {
                let found = self.observed_pod(name).await?;
                let uid = match guard::delete(&key, Some(recorded(record, &key)?), found.as_ref())?
                {
                    Delete::Gone => continue 'pods,
                    Delete::Uid(uid) => uid,
                };
                match api.delete(&pod, &preconditioned(&uid, None)).await {
                    Ok(_) => continue 'pods,
                    Err(e) if status_code(&e) == Some(404) => continue 'pods,
                    Err(e) if conflict(&e) => continue,
                    Err(e) => return Err(anyhow!(e).context(format!("deleting {key}"))),
                }
            }
            bail!("{key} kept changing while it was deleted");
        }
        Ok(())
    }

    /// Creates bare Pod `name` again from `old`, its inline flexVolumes converted when
    /// `convert`; left to the scheduler (its old node may be gone). Marked with the uid it
    /// replaces, and its own uid journaled at once.
    pub(super) async fn create_pod(
        &mut self,
        journal: &mut Journal,
        unit: usize,
        name: &str,
        old: &Value,
        convert: bool,
    ) -> anyhow::Result<()> {
        let key = pod_key(name);
        let (api, _) = self.pod_api(name)?;
        let mut object = if convert
            && old["spec"]["volumes"]
                .as_array()
                .is_some_and(|v| v.iter().any(|v| v.get("flexVolume").is_some()))
        {
            twin::converted(old, "Pod")?
        } else {
            old.clone()
        };
        twin::fresh(&mut object);
        if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
            spec.remove("nodeName");
        }
        for _ in 0..CONFLICT_RETRIES {
            let uid = recorded(&journal.units[unit], &key)?.to_owned();
            let found = self.observed_pod(name).await?;
            match guard::swap(&key, Some(&uid), found.as_ref(), true)? {
                Swap::Done => return Ok(()),
                Swap::Adopt(made) => return self.record_uid(journal, unit, &key, made).await,
                Swap::Create | Swap::Replace => {}
            }
            let mut body = object.clone();
            twin::mark_replacing(&mut body, &uid);
            let pod: Pod =
                serde_json::from_value(body).with_context(|| format!("{key} from the journal"))?;
            match api.create(&PostParams::default(), &pod).await {
                Ok(created) => {
                    let made = created.metadata.uid.unwrap_or_default();
                    return self.record_uid(journal, unit, &key, made).await;
                }
                Err(e) if conflict(&e) => continue,
                Err(e) => return Err(anyhow!(e).context(format!("creating {key} again"))),
            }
        }
        bail!("{key} kept changing while it was created again")
    }
}

/// For the e2e: a kill -9 at the one moment no outside killer can hit on time (a PV deleted,
/// its twin not yet created, a few milliseconds), when `FLEXD_TEST_KILL_AT` names the point.
/// The process dies as any `kill -9` would leave it; docs/testing.md#migrate-apply.
fn test_kill_point(point: &str) {
    if std::env::var_os("FLEXD_TEST_KILL_AT").is_some_and(|p| p == point) {
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    }
}
