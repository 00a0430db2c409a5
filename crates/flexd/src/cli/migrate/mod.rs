//! `flexd migrate`: FlexVolume PersistentVolumes and workloads as their CSI equivalents served
//! by `flexd serve` (the conversion is [`flexd::migrate`]; the cut-over is docs/migration.md).
//!
//! With `-f`, only converted objects are printed (the cut-over applies exactly them); every
//! other document is named on stderr as skipped. Any refusal prints every reason on stderr and
//! nothing on stdout. With `--plan`, `--apply`, `--resume` or `--rollback` it works on the
//! cluster itself ([`apply`] and its neighbours).

use std::collections::HashMap;
use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Args;
use flexvolume_host::{DriverName, Resolver};

use flexd::migrate::plan::{Selection, WorkloadRef};
use flexd::migrate::strategy::Requested;

use crate::settings::{parse_duration, Global, OutputFormat};

mod apply;
mod evict;
mod objects;
mod report;
mod rollback;
mod rolling;
mod store;
mod swap;
mod waits;

/// The command's line about exit statuses (as every command's `--help` ends with one).
pub const EXIT: &str = "Exit status: 0 converted and printed (-f), or planned, migrated, resumed or rolled back; 1 something cannot be converted (every reason on stderr, nothing on stdout), something selected was refused (the rest was migrated), or error (the journal keeps where it stopped); 2 bad usage.";

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["file", "plan", "apply", "resume", "rollback"])))]
#[command(group(clap::ArgGroup::new("selection").multiple(true).args(["all", "pvs", "namespaces", "workloads"])))]
pub struct MigrateArgs {
    /// The objects to convert: YAML or JSON, several documents or a `kind: List` (as `kubectl
    /// get -o yaml` prints them); `-` reads stdin. Prints them; changes nothing.
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with = "selection"
    )]
    pub file: Option<PathBuf>,
    /// Print what --apply would do with the selection, in the cluster; change nothing.
    #[arg(long, requires = "selection")]
    pub plan: bool,
    /// Migrate the selection in the cluster, unit by unit: Retain, then either scale to 0, wait
    /// for unmount and detach, swap the PVs (same names and claims) and templates, scale back,
    /// wait for Ready; or, rolling, swap them under the running pods and replace the pods one
    /// at a time (--strategy, docs/migration.md#strategies).
    #[arg(long, requires = "selection")]
    pub apply: bool,
    /// Go on with the migration (or rollback) the journal holds, after a run was stopped.
    #[arg(long, conflicts_with = "selection")]
    pub resume: bool,
    /// Put every unit the journal names back on FlexVolume, finished or not.
    #[arg(long, conflicts_with = "selection")]
    pub rollback: bool,
    /// Every FlexVolume PV and workload of the cluster.
    #[arg(long)]
    pub all: bool,
    /// The units that hold this PersistentVolume (repeatable).
    #[arg(long = "pv", value_name = "NAME")]
    pub pvs: Vec<String>,
    /// The units with a workload or claim in this namespace (repeatable).
    #[arg(long = "namespace", value_name = "NAMESPACE")]
    pub namespaces: Vec<String>,
    /// The unit that holds this workload (repeatable): NAMESPACE/KIND/NAME, KIND one of
    /// deployment, statefulset, replicaset.
    #[arg(long = "workload", value_name = "NAMESPACE/KIND/NAME", value_parser = WorkloadRef::parse_flag)]
    pub workloads: Vec<WorkloadRef>,
    /// Delete bare Pods (no controller to start them again) with their unit and create them
    /// again from their spec after the swap, inline volumes converted; without it they are
    /// refused.
    #[arg(long)]
    pub recreate_pods: bool,
    /// How each unit moves: rolling (swapped under its running pods, which are then evicted
    /// one at a time, PodDisruptionBudgets honoured, or rolled out by their Deployment: no
    /// downtime), scale-down (scaled to 0, swapped, scaled back), or auto: rolling where two
    /// pods may mount its volumes at once (ReadWriteMany or ReadOnlyMany, a driver that does
    /// not attach) and each workload keeps a pod up, else scale-down. The plan says which and
    /// why; a unit rolling cannot move safely is refused with --strategy rolling.
    #[arg(long, value_enum, default_value_t = StrategyArg::Auto, conflicts_with_all = ["file", "resume", "rollback"])]
    pub strategy: StrategyArg,
    /// Accept the plan without asking (needed when stdin is not a terminal).
    #[arg(long)]
    pub yes: bool,
    /// The cluster: this kubeconfig; default: KUBECONFIG, ~/.kube/config, or in-cluster.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Where the journal (ConfigMap flexd-migration) is kept: flexd's namespace.
    #[arg(long, value_name = "NAMESPACE", default_value = "flexd-system")]
    pub journal_namespace: String,
    /// How long one wait (pods gone, detached, Ready) may take before the run stops (the
    /// journal keeps where; --resume goes on).
    #[arg(long, value_parser = parse_duration, default_value = "10m")]
    pub wait_timeout: Duration,
    /// A driver known to attach, without probing it (repeatable). Only inline volumes need to
    /// know: an attaching driver's inline volume cannot become an inline CSI volume.
    #[arg(long, value_name = "VENDOR/DRIVER", value_parser = parse_driver_name)]
    pub attaching: Vec<DriverName>,
    /// A driver known not to attach, without probing it (repeatable; each driver once, in one
    /// of the two).
    #[arg(long, value_name = "VENDOR/DRIVER", value_parser = parse_driver_name)]
    pub not_attaching: Vec<DriverName>,
}

/// `--strategy`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StrategyArg {
    Auto,
    Rolling,
    ScaleDown,
}

impl From<StrategyArg> for Requested {
    fn from(arg: StrategyArg) -> Self {
        match arg {
            StrategyArg::Auto => Self::Auto,
            StrategyArg::Rolling => Self::Rolling,
            StrategyArg::ScaleDown => Self::ScaleDown,
        }
    }
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
    let selection = || Selection {
        all: args.all,
        recreate_pods: args.recreate_pods,
        pvs: args.pvs.iter().cloned().collect(),
        namespaces: args.namespaces.iter().cloned().collect(),
        workloads: args.workloads.iter().cloned().collect(),
        strategy: args.strategy.into(),
    };
    let mode = if args.plan {
        apply::Mode::Plan(selection())
    } else if args.apply {
        apply::Mode::Apply(selection())
    } else if args.resume {
        apply::Mode::Resume
    } else if args.rollback {
        apply::Mode::Rollback
    } else {
        return convert(global, args);
    };
    let options = apply::Options {
        kubeconfig: args.kubeconfig.as_deref(),
        journal_namespace: &args.journal_namespace,
        wait_timeout: args.wait_timeout,
        yes: args.yes,
        output: global.output,
    };
    apply::run(mode, &options)
}

/// `-f`: the objects of a file, converted and printed.
fn convert(global: &Global, args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let Some(file) = args.file else {
        return Err(super::usage_error(
            "migrate",
            clap::error::ErrorKind::MissingRequiredArgument,
            "one of -f, --plan, --apply, --resume, --rollback is needed",
        ));
    };
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
    let text = read_input(&file)?;
    let migration = match flexd::migrate::migrate(&text, &mut attaches) {
        Ok(migration) => migration,
        Err(refusals) => {
            for refusal in &refusals {
                eprintln!("flexd: cannot migrate {refusal}");
            }
            let n = refusals.len();
            bail!(
                "cannot migrate {}: {n} problem{} above; nothing was printed",
                file.display(),
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
