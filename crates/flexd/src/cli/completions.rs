//! `flexd completions SHELL`: a completion script generated from the same clap definitions
//! that parse the command line, so it cannot fall behind a new flag.

use std::process::ExitCode;

use clap::{Args, CommandFactory as _};
use clap_complete::Shell;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for (e.g. `flexd completions bash > /etc/bash_completion.d/flexd`).
    #[arg(value_enum)]
    pub shell: Shell,
}

pub fn run(args: CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut command = super::Cli::command();
    clap_complete::generate(args.shell, &mut command, "flexd", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}
