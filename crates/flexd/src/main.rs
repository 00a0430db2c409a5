//! `flexd`: the FlexVolume host runtime's command line.
//!
//! Every subcommand lives in its own module under `cli/` (`serve` under `serve/`), their shared
//! settings in `settings/`; this file only parses arguments, sets up logging and maps errors to
//! exit statuses.

mod builtin;
mod cli;
mod serve;
mod settings;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Installed as a builtin driver (`<plugin-dir>/flexd~loop/loop`): be that driver.
    if let Some(code) = builtin::run_if_invoked_as_driver() {
        return code;
    }
    let args = cli::Cli::parse();
    if let Err(e) = settings::logging::init(&args.global) {
        eprintln!("flexd: cannot set up logging: {e:#}");
        return ExitCode::from(1);
    }
    // Before any thread: descriptors up to the hard limit, drivers started with the original.
    match flexvolume_os::open_files::raise() {
        Ok(raised) => tracing::debug!(
            before = raised.before,
            after = raised.after,
            "open-file limit"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            // Bad usage found after parsing: printed and exited as clap does.
            if let Some(usage) = e.downcast_ref::<clap::Error>() {
                let _ = usage.print();
                return ExitCode::from(2);
            }
            // Each cause once: many errors quote their source in their own message too.
            let e: &(dyn std::error::Error + 'static) = e.as_ref();
            eprintln!("flexd: error: {}", flexd::errors::message_of(e));
            ExitCode::from(1)
        }
    }
}
