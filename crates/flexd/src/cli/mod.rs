//! Subcommands. Output is for humans by default and JSON with `--output json` (`-o json`).
//! Their shared flags, logging and signals live in [`crate::settings`].

pub mod call;
pub mod check;
pub mod completions;
pub mod drivers;
pub mod install;
pub mod kubeconfig;
pub mod manifests;
pub mod migrate;
pub mod ownership;
pub mod preflight;
pub mod records;
pub mod volume;
pub mod watch;

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{Parser, Subcommand};

use crate::settings::{exit, Global};

#[derive(Debug, Parser)]
#[command(
    name = "flexd",
    version = env!("FLEXD_VERSION"),
    about = "Discover, run and serve FlexVolume drivers",
    after_help = exit::ALL
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Probe the plugin dir once (every driver's init, in parallel) and list the drivers.
    #[command(after_help = exit::DRIVERS)]
    Drivers(drivers::DriversArgs),
    /// Run one call-out of a driver and print its parsed reply.
    #[command(
        after_help = exit::CALL,
        override_usage = "flexd call [OPTIONS] --driver <VENDOR/DRIVER> <CALLOUT> [ARGS]..."
    )]
    Call(call::CallArgs),
    /// Mount, unmount and list volumes: kubelet's node flow for one volume.
    #[command(after_help = exit::VOLUME)]
    Volume(volume::VolumeArgs),
    /// Print every driver install, update and removal as it happens.
    #[command(after_help = exit::UNTIL_SIGNAL)]
    Watch(watch::WatchArgs),
    /// Install a driver (file or directory) atomically into the plugin dir.
    #[command(after_help = exit::INSTALL)]
    Install(install::InstallArgs),
    /// Remove an installed driver.
    #[command(after_help = exit::PLAIN)]
    Uninstall(install::UninstallArgs),
    /// Check a driver's conformance to the protocol (a report for driver authors).
    #[command(
        after_help = exit::CHECK,
        override_usage = "flexd check [OPTIONS] --driver <VENDOR/DRIVER>"
    )]
    Check(check::CheckArgs),
    /// Give a directory tree a group the way SetUp(fsGroup) does (parallel, skips what is right).
    Ownership(ownership::OwnershipArgs),
    /// Serve every discovered driver to Kubernetes through CSI.
    #[command(after_help = exit::UNTIL_SIGNAL)]
    Serve(crate::serve::ServeArgs),
    /// The CSI controller's records: import those an older controller kept in its state dir.
    Records(records::RecordsArgs),
    /// Migrate FlexVolume PVs and workloads to CSI: plan, apply, resume or roll back in the
    /// cluster, or convert objects from a file (-f).
    #[command(after_help = migrate::EXIT)]
    Migrate(migrate::MigrateArgs),
    /// Check this node before deploying flexd: kernel, cgroups, plugin and kubelet dirs, mount
    /// propagation, SELinux, loop devices, tools; with --cluster, the Kubernetes version and
    /// kube-controller-manager too. Each finding with what to do.
    #[command(after_help = exit::PREFLIGHT)]
    Preflight(preflight::PreflightArgs),
    /// Print the Kubernetes objects that deploy flexd for the drivers (YAML, multi-document).
    #[command(after_help = exit::MANIFESTS)]
    Manifests(Box<manifests::ManifestsArgs>),
    /// Print a shell completion script for flexd on stdout.
    #[command(after_help = exit::PLAIN)]
    Completions(completions::CompletionsArgs),
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
        Command::Records(args) => records::run(&cli.global, args),
        Command::Migrate(args) => migrate::run(&cli.global, args),
        Command::Preflight(args) => preflight::run(&cli.global, args),
        Command::Manifests(args) => manifests::run(&cli.global, *args),
        Command::Completions(args) => completions::run(args),
    }
}

/// Bad usage found after parsing (one flag against another, or a global flag a command cannot
/// take): clap's own error for `subcommand`, which `main` prints with exit status 2, as clap
/// does for every other bad usage.
pub fn usage_error(
    subcommand: &str,
    kind: ErrorKind,
    message: impl std::fmt::Display,
) -> anyhow::Error {
    let mut command = <Cli as clap::CommandFactory>::command();
    command.build();
    let error = match command.find_subcommand_mut(subcommand) {
        Some(sub) => sub.error(kind, message),
        None => command.error(kind, message),
    };
    anyhow::Error::new(error)
}

