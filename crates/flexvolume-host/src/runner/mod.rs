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

mod capped;
mod namespace;
mod spawn;

use capped::CallCgroup;
pub use capped::{lingering, remove_own_cgroups};
pub use flexvolume_os::cgroup::{process_cap, CALLOUTS_DIR};
pub use namespace::{MountNamespace, NamespaceError, Propagation};
use spawn::{Placement, Process, Request};

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::num::NonZeroU32;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags, Signal};

use flexvolume_protocol::{CallOut, CallOutKind, ExitStatus, ProtocolError, Reply, Status};

/// Kubernetes' timeout for waitforattach (volume manager's `waitForAttachTimeout`).
pub const DEFAULT_WAIT_FOR_ATTACH_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Ours for every other call-out; kubelet has none and hangs forever on a stuck driver.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2 * 60);
/// Between SIGTERM and SIGKILL to the driver's process group.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(3);
/// Kept per stream; a reply is a few hundred bytes, a chatty driver's log a few kilobytes.
pub const DEFAULT_OUTPUT_CAP: usize = 1024 * 1024;
/// Processes (threads included: the pids controller counts tasks) one call-out may have at once.
/// Drivers use a handful; a FUSE helper a few dozen threads. A fork bomb stops here.
pub const DEFAULT_MAX_PROCESSES: NonZeroU32 = match NonZeroU32::new(1024) {
    Some(n) => n,
    None => unreachable!(),
};

/// How driver processes are run. Cheap to clone; shared by every plugin.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    pub default_timeout: Duration,
    pub overrides: BTreeMap<CallOutKind, Duration>,
    pub kill_grace: Duration,
    pub output_cap: usize,
    /// Told about every finished call-out (metrics); `None` costs nothing.
    pub observer: Option<Observer>,
    /// Locks (flock-ed files) the driver process inherits, so they stay held while it runs even
    /// if flexd dies: a driver orphaned by a crashed flexd then still blocks the next operation
    /// on its volume until it finishes. Empty outside an operation.
    pub held_locks: Vec<std::sync::Arc<std::fs::File>>,
    /// The process cap of one call-out (cgroup `pids.max`); `None` runs drivers uncapped.
    pub max_processes: Option<NonZeroU32>,
    /// The mount namespace drivers run in; `None`: flexd's own (see `runner/namespace.rs`).
    pub mount_namespace: Option<MountNamespace>,
}

/// How a call-out ended, as metrics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    Success,
    Failure,
    NotSupported,
    Timeout,
    Error,
}

impl CallOutcome {
    pub fn of(result: &Result<flexvolume_protocol::Reply, CallError>) -> Self {
        match result {
            Ok(_) => Self::Success,
            Err(CallError::Failure { .. }) => Self::Failure,
            Err(CallError::NotSupported { .. }) => Self::NotSupported,
            Err(CallError::Timeout { .. }) => Self::Timeout,
            Err(_) => Self::Error,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "failure",
            Self::NotSupported => "not_supported",
            Self::Timeout => "timeout",
            Self::Error => "error",
        }
    }
}

/// Receives one record per executed call-out.
pub trait CallObserver: Send + Sync {
    fn call_finished(
        &self,
        driver: &crate::DriverName,
        kind: CallOutKind,
        outcome: CallOutcome,
        elapsed: Duration,
    );
}

