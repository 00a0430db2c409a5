//! Structured logs on stderr through `tracing`, as text or JSON lines.
//!
//! A progress bar shares stderr with the logs: while one is shown (see [`show_progress`]),
//! each log line is written with the bar cleared and redrawn after it, so neither garbles the
//! other.

use std::io::{IsTerminal as _, Write};
use std::sync::Mutex;

use anyhow::Context as _;
use tracing_subscriber::EnvFilter;

use super::{Global, LogFormat};

/// Without --log-level and RUST_LOG.
const DEFAULT_FILTER: &str = "info";

/// The bar currently drawn on stderr, if any.
static PROGRESS: Mutex<Option<indicatif::ProgressBar>> = Mutex::new(None);

pub fn init(global: &Global) -> anyhow::Result<()> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let (directives, ignored) = choose_filter(global.log_level.as_deref(), rust_log.as_deref());
    let filter = EnvFilter::try_new(directives)
        .with_context(|| format!("--log-level {directives:?} is not a log filter"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(|| Stderr);
    let result = match global.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| anyhow::anyhow!(e))?;
    if let Some(bad) = ignored {
        tracing::warn!(rust_log = %bad, "RUST_LOG is not a log filter; logging at {DEFAULT_FILTER}");
    }
    Ok(())
}

/// An explicit `--log-level` wins (a person typing it means it, whatever the environment
/// says); else RUST_LOG when it parses; else info. The second value is a RUST_LOG that was
/// ignored because it does not parse, to be reported once logging works.
fn choose_filter<'a>(
    explicit: Option<&'a str>,
    rust_log: Option<&'a str>,
) -> (&'a str, Option<&'a str>) {
    match (explicit, rust_log) {
        (Some(explicit), _) => (explicit, None),
        (None, Some(env)) if env.trim().is_empty() => (DEFAULT_FILTER, None),
        (None, Some(env)) if EnvFilter::try_new(env).is_ok() => (env, None),
        (None, Some(env)) => (DEFAULT_FILTER, Some(env)),
        (None, None) => (DEFAULT_FILTER, None),
    }
}

/// Draws `bar` on stderr, log lines going above it, until the guard is dropped (which clears
/// the bar).
pub fn show_progress(bar: indicatif::ProgressBar) -> ProgressGuard {
    if let Ok(mut shown) = PROGRESS.lock() {
        *shown = Some(bar.clone());
    }
    ProgressGuard(bar)
}

pub struct ProgressGuard(indicatif::ProgressBar);

impl ProgressGuard {
    pub fn bar(&self) -> &indicatif::ProgressBar {
        &self.0
    }
}

impl Drop for ProgressGuard {
    fn drop(&mut self) {
        if let Ok(mut shown) = PROGRESS.lock() {
            *shown = None;
        }
        self.0.finish_and_clear();
    }
}

/// stderr, with the progress bar (if any) lifted out of the way of each line.
struct Stderr;

impl Stderr {
    fn around<T>(write: impl FnOnce() -> T) -> T {
        let bar = PROGRESS.lock().ok().and_then(|shown| shown.clone());
        match bar {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }
}

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Self::around(|| std::io::stderr().write(buf))
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        Self::around(|| std::io::stderr().write_all(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_log_level_beats_rust_log() {
        assert_eq!(choose_filter(Some("debug"), Some("error")), ("debug", None));
        assert_eq!(choose_filter(Some("debug"), None), ("debug", None));
    }

    #[test]
    fn without_a_flag_rust_log_then_info() {
        assert_eq!(choose_filter(None, Some("error")), ("error", None));
        assert_eq!(choose_filter(None, None), ("info", None));
        assert_eq!(choose_filter(None, Some("")), ("info", None));
        assert_eq!(
            choose_filter(None, Some("=bad[=filter")),
            ("info", Some("=bad[=filter"))
        );
    }
}
