//! `flexd migrate --plan | --apply | --resume | --rollback`: the cut-over of docs/migration.md
//! done against the API server, unit by unit, with its journal in the API server
//! (docs/migration.md#apply). The plan and the journal are pure (`flexd::migrate::{plan,
//! journal}`); this file is their I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, bail, Context as _};
use flexd::migrate::journal::{self, Journal, Operation, Step, UnitRecord};
use flexd::migrate::plan::{self, Inventory, Plan, Selection, WorkloadKind, WorkloadRef};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{json, Value};

use crate::settings::{logging, OutputFormat};

/// How often a wait looks again.
const POLL: Duration = Duration::from_secs(1);

/// How long a FlexVolume volume must stay out of its node's status before its detach is taken
/// as done (see `wait_flex_detached`): the driver's `detach` runs right after the status drops,
/// and a failed one puts the volume back.
const DETACH_SETTLE: Duration = Duration::from_secs(10);

/// What the command was asked.
pub enum Mode {
    Plan(Selection),
    Apply(Selection),
    Resume,
    Rollback,
}

pub struct Options<'a> {
    pub kubeconfig: Option<&'a Path>,
    pub journal_namespace: &'a str,
    pub wait_timeout: Duration,
    pub yes: bool,
    pub output: OutputFormat,
}

pub fn run(mode: Mode, options: &Options<'_>) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let (client, server) = crate::cli::kubeconfig::client(options.kubeconfig).await?;
        let migrator = Migrator {
            journal: Api::namespaced(client.clone(), options.journal_namespace),
            journal_namespace: options.journal_namespace.to_owned(),
            client,
            journal_version: None,
            wait_timeout: options.wait_timeout,
            output: options.output,
            bar: None,
        };
        migrator
            .run(mode, options)
            .await
            .with_context(|| format!("API server {server}"))
    })
}

