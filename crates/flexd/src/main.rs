//! `flexd`: the FlexVolume host runtime's command line.
//!
//! Every subcommand lives in its own module under `cli/`; this file only parses arguments, sets
//! up logging and maps errors to exit statuses.

mod cli;
mod serve;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    if let Err(e) = cli::logging::init(&args.global) {
        eprintln!("flexd: cannot set up logging: {e:#}");
        return ExitCode::from(1);
    }
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("flexd: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
