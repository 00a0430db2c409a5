//! `flexd serve`: every discovered FlexVolume driver served to Kubernetes through CSI.
//!
//! Each ready driver gets a CSI endpoint (`<csi-dir>/<csi-name>/csi.sock`) and, in node mode, a
//! kubelet registration socket (`<registration-dir>/<csi-name>-reg.sock`). The CSI name comes
//! from [`flexd::naming`]. Drivers found later get their sockets when the prober reports them; removed
//! drivers lose them. What each driver is (ready with its plugin, failed, removed) is the
//! library's [`Registry`]'s, fed by the same events: this module keeps only what is CSI's.

pub mod calls;
pub mod controller;
pub mod driver;
pub mod endpoint;
pub mod grpc_code;
pub mod health;
pub mod http_listener;
pub mod identity;
pub mod kubernetes_records;
pub mod list;
pub mod locks;
pub mod metrics;
pub mod node;
pub mod pagination;
pub mod provision;
pub mod registration;
#[cfg(test)]
mod replicas_tests;
pub mod request;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use flexvolume_host::controller_records::{
    ControllerRecords, FenceSettings, RecordStore, StateDirStore,
};
use flexvolume_host::lifecycle::Lifecycle;
use flexvolume_host::prober::{EventKind, ProbeEvent, Prober, ProberConfig};
use flexvolume_host::{DriverName, Registry, Resolver, RunnerConfig};

use crate::settings::Global;
use driver::ServedDriver;
use endpoint::Endpoint;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Node service (+ kubelet registration): runs on every node.
    Node,
    /// Controller service only (attach/detach), e.g. beside a CSI external-attacher.
    Controller,
    /// Node and controller services in one process.
    Both,
}

/// `serve`'s own flags; the plugin dir, state dir and node name are global (see
/// [`crate::settings::Global`]).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Which CSI services to run.
    #[arg(long, value_enum, default_value_t = Mode::Node)]
    pub mode: Mode,
    /// Where each driver's CSI socket lives: <csi-dir>/<csi-name>/csi.sock.
    #[arg(long, default_value = "/var/lib/kubelet/plugins", value_parser = crate::settings::parse_dir)]
    pub csi_dir: PathBuf,
    /// kubelet's plugin registration directory.
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry", value_parser = crate::settings::parse_dir)]
    pub registration_dir: PathBuf,
    /// Where /metrics (Prometheus text) and /healthz are served: the loopback by default, so
    /// that only the node itself (kubelet's probes, a local agent) reaches it.
    #[arg(long, default_value = "127.0.0.1:9808")]
    pub metrics_address: std::net::SocketAddr,
    /// A group that may also connect to the CSI sockets (mode 0660 instead of 0600): the
    /// non-root CSI sidecars' group in the controller pod. Registration sockets stay root's.
    #[arg(long, value_name = "GID", value_parser = clap::value_parser!(u32).range(..u32::MAX as i64))]
    pub socket_group: Option<u32>,
    /// Where the controller keeps its attachments and provisioned volumes: this flexd's state
    /// dir, or the API server, where every replica of a highly available controller reads
    /// them (docs/csi.md#controller-records).
    #[arg(long, value_enum, default_value_t = RecordsHome::StateDir)]
    pub controller_records: RecordsHome,
    /// With --controller-records=kubernetes: the directory holding the controller's own
    /// `token`, `ca.crt` and `namespace`.
    #[arg(long, value_name = "DIR", default_value = kubernetes_records::DEFAULT_CREDENTIALS)]
    pub records_credentials: PathBuf,
    /// How long a controller replica's fence on a volume holds without renewal: a replica that
    /// dies in a call leaves the volume to the other this long after the other first saw it
    /// (docs/csi.md#fences). At least twice the driver's kill grace and a second.
    #[arg(long, value_parser = crate::settings::parse_duration, default_value = "20s")]
    pub fence_lease: std::time::Duration,
}

/// Where the controller's records are kept (`--controller-records`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RecordsHome {
    /// The state dir: one controller (or `--mode both`).
    StateDir,
    /// `flexdrecords.flexd.io` objects in the API server: replicas.
    Kubernetes,
}

/// The drivers currently served, by name.
pub struct Served {
    args: ServeArgs,
    endpoints: HashMap<DriverName, Endpoint>,
    /// Drivers that should be served but whose endpoint could not start, with the reason.
    unserved: BTreeMap<DriverName, String>,
    /// The prober's events stopped: installs, updates and removals are no longer seen.
    watcher_stopped: bool,
    metrics: Arc<metrics::Metrics>,
    health: Arc<health::Health>,
    lifecycle: Arc<Lifecycle>,
    resolver: Arc<Resolver>,
}

