//! The registry: what is known about every driver, by name, for every front end
//! (docs/discovery.md#manager).
//!
//! A running program (`flexd serve`) feeds it the prober's events; a one-shot program
//! (`flexd volume`) probes the one driver it needs ([`Registry::probe_one`]), which records the
//! same outcome an event would. Either way there is one answer per driver name: ready (with its
//! plugin), failed (with the reason), or removed — and a removed driver that volumes still use is
//! told apart from one that was never there, so a refused mount can say *why*.
//!
//! As kubelet's `VolumePluginMgr`, it also holds *static* plugins, registered by a program that
//! embeds the library, apart from the probed ones: a probed driver taking a static one's name is
//! neither preferred nor dropped, its lookups fail naming both (docs/discovery.md#static-and-probed).
//!
//! A driver whose `init` failed is remembered as failed and is never replaced by an older
//! version: the user must see that the new driver is broken
//! (docs/discovery.md#failed-not-cached). Volumes mounted through a removed
//! driver are torn down with the copy pinned at mount time (see [`crate::resolver`]), not
//! through the registry.
//!
//! Lookups are two hash lookups under a read lock, whatever the number of drivers
//! (k8s#124839: kubelet's lookups raced with probing).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::layout::{self, LayoutPolicy};
use crate::plugin::Plugin;
use crate::prober::{EventKind, ProbeEvent};
use crate::runner::RunnerConfig;
use flexvolume_protocol::name::DriverName;
use flexvolume_protocol::spec::VolumeSpec;

/// Why no plugin can be used for a driver name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    #[error("no plugin matched driver {driver}: it is not installed in the plugin dir")]
    NoneMatched { driver: DriverName },
    #[error("multiple plugins matched driver {driver}: {}", .matched.join(", "))]
    MultipleMatched {
        driver: DriverName,
        /// Each match, described with where it comes from.
        matched: Vec<String>,
    },
    #[error("driver {driver} failed init, so it is not used (an older version is not kept either): {reason}")]
    Failed { driver: DriverName, reason: String },
    #[error("driver {driver} was removed: new mounts through it are refused{}",
        if *.volumes_in_use > 0 { format!("; its {} mounted volume(s) can still be unmounted", .volumes_in_use) } else { String::new() })]
    Removed {
        driver: DriverName,
        volumes_in_use: usize,
    },
}

/// Why a static plugin cannot be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("duplicate plugin name {driver}: {existing} and {new}")]
pub struct DuplicateName {
    pub driver: DriverName,
    pub existing: PathBuf,
    pub new: PathBuf,
}

/// What is known about one probed driver.
#[derive(Debug, Clone)]
pub enum DriverState {
    /// Its last `init` succeeded: this plugin serves it.
    Ready(Arc<Plugin>),
    /// Its layout or last `init` failed, for this reason.
    Failed(String),
    /// It was there and went away.
    Removed,
}

impl DriverState {
    /// What a processed change says about its driver; `None` for an entry that is not a driver.
    pub fn after(event: &ProbeEvent) -> Option<(&DriverName, DriverState)> {
        let name = event.subject.driver()?;
        let state = match (event.kind, &event.plugin) {
            (EventKind::Add | EventKind::Update, Some(plugin)) => Self::Ready(plugin.clone()),
            (EventKind::Add | EventKind::Update, None) => {
                Self::Failed("the prober reported it ready without a plugin".into())
            }
            (EventKind::Failed, _) => Self::Failed(
                event
                    .error
                    .clone()
                    .unwrap_or_else(|| "unknown error".into()),
            ),
            (EventKind::Remove, _) => Self::Removed,
        };
        Some((name, state))
    }

    pub fn plugin(&self) -> Option<&Arc<Plugin>> {
        match self {
            Self::Ready(plugin) => Some(plugin),
            Self::Failed(_) | Self::Removed => None,
        }
    }
}