/// A shared [`CallObserver`].
#[derive(Clone)]
pub struct Observer(pub std::sync::Arc<dyn CallObserver>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

impl Default for RunnerConfig {
    fn default() -> Self {
        let mut overrides = BTreeMap::new();
        overrides.insert(CallOutKind::WaitForAttach, DEFAULT_WAIT_FOR_ATTACH_TIMEOUT);
        Self {
            default_timeout: DEFAULT_TIMEOUT,
            overrides,
            kill_grace: DEFAULT_KILL_GRACE,
            output_cap: DEFAULT_OUTPUT_CAP,
            observer: None,
            held_locks: Vec::new(),
            max_processes: Some(DEFAULT_MAX_PROCESSES),
            mount_namespace: None,
        }
    }
}

impl RunnerConfig {
    pub fn timeout_for(&self, kind: CallOutKind) -> Duration {
        self.overrides
            .get(&kind)
            .copied()
            .unwrap_or(self.default_timeout)
    }

    /// This configuration, with drivers also holding `locks` (see [`RunnerConfig::held_locks`]).
    pub fn holding(&self, locks: &[std::sync::Arc<std::fs::File>]) -> Self {
        let mut config = self.clone();
        config.held_locks.extend(locks.iter().cloned());
        config
    }

    /// Sets one timeout for every call-out (the `flexd call --timeout` case).
    pub fn with_timeout_for_all(mut self, timeout: Duration) -> Self {
        self.default_timeout = timeout;
        self.overrides.clear();
        self
    }
}

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

/// Why a call-out did not produce a usable reply.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("cannot execute driver {path}: {source}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("driver {path}: {kind} timed out after {after:?}; its process group was killed")]
    Timeout {
        path: PathBuf,
        kind: CallOutKind,
        after: Duration,
    },
    #[error("driver {path}: {kind}: i/o error while running it: {source}")]
    Io {
        path: PathBuf,
        kind: CallOutKind,
        #[source]
        source: io::Error,
    },
    #[error("driver {path}: {source}")]
    Protocol {
        path: PathBuf,
        #[source]
        source: ProtocolError,
    },
    #[error("driver {path}: {kind} failed: {message}{}", code.map(|c| format!(" ({c})")).unwrap_or_default())]
    Failure {
        path: PathBuf,
        kind: CallOutKind,
        /// The driver's message, redacted.
        message: String,
        /// What went wrong, when the driver names it.
        code: Option<flexvolume_protocol::ErrorCode>,
    },
    #[error("driver {path}: {kind} is not supported")]
    NotSupported { path: PathBuf, kind: CallOutKind },
    /// The call-out's arguments cannot be passed to a process at all (found before any exec).
    #[error("driver {path}: {kind} not run: {reason}")]
    Arguments {
        path: PathBuf,
        kind: CallOutKind,
        reason: String,
    },
}

impl CallError {
    pub fn is_not_supported(&self) -> bool {
        matches!(self, Self::NotSupported { .. })
    }

    /// The code of a `Failure` the driver named.
    pub fn code(&self) -> Option<flexvolume_protocol::ErrorCode> {
        match self {
            Self::Failure { code, .. } => *code,
            _ => None,
        }
    }
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

/// Runs the driver with an arbitrary argv (after the executable), under the timeout of `kind`.
/// For tools that must send what the protocol does not define, such as `flexd check` asking an
/// unknown call-out; everything else goes through [`run`].
pub fn run_argv(
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
    })
}

/// The kernel's limit on one argv or environment string, NUL included (`MAX_ARG_STRLEN`: 32
/// pages). The options JSON is one such string, so it bounds everything a mount carries.
pub fn max_arg_strlen() -> usize {
    32 * rustix::param::page_size()
}

/// The kernel's limit on argv and environment together (`ARG_MAX`, a quarter of the stack
/// limit); 128 KiB, the historic minimum, when it cannot be read.
pub fn arg_max() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_ARG_MAX) };
    usize::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .unwrap_or(128 * 1024)
}

/// Refuses, before any exec, a call-out that the kernel would refuse with E2BIG (or that holds
/// a NUL byte, which no argv string can): a typed error that names the limit, instead of an
/// "Argument list too long" from the exec.
fn argv_fits(
    program: &Path,
    kind: CallOutKind,
    argv: &[&std::ffi::OsStr],
    envp: &[std::ffi::CString],
) -> Result<(), CallError> {
    use std::os::unix::ffi::OsStrExt;
    let refuse = |reason: String| CallError::Arguments {
        path: program.to_owned(),
        kind,
        reason,
    };
    let per_string = max_arg_strlen();
    for (i, arg) in argv.iter().enumerate() {
        let bytes = arg.as_bytes();
        if bytes.contains(&0) {
            return Err(refuse(format!("argument {} contains a NUL byte", i + 1)));
        }
        if bytes.len() + 1 > per_string {
            return Err(refuse(format!(
                "argument {} is {} bytes; the kernel takes at most {} per argument (MAX_ARG_STRLEN)",
                i + 1,
                bytes.len(),
                per_string - 1
            )));
        }
    }
    let pointer = std::mem::size_of::<usize>();
    let strings = |items: &mut dyn Iterator<Item = usize>| -> usize {
        items.map(|len| len + 1 + pointer).sum::<usize>() + pointer
    };
    let env = strings(&mut envp.iter().map(|pair| pair.as_bytes().len()));
    let args = strings(
        &mut std::iter::once(program.as_os_str().len()).chain(argv.iter().map(|a| a.len())),
    );
    let limit = arg_max();
    if env + args > limit {
        return Err(refuse(format!(
            "its arguments and environment are {} bytes; the kernel takes at most {limit} (ARG_MAX)",
            env + args
        )));
    }
    Ok(())
}

