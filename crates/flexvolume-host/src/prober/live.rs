//! The running prober: drivers installed, upgraded or removed while flexd runs are seen without
//! a restart (docs/discovery.md#guarantees).
//!
//! One thread owns inotify and the per-directory state. It sleeps in `poll(2)` on the inotify fd
//! and a wake pipe, with a timeout only while a trailing edge or a degraded rescan is pending,
//! so an idle plugin dir costs nothing. A change of a driver directory is rate limited by
//! [`Coalescer`] and its `init` runs on a worker pool, so a hung `init` of one driver never
//! delays another (docs/discovery.md#isolation). A directory is never probed twice at once; if
//! it changes while its `init` runs, it is probed again afterwards. Only the changed driver is
//! re-initialised (unlike kubelet, k8s#58352), and a failed driver is retried only when its
//! directory changes again or on an explicit [`Prober::reprobe_all`] (no retry loop,
//! calico#4308).

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};

use super::coalesce::Coalescer;
use super::event::{transition, Known, ProbeEvent};
use super::watch::{Change, WatchSet};
use super::{probe_entries, probe_entry, Probed};
use crate::layout::{self, LayoutPolicy};
use crate::runner::RunnerConfig;

/// Default minimum time between two processings of one driver dir (docs/discovery.md#rate-limit).
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// A batch of at least this many events marks a storm...
const STORM_BATCH_EVENTS: usize = 16;
/// ...after which events are left to gather this long before the next read.
const STORM_BATCH_PAUSE: Duration = Duration::from_millis(25);

#[derive(Debug, Clone)]
pub struct ProberConfig {
    pub plugin_dir: PathBuf,
    pub probe_interval: Duration,
    pub layout_policy: LayoutPolicy,
    pub runner: RunnerConfig,
    /// Concurrent `init`s (start-up and live changes).
    pub parallelism: usize,
    /// An artificial inotify watch limit (tests of the degraded mode); `None` in production.
    pub watch_limit: Option<usize>,
}

impl ProberConfig {
    pub fn new(plugin_dir: PathBuf) -> Self {
        Self {
            plugin_dir,
            probe_interval: DEFAULT_PROBE_INTERVAL,
            layout_policy: LayoutPolicy::default(),
            runner: RunnerConfig::default(),
            parallelism: super::default_parallelism(),
            watch_limit: None,
        }
    }