#[derive(Debug, Default)]
struct Drivers {
    statics: HashMap<DriverName, Arc<Plugin>>,
    probed: HashMap<DriverName, DriverState>,
}

/// Every known driver; cheap to share (`Arc<Registry>`) and safe under concurrency.
#[derive(Debug, Default)]
pub struct Registry {
    drivers: RwLock<Drivers>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    // A poisoned lock only means another thread panicked mid-update of a map of `Arc`s; the map
    // itself is still consistent, so keep serving rather than fail every later lookup.
    fn read(&self) -> RwLockReadGuard<'_, Drivers> {
        self.drivers.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Drivers> {
        self.drivers.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a plugin that is not probed (built into the embedding program).
    pub fn register_static(&self, plugin: Arc<Plugin>) -> Result<(), DuplicateName> {
        let mut drivers = self.write();
        let name = plugin.driver.name.clone();
        if let Some(existing) = drivers.statics.get(&name) {
            return Err(DuplicateName {
                driver: name,
                existing: existing.driver.path.clone(),
                new: plugin.driver.path.clone(),
            });
        }
        drivers.statics.insert(name, plugin);
        Ok(())
    }

    /// Applies one processed change from the prober. Returns the driver it changed; an entry
    /// that is not a driver (a broken plugin-dir entry) has nothing to register.
    pub fn apply<'e>(&self, event: &'e ProbeEvent) -> Option<&'e DriverName> {
        let (name, state) = DriverState::after(event)?;
        self.write().probed.insert(name.clone(), state);
        Some(name)
    }

    /// Probes one driver now (its layout and `init`) and records the outcome, as a prober event
    /// would. For one-shot programs that need one driver, not the whole plugin dir.
    pub(crate) fn probe_one(
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
            Err(e) => DriverState::Failed(e.to_string()),
            Ok(driver) => match Plugin::init(driver, runner) {
                Ok(plugin) => DriverState::Ready(Arc::new(plugin)),
                Err(e) => DriverState::Failed(format!("init failed: {e}")),
            },
        };
        self.write().probed.insert(name.clone(), state);
    }

    /// What the prober (or a one-shot probe) found about a driver; `None` if never probed.
    pub fn state(&self, name: &DriverName) -> Option<DriverState> {
        self.read().probed.get(name).cloned()
    }

    /// The driver's plugin, if exactly one is usable.
    pub fn plugin(&self, name: &DriverName) -> Option<Arc<Plugin>> {
        self.find(name, || 0).ok()
    }

    /// The plugin for new work through a driver, or why there is none. `volumes_in_use` tells,
    /// for a driver that is not installed, how many volumes still depend on it: it turns "none
    /// matched" into "removed while in use" and is only called then.
    pub fn find(
        &self,
        name: &DriverName,
        volumes_in_use: impl FnOnce() -> usize,
    ) -> Result<Arc<Plugin>, LookupError> {
        let drivers = self.read();
        let driver = name.clone();
        match (drivers.statics.get(name), drivers.probed.get(name)) {
            (Some(s), Some(DriverState::Ready(p))) => Err(LookupError::MultipleMatched {
                driver,
                matched: vec![
                    format!("static plugin {}", s.driver.path.display()),
                    format!("probed plugin {}", p.driver.path.display()),
                ],
            }),
            (Some(s), _) => Ok(s.clone()),
            (None, Some(DriverState::Ready(plugin))) => Ok(plugin.clone()),
            (None, Some(DriverState::Failed(reason))) => Err(LookupError::Failed {
                driver,
                reason: reason.clone(),
            }),
            (None, Some(DriverState::Removed)) => Err(LookupError::Removed {
                driver,
                volumes_in_use: volumes_in_use(),
            }),
            // Not there at all: if volumes still use it, it was removed under them.
            (None, None) => match volumes_in_use() {
                0 => Err(LookupError::NoneMatched { driver }),
                n => Err(LookupError::Removed {
                    driver,
                    volumes_in_use: n,
                }),
            },
        }
    }

    /// The plugin for a volume: the one named by its `flexVolume.driver`.
    pub fn find_by_spec(
        &self,
        spec: &VolumeSpec,
        volumes_in_use: impl FnOnce() -> usize,
    ) -> Result<Arc<Plugin>, LookupError> {
        self.find(&spec.driver, volumes_in_use)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::InstalledDriver;
    use crate::prober::Subject;

    // A reply as a driver's `init` prints it: the test stands in for the driver.
    fn plugin(name: &str, path: &str) -> Arc<Plugin> {
        let driver = InstalledDriver {
            name: DriverName::parse(name).unwrap(),
            dir: Path::new(path).parent().unwrap().to_owned(),
            path: path.into(),
        };
        let reply = flexvolume_protocol::find_reply(br#"{"status":"Success"}"#).unwrap();
        Arc::new(Plugin::from_init_reply(driver, &reply))
    }

    fn event(kind: EventKind, name: &str, plugin: Option<Arc<Plugin>>) -> ProbeEvent {
        let dir_name = name.replace('/', "~");
        let subject = Subject::of_dir_name(&dir_name);
        ProbeEvent {
            kind,
            driver: subject.label(),
            subject,
            dir_name,
            path: None,
            plugin,
            error: (kind == EventKind::Failed).then(|| "init failed: exit status 1".into()),
        }
    }

    /// The event of `name` installed (or updated) at `path`, its init answered.
    fn added(name: &str, path: &str) -> ProbeEvent {
        event(EventKind::Add, name, Some(plugin(name, path)))
    }

    /// A registry with one static (builtin) plugin.
    fn with_static(name: &str, path: &str) -> Registry {
        let registry = Registry::new();
        registry.register_static(plugin(name, path)).unwrap();
        registry
    }

    /// Two copies under one name: the error says which two, so the operator can remove one.
    fn assert_names_both(err: &dyn std::fmt::Display, one: &str, other: &str) {
        let text = err.to_string();
        assert!(text.contains(one) && text.contains(other), "{text}");
    }

    fn name(n: &str) -> DriverName {
        DriverName::parse(n).unwrap()
    }

    fn path_of(registry: &Registry, n: &str) -> PathBuf {
        registry.find(&name(n), || 0).unwrap().driver.path.clone()
    }

    #[test]
    fn none_failed_removed_and_ready_are_distinct() {
        let registry = Registry::new();
        assert_eq!(
            registry.find(&name("a/x"), || 0).unwrap_err(),
            LookupError::NoneMatched {
                driver: name("a/x")
            }
        );
        registry.apply(&added("a/x", "/p/a~x/x"));
        assert_eq!(path_of(&registry, "a/x"), PathBuf::from("/p/a~x/x"));
        registry.apply(&event(EventKind::Remove, "a/x", None));
        let removed = registry.find(&name("a/x"), || 2).unwrap_err();
        assert_eq!(
            removed,
            LookupError::Removed {
                driver: name("a/x"),
                volumes_in_use: 2
            }
        );
        assert!(removed.to_string().contains("2 mounted volume(s)"));
        assert!(registry.plugin(&name("a/x")).is_none());
    }

    #[test]
    fn a_driver_never_seen_but_still_used_was_removed_under_its_volumes() {
        let registry = Registry::new();
        let err = registry.find(&name("a/x"), || 1).unwrap_err();
        assert!(
            matches!(
                err,
                LookupError::Removed {
                    volumes_in_use: 1,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_failed_update_is_not_replaced_by_the_older_version() {
        let registry = Registry::new();
        registry.apply(&added("a/x", "/p/a~x/x"));
        registry.apply(&event(EventKind::Failed, "a/x", None));
        let err = registry.find(&name("a/x"), || 0).unwrap_err();
        assert!(matches!(err, LookupError::Failed { .. }), "{err}");
        assert!(err.to_string().contains("exit status 1"));
        assert!(registry.plugin(&name("a/x")).is_none());
        // Fixed: usable again, and the new version is the one used.
        registry.apply(&added("a/x", "/p/a~x/x2"));
        assert_eq!(path_of(&registry, "a/x"), PathBuf::from("/p/a~x/x2"));
    }

    #[test]
    fn an_invalid_entry_registers_nothing() {
        let registry = Registry::new();
        assert_eq!(
            registry.apply(&event(EventKind::Failed, "a/-x", None)),
            None
        );
        assert!(registry.read().probed.is_empty());
    }

    #[test]
    fn ready_without_a_plugin_is_a_failure_not_a_panic() {
        let registry = Registry::new();
        registry.apply(&event(EventKind::Add, "a/x", None));
        let err = registry.find(&name("a/x"), || 0).unwrap_err();
        assert!(err.to_string().contains("without a plugin"), "{err}");
    }

    #[test]
    fn a_one_shot_probe_records_what_an_event_would() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::new();
        let runner = RunnerConfig::default();
        // Not installed: nothing known.
        registry.probe_one(dir.path(), &name("a/x"), LayoutPolicy::default(), &runner);
        assert!(registry.state(&name("a/x")).is_none());
        // Installed but not executable: failed, with the layout's reason.
        std::fs::create_dir(dir.path().join("a~x")).unwrap();
        std::fs::write(dir.path().join("a~x/x"), "#!/bin/sh\n").unwrap();
        registry.probe_one(dir.path(), &name("a/x"), LayoutPolicy::default(), &runner);
        let err = registry.find(&name("a/x"), || 0).unwrap_err();
        assert!(err.to_string().contains("not executable"), "{err}");
    }

    #[test]
    fn duplicate_static_names_are_refused_naming_both() {
        let registry = with_static("a/x", "/opt/one/x");
        let err = registry
            .register_static(plugin("a/x", "/opt/two/x"))
            .unwrap_err();
        assert_names_both(&err, "/opt/one/x", "/opt/two/x");
    }

    #[test]
    fn a_probed_driver_taking_a_static_name_makes_lookups_name_both() {
        let registry = with_static("a/x", "/opt/builtin/x");
        assert!(registry.find(&name("a/x"), || 0).is_ok());
        registry.apply(&added("a/x", "/p/a~x/x"));
        let err = registry.find(&name("a/x"), || 0).unwrap_err();
        assert!(matches!(err, LookupError::MultipleMatched { .. }));
        assert_names_both(&err, "/opt/builtin/x", "/p/a~x/x");
        assert!(registry.plugin(&name("a/x")).is_none());
        // The probed one goes away: the static one is the only match again.
        registry.apply(&event(EventKind::Remove, "a/x", None));
        assert_eq!(path_of(&registry, "a/x"), PathBuf::from("/opt/builtin/x"));
    }

    #[test]
    fn lookups_by_spec_use_the_spec_driver() {
        let registry = Registry::new();
        registry.apply(&added("a/x", "/p/a~x/x"));
        let spec = VolumeSpec::new("pv".into(), name("a/x"));
        assert!(registry.find_by_spec(&spec, || 0).is_ok());
        let other = VolumeSpec::new("pv".into(), name("a/y"));
        assert!(matches!(
            registry.find_by_spec(&other, || 0),
            Err(LookupError::NoneMatched { .. })
        ));
    }

    #[test]
    fn concurrent_lookups_and_updates_never_see_a_torn_state() {
        let registry = Arc::new(Registry::new());
        registry.apply(&added("a/x", "/p/a~x/x"));
        std::thread::scope(|scope| {
            let writer = registry.clone();
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
                let reader = registry.clone();
                scope.spawn(move || {
                    for _ in 0..5000 {
                        let found = reader.find(&name("a/x"), || 0).unwrap();
                        assert!(found.driver.path.starts_with("/p/a~x"));
                    }
                });
            }
        });
        assert_eq!(registry.read().probed.len(), 2001);
        assert!(registry.plugin(&name("b/n1999")).is_some());
    }
}
