//! Structured logs on stderr through `tracing`, as text or JSON lines.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

use super::{Global, LogFormat};

pub fn init(global: &Global) -> anyhow::Result<()> {
    let filter =
        EnvFilter::try_from_default_env().or_else(|_| EnvFilter::try_new(&global.log_level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let result = match global.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| anyhow::anyhow!(e))
}