struct Migrator {
    client: kube::Client,
    journal: Api<ConfigMap>,
    journal_namespace: String,
    /// The journal's resourceVersion as last read or written: every write is conditional on
    /// it, so two runs cannot both go on with one journal.
    journal_version: Option<String>,
    wait_timeout: Duration,
    output: OutputFormat,
    /// The progress bar, on a terminal.
    bar: Option<logging::ProgressGuard>,
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

fn who() -> String {
    let user = std::env::var("USER")
        .unwrap_or_else(|_| format!("uid {}", rustix::process::getuid().as_raw()));
    let host = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    format!("{user}@{host} pid {}", std::process::id())
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

impl Migrator {
    async fn run(mut self, mode: Mode, options: &Options<'_>) -> anyhow::Result<ExitCode> {
        match mode {
            Mode::Plan(selection) => {
                let plan = plan::plan(&self.inventory().await?, &selection);
                self.print_plan(&plan)?;
                Ok(ExitCode::SUCCESS)
            }
            Mode::Apply(selection) => {
                if let Some(journal) = self.load().await? {
                    if !journal.finished {
                        bail!(
                            "a migration is in progress ({} started {} by {}; journal ConfigMap \
                             {}/{}): go on with --resume or undo it with --rollback",
                            journal.operation.in_words(),
                            journal.started,
                            journal.by,
                            self.journal_namespace(),
                            journal::NAME
                        );
                    }
                }
                let plan = plan::plan(&self.inventory().await?, &selection);
                self.print_plan(&plan)?;
                if plan.units.is_empty() {
                    self.say("nothing to migrate");
                    return Ok(exit_for(&plan));
                }
                if !confirm(options.yes, "Apply this plan?")? {
                    bail!("nothing changed: the plan was not accepted (--yes accepts it)");
                }
                let started = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
                let mut journal = Journal::new(plan.units.clone(), started, who());
                self.save(&mut journal).await?;
                self.apply(&mut journal).await?;
                Ok(exit_for(&plan))
            }
            Mode::Resume => {
                let mut journal = self.load().await?.ok_or_else(|| self.no_journal())?;
                if journal.finished {
                    self.say("the journal's migration is finished: nothing to resume");
                    return Ok(ExitCode::SUCCESS);
                }
                self.print_journal(&journal);
                if !confirm(options.yes, "Resume?")? {
                    bail!("nothing changed (--yes resumes)");
                }
                match journal.operation {
                    Operation::Apply => self.apply(&mut journal).await?,
                    Operation::Rollback => self.rollback(&mut journal).await?,
                }
                Ok(ExitCode::SUCCESS)
            }
            Mode::Rollback => {
                let mut journal = self.load().await?.ok_or_else(|| self.no_journal())?;
                self.print_journal(&journal);
                if !confirm(options.yes, "Roll back every unit above to FlexVolume?")? {
                    bail!("nothing changed (--yes rolls back)");
                }
                journal.operation = Operation::Rollback;
                journal.finished = false;
                self.save(&mut journal).await?;
                self.rollback(&mut journal).await?;
                Ok(ExitCode::SUCCESS)
            }
        }
    }

    fn journal_namespace(&self) -> &str {
        &self.journal_namespace
    }

    fn no_journal(&self) -> anyhow::Error {
        anyhow!(
            "no migration journal (ConfigMap {}/{}): nothing to resume or roll back",
            self.journal_namespace(),
            journal::NAME
        )
    }

    // --- what is there ----------------------------------------------------------------------

    async fn inventory(&self) -> anyhow::Result<Inventory> {
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
        Ok(Inventory {
            persistent_volumes: pvs.items,
            pods: pods.items,
            replica_sets: rs.items,
            deployments: deployments.items,
            stateful_sets: sts.items,
            csi_drivers: drivers.items,
            csi_nodes: nodes.items,
        })
    }

    // --- the journal ------------------------------------------------------------------------

    async fn load(&mut self) -> anyhow::Result<Option<Journal>> {
        let Some(map) = self
            .journal
            .get_opt(journal::NAME)
            .await
            .context("reading the migration journal")?
        else {
            return Ok(None);
        };
        self.journal_version = map.metadata.resource_version.clone();
        let text = map
            .data
            .as_ref()
            .and_then(|d| d.get(journal::KEY))
            .ok_or_else(|| {
                anyhow!(
                    "the journal ConfigMap {} has no {}",
                    journal::NAME,
                    journal::KEY
                )
            })?;
        Journal::parse(text).map(Some).map_err(|e| {
            anyhow!(
                "the journal ConfigMap {} cannot be read: {e}",
                journal::NAME
            )
        })
    }

    /// Writes the journal, conditional on the version last read or written.
    async fn save(&mut self, journal: &mut Journal) -> anyhow::Result<()> {
        let mut map = ConfigMap::default();
        map.metadata.name = Some(journal::NAME.to_owned());
        map.metadata.labels = Some(BTreeMap::from([(
            "app.kubernetes.io/managed-by".to_owned(),
            "flexd-migrate".to_owned(),
        )]));
        map.data = Some(BTreeMap::from([(
            journal::KEY.to_owned(),
            journal.to_text(),
        )]));
        let written = match &self.journal_version {
            Some(version) => {
                map.metadata.resource_version = Some(version.clone());
                self.journal
                    .replace(journal::NAME, &PostParams::default(), &map)
                    .await
            }
            None => self.journal.create(&PostParams::default(), &map).await,
        };
        let written = written.map_err(|e| match status_code(&e) {
            Some(409) => anyhow!(
                "the migration journal changed under this run (another `flexd migrate` is \
                 running on it?): stopping here; nothing is lost, --resume goes on"
            ),
            _ => anyhow!(e).context("writing the migration journal"),
        })?;
        self.journal_version = written.metadata.resource_version;
        Ok(())
    }

    async fn step(&mut self, journal: &mut Journal, unit: usize, step: Step) -> anyhow::Result<()> {
        journal.units[unit].step = step;
        self.save(journal).await?;
        self.report_step(journal, unit);
        Ok(())
    }

    // --- apply ------------------------------------------------------------------------------

    async fn apply(&mut self, journal: &mut Journal) -> anyhow::Result<()> {
        let total = journal.units.len();
        self.show_bar(total);
        for unit in 0..total {
            if journal.units[unit].step >= Step::Done {
                continue;
            }
            self.apply_unit(journal, unit).await.with_context(|| {
                format!(
                    "unit {}/{total} ({}) stopped at step {}; nothing is lost: --resume goes on, \
                     --rollback goes back",
                    unit + 1,
                    journal.units[unit].title(),
                    journal.units[unit].step.as_str()
                )
            })?;
        }
        journal.finished = true;
        self.save(journal).await?;
        self.bar = None;
        self.summary(journal, "migrated");
        Ok(())
    }

    async fn apply_unit(&mut self, journal: &mut Journal, unit: usize) -> anyhow::Result<()> {
        if journal.units[unit].step < Step::Retained {
            for m in journal.units[unit].moves.clone() {
                self.retain(&m.name).await?;
            }
            self.step(journal, unit, Step::Retained).await?;
        }
        if journal.units[unit].step < Step::ScalingDown {
            let mut replicas = BTreeMap::new();
            for w in &journal.units[unit].workloads {
                replicas.insert(w.to_string(), self.replicas(w).await?);
            }
            let attached = self.attached_now(&journal.units[unit]).await?;
            let old_pods = self.bare_pods(&journal.units[unit]).await?;
            let record = &mut journal.units[unit];
            record.old_pods = old_pods;
            record.replicas = replicas;
            record.attached_before = attached;
            record.down_since = Some(now_unix());
            self.step(journal, unit, Step::ScalingDown).await?;
        }
        if journal.units[unit].step < Step::ScaledDown {
            for w in journal.units[unit].workloads.clone() {
                self.scale(&w, 0).await?;
            }
            self.delete_bare_pods(&journal.units[unit]).await?;
            self.step(journal, unit, Step::ScaledDown).await?;
        }
        if journal.units[unit].step < Step::Stopped {
            self.wait_stopped(&journal.units[unit]).await?;
            self.wait_flex_detached(&journal.units[unit]).await?;
            self.step(journal, unit, Step::Stopped).await?;
        }
        if journal.units[unit].step < Step::Swapping {
            let mut old_pvs = BTreeMap::new();
            for m in &journal.units[unit].moves {
                let pv = self
                    .pvs()
                    .get(&m.name)
                    .await
                    .with_context(|| format!("reading PersistentVolume {}", m.name))?;
                if pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.flex_volume.as_ref())
                    .is_none()
                {
                    bail!("PersistentVolume {} has no flexVolume any more: changed by someone else; the journal has no FlexVolume object for it", m.name);
                }
                old_pvs.insert(m.name.clone(), serde_json::to_value(&pv)?);
            }
            let mut old_templates = BTreeMap::new();
            for w in &journal.units[unit].templates {
                old_templates.insert(w.to_string(), self.template(w).await?);
            }
            let record = &mut journal.units[unit];
            record.old_pvs = old_pvs;
            record.old_templates = old_templates;
            self.step(journal, unit, Step::Swapping).await?;
        }
        if journal.units[unit].step < Step::Swapped {
            let record = journal.units[unit].clone();
            for m in &record.moves {
                let old = record
                    .old_pvs
                    .get(&m.name)
                    .ok_or_else(|| anyhow!("the journal lost PersistentVolume {}", m.name))?;
                let new = converted(old, "PersistentVolume")?;
                self.swap_pv(
                    &m.name,
                    |pv| pv.spec.as_ref().is_some_and(|s| s.csi.is_some()),
                    new,
                )
                .await?;
            }
            for w in &record.templates {
                let old = record
                    .old_templates
                    .get(&w.to_string())
                    .ok_or_else(|| anyhow!("the journal lost {w}'s template"))?;
                let object = json!({
                    "apiVersion": "apps/v1", "kind": w.kind.as_str(),
                    "metadata": {"name": w.name, "namespace": w.namespace},
                    "spec": {"template": old},
                });
                let new = converted(&object, w.kind.as_str())?;
                self.set_template(w, &new["spec"]["template"]).await?;
            }
            self.wait_claims_bound(&record).await?;
            self.step(journal, unit, Step::Swapped).await?;
        }
        if journal.units[unit].step < Step::Done {
            self.start_again(journal, unit).await?;
            self.step(journal, unit, Step::Done).await?;
        }
        Ok(())
    }

    /// Scales the unit back and waits until it is Ready; records the downtime.
    async fn start_again(&mut self, journal: &mut Journal, unit: usize) -> anyhow::Result<()> {
        let record = journal.units[unit].clone();
        for w in &record.workloads {
            let replicas = record.replicas.get(&w.to_string()).copied().unwrap_or(0);
            self.scale(w, replicas).await?;
        }
        let converted_pods = journal.operation == Operation::Apply;
        for (name, old) in &record.old_pods {
            self.create_pod(name, old, converted_pods).await?;
        }
        for w in &record.workloads {
            let replicas = record.replicas.get(&w.to_string()).copied().unwrap_or(0);
            self.wait_ready(w, replicas).await?;
        }
        for name in record.old_pods.keys() {
            self.wait_pod_ready(name).await?;
        }
        let record = &mut journal.units[unit];
        record.downtime_seconds = record.down_since.map(|since| (now_unix() - since).max(0.0));
        Ok(())
    }

    // --- rollback ---------------------------------------------------------------------------

    async fn rollback(&mut self, journal: &mut Journal) -> anyhow::Result<()> {
        let total = journal.units.len();
        self.show_bar(total);
        for unit in 0..total {
            if journal.units[unit].step == Step::RolledBack {
                continue;
            }
            self.rollback_unit(journal, unit).await.with_context(|| {
                format!(
                    "rolling back unit {}/{total} ({}) stopped; nothing is lost: --resume goes on \
                     with the rollback",
                    unit + 1,
                    journal.units[unit].title()
                )
            })?;
        }
        journal.finished = true;
        self.save(journal).await?;
        self.bar = None;
        self.summary(journal, "rolled back");
        Ok(())
    }

    async fn rollback_unit(&mut self, journal: &mut Journal, unit: usize) -> anyhow::Result<()> {
        let step = journal.units[unit].step;
        if step == Step::Planned {
            return self.step(journal, unit, Step::RolledBack).await;
        }
        if step != Step::RollingBack {
            // A rollback of a unit that never stopped restarts it too: it is stopped now.
            if journal.units[unit].replicas.is_empty() {
                let mut replicas = BTreeMap::new();
                for w in &journal.units[unit].workloads {
                    replicas.insert(w.to_string(), self.replicas(w).await?);
                }
                journal.units[unit].replicas = replicas;
            }
            if journal.units[unit].old_pods.is_empty() {
                journal.units[unit].old_pods = self.bare_pods(&journal.units[unit]).await?;
            }
            journal.units[unit].down_since = Some(now_unix());
            journal.units[unit].downtime_seconds = None;
            self.step(journal, unit, Step::RollingBack).await?;
        }
        let record = journal.units[unit].clone();
        // The PVs, templates or bare Pods were (maybe) swapped: stop the pods, detach, swap
        // back (a bare Pod is deleted here and created as it was below).
        if !record.old_pvs.is_empty()
            || !record.old_templates.is_empty()
            || !record.old_pods.is_empty()
        {
            for w in &record.workloads {
                self.scale(w, 0).await?;
            }
            self.delete_bare_pods(&record).await?;
            self.wait_stopped(&record).await?;
            self.wait_csi_detached(&record).await?;
            for m in &record.moves {
                let mut old = record
                    .old_pvs
                    .get(&m.name)
                    .cloned()
                    .ok_or_else(|| anyhow!("the journal lost PersistentVolume {}", m.name))?;
                fresh(&mut old);
                if let Some(policy) = &m.reclaim_policy {
                    old["spec"]["persistentVolumeReclaimPolicy"] = json!(policy);
                }
                self.swap_pv(
                    &m.name,
                    |pv| pv.spec.as_ref().is_some_and(|s| s.flex_volume.is_some()),
                    old,
                )
                .await?;
            }
            for w in &record.templates {
                let old = record
                    .old_templates
                    .get(&w.to_string())
                    .ok_or_else(|| anyhow!("the journal lost {w}'s template"))?;
                self.set_template(w, old).await?;
            }
            self.wait_claims_bound(&record).await?;
        }
        // Retain back to what it was, on PVs that were never swapped (a swapped one was made
        // with its old policy above).
        for m in &record.moves {
            if let Some(policy) = &m.reclaim_policy {
                self.set_reclaim(&m.name, policy).await?;
            }
        }
        self.start_again(journal, unit).await?;
        self.step(journal, unit, Step::RolledBack).await
    }

    // --- the objects --------------------------------------------------------------------------

    fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    async fn retain(&self, pv: &str) -> anyhow::Result<()> {
        self.set_reclaim(pv, "Retain").await
    }

    async fn set_reclaim(&self, pv: &str, policy: &str) -> anyhow::Result<()> {
        let patch = json!({"spec": {"persistentVolumeReclaimPolicy": policy}});
        self.pvs()
            .patch(pv, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| {
                format!("setting PersistentVolume {pv}'s reclaim policy to {policy}")
            })?;
        Ok(())
    }

    /// Replaces PersistentVolume `name` by `new`, unless `is_new` says it already is: deletes
    /// the old object (its pv-protection finalizer removed: its pods are stopped), waits until
    /// it is gone, creates the new one with the same name and claimRef.
    async fn swap_pv(
        &self,
        name: &str,
        is_new: impl Fn(&PersistentVolume) -> bool,
        new: Value,
    ) -> anyhow::Result<()> {
        let api = self.pvs();
        if let Some(current) = api
            .get_opt(name)
            .await
            .with_context(|| format!("reading PersistentVolume {name}"))?
        {
            if is_new(&current) {
                return Ok(());
            }
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: current.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(name, &params).await {
                Ok(_) => {}
                Err(e) if status_code(&e) == Some(404) => {}
                Err(e) => {
                    return Err(anyhow!(e).context(format!("deleting PersistentVolume {name}")))
                }
            }
            let patch = json!({"metadata": {"finalizers": null}});
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(e) if status_code(&e) == Some(404) => {}
                Err(e) => {
                    return Err(anyhow!(e)
                        .context(format!("removing PersistentVolume {name}'s finalizers")))
                }
            }
            self.wait(
                &format!("PersistentVolume {name} to be deleted"),
                || async { Ok(api.get_opt(name).await?.is_none()) },
            )
            .await?;
            test_kill_point("pv-deleted");
        }
        let pv: PersistentVolume = serde_json::from_value(new)
            .with_context(|| format!("PersistentVolume {name} from the journal"))?;
        match api.create(&PostParams::default(), &pv).await {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(409) => Ok(()),
            Err(e) => Err(anyhow!(e).context(format!("creating PersistentVolume {name}"))),
        }
    }

