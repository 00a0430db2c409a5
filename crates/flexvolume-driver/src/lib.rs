//! # flexvolume-driver — write FlexVolume drivers in Rust
//!
//! FlexVolume drivers are usually shell scripts, and they break in the same ways: unquoted
//! `$*`, `echo -ne`, usage text where JSON was expected, log lines mixed into the reply. This
//! crate does the protocol part for you, with the very types the host runtime uses
//! ([`flexvolume_protocol`]: call-outs, replies, [`flexvolume_protocol::options`]) so both sides agree
//! byte for byte, and without the host runtime itself (no inotify, rayon or tokio in your build):
//!
//! - [`Driver`]: one method per call-out; every one but `init` answers `Not supported` unless
//!   you implement it, which makes kubelet (and flexd) apply Kubernetes' default behaviour;
//! - [`Request::parse`]: argv exactly as kubelet passes it (docs/protocol.md#call-outs), with
//!   the options JSON as typed [`VolumeOptions`] (well-known `kubernetes.io/*` keys, secrets
//!   base64-decoded);
//! - [`handle`] / [`run`]: the reply serialised as the protocol wants, exit status 0 for
//!   `Success` and 1 otherwise, and nothing but the reply on stdout — not even on a panic.
//!
//! ```no_run
//! use flexvolume_driver::{Capabilities, Driver, DriverResult, VolumeOptions};
//! use std::path::Path;
//!
//! struct Tmpfs;
//! impl Driver for Tmpfs {
//!     fn init(&self) -> DriverResult<Capabilities> {
//!         Ok(Capabilities { attach: false, ..Capabilities::default() })
//!     }
//!     fn mount(&self, target: &Path, options: &VolumeOptions) -> DriverResult<()> {
//!         // … mount something on `target` …
//!         Ok(())
//!     }
//! }
//! fn main() -> std::process::ExitCode {
//!     flexvolume_driver::run(&Tmpfs)
//! }
//! ```
//!
//! kubelet reads stdout and stderr together (`CombinedOutput`), so a driver must not write to
//! stderr either: log to a file or syslog, and capture the output of the tools you run.

use std::ffi::OsString;
use std::fmt;
use std::io::Write as _;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::process::ExitCode;

pub use flexvolume_protocol::options::{self, Options, OptionsError};
pub use flexvolume_protocol::PodInfo;
pub use flexvolume_protocol::{CallOutKind, Capabilities, ErrorCode, Reply, Status};

mod request;
mod volume_options;
pub use request::{ArgvError, Request};
pub use volume_options::{OptionsArgError, Secret, VolumeOptions};

/// An answer other than `Success`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// `{"status":"Failure","message":…}`: the operation failed; kubelet retries later.
    #[error("{0}")]
    Failure(String),
    /// `{"status":"Not supported"}`: the host applies Kubernetes' default for this call-out.
    #[error("{0}")]
    NotSupported(String),
    /// `{"status":"Failure","message":…,"code":…}`: a failure the driver can name (the volume
    /// or node does not exist, the name is taken, no room), which flexd answers with the
    /// matching CSI code instead of retrying. kubelet sees a plain `Failure`.
    #[error("{message}")]
    Named { code: ErrorCode, message: String },
}

impl DriverError {
    pub fn failure(message: impl fmt::Display) -> Self {
        Self::Failure(message.to_string())
    }

    /// The volume (or the node) does not exist.
    pub fn not_found(message: impl fmt::Display) -> Self {
        Self::Named {
            code: ErrorCode::NotFound,
            message: message.to_string(),
        }
    }

    /// Another volume already has that name.
    pub fn already_exists(message: impl fmt::Display) -> Self {
        Self::Named {
            code: ErrorCode::AlreadyExists,
            message: message.to_string(),
        }
    }

    /// The storage has no room for the volume.
    pub fn out_of_capacity(message: impl fmt::Display) -> Self {
        Self::Named {
            code: ErrorCode::OutOfCapacity,
            message: message.to_string(),
        }
    }

