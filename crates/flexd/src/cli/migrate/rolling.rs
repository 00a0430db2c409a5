//! The rolling strategy against the API server (docs/migration.md#strategies): each step that
//! [`flexd::migrate::rolling::next`] decides from the journal, done and then journaled. No
//! workload is scaled: the PVs are swapped under their bound claims while the pods run, and
//! the pods are replaced one at a time ([`super::evict`]), the same way back on a rollback.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Context as _};
use flexd::migrate::guard;
use flexd::migrate::journal::{Journal, Operation, Step, UnitRecord};
use flexd::migrate::plan::{self, Plan, Selection, WorkloadRef};
use flexd::migrate::rolling::{self, Next, PodRef, Replacement};
use flexd::migrate::strategy::{self, Strategy};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::apply::Migrator;

impl Migrator {
    /// Takes a rolling unit from its journaled step to the end of the journal's operation.
    pub(super) async fn rolling_unit(
        &mut self,
        journal: &mut Journal,
        unit: usize,
    ) -> anyhow::Result<()> {
        let operation = journal.operation;
        loop {
            let next = rolling::next(&journal.units[unit], operation);
            match next {
                Next::Nothing => return Ok(()),
                Next::Retain => {
                    let record = journal.units[unit].clone();
                    for m in &record.moves {
                        self.set_reclaim(&record, &m.name, "Retain").await?;
                    }
                }
                Next::Record => self.record_old(journal, unit).await?,
                Next::Swap => {
                    self.swap_to_csi(journal, unit).await?;
                    let list = self.replacements(&journal.units[unit], operation).await?;
                    journal.units[unit].replacing = list;
                }
                // The apply's list is done or moot: the swap back makes a new one.
                Next::BeginRollback => journal.units[unit].replacing.clear(),
                Next::SwapBack => {
                    self.swap_back(journal, unit).await?;
                    let list = self.replacements(&journal.units[unit], operation).await?;
                    journal.units[unit].replacing = list;
                }
                Next::Replace(i) => {
                    self.replace(&journal.units[unit], i).await?;
                    journal.units[unit].replacing[i].done = true;
                    self.save(journal).await?;
                    self.report_replaced(journal, unit, i);
                }
                // A unit rolled back before it began has nothing to put back.
                Next::Finish => {
                    let record = &journal.units[unit];
                    if operation == Operation::Rollback && record.step != Step::Planned {
                        self.restore_reclaim(record).await?;
                    }
                }
            }
            if let Some(step) = rolling::step_after(next, operation) {
                self.step(journal, unit, step).await?;
            }
        }
    }

    /// What replaces the unit's pods now that it is swapped (or swapped back): the pods of
    /// each workload not rolled out by its controller, as they are now.
    async fn replacements(
        &self,
        record: &UnitRecord,
        operation: Operation,
    ) -> anyhow::Result<Vec<Replacement>> {
        let mut pods: BTreeMap<WorkloadRef, Vec<PodRef>> = BTreeMap::new();
        for w in &record.workloads {
            let seen = self.workload_pods(record, w).await?;
            let listed = seen
                .into_iter()
                .filter(|p| !p.terminating)
                .map(|p| PodRef {
                    name: p.name,
                    uid: p.uid,
                })
                .collect();
            pods.insert(w.clone(), listed);
        }
        Ok(rolling::to_replace(record, operation, &pods))
    }

    /// The plan for `selection`, each rolling unit that would evict pods where this identity
    /// may not scaled down instead (or refused, with `--strategy rolling`).
    pub(super) async fn plan_for(&self, selection: &Selection) -> anyhow::Result<Plan> {
        let mut plan = plan::plan(&self.inventory().await?, selection);
        let namespaces = plan.units.iter().flat_map(strategy::evicts_in);
        let denied = self
            .may_not_evict(namespaces.map(str::to_owned).collect())
            .await?;
        strategy::without_evictions(&mut plan, &denied, selection.strategy);
        Ok(plan)
    }

    /// Before a run goes on with a journal whose rolling units evict pods: whether this
    /// identity may, so a missing grant stops it before anything changed.
    pub(super) async fn check_evictions(
        &self,
        journal: &Journal,
        operation: Operation,
    ) -> anyhow::Result<()> {
        let mut namespaces = BTreeSet::new();
        for i in guard::acted_on(journal, operation) {
            let u = &journal.units[i];
            if u.strategy == Strategy::Rolling {
                let evicted = u.workloads.iter().filter(|w| !u.rollouts.contains(w));
                namespaces.extend(evicted.map(|w| w.namespace.clone()));
            }
        }
        let denied = self.may_not_evict(namespaces).await?;
        if denied.is_empty() {
            return Ok(());
        }
        bail!(
            "nothing changed: the journal's rolling units evict pods in namespace {}, and this \
             identity may not (create on pods/eviction): grant it, and --resume or --rollback \
             again",
            denied.into_iter().collect::<Vec<_>>().join(", ")
        )
    }

    /// The `namespaces` where this identity may not evict pods (`create` on `pods/eviction`),
    /// as the API server answers a SelfSubjectAccessReview, which every identity may ask.
    async fn may_not_evict(
        &self,
        namespaces: BTreeSet<String>,
    ) -> anyhow::Result<BTreeSet<String>> {
        let api = Api::<SelfSubjectAccessReview>::all(self.client.clone());
        let mut denied = BTreeSet::new();
        for ns in namespaces {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        namespace: Some(ns.clone()),
                        verb: Some("create".to_owned()),
                        resource: Some("pods".to_owned()),
                        subresource: Some("eviction".to_owned()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let answer = api
                .create(&PostParams::default(), &review)
                .await
                .with_context(|| {
                    format!("asking whether this identity may evict pods in namespace {ns}")
                })?;
            if !answer.status.is_some_and(|s| s.allowed) {
                denied.insert(ns);
            }
        }
        Ok(denied)
    }
}
