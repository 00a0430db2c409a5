//! # flexvolume-host — the FlexVolume host library
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
//! - [`layout`]: reading the plugin dir (an [`InstalledDriver`]); [`plugin`]: an initialised
//!   driver;
//! - [`prober`]: finding drivers; [`registry`]: what is known about each driver, fed by the
//!   prober; [`resolver`]: which plugin a recorded volume is torn down with (the pinned copy of a
//!   removed driver included);
//! - [`check`]: the conformance report for driver authors;
//! - [`lifecycle`]: attach, mount and back, with Kubernetes' defaults; [`state`]: what survives a crash;
//! - [`mount`]: the mount table and mount helpers, from the `flexvolume-os` crate (with the pids
//!   cgroups the runner caps drivers in); [`install`]: putting drivers in place atomically.
//!
//! Data flows one way: plugin dir → prober → registry → plugins → call-outs → driver processes.
//! The contract is in the repository's `docs/` (protocol, discovery, lifecycle).
//!
//! "Driver" is used for several things; `docs/glossary.md` says which word means what
//! (installed driver, plugin, served driver, the SDK's `Driver` trait).

/// The mount helpers live in the `flexvolume-os` crate, which the loop driver shares; re-exported
/// here under their old path.
pub use flexvolume_os::mount;
pub use flexvolume_protocol::{name, options, protocol, spec};

pub mod check;
pub mod install;
pub mod layout;
pub mod lifecycle;
pub mod ownership;
pub mod plugin;
pub mod prober;
pub mod registry;
pub mod resolver;
pub mod runner;
pub mod state;

pub use layout::{InstalledDriver, LayoutPolicy};
pub use name::DriverName;
pub use options::Options;
pub use plugin::Plugin;
pub use protocol::{CallOut, CallOutKind, Capabilities, ErrorCode, Reply, Status};
pub use registry::Registry;
pub use resolver::Resolver;
pub use runner::{CallError, RunnerConfig};
pub use spec::{PodInfo, VolumeSpec};
