//! `flexd migrate`: FlexVolume PersistentVolumes and workloads as their CSI equivalents served
//! by `flexd serve` (the conversion is [`flexd::migrate`]; the cut-over is docs/migration.md).
//!
//! Only converted objects are printed (the cut-over applies exactly them); every other
//! document is named on stderr as skipped. Any refusal prints every reason on stderr and
//! nothing on stdout.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::Args;
use flexvolume_host::{DriverName, Resolver};

use crate::settings::{Global, OutputFormat};

/// The command's line about exit statuses (as every command's `--help` ends with one).
pub const EXIT: &str = "Exit status: 0 converted and printed, 1 something cannot be converted (every reason on stderr, nothing on stdout) or error, 2 bad usage.";

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The objects to convert: YAML or JSON, several documents or a `kind: List` (as `kubectl
    /// get -o yaml` prints them); `-` reads stdin.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
    /// A driver known to attach, without probing it (repeatable). Only inline volumes need to
    /// know: an attaching driver's inline volume cannot become an inline CSI volume.
    #[arg(long, value_name = "VENDOR/DRIVER", value_parser = parse_driver_name)]
    pub attaching: Vec<DriverName>,
    /// A driver known not to attach, without probing it (repeatable; each driver once, in one
    /// of the two).
    #[arg(long, value_name = "VENDOR/DRIVER", value_parser = parse_driver_name)]
    pub not_attaching: Vec<DriverName>,
}

fn parse_driver_name(text: &str) -> Result<DriverName, String> {
    DriverName::parse(text).map_err(|e| e.to_string())
}

fn read_input(file: &PathBuf) -> anyhow::Result<String> {
    if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read stdin")?;
        return Ok(text);
    }
    std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))
}

pub fn run(global: &Global, args: MigrateArgs) -> anyhow::Result<ExitCode> {
    // Whether a driver attaches: what the flags say, else its init in the plugin dir.
    let mut known: HashMap<DriverName, Result<bool, String>> = HashMap::new();
    for (names, attaches) in [(&args.attaching, true), (&args.not_attaching, false)] {
        for name in names {
            if known.insert(name.clone(), Ok(attaches)).is_some() {
                return Err(super::usage_error(
                    "migrate",
                    clap::error::ErrorKind::ArgumentConflict,
                    format!("driver {name} is given more than once to --attaching/--not-attaching"),
                ));
            }
        }
    }
    let resolver = Resolver::probing(
        global.runner_config()?,
        global.plugin_dir.clone(),
        global.layout_policy(),
    );
    let mut attaches = |driver: &DriverName| {
        known
            .entry(driver.clone())
            .or_insert_with(|| {
                resolver
                    .find(driver, || 0)
                    .map(|plugin| plugin.capabilities.attach)
                    .map_err(|e| format!("{e}; plugin dir {}", global.plugin_dir.display()))
            })
            .clone()
    };
    let text = read_input(&args.file)?;
    let migration = match flexd::migrate::migrate(&text, &mut attaches) {
        Ok(migration) => migration,
        Err(refusals) => {
            for refusal in &refusals {
                eprintln!("flexd: cannot migrate {refusal}");
            }
            let n = refusals.len();
            bail!(
                "cannot migrate {}: {n} problem{} above; nothing was printed",
                args.file.display(),
                if n == 1 { "" } else { "s" }
            );
        }
    };
    for note in &migration.notes {
        eprintln!("flexd: {note}");
    }
    match global.output {
        OutputFormat::Text => print!("{}", migration.to_yaml()),
        OutputFormat::Json => super::print_json(&migration.to_json_list())?,
    }
    Ok(ExitCode::SUCCESS)
}
