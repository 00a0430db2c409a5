//! The plugin manager: which plugin serves a volume (docs/discovery.md#manager).
//!
//! It holds two kinds of plugins, as kubelet's `VolumePluginMgr` does: *static* ones, registered
//! explicitly by the program embedding the library, and *probed* ones, which follow the
//! prober's events. They live in separate maps, so a probed driver that takes a static one's name
//! is not silently preferred or dropped: looking that name up fails with "multiple plugins
//! matched", naming both, until one of them goes. Two static plugins with one name are refused
//! when the second is registered.
//!
//! A probed driver whose `init` failed is remembered as failed and is never replaced by an older
//! cached version: the user must see that the new driver is broken
//! (docs/discovery.md#failed-not-cached). A driver that was removed is remembered too, so that
//! a mount through it can say *why* it is refused — volumes mounted through it are torn down
//! with the copy pinned at mount time (see [`crate::state::StateDir::pin`]), not through the
//! manager.
//!
//! Lookups take a read lock and do two hash lookups, whatever the number of plugins
//! (k8s#124839: kubelet's lookups raced with probing).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::layout::{self, LayoutPolicy};
use crate::name::DriverName;
use crate::plugin::Plugin;
use crate::prober::{EventKind, ProbeEvent};
use crate::runner::RunnerConfig;
use crate::spec::VolumeSpec;

/// Why no single plugin can be used for a driver name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    #[error("no plugin matched driver {driver}: it is not installed in the plugin dir")]
    NoneMatched { driver: String },
    #[error("multiple plugins matched driver {driver}: {}", .matched.join(", "))]
    MultipleMatched {
        driver: String,
        /// Each match, described with where it comes from.
        matched: Vec<String>,
    },
    #[error("driver {driver} failed init, so it is not used (an older version is not kept either): {reason}")]
    Failed { driver: String, reason: String },
    #[error("driver {driver} was removed: new mounts through it are refused{}",
        if *.volumes_in_use > 0 { format!("; its {} mounted volume(s) can still be unmounted", .volumes_in_use) } else { String::new() })]
    Removed {
        driver: String,
        volumes_in_use: usize,
    },
}

/// Why a static plugin cannot be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("duplicate plugin name {driver}: {existing} and {new}")]
pub struct DuplicateName {
    pub driver: String,
    pub existing: PathBuf,
    pub new: PathBuf,
}

/// What is known about a probed driver.
#[derive(Debug, Clone)]
enum Probed {
    Ready(Arc<Plugin>),
    Failed(String),
    Removed,
}

#[derive(Debug, Default)]
struct Registry {
    statics: HashMap<DriverName, Arc<Plugin>>,
    probed: HashMap<DriverName, Probed>,
}

/// The registry of plugins; cheap to share (`Arc<PluginManager>`) and safe under concurrency.
#[derive(Debug, Default)]
pub struct PluginManager {
    registry: RwLock<Registry>,
}

impl PluginManager {
    pub fn new() -> Self {
        Self::default()
    }

