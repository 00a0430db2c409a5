//! `flexd watch`: one line per processed driver change, until SIGINT/SIGTERM.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::Context as _;
use clap::Args;
use flexvolume_host::prober::{ProbeEvent, Prober, ProberConfig};
use flexvolume_host::Capabilities;
use serde::Serialize;

use crate::settings::{Global, OutputFormat};

#[derive(Debug, Args)]
pub struct WatchArgs {}

/// One line of `flexd watch --output json`.
#[derive(Serialize)]
struct Line<'a> {
    time: String,
    event: flexvolume_host::prober::EventKind,
    driver: &'a str,
    path: Option<String>,
    capabilities: Option<Capabilities>,
    error: Option<&'a str>,
}

impl<'a> Line<'a> {
    fn new(event: &'a ProbeEvent) -> Self {
        Self {
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            event: event.kind,
            driver: &event.driver,
            path: event.path.as_ref().map(|p| p.display().to_string()),
            capabilities: event.plugin.as_ref().map(|p| p.capabilities),
            error: event.error.as_deref(),
        }
    }
}

pub fn run(global: &Global, _args: WatchArgs) -> anyhow::Result<ExitCode> {
    let termination = crate::settings::signals::Termination::catch()?;
    let config = ProberConfig::for_host(
        global.plugin_dir.clone(),
        global.layout_policy(),
        global.probe_interval,
        global.runner_config()?,
    );
    let (prober, events) = Prober::start(config)
        .with_context(|| format!("cannot watch plugin dir {}", global.plugin_dir.display()))?;
    // On SIGTERM/SIGINT the prober stops, which ends the event stream below.
    let prober = Arc::new(Mutex::new(Some(prober)));
    {
        let prober = prober.clone();
        std::thread::spawn(move || {
            let signal = termination.wait();
            tracing::info!(signal, "stopping");
            if let Some(p) = prober.lock().ok().and_then(|mut p| p.take()) {
                p.stop();
            }
        });
    }
    let stdout = std::io::stdout();
    for event in events {
        let line = Line::new(&event);
        let mut out = stdout.lock();
        match global.output {
            OutputFormat::Json => writeln!(out, "{}", serde_json::to_string(&line)?)?,
            OutputFormat::Text => {
                let detail = match (&line.capabilities, line.error) {
                    (_, Some(error)) => error.to_owned(),
                    (Some(c), None) => format!(
                        "attach={} fsGroup={} supportsMetrics={}",
                        c.attach, c.fs_group, c.supports_metrics
                    ),
                    (None, None) => String::new(),
                };
                let kind = serde_json::to_value(line.event)?
                    .as_str()
                    .unwrap_or("?")
                    .to_owned();
                writeln!(out, "{} {:7} {} {}", line.time, kind, line.driver, detail)?;
            }
        }
        out.flush()?;
    }
    flexvolume_host::runner::remove_own_cgroups();
    Ok(ExitCode::SUCCESS)
}