/// Prints a value as one line of JSON on stdout.
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(value)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::CommandFactory as _;

    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Walks the whole tree, subcommands of subcommands too, after clap has propagated the
    /// global flags and added its own.
    #[test]
    fn every_argument_of_every_command_has_help() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let helped = arg.get_help().or(arg.get_long_help()).is_some();
                if !arg.is_hide_set() && !helped {
                    missing.push(format!("`{path}`: {}", arg.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                if sub.get_about().is_none() {
                    missing.push(format!("`{path} {}` (the command)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut command = Cli::command();
        command.build();
        let mut missing = Vec::new();
        walk(&command, "flexd", &mut missing);
        assert!(
            missing.is_empty(),
            "no help text for: {}",
            missing.join(", ")
        );
    }

    #[test]
    fn every_command_says_its_exit_statuses() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for sub in command.get_subcommands().filter(|s| s.get_name() != "help") {
                let path = format!("{path} {}", sub.get_name());
                let says = sub
                    .get_after_help()
                    .is_some_and(|h| h.to_string().contains("Exit status"));
                // A command with subcommands may leave it to them.
                if !says && !sub.has_subcommands() {
                    missing.push(path.clone());
                }
                walk(sub, &path, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "flexd", &mut missing);
        assert!(missing.is_empty(), "no exit statuses in: {missing:?}");
    }

    #[test]
    fn state_dir_and_node_name_are_global_and_the_old_spellings_still_parse() {
        let cli = parse(&[
            "flexd",
            "volume",
            "--node",
            "n1",
            "--state-dir",
            "/s",
            "list",
        ]);
        assert_eq!(cli.global.node_name.as_deref(), Some("n1"));
        assert_eq!(cli.global.state_dir, Path::new("/s"));
        let cli = parse(&["flexd", "--node-name", "n2", "volume", "list"]);
        assert_eq!(cli.global.node_name(), "n2");
        let cli = parse(&["flexd", "uninstall", "--driver", "a/b", "--state-dir", "/u"]);
        assert_eq!(cli.global.state_dir, Path::new("/u"));
        let cli = parse(&["flexd", "serve", "--state-dir", "/v", "--node-name", "n3"]);
        assert_eq!(
            (cli.global.state_dir.as_path(), cli.global.node_name()),
            (Path::new("/v"), "n3".to_owned())
        );
        let cli = parse(&["flexd", "-o", "json", "drivers"]);
        assert_eq!(cli.global.output, crate::settings::OutputFormat::Json);
    }

    #[test]
    fn the_driver_is_a_flag_everywhere_and_the_positional_spelling_still_works() {
        for args in [
            &["flexd", "check", "--driver", "a/b"][..],
            &["flexd", "check", "a/b"],
        ] {
            let Command::Check(check) = parse(args).command else {
                panic!("{args:?}")
            };
            assert_eq!(check.driver.or(check.driver_word).as_deref(), Some("a/b"));
        }
        assert!(Cli::try_parse_from(["flexd", "check"]).is_err());
        assert!(Cli::try_parse_from(["flexd", "check", "--driver", "a/b", "c/d"]).is_err());
        // The JSON argument starts with `{`, a later one may start with `-`.
        assert!(Cli::try_parse_from(["flexd", "call", "--driver", "a/b"]).is_err());
        for args in [
            &[
                "flexd", "call", "--driver", "a/b", "mount", "/t", "{}", "-x",
            ][..],
            &["flexd", "call", "a/b", "mount", "/t", "{}", "-x"],
        ] {
            let Command::Call(call) = parse(args).command else {
                panic!("{args:?}")
            };
            let (driver, callout, rest) = call.split().unwrap();
            assert_eq!(
                (driver.as_str(), callout.as_str()),
                ("a/b", "mount"),
                "{args:?}"
            );
            assert_eq!(rest, ["/t", "{}", "-x"], "{args:?}");
        }
    }
}
