//! Which plugin a recorded volume is torn down (or changed) with: the installed driver's current
//! plugin, else the copy of the executable pinned when the volume was set up.
//!
//! One rule for every front end. A long-running program (`flexd serve`) has a prober feeding
//! its [`Registry`]; a one-shot program (`flexd volume`) has no prober, so the resolver probes the
//! one driver it is asked about ([`Resolver::probing`]).
//!
//! A pinned copy is initialised like any driver: its `init` is run and its reply gives the
//! plugin's capabilities. Assuming them instead would tear the volume down with defaults that
//! may not be the driver's (e.g. `attach`, which decides whether detach runs); the copy is the
//! very executable whose `init` succeeded at mount time, so its answer is the one it gave then.

use std::path::PathBuf;
use std::sync::Arc;

use crate::layout::{InstalledDriver, LayoutPolicy};
use crate::lifecycle::DriverResolver;
use crate::plugin::Plugin;
use crate::registry::{DriverState, LookupError, Registry};
use crate::runner::RunnerConfig;
use crate::state::{StateDir, VolumeRecord};
use flexvolume_protocol::name::DriverName;

/// Where a one-shot program finds the drivers it probes on demand.
#[derive(Debug, Clone)]
struct OnDemand {
    plugin_dir: PathBuf,
    policy: LayoutPolicy,
}

/// Resolves drivers through a [`Registry`], falling back to pinned copies for teardown.
#[derive(Debug, Clone)]
pub struct Resolver {
    registry: Arc<Registry>,
    runner: RunnerConfig,
    on_demand: Option<OnDemand>,
}

impl Resolver {
    /// For a program whose registry a running prober keeps current.
    pub fn new(registry: Arc<Registry>, runner: RunnerConfig) -> Self {
        Self {
            registry,
            runner,
            on_demand: None,
        }
    }