impl Served {
    fn socket_paths(&self, csi_name: &str) -> (PathBuf, Option<PathBuf>) {
        let csi = self.args.csi_dir.join(csi_name).join("csi.sock");
        let registration = match self.args.mode {
            Mode::Node | Mode::Both => Some(
                self.args
                    .registration_dir
                    .join(format!("{csi_name}-reg.sock")),
            ),
            Mode::Controller => None,
        };
        (csi, registration)
    }

    /// A driver was reported (ready, updated or failed): serve it if it is not yet. Its
    /// endpoint asks the registry for the plugin, so an update needs nothing here.
    pub fn ready(&mut self, name: &DriverName) {
        if self.endpoints.contains_key(name) {
            return;
        }
        let csi_name = match flexd::naming::csi_name(name) {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(driver = %name, error = %e, "driver cannot be served through CSI");
                return;
            }
        };
        let (csi_socket, registration_socket) = self.socket_paths(&csi_name);
        let driver = Arc::new(ServedDriver::new(
            name.clone(),
            csi_name,
            csi_socket,
            registration_socket,
            self.resolver.clone(),
        ));
        let (node, controller) = match self.args.mode {
            Mode::Node => (true, false),
            Mode::Controller => (false, true),
            Mode::Both => (true, true),
        };
        let lifecycle = self.lifecycle.clone();
        let services = |router: tonic::transport::server::Router| {
            let calls = calls::VolumeCalls {
                driver: driver.clone(),
                lifecycle,
                locks: locks::VolumeLocks::default(),
            };
            let router = router.add_optional_service(node.then(|| {
                flexd::proto::csi::node_server::NodeServer::new(node::NodeService {
                    calls: calls.clone(),
                })
            }));
            router.add_optional_service(controller.then(|| {
                flexd::proto::csi::controller_server::ControllerServer::with_interceptor(
                    controller::ControllerService::new(calls, node),
                    controller::only_with_controller_side(driver.clone()),
                )
            }))
        };
        let access = endpoint::SocketAccess {
            group: self.args.socket_group,
        };
        match Endpoint::start(driver.clone(), access, services) {
            Ok(endpoint) => {
                self.unserved.remove(name);
                self.endpoints.insert(name.clone(), endpoint);
            }
            Err(e) => {
                tracing::error!(driver = %name, error = format!("{e:#}"), "cannot serve driver");
                self.unserved.insert(name.clone(), format!("{e:#}"));
            }
        }
    }

    /// A driver went away: its sockets go too.
    pub async fn remove(&mut self, name: &DriverName) {
        self.unserved.remove(name);
        if let Some(endpoint) = self.endpoints.remove(name) {
            endpoint.stop().await;
        }
    }

    pub async fn stop_all(&mut self) {
        for (_, endpoint) in self.endpoints.drain() {
            endpoint.stop().await;
        }
    }

    /// Removes sockets a previous flexd left behind (after a crash) for drivers not served now.
    /// Only names that decode as flexd's own CSI names are touched.
    fn remove_stale_sockets(&self) {
        let served: Vec<&str> = self
            .endpoints
            .values()
            .map(|e| e.driver.csi_name.as_str())
            .collect();
        let stale = |csi_name: &str| {
            flexd::naming::driver_name(csi_name).is_ok() && !served.contains(&csi_name)
        };
        if let Ok(entries) = std::fs::read_dir(&self.args.csi_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if stale(&name) {
                    let _ = std::fs::remove_file(entry.path().join("csi.sock"));
                    let _ = std::fs::remove_dir(entry.path());
                    tracing::info!(csi_name = %name, "removed stale CSI endpoint");
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.args.registration_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.strip_suffix("-reg.sock").is_some_and(stale) {
                    let _ = std::fs::remove_file(entry.path());
                    tracing::info!(socket = %name, "removed stale registration socket");
                }
            }
        }
    }

    /// What keeps flexd from doing its job until it restarts, for `/healthz`. A driver whose
    /// name has no CSI form is not counted: a restart would not serve it either.
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.watcher_stopped {
            problems.push(
                "the driver watcher stopped: installs, updates and removals are no longer seen"
                    .to_owned(),
            );
        }
        for (name, reason) in &self.unserved {
            problems.push(format!("driver {name}: not served: {reason}"));
        }
        let mut endpoints: Vec<_> = self.endpoints.iter().collect();
        endpoints.sort_by(|a, b| a.0.cmp(b.0));
        problems.extend(endpoints.into_iter().flat_map(|(_, e)| e.problems()));
        problems
    }

    fn check_health(&self) {
        self.health.set_problems(self.problems());
        self.metrics.count_unusable_records(&self.lifecycle.state);
    }

    /// Refreshes the drivers-by-status gauge.
    fn count_drivers(&self) {
        let ready = self
            .endpoints
            .values()
            .filter(|e| e.driver.plugin().is_some())
            .count();
        self.metrics
            .set_drivers(ready, self.endpoints.len() - ready);
    }

    /// Applies one processed driver change.
    async fn apply(&mut self, event: &ProbeEvent) {
        let kind = match event.kind {
            EventKind::Add => "add",
            EventKind::Update => "update",
            EventKind::Remove => "remove",
            EventKind::Failed => "failed",
        };
        self.metrics.probe_event(kind);
        let Some(name) = self.resolver.registry().apply(event) else {
            tracing::warn!(entry = %event.driver, "not a driver name; not served");
            return;
        };
        match event.kind {
            // A driver that failed init keeps (or gets) its socket with Probe answering not
            // ready, so kubelet and operators see it instead of it silently vanishing; the
            // older version is not kept (docs/discovery.md#failed-not-cached).
            EventKind::Add | EventKind::Update | EventKind::Failed => self.ready(name),
            EventKind::Remove => self.remove(name).await,
        }
        self.count_drivers();
    }
}

