//! One FlexVolume driver as served through CSI: its names, sockets and current plugin.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use flexvolume::{DriverName, Plugin};

/// A driver flexd serves. The plugin is swapped when the driver is updated; `None` while its
/// last init failed (Probe then answers not ready and every operation fails clearly).
pub struct ServedDriver {
    pub name: DriverName,
    pub csi_name: String,
    pub csi_socket: PathBuf,
    pub registration_socket: Option<PathBuf>,
    plugin: RwLock<Option<Arc<Plugin>>>,
}

impl ServedDriver {
    pub fn new(
        name: DriverName,
        csi_name: String,
        csi_socket: PathBuf,
        registration_socket: Option<PathBuf>,
        plugin: Option<Arc<Plugin>>,
    ) -> Self {
        Self {
            name,
            csi_name,
            csi_socket,
            registration_socket,
            plugin: RwLock::new(plugin),
        }
    }

    pub fn plugin(&self) -> Option<Arc<Plugin>> {
        self.plugin.read().ok().and_then(|p| p.clone())
    }

    pub fn set_plugin(&self, plugin: Option<Arc<Plugin>>) {
        if let Ok(mut slot) = self.plugin.write() {
            *slot = plugin;
        }
    }
}

/// The plugin a served driver's volumes are torn down with: the one served now, or (while its
/// init fails) the copy pinned when the volume was set up.
pub struct ServedResolver(pub Arc<ServedDriver>);

impl flexvolume::lifecycle::DriverResolver for ServedResolver {
    fn resolve(&self, record: &flexvolume::state::VolumeRecord) -> Option<Arc<Plugin>> {
        if record.driver != self.0.name.as_str() {
            return None;
        }
        self.0
            .plugin()
            .or_else(|| crate::cli::volume::pinned_plugin(record).map(Arc::new))
    }
}