    /// The request cannot be served as written (an option this driver refuses).
    pub fn invalid_argument(message: impl fmt::Display) -> Self {
        Self::Named {
            code: ErrorCode::InvalidArgument,
            message: message.to_string(),
        }
    }

    /// A size the storage cannot hold at all.
    pub fn out_of_range(message: impl fmt::Display) -> Self {
        Self::Named {
            code: ErrorCode::OutOfRange,
            message: message.to_string(),
        }
    }

    /// What every call-out a driver does not implement answers.
    pub fn not_supported(kind: CallOutKind) -> Self {
        Self::NotSupported(format!("{kind} is not supported by this driver"))
    }
}

pub type DriverResult<T> = Result<T, DriverError>;

/// `?` on any error, with what was being done: `fs::create_dir(p).context("create image dir")?`.
pub trait ResultExt<T> {
    fn context(self, what: impl fmt::Display) -> DriverResult<T>;
}

impl<T, E: fmt::Display> ResultExt<T> for Result<T, E> {
    fn context(self, what: impl fmt::Display) -> DriverResult<T> {
        self.map_err(|e| DriverError::Failure(format!("{what}: {e}")))
    }
}

/// A FlexVolume driver: one method per call-out, argv already parsed. Every method but
/// [`Driver::init`] answers `Not supported` by default.
pub trait Driver {
    /// `init`: what the driver can do. Unset capabilities should keep Kubernetes' defaults
    /// (`Capabilities { attach: false, ..Capabilities::default() }`).
    fn init(&self) -> DriverResult<Capabilities>;

    /// `getvolumename <json>`: a name that identifies the volume. kubelet and flexd run it (a
    /// failure fails the operation) but ignore the answer: `detach` receives the PV's name.
    fn get_volume_name(&self, options: &VolumeOptions) -> DriverResult<String> {
        let _ = options;
        Err(DriverError::not_supported(CallOutKind::GetVolumeName))
    }

    /// `attach <json> <node>`: make the volume available to `node`; the device, if known.
    fn attach(&self, options: &VolumeOptions, node: &str) -> DriverResult<String> {
        let _ = (options, node);
        Err(DriverError::not_supported(CallOutKind::Attach))
    }

    /// `waitforattach <device> <json>`: wait until the device is there; the device path.
    fn wait_for_attach(&self, device: &str, options: &VolumeOptions) -> DriverResult<String> {
        let _ = (device, options);
        Err(DriverError::not_supported(CallOutKind::WaitForAttach))
    }

    /// `isattached <json> <node>`.
    fn is_attached(&self, options: &VolumeOptions, node: &str) -> DriverResult<bool> {
        let _ = (options, node);
        Err(DriverError::not_supported(CallOutKind::IsAttached))
    }

    /// `mountdevice <device-mount-dir> <device> <json>`: the global mount of the device.
    fn mount_device(&self, dir: &Path, device: &str, options: &VolumeOptions) -> DriverResult<()> {
        let _ = (dir, device, options);
        Err(DriverError::not_supported(CallOutKind::MountDevice))
    }

    /// `detach <volume-name> <node>`; the name is the PV's (kubelet runs getvolumename but
    /// ignores its answer, and so does flexd).
    fn detach(&self, volume_name: &str, node: &str) -> DriverResult<()> {
        let _ = (volume_name, node);
        Err(DriverError::not_supported(CallOutKind::Detach))
    }

    /// `unmountdevice <device-mount-dir>`.
    fn unmount_device(&self, dir: &Path) -> DriverResult<()> {
        let _ = dir;
        Err(DriverError::not_supported(CallOutKind::UnmountDevice))
    }

    /// `mount <target-dir> <json>`: the only call-out (with unmount) that receives secrets.
    fn mount(&self, target: &Path, options: &VolumeOptions) -> DriverResult<()> {
        let _ = (target, options);
        Err(DriverError::not_supported(CallOutKind::Mount))
    }

    /// `unmount <target-dir>`.
    fn unmount(&self, target: &Path) -> DriverResult<()> {
        let _ = target;
        Err(DriverError::not_supported(CallOutKind::Unmount))
    }