/// On a first run the plugin dir is empty and nothing is served, which looks like a start that
/// went wrong: say so, and what to do next. Drivers installed later are served as they appear
/// (the prober watches the dir), so no restart is needed.
fn warn_no_drivers(plugin_dir: &Path) {
    tracing::warn!(
        plugin_dir = %plugin_dir.display(),
        "the plugin dir has no drivers, so nothing is served yet: install one with \
         `flexd install --driver VENDOR/NAME PATH`, or the loop driver shipped with flexd with \
         `flexd install --builtin loop` (with the same --plugin-dir); flexd serves each driver \
         as it is installed, without a restart"
    );
}

pub fn run(global: &Global, args: ServeArgs) -> anyhow::Result<ExitCode> {
    let termination = crate::settings::signals::Termination::catch()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let metrics = metrics::Metrics::new();
    let health = Arc::new(health::Health::default());
    let runner = RunnerConfig {
        observer: Some(flexvolume_host::runner::Observer(metrics.clone())),
        ..global.runner_config()?
    };
    if let Some(namespace) = &runner.mount_namespace {
        // kubelet's dir, where volumes are published, usually holds the CSI dir.
        crate::settings::warn_unless_propagated(namespace, &args.csi_dir);
    }
    if runner.max_processes.is_some() {
        // Detected now rather than at the first call-out, so the log says at start whether
        // drivers are capped (a warning with the reason is logged when they are not).
        if let Ok(dir) = flexvolume_host::runner::process_cap() {
            tracing::info!(cgroup = %dir.display(), max_processes = runner.max_processes.map_or(0, |m| m.get()), "driver call-outs are process-capped");
        }
    }
    let resolver = Arc::new(Resolver::new(Arc::new(Registry::new()), runner.clone()));
    // Every publish lists the records to refuse overlaps: a daemon learns their changes from
    // inotify rather than stat'ing each record each time.
    let state = global.state();
    match state.restrict() {
        Ok(Some(mode)) => tracing::warn!(
            state_dir = %global.state_dir.display(),
            was = format!("{mode:o}"),
            "the state dir was readable by others; now owner-only (0700)"
        ),
        Ok(None) => {}
        Err(e) => return Err(e).context("cannot create the state dir"),
    }
    state.watch_records();
    let mut lifecycle = Lifecycle::new(runner.clone(), state.clone(), global.node_name());
    let fences = FenceSettings::new(args.fence_lease, runner.kill_grace)
        .map_err(|e| anyhow::anyhow!("--fence-lease: {e}"))?;
    let store: Arc<dyn RecordStore> = match args.controller_records {
        RecordsHome::Kubernetes => {
            anyhow::ensure!(
                args.mode == Mode::Controller,
                "--controller-records=kubernetes is for --mode controller: a node keeps its own records"
            );
            Arc::new(runtime.block_on(kubernetes_records::connect(&args.records_credentials))?)
        }
        RecordsHome::StateDir => {
            let store = StateDirStore::new(state);
            let adopted = store.adopt_legacy().context(
                "cannot adopt the controller records an older flexd left in the state dir",
            )?;
            if adopted > 0 {
                tracing::info!(
                    volumes = adopted,
                    "adopted the controller records an older flexd kept in the state dir"
                );
            }
            Arc::new(store)
        }
    };
    let records = ControllerRecords::new(store, fences);
    tracing::info!(holder = %records.holder(), lease = ?fences.lease, "controller fences are signed by this replica");
    lifecycle.controller_records = Arc::new(records);
    let lifecycle = Arc::new(lifecycle);
    let config = ProberConfig::for_host(
        global.plugin_dir.clone(),
        global.layout_policy(),
        global.probe_interval,
        runner,
    );
    let (prober, events) = Prober::start(config)
        .with_context(|| format!("cannot watch plugin dir {}", global.plugin_dir.display()))?;
    // The drivers present at start are reported before start() returns.
    let initial: Vec<ProbeEvent> = events.try_iter().collect();
    if initial.is_empty() {
        warn_no_drivers(&global.plugin_dir);
    }
    runtime.block_on(async move {
        let listener = http_listener::bind(args.metrics_address).await?;
        // Before serving: what a crash left half done. It may wait for a driver the crash left
        // running (the record's lock), so it runs beside the service, which takes the same locks.
        let reconciling = lifecycle.clone();
        tokio::task::spawn_blocking(move || match reconciling.reconcile() {
            Ok(report) => tracing::info!(
                consistent = report.consistent,
                interrupted = report.interrupted.len(),
                rolled_back = report.rolled_back.len(),
                torn_down = report.torn_down.len(),
                lost = report.lost.len(),
                unreadable = report.unreadable,
                "state reconciled with the mount table"
            ),
            Err(e) => tracing::error!(error = %e, "cannot reconcile the state dir"),
        });
        let mut served = Served {
            args,
            endpoints: HashMap::new(),
            unserved: BTreeMap::new(),
            watcher_stopped: false,
            metrics: metrics.clone(),
            health: health.clone(),
            lifecycle,
            resolver,
        };
        for event in &initial {
            served.apply(event).await;
        }
        served.count_drivers();
        served.remove_stale_sockets();
        served.check_health();
        // Health and metrics answer once the drivers present at start are served.
        let metrics_task = tokio::spawn(http_listener::serve(listener, metrics, health));

        let (live_tx, mut live) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for event in events {
                if live_tx.send(event).is_err() {
                    return;
                }
            }
        });
        let mut stop = tokio::task::spawn_blocking(move || termination.wait());
        let mut health_check = tokio::time::interval(std::time::Duration::from_secs(1));
        health_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                signal = &mut stop => {
                    tracing::info!(signal = signal.unwrap_or(0), "stopping");
                    break;
                }
                event = live.recv(), if !served.watcher_stopped => match event {
                    Some(event) => served.apply(&event).await,
                    // The prober thread ended (it only does when stopped, so it died).
                    None => {
                        tracing::error!("the driver watcher stopped; /healthz reports it");
                        served.watcher_stopped = true;
                    }
                },
                _ = health_check.tick() => served.check_health(),
            }
        }
        prober.stop();
        served.stop_all().await;
        flexvolume_host::runner::remove_own_cgroups();
        metrics_task.abort();
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(dir: &std::path::Path) -> Served {
        let runner = RunnerConfig::default();
        Served {
            args: ServeArgs {
                mode: Mode::Node,
                csi_dir: dir.join("plugins"),
                registration_dir: dir.join("registry"),
                metrics_address: ([127, 0, 0, 1], 0).into(),
                socket_group: None,
                controller_records: RecordsHome::StateDir,
                records_credentials: kubernetes_records::DEFAULT_CREDENTIALS.into(),
                fence_lease: std::time::Duration::from_secs(20),
            },
            endpoints: HashMap::new(),
            unserved: BTreeMap::new(),
            watcher_stopped: false,
            metrics: metrics::Metrics::new(),
            health: Arc::default(),
            lifecycle: Arc::new(Lifecycle::new(
                runner.clone(),
                flexvolume_host::state::StateDir::new(dir.join("state")),
                "n".to_owned(),
            )),
            resolver: Arc::new(Resolver::new(Arc::new(Registry::new()), runner)),
        }
    }

    /// The prober thread cannot be killed from outside a real `flexd serve`; what the serving
    /// loop does when its events end is this.
    #[test]
    fn a_dead_watcher_and_an_unserved_driver_are_problems() {
        let dir = std::env::temp_dir().join(format!("flexd-health-{}", std::process::id()));
        let mut served = served(&dir);
        assert!(served.problems().is_empty());
        served.watcher_stopped = true;
        served.unserved.insert(
            DriverName::parse("acme/x").unwrap(),
            "cannot listen".to_owned(),
        );
        assert_eq!(
            served.problems(),
            [
                "the driver watcher stopped: installs, updates and removals are no longer seen",
                "driver acme/x: not served: cannot listen",
            ]
        );
    }
}
