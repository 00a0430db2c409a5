//! One FlexVolume driver as served through CSI: its CSI name and sockets. Whether it is ready,
//! and with which plugin, is the library's [`Registry`](flexvolume_host::Registry)'s to say.

use std::path::PathBuf;
use std::sync::Arc;

use flexvolume_host::lifecycle::DriverResolver;
use flexvolume_host::state::VolumeRecord;
use flexvolume_host::{DriverName, Plugin, Resolver};

/// A driver flexd serves. It keeps only what is CSI's; its plugin is looked up in the registry
/// the prober feeds, so an update is seen at once and `None` while its last init failed (Probe
/// then answers not ready and every operation fails clearly).
pub struct ServedDriver {
    pub name: DriverName,
    pub csi_name: String,
    pub csi_socket: PathBuf,
    pub registration_socket: Option<PathBuf>,
    resolver: Arc<Resolver>,
}

impl ServedDriver {
    pub fn new(
        name: DriverName,
        csi_name: String,
        csi_socket: PathBuf,
        registration_socket: Option<PathBuf>,
        resolver: Arc<Resolver>,
    ) -> Self {
        Self {
            name,
            csi_name,
            csi_socket,
            registration_socket,
            resolver,
        }
    }

    pub fn plugin(&self) -> Option<Arc<Plugin>> {
        self.resolver.registry().plugin(&self.name)
    }
}

/// The plugin a served driver's volumes are torn down with (the library's rule: the one
/// served now, else the copy pinned when the volume was set up). A record of another driver is
/// not this endpoint's to touch.
pub struct ServedResolver(pub Arc<ServedDriver>);

impl DriverResolver for ServedResolver {
    fn resolve(&self, record: &VolumeRecord) -> Option<Arc<Plugin>> {
        if record.driver != self.0.name {
            return None;
        }
        self.0.resolver.resolve(record)
    }
}