    /// `expandvolume <json> <device-mount-dir> <new-bytes> <old-bytes>`: grow the volume on
    /// the storage side; the size it has now.
    fn expand_volume(
        &self,
        options: &VolumeOptions,
        dir: &Path,
        new_bytes: u64,
        old_bytes: u64,
    ) -> DriverResult<u64> {
        let _ = (options, dir, new_bytes, old_bytes);
        Err(DriverError::not_supported(CallOutKind::ExpandVolume))
    }

    /// `expandfs <json> <device> <device-mount-dir> <new-bytes> <old-bytes>`: grow the
    /// filesystem on the node.
    fn expand_fs(
        &self,
        options: &VolumeOptions,
        device: &str,
        dir: &Path,
        new_bytes: u64,
        old_bytes: u64,
    ) -> DriverResult<()> {
        let _ = (options, device, dir, new_bytes, old_bytes);
        Err(DriverError::not_supported(CallOutKind::ExpandFs))
    }

    /// `provision <json>` (dynamic provisioning; say `provision: true` in `init`'s
    /// capabilities): create the volume. The options are the StorageClass parameters,
    /// `kubernetes.io/pvOrVolumeName` and the requested size ([`VolumeOptions::request_bytes`]).
    /// Returns options the volume keeps besides the parameters (what attach and mount need to
    /// find it). Must be idempotent: the host repeats it after a crash.
    fn provision(&self, options: &VolumeOptions) -> DriverResult<Provisioned> {
        let _ = options;
        Err(DriverError::not_supported(CallOutKind::Provision))
    }

    /// `delete <json>`: delete a volume `provision` created; the options are the volume's.
    /// A volume that is not there is deleted already: answer success (or
    /// [`DriverError::not_found`]).
    fn delete(&self, options: &VolumeOptions) -> DriverResult<()> {
        let _ = options;
        Err(DriverError::not_supported(CallOutKind::Delete))
    }
}

/// What `provision` created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provisioned {
    /// Options the volume keeps (its PV's flexVolume `options`, its CSI volume context)
    /// besides the StorageClass parameters.
    pub options: std::collections::BTreeMap<String, String>,
    /// The size of the volume made, in bytes, when the driver knows it (sent as
    /// `volumeNewSize`): what CreateVolume reports instead of the size asked for, which is
    /// none when the CO asked for none.
    pub capacity_bytes: Option<u64>,
}

impl<const N: usize> From<[(String, String); N]> for Provisioned {
    fn from(options: [(String, String); N]) -> Self {
        Self {
            options: options.into(),
            capacity_bytes: None,
        }
    }
}

/// What the driver prints and how it exits.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub reply: Reply,
    /// 0 for `Success`, 1 otherwise (kubelet treats a non-zero `Success` as a driver bug).
    pub exit_code: u8,
}

impl Response {
    fn new(reply: Reply) -> Self {
        let exit_code = if reply.status == Status::Success {
            0
        } else {
            1
        };
        Self { reply, exit_code }
    }

    fn error(error: DriverError) -> Self {
        let (status, message, code) = match error {
            DriverError::Failure(m) => (Status::Failure, m, None),
            DriverError::NotSupported(m) => (Status::NotSupported, m, None),
            DriverError::Named { code, message } => (Status::Failure, message, Some(code)),
        };
        Self::new(Reply {
            message,
            code,
            ..reply(status)
        })
    }

    /// The exact stdout: one compact JSON object (what kubelet's `json.Unmarshal` reads).
    pub fn to_json(&self) -> String {
        // A struct of strings, numbers and booleans always serialises.
        serde_json::to_string(&self.reply).unwrap_or_default()
    }
}

fn reply(status: Status) -> Reply {
    Reply {
        status,
        message: String::new(),
        device: None,
        volume_name: None,
        attached: None,
        capabilities: None,
        volume_new_size: None,
        code: None,
        options: None,
    }
}

