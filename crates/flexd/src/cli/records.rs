//! `flexd records import`: the controller's records (docs/csi.md#controller-records) that an
//! older controller kept in its state dir (the claim it ran on before it had replicas), copied to
//! where this flexd keeps them: the API server with `--controller-records=kubernetes`, the
//! global `--state-dir` otherwise. Run once, before the new controller serves
//! (docs/operator-guide.md#upgrade-state-claim); running it again changes nothing.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use flexvolume_host::controller_records::{
    legacy_records, ControllerRecord, RecordStore, StateDirStore,
};
use flexvolume_host::state::StateDir;
use serde::Serialize;

use crate::serve::{kubernetes_records, RecordsHome};
use crate::settings::{Global, OutputFormat};

#[derive(Debug, Args)]
pub struct RecordsArgs {
    #[command(subcommand)]
    pub command: RecordsCommand,
}

#[derive(Debug, Subcommand)]
pub enum RecordsCommand {
    /// Copy an older controller's records from its state dir to where this flexd keeps them.
    #[command(after_help = crate::settings::exit::PLAIN)]
    Import(ImportArgs),
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The older controller's state dir (its claim, mounted read-only).
    #[arg(long, value_name = "DIR", value_parser = crate::settings::parse_dir)]
    pub from: PathBuf,
    /// Where the records go: the global --state-dir, or the API server.
    #[arg(long, value_enum, default_value_t = RecordsHome::StateDir)]
    pub controller_records: RecordsHome,
    /// With --controller-records=kubernetes: the directory holding the controller's own
    /// `token`, `ca.crt` and `namespace`.
    #[arg(long, value_name = "DIR", default_value = kubernetes_records::DEFAULT_CREDENTIALS)]
    pub records_credentials: PathBuf,
}

/// What an import did, by kind of record.
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct ImportReport {
    /// Copied: the destination had none.
    pub imported: Counts,
    /// The destination had the same record already (an import run before).
    pub already_there: Counts,
    /// The destination had another record under the same key, which is newer (the new
    /// controller wrote it): kept.
    pub kept_newer: Counts,
}

#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct Counts {
    pub attachments: usize,
    pub provisioned: usize,
}

pub fn run(global: &Global, args: RecordsArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        RecordsCommand::Import(args) => import(global, args),
    }
}

fn import(global: &Global, args: ImportArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.from.is_dir(),
        "--from {}: no such directory (the older controller's state dir)",
        args.from.display()
    );
    let source = StateDirStore::new(StateDir::new(&args.from));
    let destination_root = global.state_dir.clone();
    let report = match args.controller_records {
        RecordsHome::StateDir => {
            anyhow::ensure!(
                destination_root != args.from,
                "--from is the --state-dir records are imported into"
            );
            let destination = StateDirStore::new(StateDir::new(&destination_root));
            copy(&source, &destination, &destination_root)?
        }
        RecordsHome::Kubernetes => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            let destination =
                Arc::new(runtime.block_on(kubernetes_records::connect(&args.records_credentials))?);
            let copying = destination.clone();
            runtime.block_on(async move {
                tokio::task::spawn_blocking(move || copy(&source, &*copying, &destination_root))
                    .await
                    .context("the import did not finish")?
            })?
        }
    };
    match global.output {
        OutputFormat::Json => super::print_json(&report)?,
        OutputFormat::Text => println!(
            "imported {} attachments and {} provisioned volumes from {}; already there: {} and {}; newer kept: {} and {}",
            report.imported.attachments,
            report.imported.provisioned,
            args.from.display(),
            report.already_there.attachments,
            report.already_there.provisioned,
            report.kept_newer.attachments,
            report.kept_newer.provisioned,
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// Every record of the state dir `source`: those this flexd writes and those an older one did
/// (`legacy_records`). An unreadable record fails, naming it, so that nothing is silently left
/// behind.
fn source_records(source: &StateDirStore) -> anyhow::Result<Vec<ControllerRecord>> {
    let mut records = Vec::new();
    for record in legacy_records(&source.state)? {
        records.push(record.context("a record of an older controller")?);
    }
    for driver in source.drivers()? {
        let mut from = None;
        loop {
            let page = source.page(&driver, from.as_deref(), 500)?;
            for stored in page.records {
                records.push(
                    stored
                        .with_context(|| format!("a record of driver {driver}"))?
                        .record,
                );
            }
            match page.next {
                Some(next) => from = Some(next),
                None => break,
            }
        }
    }
    Ok(records)
}

/// Copies every readable record of `source` that `destination` does not have, volume by volume,
/// each with one write from the version read (a conflict fails the import: run it again).
/// Attachments are re-keyed to `destination_root` (the destination's own state dir, whose locks
/// they are taken under), and lose their pinned driver copy, which stays in the old state dir:
/// they are detached with the installed driver. A fence is never copied.
pub fn copy(
    source: &StateDirStore,
    destination: &dyn RecordStore,
    destination_root: &std::path::Path,
) -> anyhow::Result<ImportReport> {
    let mut report = ImportReport::default();
    for record in source_records(source)? {
        let driver = flexvolume_host::DriverName::parse(&record.driver)
            .with_context(|| format!("the driver of record {:?}", record.volume))?;
        let stored = destination.read(&driver, &record.volume)?;
        let (mut there, version) = match stored {
            Some(s) => (s.record, Some(s.version)),
            None => (ControllerRecord::new(&driver, &record.volume), None),
        };
        anyhow::ensure!(
            there.is_of(&driver, &record.volume),
            "the destination's record of volume {} of driver {driver} holds another volume",
            record.volume
        );
        let mut changed = false;
        if let Some(volume) = record.provisioned {
            let counts = match &there.provisioned {
                None => {
                    there.provisioned = Some(volume);
                    changed = true;
                    &mut report.imported
                }
                Some(kept) if *kept == volume => &mut report.already_there,
                Some(_) => &mut report.kept_newer,
            };
            counts.provisioned += 1;
        }
        for (node, mut attachment) in record.attachments {
            attachment.target = flexvolume_host::controller_records::attachment_path(
                destination_root,
                &attachment.driver,
                &attachment.volume_name,
                &attachment.node,
            )?;
            attachment.pinned = None;
            let counts = match there.attachments.get(&node) {
                None => {
                    there.attachments.insert(node, attachment);
                    changed = true;
                    &mut report.imported
                }
                Some(kept) if *kept == attachment => &mut report.already_there,
                Some(_) => &mut report.kept_newer,
            };
            counts.attachments += 1;
        }
        if changed {
            destination.write(&there, version.as_ref())?;
        }
    }
    Ok(report)
}