    /// For a one-shot program: each driver it is asked about is probed (layout and `init`) when
    /// the registry does not know it yet.
    pub fn probing(runner: RunnerConfig, plugin_dir: PathBuf, policy: LayoutPolicy) -> Self {
        Self {
            registry: Arc::new(Registry::new()),
            runner,
            on_demand: Some(OnDemand { plugin_dir, policy }),
        }
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// What is known about a driver, probing it first if this resolver probes on demand.
    fn state(&self, name: &DriverName) -> Option<DriverState> {
        if let (None, Some(on_demand)) = (self.registry.state(name), &self.on_demand) {
            self.registry
                .probe_one(&on_demand.plugin_dir, name, on_demand.policy, &self.runner);
        }
        self.registry.state(name)
    }

    /// The plugin for new work (mount, attach) through a driver, or why there is none: a
    /// driver that is absent, broken or removed while volumes use it is refused.
    pub fn find(
        &self,
        name: &DriverName,
        volumes_in_use: impl FnOnce() -> usize,
    ) -> Result<Arc<Plugin>, LookupError> {
        self.state(name);
        self.registry.find(name, volumes_in_use)
    }

    /// The copy of `name` pinned by any recorded volume, for work that must go on after the
    /// driver was removed (detach of a volume it attached).
    pub fn pinned_for(&self, state: &StateDir, name: &DriverName) -> Option<Arc<Plugin>> {
        let record = state
            .list()
            .ok()?
            .into_iter()
            .flatten()
            .find(|r| r.driver == *name && r.pinned.is_some())?;
        self.pinned(&record)
    }

    /// A plugin running the executable pinned in a volume record, initialised by its own `init`.
    pub fn pinned(&self, record: &VolumeRecord) -> Option<Arc<Plugin>> {
        let path = record.pinned.clone()?;
        let driver = InstalledDriver {
            name: record.driver.clone(),
            dir: path.parent()?.to_owned(),
            path,
        };
        match Plugin::init(driver, &self.runner) {
            Ok(plugin) => Some(Arc::new(plugin)),
            Err(e) => {
                tracing::warn!(driver = %record.driver, pinned = ?record.pinned, error = %e, "the pinned copy failed init");
                None
            }
        }
    }
}

impl DriverResolver for Resolver {
    fn resolve(&self, record: &VolumeRecord) -> Option<Arc<Plugin>> {
        let name = &record.driver;
        match self.find(name, || 0) {
            Ok(plugin) => return Some(plugin),
            Err(LookupError::Failed { reason, .. }) => {
                tracing::warn!(driver = %name, error = %reason, "installed driver failed init; using the pinned copy")
            }
            Err(e) => {
                tracing::info!(driver = %name, pinned = ?record.pinned, reason = %e, "driver not usable; tearing down with its pinned copy")
            }
        }
        self.pinned(record)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::*;
    use crate::state::{Progress, Role};

    /// A driver whose `init` answers with `attach` as given, or fails.
    fn driver_script(path: &Path, init: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let body = format!(
            "#!/bin/sh\ncase \"$1\" in init) echo '{init}';; *) echo '{{\"status\":\"Not supported\"}}';; esac\n"
        );
        std::fs::write(path, body).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn record(pinned: Option<PathBuf>) -> VolumeRecord {
        VolumeRecord {
            target: "/t/a".into(),
            driver: DriverName::parse("acme/drv").unwrap(),
            volume_name: "pv".into(),
            fs_type: String::new(),
            read_only: false,
            options: BTreeMap::new(),
            attachable: false,
            node: "n".into(),
            device: None,
            staging: None,
            detach_name: "pv".into(),
            pinned,
            created_target: false,
            progress: Progress::Mounted,
            role: Role::Mount,
        }
    }

    const NO_ATTACH: &str = r#"{"status":"Success","capabilities":{"attach":false}}"#;

    #[test]
    fn a_pinned_copy_takes_its_capabilities_from_its_own_init() {
        let dir = tempfile::tempdir().unwrap();
        let pinned = dir.path().join("pins/acme~drv/1/drv");
        driver_script(&pinned, NO_ATTACH);
        let resolver = Resolver::probing(
            RunnerConfig::default(),
            dir.path().join("exec"),
            LayoutPolicy::default(),
        );
        // Not installed: the pinned copy, with the capabilities it answered (not the defaults).
        let plugin = resolver.resolve(&record(Some(pinned.clone()))).unwrap();
        assert_eq!(plugin.driver.path, pinned);
        assert!(!plugin.capabilities.attach);
        // No pinned copy: nothing to tear down with.
        assert!(resolver.resolve(&record(None)).is_none());
    }

    #[test]
    fn a_pinned_copy_whose_init_fails_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let pinned = dir.path().join("pins/acme~drv/1/drv");
        driver_script(&pinned, r#"{"status":"Failure","message":"no backend"}"#);
        let resolver = Resolver::new(Arc::new(Registry::new()), RunnerConfig::default());
        assert!(resolver.resolve(&record(Some(pinned))).is_none());
    }

    #[test]
    fn the_installed_driver_wins_over_the_pinned_copy() {
        let dir = tempfile::tempdir().unwrap();
        let plugin_dir = dir.path().join("exec");
        let installed = plugin_dir.join("acme~drv/drv");
        driver_script(&installed, NO_ATTACH);
        let pinned = dir.path().join("pins/acme~drv/1/drv");
        driver_script(&pinned, NO_ATTACH);
        let resolver =
            Resolver::probing(RunnerConfig::default(), plugin_dir, LayoutPolicy::default());
        let plugin = resolver.resolve(&record(Some(pinned))).unwrap();
        assert_eq!(plugin.driver.path, installed);
        // The one-shot probe is what the registry now knows.
        let name = DriverName::parse("acme/drv").unwrap();
        assert!(resolver.registry().plugin(&name).is_some());
        assert!(resolver.find(&name, || 0).is_ok());
    }
}
