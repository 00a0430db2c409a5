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
use flexvolume_host::controller_records::{ControllerRecords, StateDirRecords};
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
    let source = StateDirRecords::new(StateDir::new(&args.from));
    let destination_root = global.state_dir.clone();
    let report = match args.controller_records {
        RecordsHome::StateDir => {
            anyhow::ensure!(
                destination_root != args.from,
                "--from is the --state-dir records are imported into"
            );
            let destination = StateDirRecords::new(StateDir::new(&destination_root));
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

/// Copies every readable record of `source` that `destination` does not have. Attachments
/// are re-keyed to `destination_root` (the destination's own state dir, whose locks they are
/// taken under), and lose their pinned driver copy, which stays in the old state dir: they are
/// detached with the installed driver. An unreadable record fails the import, naming it, so that
/// nothing is silently left behind.
pub fn copy(
    source: &StateDirRecords,
    destination: &dyn ControllerRecords,
    destination_root: &std::path::Path,
) -> anyhow::Result<ImportReport> {
    let mut report = ImportReport::default();
    for driver in source.drivers()? {
        for record in source.all_provisioned(&driver)? {
            let volume =
                record.with_context(|| format!("a provisioned record of driver {driver}"))?;
            let counts = match destination.provisioned(&driver, &volume.name)? {
                None => {
                    destination.save_provisioned(&driver, &volume)?;
                    &mut report.imported
                }
                Some(there) if there == volume => &mut report.already_there,
                Some(_) => &mut report.kept_newer,
            };
            counts.provisioned += 1;
        }
        for record in source.attachments(&driver)? {
            let mut record = record.with_context(|| format!("an attachment of driver {driver}"))?;
            record.target = flexvolume_host::controller_records::attachment_path(
                destination_root,
                &record.driver,
                &record.volume_name,
                &record.node,
            )?;
            record.pinned = None;
            let counts = match destination.attachment(&driver, &record.volume_name, &record.node)? {
                None => {
                    destination.save_attachment(&record)?;
                    &mut report.imported
                }
                Some(there) if there == record => &mut report.already_there,
                Some(_) => &mut report.kept_newer,
            };
            counts.attachments += 1;
        }
    }
    Ok(report)
}
