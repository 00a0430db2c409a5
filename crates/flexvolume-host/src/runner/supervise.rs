//! The supervision loop: spawn (retrying ETXTBSY), capture both streams capped, time out or
//! be cancelled, kill the process group, reap.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags, Signal};

use flexvolume_protocol::ExitStatus;

use super::cancel::Cancel;
use super::capped::CallCgroup;
use super::config::RunnerConfig;
use super::error::CallError;
use super::namespace::MountNamespace;
use super::spawn::{Placement, Process, Request};
use super::RawOutput;

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
pub(super) fn spawn(
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

pub(super) enum Supervised {
    TimedOut,
    /// Its cancellation fired, with this reason.
    Cancelled(String),
    Io(io::Error),
}

/// How [`wait_until`] returned.
enum Waited {
    Exited,
    Deadline,
    Cancelled(String),
}

/// A cancellation as one wait watches it: its eventfd (`None` if none could be made, then
/// looked at every `FALLBACK_TICK`).
pub(super) struct Watch<'a> {
    cancel: &'a Cancel,
    wake: Option<Arc<OwnedFd>>,
}

impl<'a> Watch<'a> {
    pub(super) fn new(cancel: &'a Cancel) -> Self {
        Self {
            cancel,
            wake: cancel.waker(),
        }
    }
}

/// Captures output until the driver exits, times out or is cancelled; reaps it in all cases.
/// A cancelled driver is killed exactly as a timed-out one.
pub(super) fn supervise(
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
    let watch = config.cancel.as_ref().map(Watch::new);
    let waited = wait_until(
        child,
        pidfd.as_ref(),
        watch.as_ref(),
        &mut out,
        &mut err,
        deadline,
    )
    .map_err(Supervised::Io)?;
    let stopped = match waited {
        Waited::Exited => None,
        Waited::Deadline => Some(Supervised::TimedOut),
        Waited::Cancelled(why) => Some(Supervised::Cancelled(why)),
    };
    if let Some(stopped) = stopped {
        kill_group(
            child,
            cgroup,
            pidfd.as_ref(),
            &mut out,
            &mut err,
            config.kill_grace,
        );
        return Err(stopped);
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

/// Pumps both pipes until the process exits, the deadline passes or `cancel` fires. An exit
/// seen in the same wake-up as a cancel wins: the driver finished, and its answer is the truth.
fn wait_until(
    child: &mut Process,
    pidfd: Option<&OwnedFd>,
    cancel: Option<&Watch>,
    out: &mut Capture,
    err: &mut Capture,
    deadline: Instant,
) -> io::Result<Waited> {
    // Without a pidfd, exit is noticed by try_wait at this interval (and without an eventfd,
    // a cancel by its reason).
    const FALLBACK_TICK: Duration = Duration::from_millis(5);
    let wake = cancel.and_then(|c| c.wake.as_deref());
    loop {
        // Checked before the deadline: a cancel that came first is why the driver is stopped.
        if let Some(why) = cancel.and_then(|c| c.cancel.reason()) {
            return Ok(Waited::Cancelled(why));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Waited::Deadline);
        }
        let mut wait = deadline - now;
        if pidfd.is_none() || (cancel.is_some() && wake.is_none()) {
            wait = wait.min(FALLBACK_TICK);
        }
        let mut fds = Vec::with_capacity(4);
        let out_fd = out.fd.as_ref().map(|f| f.as_fd());
        let err_fd = err.fd.as_ref().map(|f| f.as_fd());
        let wake_fd = wake.map(|f| f.as_fd());
        for fd in [pidfd.map(|f| f.as_fd()), out_fd, err_fd, wake_fd]
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
            return Ok(Waited::Exited);
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
    // The grace is not cut short by a cancel: a cancelled driver gets the same chance to clean
    // up as a timed-out one.
    let waited = wait_until(child, pidfd, None, out, err, Instant::now() + grace);
    if !matches!(waited, Ok(Waited::Exited)) {
        let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
    }
    let _ = child.wait();
    // Helpers that ignored SIGTERM after their parent died must not outlive the timeout (or
    // the cancel).
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
mod tests;
