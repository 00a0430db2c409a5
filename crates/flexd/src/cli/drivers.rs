//! `flexd drivers`: probe once and list what is installed.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use flexvolume::prober::{self, Probed};
use flexvolume::Capabilities;
use serde::Serialize;

use crate::settings::{Global, OutputFormat};

#[derive(Debug, Args)]
pub struct DriversArgs {
    /// Timeout of each driver's init.
    #[arg(long, value_parser = crate::settings::parse_duration, default_value = "2m")]
    pub timeout: std::time::Duration,
}

/// One line of `flexd drivers --output json`.
#[derive(Debug, Serialize)]
pub struct DriverReport {
    pub name: String,
    pub dir: String,
    pub path: Option<String>,
    pub status: &'static str,
    pub error: Option<String>,
    pub capabilities: Option<Capabilities>,
}

impl DriverReport {
    pub fn from_probed(p: &Probed) -> Self {
        let (status, error, capabilities) = match &p.result {
            Ok(plugin) => ("ready", None, Some(plugin.capabilities)),
            Err(e) => ("failed", Some(e.to_string()), None),
        };
        Self {
            name: p.subject.label(),
            dir: p.dir.display().to_string(),
            path: p.path.as_ref().map(|p| p.display().to_string()),
            status,
            error,
            capabilities,
        }
    }
}

pub fn run(global: &Global, args: DriversArgs) -> anyhow::Result<ExitCode> {
    let config = global.runner_config()?.with_timeout_for_all(args.timeout);
    let probed = prober::probe_all(
        &global.plugin_dir,
        global.layout_policy(),
        &config,
        prober::default_parallelism(),
    )
    .with_context(|| format!("cannot read plugin dir {}", global.plugin_dir.display()))?;
    let reports: Vec<DriverReport> = probed.iter().map(DriverReport::from_probed).collect();
    match global.output {
        OutputFormat::Json => super::print_json(&reports)?,
        OutputFormat::Text => print_table(&reports),
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(reports: &[DriverReport]) {
    if reports.is_empty() {
        println!("no drivers");
        return;
    }
    let width = reports
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!("{:width$}  {:6}  {:6}  DETAIL", "NAME", "STATUS", "ATTACH");
    for r in reports {
        let attach = match &r.capabilities {
            Some(c) if c.attach => "yes",
            Some(_) => "no",
            None => "-",
        };
        let detail = r.error.as_deref().or(r.path.as_deref()).unwrap_or("");
        println!(
            "{:width$}  {:6}  {:6}  {}",
            r.name, r.status, attach, detail
        );
    }
}
