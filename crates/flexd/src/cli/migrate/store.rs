//! The journal in the API server (ConfigMap `flexd-migration`): read with its digest checked,
//! written conditionally, and checked against the cluster before a run acts on it
//! (docs/migration.md#journal).

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context as _};
use flexd::migrate::guard::{self, Cluster};
use flexd::migrate::journal::{self, Journal, Operation, Step};
use flexd::migrate::plan::{pod_key, pv_key};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;

use super::apply::{status_code, Migrator};

impl Migrator {
    pub(super) fn no_journal(&self) -> anyhow::Error {
        anyhow!(
            "no migration journal (ConfigMap {}/{}): nothing to resume or roll back",
            self.journal_namespace,
            journal::NAME
        )
    }

    /// The journal, if there is one. One that is not what `flexd migrate` wrote (its digest),
    /// or that predates the digest and is still in progress, is an error: nothing of it is
    /// followed.
    pub(super) async fn load(&mut self) -> anyhow::Result<Option<Journal>> {
        let Some(map) = self
            .journal
            .get_opt(journal::NAME)
            .await
            .context("reading the migration journal")?
        else {
            return Ok(None);
        };
        self.journal_version = map.metadata.resource_version.clone();
        let name = format!("{}/{}", self.journal_namespace, journal::NAME);
        let text = map
            .data
            .as_ref()
            .and_then(|d| d.get(journal::KEY))
            .ok_or_else(|| anyhow!("the journal ConfigMap {name} has no {}", journal::KEY))?;
        let journal = Journal::parse(text).with_context(|| {
            format!(
                "the journal ConfigMap {name} is not followed; look at it, finish or undo its \
                 units by hand (docs/migration.md#rollback) and delete it"
            )
        })?;
        // A finished old journal is only replaced; an unfinished one would be acted on.
        if !journal.finished {
            journal.require_sealed().with_context(|| {
                format!(
                    "the journal ConfigMap {name} ({} started {} by {}) is not followed",
                    journal.operation.in_words(),
                    journal.started,
                    journal.by
                )
            })?;
        }
        Ok(Some(journal))
    }

    /// Writes the journal, conditional on the version last read or written.
    pub(super) async fn save(&mut self, journal: &mut Journal) -> anyhow::Result<()> {
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

    pub(super) async fn step(
        &mut self,
        journal: &mut Journal,
        unit: usize,
        step: Step,
    ) -> anyhow::Result<()> {
        journal.units[unit].step = step;
        self.save(journal).await?;
        self.report_step(journal, unit);
        Ok(())
    }

    /// Journals the uid of an object flexd created under `key`'s name, at once: what the next
    /// change of it is preconditioned on.
    pub(super) async fn record_uid(
        &mut self,
        journal: &mut Journal,
        unit: usize,
        key: &str,
        uid: String,
    ) -> anyhow::Result<()> {
        journal.units[unit].uids.insert(key.to_owned(), uid);
        self.save(journal).await
    }

    /// Before a run of `operation` acts on the journal: every object it would act on must be
    /// the one the journal recorded (and, for a rollback of a swapped unit, still what the
    /// apply wrote). Refuses, naming each difference, and changes nothing otherwise.
    pub(super) async fn verify(
        &self,
        journal: &Journal,
        operation: Operation,
    ) -> anyhow::Result<()> {
        journal.require_sealed().with_context(|| {
            format!(
                "the journal ConfigMap {}/{} is not followed",
                self.journal_namespace,
                journal::NAME
            )
        })?;
        let mut cluster = Cluster::new();
        for i in guard::acted_on(journal, operation) {
            let record = &journal.units[i];
            for name in &record.pvs {
                if let Some(found) = self.observed_pv(name).await? {
                    cluster.insert(pv_key(name), found);
                }
            }
            for w in &record.workloads {
                if let Some(found) = self.observed_workload(w).await? {
                    cluster.insert(w.to_string(), found);
                }
            }
            for name in &record.bare_pods {
                if let Some(found) = self.observed_pod(name).await? {
                    cluster.insert(pod_key(name), found);
                }
            }
        }
        let changed = guard::verify(journal, operation, &cluster);
        if changed.is_empty() {
            return Ok(());
        }
        let list: Vec<String> = changed.iter().map(|c| format!("  - {c}")).collect();
        bail!(
            "nothing changed: the cluster's objects are not those the journal ConfigMap {}/{} \
             recorded, and flexd acts on no other:\n{}\nPut them back as they were, or finish or \
             undo those units by hand (docs/migration.md#rollback).",
            self.journal_namespace,
            journal::NAME,
            list.join("\n")
        )
    }
}
