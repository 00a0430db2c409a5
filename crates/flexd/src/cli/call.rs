//! `flexd call`: run one call-out by hand, as kubelet would, and show the parsed reply.
//!
//! Exit status: 0 Success, 1 Failure or error, 3 Not supported (see [`crate::settings::exit`]).

use std::ffi::OsString;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use flexvolume_host::runner::{self, CallError};
use flexvolume_host::{layout, CallOut, CallOutKind, DriverName};
use serde::Serialize;

use crate::settings::{Global, OutputFormat};

pub const EXIT_NOT_SUPPORTED: u8 = crate::settings::exit::NO;

#[derive(Debug, Args)]
pub struct CallArgs {
    /// Timeout of the call-out (default: 10m for waitforattach, 2m for the others).
    #[arg(long, value_parser = crate::settings::parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// The driver, as in a volume spec: vendor/driver. (Without it, the first word is the
    /// driver: `flexd call vendor/driver init`.)
    #[arg(long, value_name = "VENDOR/DRIVER")]
    pub driver: Option<String>,
    /// The call-out: init, getvolumename, attach, waitforattach, isattached, mountdevice,
    /// detach, unmountdevice, mount, unmount, expandvolume, expandfs.
    #[arg(value_name = "CALLOUT", required = true)]
    pub first: String,
    /// The call-out's arguments, passed as they are (a JSON argument is one argument).
    #[arg(allow_hyphen_values = true)]
    pub args: Vec<OsString>,
}

impl CallArgs {
    /// The driver, the call-out and its arguments, whichever way the driver was given.
    pub(crate) fn split(self) -> anyhow::Result<(String, String, Vec<OsString>)> {
        match self.driver {
            Some(driver) => Ok((driver, self.first, self.args)),
            None => {
                let mut rest = self.args.into_iter();
                let callout = rest
                    .next()
                    .context("give the driver with --driver VENDOR/DRIVER, then the call-out")?
                    .into_string()
                    .map_err(|_| anyhow::anyhow!("the call-out name is not UTF-8"))?;
                Ok((self.first, callout, rest.collect()))
            }
        }
    }
}

#[derive(Serialize)]
struct Outcome<'a> {
    status: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

pub fn run(global: &Global, args: CallArgs) -> anyhow::Result<ExitCode> {
    let timeout = args.timeout;
    let (driver, callout, raw_args) = args.split()?;
    let name = DriverName::parse(&driver)?;
    let kind: CallOutKind = callout.parse().map_err(anyhow::Error::msg)?;
    let call = CallOut::from_raw(kind, raw_args)?;
    let driver = layout::locate(&global.plugin_dir, &name, global.layout_policy())
        .with_context(|| format!("driver {name} is not usable"))?;
    let mut config = global.runner_config()?;
    if let Some(timeout) = timeout {
        config = config.with_timeout_for_all(timeout);
    }
    match runner::call(&config, &driver.path, &call) {
        Ok(reply) => {
            match global.output {
                OutputFormat::Json => super::print_json(&reply)?,
                OutputFormat::Text => println!("{}", serde_json::to_string_pretty(&reply)?),
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(CallError::Failure { message, .. }) => {
            print_outcome(global, "Failure", Some(message))?;
            Ok(ExitCode::from(1))
        }
        Err(CallError::NotSupported { .. }) => {
            print_outcome(global, "Not supported", None)?;
            Ok(ExitCode::from(EXIT_NOT_SUPPORTED))
        }
        Err(e) => Err(e.into()),
    }
}

fn print_outcome(global: &Global, status: &str, message: Option<String>) -> anyhow::Result<()> {
    let outcome = Outcome { status, message };
    match global.output {
        OutputFormat::Json => super::print_json(&outcome),
        OutputFormat::Text => {
            println!("{}", serde_json::to_string_pretty(&outcome)?);
            Ok(())
        }
    }
}
