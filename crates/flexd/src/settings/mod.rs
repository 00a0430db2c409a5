//! What every part of the binary shares, whichever subcommand runs: the global flags (each
//! also read from the environment where a DaemonSet would set it), how drivers are run, logging
//! and termination signals. `serve` and the `cli/` subcommands take their settings from here,
//! so a flag means the same thing, is spelled the same way and has the same default everywhere.

pub mod exit;
pub mod logging;
pub mod signals;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use flexvolume_host::layout::{LayoutPolicy, DEFAULT_PLUGIN_DIR};

/// Where flexd keeps what must survive a crash to undo operations, unless told otherwise.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/flexd";

/// Flags every subcommand understands, before or after the subcommand's name.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub struct Global {
    /// The FlexVolume plugin dir (kubelet's --volume-plugin-dir).
    #[arg(long, global = true, env = "FLEXD_PLUGIN_DIR", default_value = DEFAULT_PLUGIN_DIR, value_parser = parse_dir)]
    pub plugin_dir: PathBuf,
    /// flexd's state: what must survive a crash to undo operations (volume records, locks,
    /// pinned driver copies). Every command that mounts, unmounts or removes drivers uses it.
    #[arg(long, global = true, env = "FLEXD_STATE_DIR", default_value = DEFAULT_STATE_DIR, value_parser = parse_dir)]
    pub state_dir: PathBuf,
    /// This node's name, as Kubernetes knows it (attach, detach, NodeGetInfo); default: the
    /// host name.
    // `--node` is how `flexd volume` spelled it first.
    #[arg(long, global = true, env = "NODE_NAME", alias = "node")]
    pub node_name: Option<String>,
    /// Accept driver executables that are symlinks resolving outside the plugin dir.
    #[arg(long, global = true)]
    pub allow_symlinks: bool,
    /// Output for humans (text) or for scripts (json).
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax, e.g. `debug` or `info,flexvolume_host=debug`). Given,
    /// it wins over RUST_LOG; not given: RUST_LOG, else `info`.
    #[arg(long, global = true, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// Minimum time between two processings of one driver directory (watch, serve).
    #[arg(long, global = true, value_parser = parse_duration, default_value = "1s")]
    pub probe_interval: Duration,
    /// Processes (threads included) one driver call-out may have at once, held by a cgroup of
    /// its own (`pids.max`); 0 runs drivers uncapped. Root ignores RLIMIT_NPROC, hence a cgroup.
    /// At most 4194303: the kernel has at most 4194304 processes, and a cgroup v1 cap counts
    /// flexd's spawner thread too.
    #[arg(long, global = true, env = "FLEXD_DRIVER_MAX_PROCESSES", default_value_t = flexvolume_host::runner::DEFAULT_MAX_PROCESSES.get(), value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(0..=MAX_DRIVER_PROCESSES))]
    pub driver_max_processes: u32,
    /// Run every driver call-out in the mount namespace at PATH (e.g. /proc/1/ns/mnt, with
    /// hostPID), so drivers find the host's tools and their mounts land where kubelet looks.
    /// flexd's own work stays in its own namespace: the plugin dir, the state dir and the
    /// volume paths must be the same directories, with mounts propagating both ways
    /// (Bidirectional), in both. Unset: drivers run in flexd's namespace.
    #[arg(
        long,
        global = true,
        env = "FLEXD_DRIVER_MOUNT_NAMESPACE",
        value_name = "PATH"
    )]
    pub driver_mount_namespace: Option<PathBuf>,
}

impl Global {
    /// How drivers are run, with the limits set on the command line. Fails when the driver
    /// mount namespace cannot be used, so a wrong one stops flexd at start.
    pub fn runner_config(&self) -> anyhow::Result<flexvolume_host::RunnerConfig> {
        let mount_namespace = match &self.driver_mount_namespace {
            None => None,
            Some(path) => {
                let namespace = flexvolume_host::runner::MountNamespace::open(path)?;
                // Drivers and their pinned copies are executed by these paths, from there.
                namespace.check_same_dirs(&[&self.plugin_dir, &self.state_dir])?;
                // Device mount dirs live there.
                warn_unless_propagated(&namespace, &self.state_dir);
                tracing::info!(namespace = %path.display(), "driver call-outs run in this mount namespace");
                Some(namespace)
            }
        };
        Ok(flexvolume_host::RunnerConfig {
            max_processes: std::num::NonZeroU32::new(self.driver_max_processes),
            mount_namespace,
            ..flexvolume_host::RunnerConfig::default()
        })
    }

    pub fn layout_policy(&self) -> LayoutPolicy {
        LayoutPolicy {
            allow_symlinks: self.allow_symlinks,
        }
    }

    /// `--node-name` (or NODE_NAME), else the host name, as kubelet defaults its node name.
    pub fn node_name(&self) -> String {
        self.node_name.clone().unwrap_or_else(|| {
            rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned()
        })
    }

    pub fn state(&self) -> flexvolume_host::state::StateDir {
        flexvolume_host::state::StateDir::new(&self.state_dir)
    }
}

/// Warns when mounts below `dir` do not travel both ways between flexd's namespace and the
/// drivers' (docs/lifecycle.md#driver-mount-namespace): flexd checks, walks and binds volumes
/// in its own view, drivers mount in theirs. A warning, not an error: flexd cannot know every
/// volume path in advance, and what is checked here is one directory's mount.
pub fn warn_unless_propagated(namespace: &flexvolume_host::runner::MountNamespace, dir: &Path) {
    use flexvolume_host::runner::Propagation;
    if !dir.exists() {
        return;
    }
    match namespace.propagation(dir) {
        Ok(Propagation::BothWays) => {
            tracing::debug!(dir = %dir.display(), "mounts below it propagate both ways");
        }
        Ok(Propagation::IntoFlexdOnly) => tracing::warn!(
            dir = %dir.display(),
            namespace = %namespace.path().display(),
            "mounts flexd makes itself below this directory (binds, format-and-mount) will not \
             reach the driver mount namespace: mount it with Bidirectional propagation"
        ),
        Ok(Propagation::Neither) => tracing::warn!(
            dir = %dir.display(),
            namespace = %namespace.path().display(),
            "mounts drivers make below this directory will not be visible to flexd, nor flexd's \
             own to them: mount it at the same path with Bidirectional propagation"
        ),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot tell whether mounts below it propagate")
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Tables and sentences.
    Text,
    /// One JSON document per result on stdout.
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per event, fields flattened (for log collectors).
    Json,
}

/// A directory flag, made absolute against the working directory once, at parsing: records
/// and call-outs keep paths that must mean the same directory whatever the working directory
/// of a later command or driver (a relative `--state-dir state` once broke detach, whose
/// record path the state dir refused as relative).
pub fn parse_dir(text: &str) -> Result<PathBuf, String> {
    if text.is_empty() {
        return Err("a directory is required, not an empty string".to_owned());
    }
    std::path::absolute(text).map_err(|e| format!("cannot make {text:?} absolute: {e}"))
}

/// Durations as written everywhere in the CLI: `500ms`, `2s`, `10m`.
/// The largest `--driver-max-processes`: the kernel's PID_MAX_LIMIT (the most `pids.max` takes)
/// less the spawner thread a cgroup v1 cap also counts. A larger one overflowed that `+ 1`.
pub const MAX_DRIVER_PROCESSES: u64 = 4_194_304 - 1;

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{e} (write durations like 500ms, 2s, 10m)"))
}