    /// The configuration every front end runs the prober with: the operator's plugin dir,
    /// layout policy and probe interval, and how drivers' `init`s are run.
    pub fn for_host(
        plugin_dir: PathBuf,
        layout_policy: LayoutPolicy,
        probe_interval: Duration,
        runner: RunnerConfig,
    ) -> Self {
        Self {
            probe_interval,
            layout_policy,
            runner,
            ..Self::new(plugin_dir)
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProberError {
    #[error("cannot watch plugin dir {path}: {source}")]
    Watch {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the prober: {0}")]
    Start(#[source] std::io::Error),
}

enum Message {
    Stop,
    ReprobeAll,
    /// A probe's result, with the directory's fingerprints taken before it was read and after.
    Probed(String, Option<Probed>, u64, u64),
}

/// A handle on the running prober; dropping it stops the prober and joins its threads.
pub struct Prober {
    messages: Sender<Message>,
    wake: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

fn wake_up(fd: &OwnedFd) {
    let _ = rustix::io::write(fd, &[1]);
}

impl Prober {
    /// Watches the plugin dir (creating it if needed), probes every driver present (their `init`s
    /// in parallel) and reports them first, as `add` or `failed`, sorted by directory name; then
    /// reports every processed change until stopped.
    pub fn start(config: ProberConfig) -> Result<(Prober, Receiver<ProbeEvent>), ProberError> {
        let (events_tx, events) = mpsc::channel();
        let mut watches =
            WatchSet::new(&config.plugin_dir, config.watch_limit).map_err(ProberError::Start)?;
        // Watch before scanning, so nothing installed during the scan is missed.
        watches.watch_root().map_err(|source| ProberError::Watch {
            path: config.plugin_dir.clone(),
            source,
        })?;
        let keys = watches.present_keys();
        for key in &keys {
            watches.sync_key(key);
        }
        let entries: Vec<_> = keys
            .iter()
            .filter(|k| !is_empty_dir(&config.plugin_dir.join(k)))
            .filter_map(|k| layout::entry(&config.plugin_dir, k.as_ref(), config.layout_policy))
            .collect();
        let mut probed = probe_entries(entries, &config.runner, config.parallelism);
        probed.sort_by(|a, b| a.dir.cmp(&b.dir));
        let mut known = HashMap::new();
        for p in probed {
            let key = p
                .dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let (event, now_known) = transition(&key, &Known::Absent, Some(&p));
            known.insert(key, now_known);
            if let Some(event) = event {
                let _ = events_tx.send(event);
            }
        }

        let (read_end, write_end) = rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
        )
        .map_err(|e| ProberError::Start(e.into()))?;
        let wake = Arc::new(write_end);
        let (messages_tx, messages_rx) = mpsc::channel();
        let fingerprints = watches
            .degraded
            .iter()
            .map(|k| (k.clone(), watches.fingerprint(k)))
            .collect();
        let state = Loop {
            coalescer: Coalescer::new(config.probe_interval),
            config,
            watches,
            known,
            in_flight: HashSet::new(),
            rerun: HashSet::new(),
            fingerprints,
            reported: HashMap::new(),
            explicit: HashSet::new(),
            next_rescan: None,
            events: events_tx,
        };
        let thread = {
            let wake = wake.clone();
            let messages_tx = messages_tx.clone();
            std::thread::Builder::new()
                .name("flexd-prober".into())
                .spawn(move || state.run(read_end, messages_rx, messages_tx, wake))
                .map_err(ProberError::Start)?
        };
        Ok((
            Prober {
                messages: messages_tx,
                wake,
                thread: Some(thread),
            },
            events,
        ))
    }

    /// Probes every driver again now (an explicit re-probe: also retries failed drivers).
    pub fn reprobe_all(&self) {
        let _ = self.messages.send(Message::ReprobeAll);
        wake_up(&self.wake);
    }

    /// Stops the prober and waits for it.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let _ = self.messages.send(Message::Stop);
        wake_up(&self.wake);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// An empty driver directory is an install in progress (`mkdir`, then the executable): it is
/// not reported until something is put in it.
fn is_empty_dir(path: &std::path::Path) -> bool {
    let is_real_dir = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
    is_real_dir
        && std::fs::read_dir(path).is_ok_and(|mut entries| {
            entries.all(|e| e.is_ok_and(|e| crate::layout::is_hidden(&e.file_name())))
        })
}

/// What one event reported about a key: the directory tree as it was once the probe ended, and
/// the outcome. Two probes with equal `Reported` saw the same driver, so the second has nothing to
/// say.
#[derive(Debug, PartialEq, Eq)]
struct Reported {
    tree: u64,
    path: Option<PathBuf>,
    outcome: Option<Result<crate::Capabilities, String>>,
}

impl Reported {
    fn of(tree: u64, found: Option<&Probed>) -> Self {
        Self {
            tree,
            path: found.and_then(|p| p.path.clone()),
            outcome: found.map(|p| match &p.result {
                Ok(plugin) => Ok(plugin.capabilities),
                Err(e) => Err(e.to_string()),
            }),
        }
    }
}

struct Loop {
    config: ProberConfig,
    watches: WatchSet,
    coalescer: Coalescer<String>,
    known: HashMap<String, Known>,
    in_flight: HashSet<String>,
    /// Keys that changed while their `init` was running.
    rerun: HashSet<String>,
    /// Fingerprints of degraded keys, compared every interval.
    fingerprints: HashMap<String, u64>,
    /// What the last event of each key described; a probe that finds exactly that again has
    /// nothing to report.
    reported: HashMap<String, Reported>,
    /// Keys re-probed on request: they report even when nothing changed.
    explicit: HashSet<String>,
    next_rescan: Option<Instant>,
    events: Sender<ProbeEvent>,
}

impl Loop {
    fn run(
        mut self,
        wake_read: OwnedFd,
        messages: Receiver<Message>,
        messages_tx: Sender<Message>,
        wake: Arc<OwnedFd>,
    ) {
        let jobs = self.start_workers(messages_tx, wake);
        let mut changes = Vec::new();
        let mut busy_since_read: Option<Instant> = None;
        loop {
            // After a large batch (an event storm), let events gather for a moment: a storm then
            // costs a few dozen wake-ups a second, while a quiet plugin dir still reacts at once.
            if let Some(read_at) = busy_since_read.take() {
                let pause = STORM_BATCH_PAUSE.saturating_sub(read_at.elapsed());
                if !pause.is_zero() {
                    std::thread::sleep(pause);
                }
            }
            let now = Instant::now();
            let deadline = [self.coalescer.next_deadline(), self.rescan_deadline(now)]
                .into_iter()
                .flatten()
                .min();
            let timeout = deadline.map(|d| {
                let wait = d.saturating_duration_since(now);
                Timespec {
                    tv_sec: wait.as_secs() as _,
                    tv_nsec: wait.subsec_nanos() as _,
                }
            });
            let inotify_fd = self.watches.fd();
            let mut fds = [
                PollFd::new(&inotify_fd, PollFlags::IN),
                PollFd::new(&wake_read, PollFlags::IN),
            ];
            // Errors (EINTR) just mean: look again.
            let _ = rustix::event::poll(&mut fds, timeout.as_ref());
            let mut drain = [0u8; 256];
            while matches!(rustix::io::read(&wake_read, &mut drain), Ok(n) if n > 0) {}

            let mut dirty: Vec<String> = Vec::new();
            for message in messages.try_iter() {
                match message {
                    Message::Stop => return,
                    Message::ReprobeAll => {
                        // Explicit: bypasses the rate limit.
                        for key in self.all_keys() {
                            self.explicit.insert(key.clone());
                            self.dispatch(&key, &jobs);
                        }
                    }
                    Message::Probed(key, found, seen, after) => {
                        self.in_flight.remove(&key);
                        let reported = Reported::of(after, found.as_ref());
                        let explicit = self.explicit.remove(&key);
                        if explicit || self.reported.get(&key) != Some(&reported) {
                            self.settle(&key, found.as_ref());
                            if found.is_some() {
                                self.reported.insert(key.clone(), reported);
                            } else {
                                self.reported.remove(&key);
                            }
                        } else {
                            // The events that led here were already reflected in what the
                            // last probe saw (an install that raced it): one change, one event.
                            tracing::debug!(key, "re-probe found what was reported; no event");
                        }
                        // Changed while its init ran: probe again, unless the probe already saw
                        // the directory as it is now.
                        if self.rerun.remove(&key)
                            && super::watch::fingerprint(&self.config.plugin_dir, &key) != seen
                        {
                            dirty.push(key);
                        }
                    }
                }
            }

            changes.clear();
            match self.watches.read(&mut changes) {
                Ok(n) if n >= STORM_BATCH_EVENTS => busy_since_read = Some(Instant::now()),
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %e, "reading inotify events failed; rescanning");
                    changes.push(Change::Rescan);
                }
            }
            for change in changes.drain(..) {
                match change {
                    Change::Key(key) => dirty.push(key),
                    Change::Rescan => dirty.extend(self.all_keys()),
                    Change::RootGone => {
                        tracing::warn!(plugin_dir = %self.config.plugin_dir.display(), "plugin dir removed; recreating it");
                        if let Err(e) = self.watches.watch_root() {
                            tracing::error!(error = %e, "cannot recreate the plugin dir; retrying at the next interval");
                            self.watches.root_degraded = true;
                        }
                        dirty.extend(self.all_keys());
                    }
                }
            }
            let now = Instant::now();
            if self.rescan_deadline(now).is_some_and(|d| d <= now) {
                dirty.extend(self.rescan_degraded());
                self.next_rescan = None;
            }
            dirty.sort();
            dirty.dedup();
            for key in dirty {
                // A new, still empty driver directory (`mkdir` before the copy) costs one
                // readdir: watch it, but keep the rate limit's leading edge for the executable.
                // Watch first, then look: anything put in after the look is an event.
                let unknown = matches!(self.known.get(&key), None | Some(Known::Absent));
                if unknown && !self.in_flight.contains(&key) {
                    self.watches.sync_key(&key);
                    if is_empty_dir(&self.config.plugin_dir.join(&key)) {
                        continue;
                    }
                }
                if self.coalescer.change(&key, now) {
                    self.dispatch(&key, &jobs);
                } else if !self.watches.degraded.contains(&key) {
                    // Its trailing-edge probe is scheduled and will read the directory as it is
                    // then (and re-watch it): until then its events say nothing new.
                    self.watches.unwatch_key(&key);
                }
            }
            for key in self.coalescer.due(now) {
                self.dispatch(&key, &jobs);
            }
        }
    }

    /// Known keys and keys present on disk.
    fn all_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.known.keys().cloned().collect();
        keys.extend(self.watches.present_keys());
        keys.sort();
        keys.dedup();
        keys
    }

    fn start_workers(&self, messages: Sender<Message>, wake: Arc<OwnedFd>) -> Sender<String> {
        let (jobs_tx, jobs_rx) = mpsc::channel::<String>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        for i in 0..self.config.parallelism.max(1) {
            let jobs_rx = jobs_rx.clone();
            let messages = messages.clone();
            let wake = wake.clone();
            let config = self.config.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("flexd-probe-{i}"))
                .spawn(move || loop {
                    let job = jobs_rx.lock().ok().and_then(|rx| rx.recv().ok());
                    let Some(key) = job else { return };
                    let seen = super::watch::fingerprint(&config.plugin_dir, &key);
                    let found = if is_empty_dir(&config.plugin_dir.join(&key)) {
                        None
                    } else {
                        layout::entry(&config.plugin_dir, key.as_ref(), config.layout_policy)
                            .map(|entry| probe_entry(entry, &config.runner))
                    };
                    let after = super::watch::fingerprint(&config.plugin_dir, &key);
                    if messages
                        .send(Message::Probed(key, found, seen, after))
                        .is_err()
                    {
                        return;
                    }
                    wake_up(&wake);
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a probe worker");
            }
        }
        jobs_tx
    }

    fn dispatch(&mut self, key: &str, jobs: &Sender<String>) {
        if self.in_flight.contains(key) {
            self.rerun.insert(key.to_owned());
            return;
        }
        self.watches.sync_key(key);
        if self.watches.degraded.contains(key) {
            let fingerprint = self.watches.fingerprint(key);
            self.fingerprints.insert(key.to_owned(), fingerprint);
        } else {
            self.fingerprints.remove(key);
        }
        self.in_flight.insert(key.to_owned());
        let _ = jobs.send(key.to_owned());
    }

    /// Applies a probe's result and reports the change.
    fn settle(&mut self, key: &str, found: Option<&Probed>) {
        let before = self.known.remove(key).unwrap_or_default();
        let (event, after) = transition(key, &before, found);
        if !matches!(after, Known::Absent) {
            self.known.insert(key.to_owned(), after);
        }
        if let Some(event) = event {
            match &event.error {
                Some(error) => tracing::warn!(driver = %event.driver, %error, "driver failed"),
                None => {
                    tracing::info!(driver = %event.driver, kind = ?event.kind, "driver changed")
                }
            }
            let _ = self.events.send(event);
        }
    }

    fn rescan_deadline(&mut self, now: Instant) -> Option<Instant> {
        if self.watches.degraded.is_empty() && !self.watches.root_degraded {
            self.next_rescan = None;
            return None;
        }
        Some(
            *self
                .next_rescan
                .get_or_insert(now + self.config.probe_interval),
        )
    }

    /// Degraded keys whose fingerprint changed (all keys when the plugin dir itself is not
    /// watched).
    fn rescan_degraded(&mut self) -> Vec<String> {
        if self.watches.root_degraded {
            if !self.config.plugin_dir.is_dir() {
                let _ = self.watches.watch_root();
            } else if self.watches.watch_root().is_ok() && !self.watches.root_degraded {
                tracing::info!("plugin dir watched again");
            }
        }
        let mut keys: Vec<String> = self.watches.degraded.iter().cloned().collect();
        if self.watches.root_degraded {
            keys = self.all_keys();
        }
        let mut changed = Vec::new();
        for key in keys {
            let fingerprint = self.watches.fingerprint(&key);
            if self.fingerprints.insert(key.clone(), fingerprint) != Some(fingerprint) {
                changed.push(key);
            }
        }
        changed
    }
}
