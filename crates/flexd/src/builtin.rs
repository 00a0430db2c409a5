//! Drivers shipped inside the flexd executable, so a fresh machine has a real driver to run.
//!
//! flexd is a multi-call binary: invoked under a builtin driver's executable name (argv[0]'s
//! file name, as when `flexd install --builtin loop` has copied it to
//! `<plugin-dir>/flexd~loop/loop`), it is that driver and nothing else — no CLI parsing, no
//! logging, only the reply on stdout.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::ValueEnum;

/// The drivers flexd carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Builtin {
    /// File-backed block volumes on loop devices (crate flexvolume-loop).
    Loop,
}

impl Builtin {
    /// The name volume specs use (`flexVolume.driver`).
    pub fn driver_name(self) -> &'static str {
        match self {
            Self::Loop => "flexd/loop",
        }
    }

    /// What `flexd install --builtin` copies: the standalone `flexd-<driver>` built beside
    /// flexd when there is one (a fraction of flexd's size, which matters because flexd pins
    /// a copy of a driver for every mounted volume), else flexd's own executable.
    pub fn executable(self) -> std::io::Result<PathBuf> {
        let flexd = std::env::current_exe()?;
        let standalone = flexd.with_file_name(format!("flexd-{}", self.executable_name()));
        Ok(match std::fs::metadata(&standalone) {
            Ok(meta) if meta.is_file() => standalone,
            _ => flexd,
        })
    }

    /// The executable's file name in the plugin dir, which selects the driver at start.
    fn executable_name(self) -> &'static str {
        match self {
            Self::Loop => "loop",
        }
    }

    fn run(self, args: &[OsString]) -> ExitCode {
        match self {
            Self::Loop => {
                flexvolume_driver::run_with_args(&flexvolume_loop::LoopDriver::configured(), args)
            }
        }
    }
}

/// Runs the builtin driver this process was invoked as, if any.
pub fn run_if_invoked_as_driver() -> Option<ExitCode> {
    let mut args = std::env::args_os();
    let argv0 = args.next()?;
    let name = Path::new(&argv0).file_name()?;
    let builtin = Builtin::value_variants()
        .iter()
        .find(|b| name == b.executable_name())?;
    let rest: Vec<OsString> = args.collect();
    Some(builtin.run(&rest))
}
