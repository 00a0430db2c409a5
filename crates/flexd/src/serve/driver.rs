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
