//! Subcommands. Output is for humans by default and JSON with `--output json`.

pub mod call;
pub mod check;
pub mod drivers;
pub mod install;
pub mod logging;
pub mod ownership;
pub mod signals;
pub mod volume;
pub mod watch;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use flexvolume::layout::{LayoutPolicy, DEFAULT_PLUGIN_DIR};

#[derive(Debug, Parser)]
#[command(
    name = "flexd",
    version,
    about = "Discover, run and serve FlexVolume drivers"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every subcommand understands.
#[derive(Debug, Args)]
pub struct Global {
    /// The FlexVolume plugin dir (kubelet's --volume-plugin-dir).
    #[arg(long, global = true, env = "FLEXD_PLUGIN_DIR", default_value = DEFAULT_PLUGIN_DIR)]
    pub plugin_dir: PathBuf,
    /// Accept driver executables that are symlinks resolving outside the plugin dir.
    #[arg(long, global = true)]
    pub allow_symlinks: bool,
    /// Output for humans (text) or for scripts (json).
    #[arg(long, global = true, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Minimum time between two processings of one driver directory.
    #[arg(long, global = true, value_parser = parse_duration, default_value = "1s")]
    pub probe_interval: Duration,
    /// Log filter (tracing EnvFilter syntax, e.g. `info` or `flexvolume=debug`); RUST_LOG wins.
    #[arg(long, global = true, default_value = "info")]
    pub log_level: String,
    /// Processes (threads included) one driver call-out may have at once, held by a cgroup of
    /// its own (`pids.max`); 0 runs drivers uncapped. Root ignores RLIMIT_NPROC, hence a cgroup.
    #[arg(long, global = true, env = "FLEXD_DRIVER_MAX_PROCESSES", default_value_t = flexvolume::runner::DEFAULT_MAX_PROCESSES.get())]
    pub driver_max_processes: u32,
}

impl Global {
    /// How drivers are run, with the limits set on the command line.
    pub fn runner_config(&self) -> flexvolume::RunnerConfig {
        flexvolume::RunnerConfig {
            max_processes: std::num::NonZeroU32::new(self.driver_max_processes),
            ..flexvolume::RunnerConfig::default()
        }
    }

    pub fn layout_policy(&self) -> LayoutPolicy {
        LayoutPolicy {
            allow_symlinks: self.allow_symlinks,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Probe the plugin dir once (every driver's init, in parallel) and list the drivers.
    Drivers(drivers::DriversArgs),
    /// Run one call-out of a driver and print its parsed reply.
    Call(call::CallArgs),
    /// Mount, unmount and list volumes: kubelet's node flow for one volume.
    Volume(volume::VolumeArgs),
    /// Print every driver install, update and removal as it happens.
    Watch(watch::WatchArgs),
    /// Install a driver (file or directory) atomically into the plugin dir.
    Install(install::InstallArgs),
    /// Remove an installed driver.
    Uninstall(install::UninstallArgs),
    /// Check a driver's conformance to the protocol (a report for driver authors).
    Check(check::CheckArgs),
    /// Give a directory tree a group the way SetUp(fsGroup) does (parallel, skips what is right).
    Ownership(ownership::OwnershipArgs),
    /// Serve every discovered driver to Kubernetes through CSI.
    Serve(crate::serve::ServeArgs),
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Drivers(args) => drivers::run(&cli.global, args),
        Command::Call(args) => call::run(&cli.global, args),
        Command::Volume(args) => volume::run(&cli.global, args),
        Command::Watch(args) => watch::run(&cli.global, args),
        Command::Install(args) => install::run_install(&cli.global, args),
        Command::Uninstall(args) => install::run_uninstall(&cli.global, args),
        Command::Check(args) => check::run(&cli.global, args),
        Command::Ownership(args) => ownership::run(&cli.global, args),
        Command::Serve(args) => crate::serve::run(&cli.global, args),
    }
}

/// Durations as written everywhere in the CLI: `500ms`, `2s`, `10m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{e} (write durations like 500ms, 2s, 10m)"))
}

/// Prints a value as one line of JSON on stdout.
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(value)?);
    Ok(())
}