/// How often a spawn that failed with ETXTBSY is retried, and the first pause between tries.
const TEXT_BUSY_RETRIES: u32 = 5;
const TEXT_BUSY_PAUSE: Duration = Duration::from_millis(10);

/// Spawns the driver (see `runner/spawn.rs`). ETXTBSY is retried briefly: in a multi-threaded
/// host, another thread's fork can hold a just-written executable open for writing until its
/// own exec, which makes our exec of that file fail for a moment even though nobody is writing
/// it any more.
///
/// In another mount `namespace`, the child enters it as its last step before exec: everything
/// else (pipes, `/dev/null`, the process group, the inherited locks, the cgroup) is flexd's,
/// while the executable and all the driver does resolve in the driver's namespace.
fn spawn(
    program: &Path,
    request: &Request,
    namespace: Option<&MountNamespace>,
    cgroup: Option<&CallCgroup>,
) -> Result<Process, CallError> {
    let spawn_error = |source: io::Error| CallError::Spawn {
        path: program.to_owned(),
        source,
    };
    let mut pause = TEXT_BUSY_PAUSE;
    let mut tries = 0;
    loop {
        let result = match cgroup {
            Some(cgroup) => cgroup.spawn(request),
            None => request.spawn(Placement::Inherited),
        };
        match result {
            Err(e)
                if e.kind() == io::ErrorKind::ExecutableFileBusy && tries < TEXT_BUSY_RETRIES =>
            {
                tries += 1;
                std::thread::sleep(pause);
                pause *= 2;
            }
            Err(source) => {
                let source = match namespace {
                    // "No such file" must say where it was looked for.
                    Some(namespace) => io::Error::new(
                        source.kind(),
                        format!(
                            "{source} (in the driver mount namespace {})",
                            namespace.path().display()
                        ),
                    ),
                    None => source,
                };
                return Err(spawn_error(source));
            }
            Ok(child) => return Ok(child),
        }
    }
}

enum Supervised {
    TimedOut,
    Io(io::Error),
}

/// Captures output until the driver exits or times out; reaps it in both cases.
fn supervise(
    config: &RunnerConfig,
    child: &mut Process,
    cgroup: Option<&CallCgroup>,
    timeout: Duration,
    start: Instant,
) -> Result<RawOutput, Supervised> {
    let mut out = Capture::new(child.stdout.take(), config.output_cap).map_err(Supervised::Io)?;
    let mut err = Capture::new(child.stderr.take(), config.output_cap).map_err(Supervised::Io)?;
    // Made with the process where clone3 works; else opened now (kernels without pidfd have
    // neither, and fall back to polling).
    let pidfd = child.take_pidfd().or_else(|| {
        let pid = Pid::from_raw(child.id() as i32)?;
        rustix::process::pidfd_open(pid, PidfdFlags::empty()).ok()
    });

    let deadline = start + timeout;
    let exited =
        wait_until(child, pidfd.as_ref(), &mut out, &mut err, deadline).map_err(Supervised::Io)?;
    if !exited {
        kill_group(
            child,
            cgroup,
            pidfd.as_ref(),
            &mut out,
            &mut err,
            config.kill_grace,
        );
        return Err(Supervised::TimedOut);
    }
    // The driver is gone; take what is already in the pipes, without waiting for writers that
    // outlive it (a daemonized helper holding stdout).
    out.drain_available();
    err.drain_available();
    let status = child.wait().map_err(Supervised::Io)?;
    let exit = match (status.code(), status.signal()) {
        (Some(code), _) => ExitStatus::Code(code),
        (None, Some(signal)) => ExitStatus::Signal(signal),
        (None, None) => ExitStatus::Code(-1),
    };
    Ok(RawOutput {
        exit,
        dropped: (out.dropped, err.dropped),
        stdout: out.buf,
        stderr: err.buf,
        elapsed: start.elapsed(),
    })
}

