//! Executing a driver: spawn, capture, time out, reap.
//!
//! Rules (docs/protocol.md#execution), each learnt from drivers in the field:
//! - no shell, stdin `/dev/null` (a driver that reads stdin must not hang on ours);
//! - its own process group, so a timeout kills the helpers it started too;
//! - we wait for the *process*, not for the pipes to close: FUSE helpers and `mount.cifs`
//!   daemonize children that keep stdout open for their whole life;
//! - output is capped per stream; the rest is drained and dropped so the driver never blocks on a
//!   full pipe.
//!
//! - a cap on the processes one call-out may have, and a kill that reaches helpers which left the
//!   process group (see `runner/capped.rs`, and `flexvolume_os::cgroup` for the hierarchy).
//!
//! One thread per call: `poll(2)` on both pipes and a pidfd. Kernels without pidfd (< 5.3) get a
//! short poll interval and `try_wait` instead.
//!
//! - a call-out can be stopped from another thread ([`Cancel`], an eventfd in the same poll):
//!   it is killed as a timed-out one, so a lost fence stops the driver working on its volume.

mod argv;
mod cancel;
mod capped;
mod config;
mod error;
mod namespace;
mod observer;
mod spawn;
mod supervise;

pub use cancel::Cancel;
pub use capped::{lingering, remove_own_cgroups};
pub use config::{
    RunnerConfig, DEFAULT_KILL_GRACE, DEFAULT_MAX_PROCESSES, DEFAULT_OUTPUT_CAP, DEFAULT_TIMEOUT,
};
pub use error::CallError;
pub use flexvolume_os::cgroup::{process_cap, CALLOUTS_DIR};
pub use namespace::{MountNamespace, NamespaceError, Propagation};
pub use observer::{CallObserver, CallOutcome, Observer};

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use flexvolume_protocol::{CallOut, CallOutKind, ExitStatus, Reply, Status};

use argv::argv_fits;
use capped::CallCgroup;
use spawn::Request;
use supervise::{spawn, supervise, Supervised};

/// What a finished driver process left us.
#[derive(Debug, Clone)]
pub struct RawOutput {
    pub exit: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes read past the cap and dropped, per stream.
    pub dropped: (u64, u64),
    pub elapsed: Duration,
}

/// Runs one call-out of the executable at `program` and interprets the answer.
///
/// `Failure` and `Not supported` become [`CallError::Failure`] / [`CallError::NotSupported`], so
/// `Ok` always means `Success`. The reply's message is redacted.
pub fn call(config: &RunnerConfig, program: &Path, call: &CallOut) -> Result<Reply, CallError> {
    let raw = run(config, program, call)?;
    let quote = |bytes: &[u8]| call.redact(&flexvolume_protocol::excerpt(bytes));
    let reply =
        flexvolume_protocol::interpret(call.kind, raw.exit, &raw.stdout, &raw.stderr, quote)
            .map_err(|source| CallError::Protocol {
                path: program.to_owned(),
                source,
            })?;
    let path = || program.to_owned();
    match reply.status {
        Status::Success => Ok(Reply {
            message: call.redact(&reply.message),
            ..reply
        }),
        Status::Failure => Err(CallError::Failure {
            path: path(),
            kind: call.kind,
            message: call.redact(&reply.message),
            code: reply.code,
        }),
        Status::NotSupported => Err(CallError::NotSupported {
            path: path(),
            kind: call.kind,
        }),
    }
}

/// Runs one call-out and returns its raw output; no interpretation.
pub fn run(config: &RunnerConfig, program: &Path, call: &CallOut) -> Result<RawOutput, CallError> {
    let mut argv: Vec<&std::ffi::OsStr> = vec![call.kind.as_str().as_ref()];
    argv.extend(call.args.iter().map(|a| a.as_os_str()));
    run_argv(config, program, call.kind, &argv)
}

/// Runs the driver with an arbitrary argv (after the executable), under the timeout of `kind`
/// and the configuration's [`Cancel`], if any.
/// For tools that must send what the protocol does not define, such as `flexd check` asking an
/// unknown call-out; everything else goes through [`run`].
pub(crate) fn run_argv(
    config: &RunnerConfig,
    program: &Path,
    kind: CallOutKind,
    argv: &[&std::ffi::OsStr],
) -> Result<RawOutput, CallError> {
    // Read once: what the size check counts is what the driver gets.
    let envp = spawn::environment();
    argv_fits(program, kind, argv, &envp)?;
    let start = Instant::now();
    let timeout = config.timeout_for(kind);
    let io_err = |source| CallError::Io {
        path: program.to_owned(),
        kind,
        source,
    };
    let cancelled = |why| CallError::Cancelled {
        path: program.to_owned(),
        kind,
        why,
    };
    // A call-out after the cancel is not started: what the cancel guards (a fence) is gone.
    // One cancelled from here on is seen by the supervision's first look.
    if let Some(why) = config.cancel.as_ref().and_then(Cancel::reason) {
        return Err(cancelled(why));
    }
    let namespace = config.mount_namespace.as_ref();
    // In another namespace the driver starts in that namespace's root: a relative path would be
    // looked up from there, not from flexd's working directory.
    let absolute;
    let program = match namespace {
        Some(_) if program.is_relative() => {
            absolute = std::path::absolute(program).map_err(|source| CallError::Spawn {
                path: program.to_owned(),
                source,
            })?;
            absolute.as_path()
        }
        _ => program,
    };
    // The descriptors stay open for the whole call: the config holds the locks' `Arc<File>`s
    // and the namespace.
    let request = Request::new(
        program,
        argv,
        envp,
        config.held_locks.iter().map(|f| f.as_raw_fd()).collect(),
        namespace.map(MountNamespace::raw_fd),
    )
    .map_err(|source| CallError::Spawn {
        path: program.to_owned(),
        source,
    })?;
    let mut cgroup = config.max_processes.and_then(CallCgroup::create);
    let mut child = match spawn(program, &request, namespace, cgroup.as_ref()) {
        Err(CallError::Spawn { source, .. }) if cgroup.is_some() => {
            // Joining the cgroup failed in the child (it is ours and empty, so this is odd):
            // a driver that runs uncapped beats a volume that cannot mount.
            tracing::warn!(error = %source, "driver could not join its process-cap cgroup; retrying uncapped");
            if let Some(cgroup) = cgroup.take() {
                cgroup.release();
            }
            spawn(program, &request, namespace, None)?
        }
        other => other?,
    };
    let result = supervise(config, &mut child, cgroup.as_ref(), timeout, start);
    if result.is_err() {
        // Abandoned half-way (an i/o error): no driver is ever left running or as a zombie.
        if let Some(pgid) = Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
        }
        let _ = child.wait();
    }
    if let Some(cgroup) = cgroup {
        if result.is_err() {
            cgroup.kill_all();
        } else {
            // Helpers the driver left running on purpose (FUSE daemons) keep running.
            cgroup.release();
        }
    }
    result.map_err(|outcome| match outcome {
        Supervised::Io(source) => io_err(source),
        Supervised::TimedOut => CallError::Timeout {
            path: program.to_owned(),
            kind,
            after: timeout,
        },
        Supervised::Cancelled(why) => cancelled(why),
    })
}
