//! # flexvolume-protocol — the FlexVolume protocol as pure data
//!
//! What a FlexVolume host and a FlexVolume driver must agree on byte for byte, and nothing else:
//! no process, no filesystem, no threads. The host runtime (`flexvolume-host`) and the driver SDK
//! (`flexvolume-driver`) both build on it, so a driver author's build pulls in none of the host
//! machinery (inotify, rayon, tokio).
//!
//! - [`name`]: driver names (`vendor/driver`) and their on-disk form (`vendor~driver`),
//!   validated before any path is built from them;
//! - call-outs and their argv ([`CallOut`], [`CallOutKind`]); replies and capabilities
//!   ([`Reply`], [`Capabilities`], [`ErrorCode`]); the tolerant reply parser and the exit-status
//!   rules ([`find_reply`], [`interpret`]); all at the crate root, from private modules named
//!   for what they hold;
//! - [`options`]: the options JSON, byte-for-byte as kubelet builds it, and its parser on the
//!   driver's side; secrets are redacted from every printable form;
//! - [`spec`]: a volume as the options builder sees it, the pod it is for, and Kubernetes
//!   quantities.
//!
//! The contract these modules implement is `docs/protocol.md` in the repository.

mod call_out;
mod error;
pub mod name;
pub mod options;
mod reply;
mod reply_parser;
pub mod spec;

pub use call_out::{CallOut, CallOutKind};
pub use error::ProtocolError;
pub use name::DriverName;
pub use options::Options;
pub use reply::{Capabilities, ErrorCode, Reply, Status};
pub use reply_parser::{excerpt, find_reply, interpret, ExitStatus, QUOTE_LIMIT};
pub use spec::{PodInfo, VolumeSpec};

#[cfg(test)]
mod tests;