/// Runs one call-out: parses `args` (argv after the executable), dispatches to the driver,
/// and builds the reply. Messages are redacted of every secret value the call received, so a
/// handler that quotes its options by mistake does not leak them. A panicking handler answers
/// `Failure`.
pub fn handle<D: Driver + ?Sized>(driver: &D, args: &[OsString]) -> Response {
    let request = match Request::parse(args) {
        Ok(request) => request,
        Err(ArgvError::Unknown(name)) => {
            return Response::error(DriverError::NotSupported(format!(
                "unknown call-out {name:?}"
            )))
        }
        Err(e) => return Response::error(DriverError::Failure(e.to_string())),
    };
    let sensitive = request
        .options()
        .map(|o| o.options().sensitive_values())
        .unwrap_or_default();
    let kind = request.kind();
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| dispatch(driver, &request)));
    let mut response = match outcome {
        Ok(Ok(reply)) => Response::new(reply),
        Ok(Err(error)) => Response::error(error),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            Response::error(DriverError::Failure(format!(
                "driver bug: {kind} panicked: {what}"
            )))
        }
    };
    response.reply.message = options::redact_values(&response.reply.message, &sensitive);
    response
}

fn dispatch<D: Driver + ?Sized>(driver: &D, request: &Request) -> DriverResult<Reply> {
    let ok = || reply(Status::Success);
    Ok(match request {
        Request::Init => Reply {
            capabilities: Some(driver.init()?),
            ..ok()
        },
        Request::GetVolumeName { options } => Reply {
            volume_name: Some(driver.get_volume_name(options)?),
            ..ok()
        },
        Request::Attach { options, node } => Reply {
            device: Some(driver.attach(options, node)?),
            ..ok()
        },
        Request::WaitForAttach { device, options } => Reply {
            device: Some(driver.wait_for_attach(device, options)?),
            ..ok()
        },
        Request::IsAttached { options, node } => Reply {
            attached: Some(driver.is_attached(options, node)?),
            ..ok()
        },
        Request::MountDevice {
            dir,
            device,
            options,
        } => {
            driver.mount_device(dir, device, options)?;
            ok()
        }
        Request::Detach { volume_name, node } => {
            driver.detach(volume_name, node)?;
            ok()
        }
        Request::UnmountDevice { dir } => {
            driver.unmount_device(dir)?;
            ok()
        }
        Request::Mount { target, options } => {
            driver.mount(target, options)?;
            ok()
        }
        Request::Unmount { target } => {
            driver.unmount(target)?;
            ok()
        }
        Request::ExpandVolume {
            options,
            dir,
            new_bytes,
            old_bytes,
        } => Reply {
            volume_new_size: Some(driver.expand_volume(options, dir, *new_bytes, *old_bytes)?),
            ..ok()
        },
        Request::ExpandFs {
            options,
            device,
            dir,
            new_bytes,
            old_bytes,
        } => {
            driver.expand_fs(options, device, dir, *new_bytes, *old_bytes)?;
            ok()
        }
        Request::Provision { options } => {
            let made = driver.provision(options)?;
            Reply {
                options: Some(made.options),
                volume_new_size: made.capacity_bytes,
                ..ok()
            }
        }
        Request::Delete { options } => {
            driver.delete(options)?;
            ok()
        }
    })
}

/// The whole `main` of a driver: reads this process's argv, handles the call-out, prints the
/// reply (one line on stdout, nothing on stderr) and returns the exit status.
pub fn run<D: Driver + ?Sized>(driver: &D) -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    run_with_args(driver, &args)
}

/// [`run`] with argv given (for multi-call binaries, whose `argv[1]` is not the call-out).
pub fn run_with_args<D: Driver + ?Sized>(driver: &D, args: &[OsString]) -> ExitCode {
    // The default hook prints to stderr, which kubelet reads together with stdout.
    panic::set_hook(Box::new(|_| {}));
    let response = handle(driver, args);
    let mut line = response.to_json();
    line.push('\n');
    let mut stdout = std::io::stdout().lock();
    // Nothing useful can be done if stdout is gone; the exit status still tells.
    let _ = stdout
        .write_all(line.as_bytes())
        .and_then(|()| stdout.flush());
    ExitCode::from(response.exit_code)
}

#[cfg(test)]
mod tests;
