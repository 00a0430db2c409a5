//! Finding drivers: the one-shot probe of the whole plugin dir (`flexd drivers`) and the running
//! [`Prober`] that reports every install, upgrade and removal (`flexd watch`, `flexd serve`).
//!
//! Every driver's `init` runs in parallel, so one slow or hung driver costs its own timeout and
//! never delays the others; a broken entry is reported next to the good ones, never instead of
//! them.

pub mod coalesce;
pub mod event;
pub mod live;
pub mod watch;

pub use event::{EventKind, ProbeEvent, Subject};
pub use live::{Prober, ProberConfig, ProberError, DEFAULT_PROBE_INTERVAL};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::layout::{self, Entry, LayoutError, LayoutPolicy};
use crate::plugin::Plugin;
use crate::runner::{CallError, RunnerConfig};

/// Why a plugin-dir entry is not a ready plugin.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("init failed: {0}")]
    Init(#[from] CallError),
}

/// The outcome of probing one plugin-dir entry.
#[derive(Debug, Clone)]
pub struct Probed {
    /// The driver, or the entry whose name is not one.
    pub subject: Subject,
    /// [`Subject::label`], for printing; code that acts on the driver uses `subject`.
    pub name: String,
    pub dir: PathBuf,
    /// The executable's path, when the entry has a valid name.
    pub path: Option<PathBuf>,
    pub result: Result<Arc<Plugin>, Arc<ProbeError>>,
}

/// Turns one layout entry into a probed driver by running `init`.
pub(crate) fn probe_entry(entry: Entry, config: &RunnerConfig) -> Probed {
    let subject = Subject::of_entry(&entry);
    let path = entry.outcome.as_ref().ok().map(|d| d.path.clone());
    let result = match entry.outcome {
        Ok(driver) => Plugin::init(driver, config)
            .map(Arc::new)
            .map_err(|e| Arc::new(ProbeError::Init(e))),
        Err(e) => Err(Arc::new(ProbeError::Layout(e))),
    };
    Probed {
        name: subject.label(),
        subject,
        dir: entry.dir,
        path,
        result,
    }
}

/// Probes every visible entry of the plugin dir, `init`s in parallel; sorted by entry name.
pub fn probe_all(
    plugin_dir: &Path,
    policy: LayoutPolicy,
    config: &RunnerConfig,
    parallelism: usize,
) -> std::io::Result<Vec<Probed>> {
    let entries = layout::scan(plugin_dir, policy)?;
    Ok(probe_entries(entries, config, parallelism))
}

/// `init`s a batch of entries on `parallelism` threads, keeping their order.
pub(crate) fn probe_entries(
    entries: Vec<Entry>,
    config: &RunnerConfig,
    parallelism: usize,
) -> Vec<Probed> {
    let count = entries.len();
    let slots: Vec<Mutex<Option<Entry>>> =
        entries.into_iter().map(|e| Mutex::new(Some(e))).collect();
    let results: Vec<Mutex<Option<Probed>>> = (0..count).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let workers = parallelism.clamp(1, count.max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let entry = slots[i].lock().ok().and_then(|mut s| s.take());
                if let Some(entry) = entry {
                    let probed = probe_entry(entry, config);
                    if let Ok(mut slot) = results[i].lock() {
                        *slot = Some(probed);
                    }
                }
            });
        }
    });
    results
        .into_iter()
        .filter_map(|m| m.into_inner().ok().flatten())
        .collect()
}

/// A sensible number of concurrent `init`s: drivers mostly wait on exec and I/O.
pub fn default_parallelism() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get() * 4)
        .unwrap_or(8)
        .min(64)
}