    async fn replicas(&self, w: &WorkloadRef) -> anyhow::Result<i32> {
        let scale = match w.kind {
            WorkloadKind::Deployment => self.api::<Deployment>(w).get_scale(&w.name).await,
            WorkloadKind::StatefulSet => self.api::<StatefulSet>(w).get_scale(&w.name).await,
            WorkloadKind::ReplicaSet => self.api::<ReplicaSet>(w).get_scale(&w.name).await,
        }
        .with_context(|| format!("reading {w}'s replicas"))?;
        Ok(scale.spec.and_then(|s| s.replicas).unwrap_or(0))
    }

    async fn scale(&self, w: &WorkloadRef, replicas: i32) -> anyhow::Result<()> {
        let patch = Patch::Merge(json!({"spec": {"replicas": replicas}}));
        let pp = PatchParams::default();
        match w.kind {
            WorkloadKind::Deployment => {
                self.api::<Deployment>(w)
                    .patch_scale(&w.name, &pp, &patch)
                    .await
            }
            WorkloadKind::StatefulSet => {
                self.api::<StatefulSet>(w)
                    .patch_scale(&w.name, &pp, &patch)
                    .await
            }
            WorkloadKind::ReplicaSet => {
                self.api::<ReplicaSet>(w)
                    .patch_scale(&w.name, &pp, &patch)
                    .await
            }
        }
        .with_context(|| format!("scaling {w} to {replicas}"))?;
        Ok(())
    }