/// Pumps both pipes until the process exits (true) or the deadline passes (false).
fn wait_until(
    child: &mut Process,
    pidfd: Option<&OwnedFd>,
    out: &mut Capture,
    err: &mut Capture,
    deadline: Instant,
) -> io::Result<bool> {
    // Without a pidfd, exit is noticed by try_wait at this interval.
    const FALLBACK_TICK: Duration = Duration::from_millis(5);
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        let mut wait = deadline - now;
        if pidfd.is_none() {
            wait = wait.min(FALLBACK_TICK);
        }
        let mut fds = Vec::with_capacity(3);
        let out_fd = out.fd.as_ref().map(|f| f.as_fd());
        let err_fd = err.fd.as_ref().map(|f| f.as_fd());
        for fd in [pidfd.map(|f| f.as_fd()), out_fd, err_fd]
            .into_iter()
            .flatten()
        {
            fds.push(PollFd::from_borrowed_fd(fd, PollFlags::IN));
        }
        if fds.is_empty() {
            // Both pipes closed and no pidfd: only try_wait can tell.
            std::thread::sleep(wait);
        } else {
            let ts = Timespec {
                tv_sec: wait.as_secs() as _,
                tv_nsec: wait.subsec_nanos() as _,
            };
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        out.drain_available();
        err.drain_available();
        let exited = match pidfd {
            Some(fd) => poll_ready(fd),
            None => child.try_wait()?.is_some(),
        };
        if exited {
            return Ok(true);
        }
    }
}

fn poll_ready(fd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
}

/// SIGTERM to the group (and to helpers in the call-out's cgroup that left the group), a grace
/// period, then SIGKILL; always reaps the driver. The caller empties the cgroup afterwards.
fn kill_group(
    child: &mut Process,
    cgroup: Option<&CallCgroup>,
    pidfd: Option<&OwnedFd>,
    out: &mut Capture,
    err: &mut Capture,
    grace: Duration,
) {
    let Some(pgid) = Pid::from_raw(child.id() as i32) else {
        return;
    };
    let _ = rustix::process::kill_process_group(pgid, Signal::TERM);
    if let Some(cgroup) = cgroup {
        cgroup.signal_all(Signal::TERM);
    }
    let exited = wait_until(child, pidfd, out, err, Instant::now() + grace).unwrap_or(false);
    if !exited {
        let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
    }
    let _ = child.wait();
    // Helpers that ignored SIGTERM after their parent died must not outlive the timeout.
    let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
}

/// One output stream: non-blocking reads into a capped buffer.
struct Capture {
    fd: Option<File>,
    buf: Vec<u8>,
    cap: usize,
    dropped: u64,
}

impl Capture {
    fn new(fd: Option<OwnedFd>, cap: usize) -> io::Result<Self> {
        if let Some(fd) = &fd {
            rustix::io::ioctl_fionbio(fd, true)?;
        }
        Ok(Self {
            fd: fd.map(File::from),
            buf: Vec::new(),
            cap,
            dropped: 0,
        })
    }

    /// Reads what is available now. Bounded, so a writer that outlives the driver and writes
    /// faster than we read cannot keep us here.
    fn drain_available(&mut self) {
        let Some(file) = self.fd.as_mut() else { return };
        let mut chunk = [0u8; 64 * 1024];
        let mut budget = self.cap.max(chunk.len()) * 2;
        loop {
            match file.read(&mut chunk) {
                Ok(0) => {
                    self.fd = None;
                    return;
                }
                Ok(n) => {
                    let keep = n.min(self.cap - self.buf.len());
                    self.buf.extend_from_slice(&chunk[..keep]);
                    self.dropped += (n - keep) as u64;
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return, // WouldBlock: nothing more for now
            }
        }
    }
}

#[cfg(test)]
mod argv_tests;
