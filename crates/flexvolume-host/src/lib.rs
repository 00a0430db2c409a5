//! # flexvolume-host — the FlexVolume host library
//!
//! Kubernetes' FlexVolume drivers are executables in a plugin dir
//! (`<plugin-dir>/<vendor~driver>/<driver>`), called with a call-out name (`init`, `attach`,
//! `mount`, …) and JSON arguments, answering one JSON object. This crate is everything kubelet
//! and the controller manager do with them, as a library:
//!
//! - the protocol as pure data (driver names, call-outs, replies, the options JSON
//!   byte-for-byte as kubelet builds it) is the `flexvolume-protocol` crate's, which the driver
//!   SDK shares; the types this API speaks are re-exported at the root ([`DriverName`],
//!   [`CallOut`], [`Reply`], …);
//! - [`runner`]: running a driver safely (no shell, timeouts, process groups, capped output);
//! - [`layout`]: reading the plugin dir (an [`InstalledDriver`]); [`plugin`]: an initialised
//!   driver;
//! - [`prober`]: finding drivers; [`registry`]: what is known about each driver, fed by the
//!   prober; [`resolver`]: which plugin a recorded volume is torn down with (the pinned copy of a
//!   removed driver included);
//! - [`check`]: the conformance report for driver authors;
//! - [`lifecycle`]: attach, mount and back, with Kubernetes' defaults; [`state`]: what survives a crash;
//! - [`install`]: putting drivers in place atomically. The mount table and mount helpers (and
//!   the pids cgroups the runner caps drivers in) are the `flexvolume-os` crate's.
//!
//! Data flows one way: plugin dir → prober → registry → plugins → call-outs → driver processes.
//! The contract is in the repository's `docs/` (protocol, discovery, lifecycle).
//!
//! "Driver" is used for several things; `docs/glossary.md` says which word means what
//! (installed driver, plugin, served driver, the SDK's `Driver` trait).

pub mod check;
pub mod controller_records;
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

/// The protocol types this library's API speaks, so its users name them without a second
/// dependency; their modules (and the rest of the protocol) are `flexvolume_protocol`'s.
pub use flexvolume_protocol::{
    CallOut, CallOutKind, Capabilities, DriverName, ErrorCode, Options, PodInfo, Reply, Status,
    VolumeSpec,
};

pub use layout::{InstalledDriver, LayoutPolicy};
pub use plugin::Plugin;
pub use registry::Registry;
pub use resolver::Resolver;
pub use runner::{CallError, Cancel, RunnerConfig};
