//! `flexd migrate --rollback`: every unit the journal names back on FlexVolume, finished or
//! not, each object changed only if it is the one the journal recorded and, once swapped,
//! still what the apply wrote (docs/migration.md#journal).

use std::collections::BTreeMap;

use anyhow::Context as _;
use flexd::migrate::journal::{Journal, Step, UnitRecord};
use flexd::migrate::strategy::Strategy;
use flexd::migrate::twin;
use serde_json::json;

use super::apply::{now_unix, Migrator};

impl Migrator {
    pub(super) async fn rollback(&mut self, journal: &mut Journal) -> anyhow::Result<()> {
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
        self.finish(journal, "rolled back").await
    }

    async fn rollback_unit(&mut self, journal: &mut Journal, unit: usize) -> anyhow::Result<()> {
        if journal.units[unit].strategy == Strategy::Rolling {
            return self.rolling_unit(journal, unit).await;
        }
        let step = journal.units[unit].step;
        if step == Step::Planned {
            return self.step(journal, unit, Step::RolledBack).await;
        }
        if step != Step::RollingBack {
            // A rollback of a unit that never stopped restarts it too: it is stopped now. A
            // finished one is started again with the replicas it has now, not those of before
            // the migration (someone may have scaled it since).
            if journal.units[unit].replicas.is_empty() || step == Step::Done {
                let record = &journal.units[unit];
                let mut replicas = BTreeMap::new();
                for w in &record.workloads {
                    replicas.insert(w.to_string(), self.replicas(record, w).await?);
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
        // back (a bare Pod is deleted here and created as it was below). Only what the journal
        // holds the old object of was swapped.
        if !record.old_pvs.is_empty()
            || !record.old_templates.is_empty()
            || !record.old_pods.is_empty()
        {
            for w in &record.workloads {
                self.scale(&record, w, 0).await?;
            }
            self.delete_bare_pods(&record).await?;
            self.wait_stopped(&record).await?;
            self.wait_csi_detached(&record).await?;
            self.swap_back(journal, unit).await?;
        }
        self.restore_reclaim(&journal.units[unit]).await?;
        self.start_again(journal, unit).await?;
        self.step(journal, unit, Step::RolledBack).await
    }

    /// Puts back each PV and template the journal holds the old object of (only those were
    /// swapped): the CSI PV is replaced by the FlexVolume one, created again with the same name
    /// and claimRef and its old reclaim policy. Then waits for the claims to be Bound again.
    pub(super) async fn swap_back(
        &mut self,
        journal: &mut Journal,
        unit: usize,
    ) -> anyhow::Result<()> {
        let record = journal.units[unit].clone();
        for m in &record.moves {
            let Some(old) = record.old_pvs.get(&m.name) else {
                continue;
            };
            // What the apply made of it, the only PV a rollback replaces.
            let made = twin::converted(old, "PersistentVolume")?;
            let mut old = old.clone();
            twin::fresh(&mut old);
            if let Some(policy) = &m.reclaim_policy {
                old["spec"]["persistentVolumeReclaimPolicy"] = json!(policy);
            }
            self.swap_pv(journal, unit, &m.name, false, old, &made["spec"])
                .await?;
        }
        for w in &record.templates {
            let Some(old) = record.old_templates.get(&w.to_string()) else {
                continue;
            };
            let made = twin::converted_template(w, old)?;
            self.set_template(&record, w, old, &[&made, old]).await?;
        }
        self.wait_claims_bound(&record).await
    }

    /// Retain back to what it was, on PVs that were never swapped (a swapped one was made with
    /// its old policy); each the PV the journal now records under the name.
    pub(super) async fn restore_reclaim(&self, record: &UnitRecord) -> anyhow::Result<()> {
        for m in &record.moves {
            if let Some(policy) = &m.reclaim_policy {
                self.set_reclaim(record, &m.name, policy).await?;
            }
        }
        Ok(())
    }
}
