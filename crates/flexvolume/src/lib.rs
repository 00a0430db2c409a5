//! # flexvolume — a FlexVolume host runtime
//!
//! Kubernetes' FlexVolume drivers are executables in a plugin dir
//! (`<plugin-dir>/<vendor~driver>/<driver>`), called with a call-out name (`init`, `attach`,
//! `mount`, …) and JSON arguments, answering one JSON object. This crate is everything kubelet
//! and the controller manager do with them, as a library:
//!
//! - [`name`], [`protocol`], [`options`], [`spec`]: the protocol as pure data (driver names,
//!   call-outs, replies, the options JSON byte-for-byte as kubelet builds it). They live in the
//!   `flexvolume-protocol` crate, which the driver SDK shares, and are re-exported here under
//!   their old paths;
//! - [`runner`]: running a driver safely (no shell, timeouts, process groups, capped output);
//! - [`layout`]: reading the plugin dir; [`plugin`]: an initialised driver;
//! - [`prober`]: finding drivers; [`manager`]: which plugin serves a volume;
//! - [`lifecycle`]: attach, mount and back, with Kubernetes' defaults; [`state`]: what survives a crash;
//! - [`mount`]: the mount table and mount helpers; [`install`]: putting drivers in place atomically.
//!
//! Data flows one way: plugin dir → prober → plugins → call-outs → driver processes. The
//! contract is in the repository's `docs/` (protocol, discovery, lifecycle).

pub use flexvolume_protocol::{name, options, protocol, spec};

pub mod install;
pub mod layout;
pub mod lifecycle;
pub mod manager;
pub mod mount;
pub mod ownership;
pub mod plugin;
pub mod prober;
pub mod runner;
pub mod state;

pub use layout::{Driver, LayoutPolicy};
pub use name::DriverName;
pub use options::Options;
pub use plugin::Plugin;
pub use protocol::{CallOut, CallOutKind, Capabilities, Reply, Status};
pub use runner::{CallError, RunnerConfig};
pub use spec::{PodInfo, VolumeSpec};
