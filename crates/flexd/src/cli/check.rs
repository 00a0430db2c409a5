//! `flexd check --driver DRIVER`: prints the conformance report of [`flexvolume_host::check`] (a table, or
//! JSON with `--output json`); the exit status is 0 only when every required check passed.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use flexvolume_host::check::{Report, Verdict};
use flexvolume_host::{layout, DriverName};

use crate::settings::{Global, OutputFormat};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The driver to check: vendor/driver.
    #[arg(
        long = "driver",
        value_name = "VENDOR/DRIVER",
        required_unless_present = "driver_word",
        conflicts_with = "driver_word"
    )]
    pub driver: Option<String>,
    // The first spelling, `flexd check vendor/driver`, still works.
    #[arg(hide = true, value_name = "VENDOR/DRIVER")]
    pub driver_word: Option<String>,
    /// Timeout of each call-out.
    #[arg(long, value_parser = crate::settings::parse_duration, default_value = "2m")]
    pub timeout: Duration,
    /// Options of the scratch volume used by the checks (JSON object of strings).
    #[arg(long, default_value = "{}")]
    pub options: String,
}

fn parse_options(text: &str) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    serde_json::from_str(text)
        .context("--options must be a JSON object of strings, e.g. {\"server\":\"nfs.example\"}")
}

pub fn run(global: &Global, args: CheckArgs) -> anyhow::Result<ExitCode> {
    let wanted = args.driver.or(args.driver_word).unwrap_or_default();
    let name = DriverName::parse(&wanted)?;
    let driver = layout::locate(&global.plugin_dir, &name, global.layout_policy())
        .with_context(|| format!("driver {name} is not usable"))?;
    let config = global.runner_config()?.with_timeout_for_all(args.timeout);
    let options = parse_options(&args.options)?;
    let report = flexvolume_host::check::run(&driver, &config, options);
    match global.output {
        OutputFormat::Json => super::print_json(&report)?,
        OutputFormat::Text => print_table(&report),
    }
    Ok(outcome(&report).0)
}

/// The exit status and closing line of a report: 3 (a definite "not conclusive", not an error)
/// when nothing failed but the mount checks could not run without options.
fn outcome(report: &Report) -> (ExitCode, &'static str) {
    let failed = report
        .checks
        .iter()
        .any(|c| c.required && c.verdict == Verdict::Fail);
    if report.passed {
        (ExitCode::SUCCESS, "all required checks passed")
    } else if report.needs_options && !failed {
        (
            ExitCode::from(crate::settings::exit::NO),
            "nothing failed, but the mount checks NEED OPTIONS the driver did not get: rerun with --options",
        )
    } else {
        (ExitCode::from(1), "some required checks FAILED")
    }
}

fn print_table(report: &Report) {
    println!("driver {} ({})", report.driver, report.path);
    let width = report
        .checks
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(5);
    for c in &report.checks {
        let verdict = match c.verdict {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Warn => "WARN",
            Verdict::Skip => "SKIP",
            Verdict::NeedsOptions => "NEEDS OPTIONS",
        };
        let kind = if c.required { "required" } else { "advisory" };
        println!(
            "{verdict}  {:width$}  {kind:8}  {:>8.1} ms  {}",
            c.name, c.ms, c.detail
        );
    }
    println!("{}", outcome(report).1);
}
