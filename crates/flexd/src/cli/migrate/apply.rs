//! `flexd migrate --plan | --apply | --resume | --rollback`: the cut-over of docs/migration.md
//! done against the API server, unit by unit, with its journal in the API server
//! (docs/migration.md#apply). The plan, the journal and whether an object may be changed are
//! pure (`flexd::migrate::{plan, journal, guard}`); these files are their I/O: the engine's
//! steps here, the journal's store ([`super::store`]), reading the objects
//! ([`super::objects`]), changing them ([`super::swap`]), the waits ([`super::waits`]), the
//! rollback ([`super::rollback`]), the rolling strategy ([`super::rolling`], its pods replaced
//! by [`super::evict`]) and what the command says ([`super::report`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Context as _};
use flexd::migrate::journal::{self, Journal, Operation, Step};
use flexd::migrate::plan::Selection;
use flexd::migrate::strategy::Strategy;
use flexd::migrate::twin;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

use super::report::{confirm, exit_for};
use crate::settings::{logging, OutputFormat};

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

pub(super) struct Migrator {
    pub(super) client: kube::Client,
    pub(super) journal: Api<ConfigMap>,
    pub(super) journal_namespace: String,
    /// The journal's resourceVersion as last read or written: every write is conditional on
    /// it, so two runs cannot both go on with one journal.
    pub(super) journal_version: Option<String>,
    pub(super) wait_timeout: Duration,
    pub(super) output: OutputFormat,
    /// The progress bar, on a terminal.
    pub(super) bar: Option<logging::ProgressGuard>,
}

pub(super) fn now_unix() -> f64 {
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

pub(super) fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

impl Migrator {
    async fn run(mut self, mode: Mode, options: &Options<'_>) -> anyhow::Result<ExitCode> {
        match mode {
            Mode::Plan(selection) => {
                let plan = self.plan_for(&selection).await?;
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
                            self.journal_namespace,
                            journal::NAME
                        );
                    }
                }
                let plan = self.plan_for(&selection).await?;
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
                self.verify(&journal, journal.operation).await?;
                self.check_evictions(&journal, journal.operation).await?;
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
                self.verify(&journal, Operation::Rollback).await?;
                self.check_evictions(&journal, Operation::Rollback).await?;
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
        self.finish(journal, "migrated").await
    }

    /// The journal marked finished and saved, then the summary: the end of an apply and of a
    /// rollback alike.
    pub(super) async fn finish(&mut self, journal: &mut Journal, done: &str) -> anyhow::Result<()> {
        journal.finished = true;
        self.save(journal).await?;
        self.bar = None;
        self.summary(journal, done);
        Ok(())
    }

    async fn apply_unit(&mut self, journal: &mut Journal, unit: usize) -> anyhow::Result<()> {
        if journal.units[unit].strategy == Strategy::Rolling {
            return self.rolling_unit(journal, unit).await;
        }
        if journal.units[unit].step < Step::Retained {
            let record = journal.units[unit].clone();
            for m in &record.moves {
                self.set_reclaim(&record, &m.name, "Retain").await?;
            }
            self.step(journal, unit, Step::Retained).await?;
        }
        if journal.units[unit].step < Step::ScalingDown {
            let record = &journal.units[unit];
            let mut replicas = BTreeMap::new();
            for w in &record.workloads {
                replicas.insert(w.to_string(), self.replicas(record, w).await?);
            }
            let attached = self.attached_now(record).await?;
            let old_pods = self.bare_pods(record).await?;
            let record = &mut journal.units[unit];
            record.old_pods = old_pods;
            record.replicas = replicas;
            record.attached_before = attached;
            record.down_since = Some(now_unix());
            self.step(journal, unit, Step::ScalingDown).await?;
        }
        if journal.units[unit].step < Step::ScaledDown {
            let record = journal.units[unit].clone();
            for w in &record.workloads {
                self.scale(&record, w, 0).await?;
            }
            self.delete_bare_pods(&record).await?;
            self.step(journal, unit, Step::ScaledDown).await?;
        }
        if journal.units[unit].step < Step::Stopped {
            self.wait_stopped(&journal.units[unit]).await?;
            self.wait_flex_detached(&journal.units[unit]).await?;
            self.step(journal, unit, Step::Stopped).await?;
        }
        if journal.units[unit].step < Step::Swapping {
            self.record_old(journal, unit).await?;
            self.step(journal, unit, Step::Swapping).await?;
        }
        if journal.units[unit].step < Step::Swapped {
            self.swap_to_csi(journal, unit).await?;
            self.step(journal, unit, Step::Swapped).await?;
        }
        if journal.units[unit].step < Step::Done {
            self.start_again(journal, unit).await?;
            self.step(journal, unit, Step::Done).await?;
        }
        Ok(())
    }

    /// Journals the unit's FlexVolume PVs and its templates as they are before the swap: what
    /// the swap converts and a rollback puts back.
    pub(super) async fn record_old(
        &mut self,
        journal: &mut Journal,
        unit: usize,
    ) -> anyhow::Result<()> {
        let record = &journal.units[unit];
        let mut old_pvs = BTreeMap::new();
        for m in &record.moves {
            old_pvs.insert(m.name.clone(), self.flex_pv(record, &m.name).await?);
        }
        let mut old_templates = BTreeMap::new();
        for w in &record.templates {
            old_templates.insert(w.to_string(), self.template(record, w).await?);
        }
        let record = &mut journal.units[unit];
        record.old_pvs = old_pvs;
        record.old_templates = old_templates;
        Ok(())
    }

    /// Swaps each journaled PV for its CSI twin (same name and claimRef) and rewrites each
    /// template, then waits for the claims to be Bound again.
    pub(super) async fn swap_to_csi(
        &mut self,
        journal: &mut Journal,
        unit: usize,
    ) -> anyhow::Result<()> {
        let record = journal.units[unit].clone();
        for m in &record.moves {
            let old = record
                .old_pvs
                .get(&m.name)
                .ok_or_else(|| anyhow!("the journal lost PersistentVolume {}", m.name))?;
            let new = twin::converted(old, "PersistentVolume")?;
            self.swap_pv(journal, unit, &m.name, true, new, &old["spec"])
                .await?;
        }
        for w in &record.templates {
            let old = record
                .old_templates
                .get(&w.to_string())
                .ok_or_else(|| anyhow!("the journal lost {w}'s template"))?;
            let new = twin::converted_template(w, old)?;
            self.set_template(&record, w, &new, &[old, &new]).await?;
        }
        self.wait_claims_bound(&record).await
    }

    /// Scales the unit back and waits until it is Ready; records the downtime.
    pub(super) async fn start_again(
        &mut self,
        journal: &mut Journal,
        unit: usize,
    ) -> anyhow::Result<()> {
        let record = journal.units[unit].clone();
        for w in &record.workloads {
            let replicas = record.replicas.get(&w.to_string()).copied().unwrap_or(0);
            self.scale(&record, w, replicas).await?;
        }
        let converted_pods = journal.operation == Operation::Apply;
        for (name, old) in &record.old_pods {
            self.create_pod(journal, unit, name, old, converted_pods)
                .await?;
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
}