    // A poisoned lock only means another thread panicked mid-update of a map of `Arc`s; the map
    // itself is still consistent, so keep serving rather than fail every later lookup.
    fn read(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Registry> {
        self.registry.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a plugin that is not probed (built into the embedding program).
    pub fn register_static(&self, plugin: Arc<Plugin>) -> Result<(), DuplicateName> {
        let mut registry = self.write();
        let name = plugin.driver.name.clone();
        if let Some(existing) = registry.statics.get(&name) {
            return Err(DuplicateName {
                driver: name.to_string(),
                existing: existing.driver.path.clone(),
                new: plugin.driver.path.clone(),
            });
        }
        registry.statics.insert(name, plugin);
        Ok(())
    }

    /// Applies one processed change from the prober. Events whose name is not a valid driver
    /// name (a broken plugin-dir entry) have nothing to register.
    pub fn apply(&self, event: &ProbeEvent) {
        let Ok(name) = DriverName::parse(&event.driver) else {
            return;
        };
        let state = match (event.kind, &event.plugin) {
            (EventKind::Add | EventKind::Update, Some(plugin)) => Probed::Ready(plugin.clone()),
            (EventKind::Add | EventKind::Update, None) => {
                Probed::Failed("the prober reported it ready without a plugin".into())
            }
            (EventKind::Failed, _) => Probed::Failed(
                event
                    .error
                    .clone()
                    .unwrap_or_else(|| "unknown error".into()),
            ),
            (EventKind::Remove, _) => Probed::Removed,
        };
        self.write().probed.insert(name, state);
    }

    /// Probes one driver now (its layout and `init`) and records the outcome, as a prober event
    /// would. For one-shot programs that need one driver, not the whole plugin dir.
    pub fn probe_one(
        &self,
        plugin_dir: &Path,
        name: &DriverName,
        policy: LayoutPolicy,
        runner: &RunnerConfig,
    ) {
        let installed = std::fs::symlink_metadata(plugin_dir.join(name.dir_name())).is_ok();
        let state = match layout::locate(plugin_dir, name, policy) {
            Err(_) if !installed => {
                self.write().probed.remove(name);
                return;
            }
            Err(e) => Probed::Failed(e.to_string()),
            Ok(driver) => match Plugin::init(driver, runner) {
                Ok(plugin) => Probed::Ready(Arc::new(plugin)),
                Err(e) => Probed::Failed(format!("init failed: {e}")),
            },
        };
        self.write().probed.insert(name.clone(), state);
    }

    /// The one plugin for a driver name. `volumes_in_use` tells, for a driver that is not
    /// installed, how many volumes still depend on it: it turns "none matched" into "removed
    /// while in use" and is only called then.
    pub fn find_by_name(
        &self,
        name: &DriverName,
        volumes_in_use: impl FnOnce() -> usize,
    ) -> Result<Arc<Plugin>, LookupError> {
        let registry = self.read();
        let driver = || name.to_string();
        let static_plugin = registry.statics.get(name);
        match (static_plugin, registry.probed.get(name)) {
            (Some(s), Some(Probed::Ready(p))) => Err(LookupError::MultipleMatched {
                driver: driver(),
                matched: vec![
                    format!("static plugin {}", s.driver.path.display()),
                    format!("probed plugin {}", p.driver.path.display()),
                ],
            }),
            (Some(s), _) => Ok(s.clone()),
            (None, Some(Probed::Ready(p))) => Ok(p.clone()),
            (None, Some(Probed::Failed(reason))) => Err(LookupError::Failed {
                driver: driver(),
                reason: reason.clone(),
            }),
            (None, Some(Probed::Removed)) => Err(LookupError::Removed {
                driver: driver(),
                volumes_in_use: volumes_in_use(),
            }),
            // Not there at all: if volumes still use it, it was removed under them.
            (None, None) => match volumes_in_use() {
                0 => Err(LookupError::NoneMatched { driver: driver() }),
                n => Err(LookupError::Removed {
                    driver: driver(),
                    volumes_in_use: n,
                }),
            },
        }
    }

    /// The one plugin for a volume: the one named by its `flexVolume.driver`.
    pub fn find_by_spec(
        &self,
        spec: &VolumeSpec,
        volumes_in_use: impl FnOnce() -> usize,
    ) -> Result<Arc<Plugin>, LookupError> {
        self.find_by_name(&spec.driver, volumes_in_use)
    }

    /// The names of every usable plugin, sorted.
    pub fn ready_names(&self) -> Vec<DriverName> {
        let registry = self.read();
        let mut names: Vec<DriverName> = registry
            .statics
            .keys()
            .chain(
                registry
                    .probed
                    .iter()
                    .filter(|(_, p)| matches!(p, Probed::Ready(_)))
                    .map(|(n, _)| n),
            )
            .cloned()
            .collect();
        names.sort_by_key(|n| n.to_string());
        names.dedup();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Driver;

    fn plugin(name: &str, path: &str) -> Arc<Plugin> {
        let driver = Driver {
            name: DriverName::parse(name).unwrap(),
            dir: Path::new(path).parent().unwrap().to_owned(),
            path: path.into(),
        };
        let reply = crate::protocol::find_reply(br#"{"status":"Success"}"#).unwrap();
        Arc::new(Plugin::from_init_reply(driver, &reply))
    }

    fn event(kind: EventKind, name: &str, plugin: Option<Arc<Plugin>>) -> ProbeEvent {
        ProbeEvent {
            kind,
            driver: name.into(),
            dir_name: name.replace('/', "~"),
            path: None,
            plugin,
            error: (kind == EventKind::Failed).then(|| "init failed: exit status 1".into()),
        }
    }

    fn name(n: &str) -> DriverName {
        DriverName::parse(n).unwrap()
    }

    #[test]
    fn none_failed_removed_and_ready_are_distinct() {
        let manager = PluginManager::new();
        assert_eq!(
            manager.find_by_name(&name("a/x"), || 0).unwrap_err(),
            LookupError::NoneMatched {
                driver: "a/x".into()
            }
        );
        manager.apply(&event(
            EventKind::Add,
            "a/x",
            Some(plugin("a/x", "/p/a~x/x")),
        ));
        assert_eq!(
            manager
                .find_by_name(&name("a/x"), || 0)
                .unwrap()
                .driver
                .path,
            PathBuf::from("/p/a~x/x")
        );
        manager.apply(&event(EventKind::Remove, "a/x", None));
        let removed = manager.find_by_name(&name("a/x"), || 2).unwrap_err();
        assert_eq!(
            removed,
            LookupError::Removed {
                driver: "a/x".into(),
                volumes_in_use: 2
            }
        );
        assert!(removed.to_string().contains("2 mounted volume(s)"));
    }

    #[test]
    fn a_failed_update_is_not_replaced_by_the_older_version() {
        let manager = PluginManager::new();
        manager.apply(&event(
            EventKind::Add,
            "a/x",
            Some(plugin("a/x", "/p/a~x/x")),
        ));
        manager.apply(&event(EventKind::Failed, "a/x", None));
        let err = manager.find_by_name(&name("a/x"), || 0).unwrap_err();
        assert!(matches!(err, LookupError::Failed { .. }), "{err}");
        assert!(err.to_string().contains("exit status 1"));
        // Fixed: usable again, and the new version is the one used.
        manager.apply(&event(
            EventKind::Add,
            "a/x",
            Some(plugin("a/x", "/p/a~x/x2")),
        ));
        assert_eq!(
            manager
                .find_by_name(&name("a/x"), || 0)
                .unwrap()
                .driver
                .path,
            PathBuf::from("/p/a~x/x2")
        );
    }

    #[test]
    fn duplicate_static_names_are_refused_naming_both() {
        let manager = PluginManager::new();
        manager
            .register_static(plugin("a/x", "/opt/one/x"))
            .unwrap();
        let err = manager
            .register_static(plugin("a/x", "/opt/two/x"))
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("/opt/one/x") && text.contains("/opt/two/x"),
            "{text}"
        );
    }

    #[test]
    fn a_probed_driver_taking_a_static_name_makes_lookups_name_both() {
        let manager = PluginManager::new();
        manager
            .register_static(plugin("a/x", "/opt/builtin/x"))
            .unwrap();
        assert!(manager.find_by_name(&name("a/x"), || 0).is_ok());
        manager.apply(&event(
            EventKind::Add,
            "a/x",
            Some(plugin("a/x", "/p/a~x/x")),
        ));
        let err = manager.find_by_name(&name("a/x"), || 0).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, LookupError::MultipleMatched { .. }));
        assert!(
            text.contains("/opt/builtin/x") && text.contains("/p/a~x/x"),
            "{text}"
        );
        // The probed one goes away: the static one is the only match again.
        manager.apply(&event(EventKind::Remove, "a/x", None));
        assert_eq!(
            manager
                .find_by_name(&name("a/x"), || 0)
                .unwrap()
                .driver
                .path,
            PathBuf::from("/opt/builtin/x")
        );
        assert_eq!(manager.ready_names(), vec![name("a/x")]);
    }

    #[test]
    fn lookups_by_spec_use_the_spec_driver() {
        let manager = PluginManager::new();
        manager.apply(&event(
            EventKind::Add,
            "a/x",
            Some(plugin("a/x", "/p/a~x/x")),
        ));
        let spec = VolumeSpec::new("pv".into(), name("a/x"));
        assert!(manager.find_by_spec(&spec, || 0).is_ok());
        let other = VolumeSpec::new("pv".into(), name("a/y"));
        assert!(matches!(
            manager.find_by_spec(&other, || 0),
            Err(LookupError::NoneMatched { .. })
        ));
    }

    #[test]
    fn concurrent_lookups_and_updates_never_see_a_torn_state() {
        let manager = Arc::new(PluginManager::new());
        manager.apply(&event(
            EventKind::Add,
            "a/x",
            Some(plugin("a/x", "/p/a~x/x")),
        ));
        std::thread::scope(|scope| {
            let writer = manager.clone();
            scope.spawn(move || {
                for i in 0..2000 {
                    let path = format!("/p/a~x/v{i}");
                    writer.apply(&event(EventKind::Update, "a/x", Some(plugin("a/x", &path))));
                    writer.apply(&event(
                        EventKind::Add,
                        &format!("b/n{i}"),
                        Some(plugin("b/y", "/q")),
                    ));
                }
            });
            for _ in 0..2 {
                let reader = manager.clone();
                scope.spawn(move || {
                    for _ in 0..5000 {
                        let found = reader.find_by_name(&name("a/x"), || 0).unwrap();
                        assert!(found.driver.path.starts_with("/p/a~x"));
                    }
                });
            }
        });
        assert_eq!(manager.ready_names().len(), 2001);
    }
}