    fn api<K>(&self, w: &WorkloadRef) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &w.namespace)
    }

    async fn template(&self, w: &WorkloadRef) -> anyhow::Result<Value> {
        let object = match w.kind {
            WorkloadKind::Deployment => {
                serde_json::to_value(self.api::<Deployment>(w).get(&w.name).await?)?
            }
            WorkloadKind::StatefulSet => {
                serde_json::to_value(self.api::<StatefulSet>(w).get(&w.name).await?)?
            }
            WorkloadKind::ReplicaSet => {
                serde_json::to_value(self.api::<ReplicaSet>(w).get(&w.name).await?)?
            }
        };
        Ok(object["spec"]["template"].clone())
    }

    async fn set_template(&self, w: &WorkloadRef, template: &Value) -> anyhow::Result<()> {
        // A merge patch replaces lists whole: the volumes become exactly the template's.
        let patch = Patch::Merge(json!({"spec": {"template": template}}));
        let pp = PatchParams::default();
        match w.kind {
            WorkloadKind::Deployment => self
                .api::<Deployment>(w)
                .patch(&w.name, &pp, &patch)
                .await
                .map(drop),
            WorkloadKind::StatefulSet => self
                .api::<StatefulSet>(w)
                .patch(&w.name, &pp, &patch)
                .await
                .map(drop),
            WorkloadKind::ReplicaSet => self
                .api::<ReplicaSet>(w)
                .patch(&w.name, &pp, &patch)
                .await
                .map(drop),
        }
        .with_context(|| format!("rewriting {w}'s pod template"))
    }

    fn pod_api(&self, name: &str) -> anyhow::Result<(Api<Pod>, String)> {
        let (ns, pod) = name
            .split_once('/')
            .ok_or_else(|| anyhow!("{name:?} is not namespace/name"))?;
        Ok((Api::namespaced(self.client.clone(), ns), pod.to_owned()))
    }

    /// The unit's bare Pods as they are now, what is created again.
    async fn bare_pods(&self, record: &UnitRecord) -> anyhow::Result<BTreeMap<String, Value>> {
        let mut pods = BTreeMap::new();
        for name in &record.bare_pods {
            let (api, pod) = self.pod_api(name)?;
            // One gone already (deleted by someone else) has nothing to be created from.
            if let Some(object) = api
                .get_opt(&pod)
                .await
                .with_context(|| format!("reading Pod {name}"))?
            {
                pods.insert(name.clone(), serde_json::to_value(&object)?);
            }
        }
        Ok(pods)
    }

    async fn delete_bare_pods(&self, record: &UnitRecord) -> anyhow::Result<()> {
        for name in &record.bare_pods {
            let (api, pod) = self.pod_api(name)?;
            match api.delete(&pod, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if status_code(&e) == Some(404) => {}
                Err(e) => return Err(anyhow!(e).context(format!("deleting Pod {name}"))),
            }
        }
        Ok(())
    }

    /// Creates bare Pod `name` again from `old`, its inline flexVolumes converted when
    /// `convert`; left to the scheduler (its old node may be gone).
    async fn create_pod(&self, name: &str, old: &Value, convert: bool) -> anyhow::Result<()> {
        let (api, _) = self.pod_api(name)?;
        let mut object = if convert
            && old["spec"]["volumes"]
                .as_array()
                .is_some_and(|v| v.iter().any(|v| v.get("flexVolume").is_some()))
        {
            converted(old, "Pod")?
        } else {
            old.clone()
        };
        fresh(&mut object);
        if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
            spec.remove("nodeName");
        }
        let pod: Pod = serde_json::from_value(object)
            .with_context(|| format!("Pod {name} from the journal"))?;
        match api.create(&PostParams::default(), &pod).await {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(409) => Ok(()),
            Err(e) => Err(anyhow!(e).context(format!("creating Pod {name} again"))),
        }
    }

    async fn wait_pod_ready(&self, name: &str) -> anyhow::Result<()> {
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

    // --- waits ----------------------------------------------------------------------------------

    async fn wait<F, Fut>(&self, what: &str, mut done: F) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<bool>>,
    {
        let deadline = Instant::now() + self.wait_timeout;
        loop {
            let last_error = match done().await {
                Ok(true) => return Ok(()),
                Ok(false) => None,
                Err(e) => Some(e),
            };
            if Instant::now() >= deadline {
                let why = last_error
                    .map(|e| format!(" (last error: {e:#})"))
                    .unwrap_or_default();
                bail!(
                    "waited {} for {what}{why}",
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
    async fn wait_stopped(&self, record: &UnitRecord) -> anyhow::Result<()> {
        let what = format!("the pods of {} to stop (still there: pods that do not stop, or that something else starts)", record.title());
        self.wait(&what, || async {
            Ok(self.unit_pods(record).await?.is_empty())
        })
        .await
    }

    /// The FlexVolume volumes the unit's attaching drivers have attached, per node it used:
    /// kube-controller-manager names them `vendor/driver/<getvolumename's answer>`.
    async fn attached_now(
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
    async fn wait_flex_detached(&self, record: &UnitRecord) -> anyhow::Result<()> {
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
    async fn wait_csi_detached(&self, record: &UnitRecord) -> anyhow::Result<()> {
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

    async fn wait_claims_bound(&self, record: &UnitRecord) -> anyhow::Result<()> {
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

    async fn wait_ready(&self, w: &WorkloadRef, replicas: i32) -> anyhow::Result<()> {
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

    // --- what it says ---------------------------------------------------------------------------

    fn say(&self, text: &str) {
        match self.output {
            OutputFormat::Text => eprintln!("flexd: {text}"),
            OutputFormat::Json => println!("{}", json!({"event": "message", "message": text})),
        }
    }

    fn print_plan(&self, plan: &Plan) -> anyhow::Result<()> {
        match self.output {
            OutputFormat::Json => println!("{}", serde_json::to_string(plan)?),
            OutputFormat::Text => print!("{}", plan_text(plan)),
        }
        Ok(())
    }

    fn print_journal(&self, journal: &Journal) {
        if self.output == OutputFormat::Json {
            return;
        }
        eprintln!(
            "flexd: journal {}/{}: {} started {} by {}",
            self.journal_namespace(),
            journal::NAME,
            journal.operation.in_words(),
            journal.started,
            journal.by
        );
        for (i, unit) in journal.units.iter().enumerate() {
            eprintln!("  {}. {}: {}", i + 1, unit.title(), unit.step.as_str());
        }
    }

    fn report_step(&self, journal: &Journal, unit: usize) {
        let record = &journal.units[unit];
        match self.output {
            OutputFormat::Json => println!(
                "{}",
                json!({
                    "event": "step", "unit": unit + 1, "units": journal.units.len(),
                    "step": record.step.as_str(), "workloads": record.workloads,
                    "bare_pods": record.bare_pods, "pvs": record.pvs,
                })
            ),
            OutputFormat::Text => {
                let line = format!(
                    "[{}/{}] {}: {}",
                    unit + 1,
                    journal.units.len(),
                    record.title(),
                    record.step.as_str()
                );
                match &self.bar {
                    // A terminal: the bar says where it is and what it waits for; each step
                    // still gets its line above it.
                    Some(shown) => {
                        let finished = journal
                            .units
                            .iter()
                            .filter(|u| matches!(u.step, Step::Done | Step::RolledBack))
                            .count();
                        shown.bar().set_position(finished as u64);
                        shown.bar().set_message(line.clone());
                        shown.bar().println(format!("flexd: {line}"));
                    }
                    None => eprintln!("flexd: {line}"),
                }
            }
        }
    }

    /// A bar over the units on a terminal (text output); structured lines otherwise.
    fn show_bar(&mut self, units: usize) {
        if self.output != OutputFormat::Text || !std::io::stderr().is_terminal() {
            return;
        }
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(units as u64),
            indicatif::ProgressDrawTarget::stderr(),
        )
        .with_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{bar:20}] {pos}/{len} units, {elapsed} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.enable_steady_tick(Duration::from_millis(250));
        self.bar = Some(logging::show_progress(bar));
    }

    fn summary(&self, journal: &Journal, done: &str) {
        match self.output {
            OutputFormat::Json => {
                let units: Vec<Value> = journal
                    .units
                    .iter()
                    .map(|u| json!({"workloads": u.workloads, "bare_pods": u.bare_pods, "pvs": u.pvs, "step": u.step.as_str(), "downtime_seconds": u.downtime_seconds}))
                    .collect();
                println!(
                    "{}",
                    json!({"event": "summary", "operation": journal.operation, "units": units})
                );
            }
            OutputFormat::Text => {
                for u in &journal.units {
                    let down = u
                        .downtime_seconds
                        .map(|s| format!(", down {s:.1} s"))
                        .unwrap_or_default();
                    for w in &u.workloads {
                        println!("{w}: {done}{down}");
                    }
                    for p in &u.bare_pods {
                        println!("Pod {p}: {done} (created again){down}");
                    }
                    if u.workloads.is_empty() && u.bare_pods.is_empty() {
                        for pv in &u.pvs {
                            println!("PersistentVolume {pv}: {done} (no pods used it)");
                        }
                    }
                }
            }
        }
    }
}

/// Exit 1 when the plan refused something selected (the rest was migrated).
fn exit_for(plan: &Plan) -> ExitCode {
    if plan.refused.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
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

/// `object` through `flexd migrate`'s conversion: the CSI twin, what the API server owns
/// dropped.
fn converted(object: &Value, kind: &str) -> anyhow::Result<Value> {
    let mut object = object.clone();
    if object.get("kind").is_none() {
        object["kind"] = json!(kind);
        object["apiVersion"] = json!("v1");
    }
    // Attaching is asked only of inline volumes, and the plan refused inline volumes of
    // attaching drivers already.
    let mut attaches = |_: &flexvolume_host::DriverName| Ok(false);
    let migration =
        flexd::migrate::migrate(&object.to_string(), &mut attaches).map_err(|refusals| {
            anyhow!(
                "cannot convert {kind}: {}",
                refusals
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        })?;
    migration
        .objects
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("{kind} has no flexVolume to convert"))
}

/// What the API server owns, dropped, so the object can be created again.
fn fresh(object: &mut Value) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "managedFields",
        ] {
            meta.remove(key);
        }
    }
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
}

fn confirm(yes: bool, question: &str) -> anyhow::Result<bool> {
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    eprint!("{question} [y/N] ");
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .context("reading the answer")?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// The plan for humans.
pub fn plan_text(plan: &Plan) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let n = plan.units.len();
    let _ = writeln!(out, "{n} unit{} to migrate, one after the other (each stops, is swapped and starts again on its own):", if n == 1 { "" } else { "s" });
    for (i, unit) in plan.units.iter().enumerate() {
        let _ = writeln!(out, "{:>3}. {}", i + 1, unit.title());
        for m in &unit.pvs {
            let claim = m
                .claim
                .as_deref()
                .map(|c| format!(", claim {c}"))
                .unwrap_or_default();
            let attaches = if m.attaches { ", attaches" } else { "" };
            let policy = match m.reclaim_policy.as_deref() {
                Some("Retain") | None => String::new(),
                Some(other) => format!(", reclaim policy {other} → Retain"),
            };
            let _ = writeln!(
                out,
                "       PersistentVolume {}: {} → CSI {}{attaches}{claim}{policy}",
                m.name, m.driver, m.csi_driver
            );
        }
        for p in &unit.bare_pods {
            let _ = writeln!(
                out,
                "       Pod {p}: deleted and created again after the swap"
            );
        }
        for w in &unit.templates {
            let _ = writeln!(
                out,
                "       {w}: inline flexVolume → inline csi in its pod template"
            );
        }
        if !unit.workloads.is_empty() {
            let _ = writeln!(
                out,
                "       scaled to 0 and back; pods that restart: {}",
                if unit.pods.is_empty() {
                    "none now".to_owned()
                } else {
                    unit.pods.join(", ")
                }
            );
        }
    }
    if !plan.refused.is_empty() {
        let _ = writeln!(out, "Refused (not migrated):");
        for r in &plan.refused {
            let _ = writeln!(out, "  - {}: {}", r.what, r.reason);
        }
    }
    out
}
