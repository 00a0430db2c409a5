//! # flexvolume-os — the Linux primitives under a FlexVolume host and its drivers
//!
//! What the host runtime (`flexvolume-host`) and a driver (`flexvolume-loop`) both do to the
//! operating system, with nothing of the host's machinery (discovery, the runner, threads):
//!
//! - [`mount`]: the mount table, bind mounts, unmounts, format-and-mount, filesystem growth;
//!   [`mount::safe_path`]: opening and creating paths without following any symlink;
//! - [`cgroup`]: the `pids` cgroup hierarchy that caps driver processes, and the call-out
//!   cgroups left behind;
//! - [`open_files`]: the open-file limit, raised for the host and put back for drivers.
//!
//! Like youki's `libcgroups` under `libcontainer`: policy (which call-out runs where, for how
//! long) stays in the runtime; this crate only knows how the kernel is asked.

pub mod cgroup;
pub mod mount;
pub mod open_files;
