//! `flexd drivers`: probe once and list what is installed.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use flexvolume_host::prober::{self, Probed, Subject};
use flexvolume_host::Capabilities;
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
    /// The name `flexd serve` serves it under (`None`: the name has no valid CSI form).
    #[serde(rename = "csiName")]
    pub csi_name: Option<String>,
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
        let csi_name = match &p.subject {
            Subject::Driver(name) => flexd::naming::csi_name(name).ok(),
            Subject::InvalidEntry { .. } => None,
        };
        Self {
            name: p.subject.label(),
            csi_name,
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
    let width = |column: fn(&DriverReport) -> usize, title: &str| {
        reports
            .iter()
            .map(column)
            .max()
            .unwrap_or(0)
            .max(title.len())
    };
    let name_width = width(|r| r.name.len(), "NAME");
    let csi_width = width(|r| r.csi_name.as_deref().map_or(1, str::len), "CSI NAME");
    println!(
        "{:name_width$}  {:6}  {:6}  {:csi_width$}  DETAIL",
        "NAME", "STATUS", "ATTACH", "CSI NAME"
    );
    for r in reports {
        let attach = match &r.capabilities {
            Some(c) if c.attach => "yes",
            Some(_) => "no",
            None => "-",
        };
        let detail = r.error.as_deref().or(r.path.as_deref()).unwrap_or("");
        println!(
            "{:name_width$}  {:6}  {:6}  {:csi_width$}  {}",
            r.name,
            r.status,
            attach,
            r.csi_name.as_deref().unwrap_or("-"),
            detail
        );
    }
}
