//! One cgroup per running call-out: `pids.max` caps its processes, and a timeout kills
//! everything in it, including helpers that left the driver's process group with `setsid`.
//! After a normal exit, helpers the driver left running on purpose (FUSE daemons) are left
//! alone, alive and still capped, and reported as [`lingering`] until they end.
//!
//! The child must be born inside the cgroup, or its first fork could escape. Moving a task
//! between cgroups takes a lock whose write side waits for an RCU grace period: about 8 ms on
//! a quiet host, every time, which would add to every sporadic call-out. So nothing moves per
//! call-out:
//! - cgroup v1 (hybrid hosts) lets one thread sit in another cgroup than its process. Each
//!   call-out cgroup has a *spawner* thread living in it; a child is born in its parent
//!   thread's cgroup, so a driver the spawner starts is born inside.
//! - cgroup v2 has no such per-thread membership, but `clone3` can start a process inside a
//!   cgroup (`CLONE_INTO_CGROUP`, Linux 5.7): no move at all (see `runner/spawn.rs`). Where
//!   that is missing, the child joins before its exec, and pays the move.
//!
//! Cgroups (with their spawners) are pooled: making a cgroup and a thread costs one move,
//! once, when the pool grows. What a full pool has no room for is retired by a thread of its
//! own, off the call-outs' path: ending a spawner waits for it to be scheduled, and removing
//! a cgroup takes the kernel's cgroup lock, which nobody's answer needs to wait for.

use std::io;
use std::num::NonZeroU32;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use super::spawn::{Placement, Process, Request};
use flexvolume_os::cgroup::leftovers::{self, remember as remember_leftover};
use flexvolume_os::cgroup::{self, hierarchy};

/// How long a kill waits for the cgroup to empty before it gives up and leaves it for later.
const KILL_DEADLINE: Duration = Duration::from_secs(5);
/// Idle cgroups kept at most (one per concurrent call-out is enough); more are removed. Each
/// kept one holds a cgroup and, on cgroup v1, an idle spawner thread: 512 cut a burst of 256
/// publishes only from 5.0x to 4.3x the drivers' time (bench/csi.sh), not worth 480 idle
/// threads on every node.
const MAX_IDLE: usize = 32;

static NEXT_ID: AtomicU64 = AtomicU64::new(0);
/// Empty call-out cgroups ready for the next call-outs.
static IDLE: Mutex<Vec<Pooled>> = Mutex::new(Vec::new());

/// An idle cgroup: its `pids.max` as last written, and what starts drivers in it once it has
/// one.
struct Pooled {
    dir: PathBuf,
    max: Option<NonZeroU32>,
    starter: Option<Starter>,
}

/// What starts a driver inside a call-out cgroup.
enum Starter {
    /// cgroup v1: a thread living in the cgroup; a child is born in its parent thread's cgroup.
    Spawner(Spawner),
    /// cgroup v2: the cgroup's directory, open, for `clone3(CLONE_INTO_CGROUP)`.
    Dir(OwnedFd),
}

impl Starter {
    /// Done with it: a spawner's thread must end (leaving the cgroup) before the cgroup can go.
    fn retire(self) {
        if let Starter::Spawner(spawner) = self {
            spawner.stop();
        }
    }
}

/// Call-out cgroups where helpers of finished call-outs still run (FUSE daemons, or helpers
/// that outlived a kill), as of the last look. For operators: each holds driver processes
/// flexd no longer waits for.
pub fn lingering() -> Vec<PathBuf> {
    sweep_leftovers();
    leftovers::lock().clone()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Looks again at the leftovers: once empty, they go back to the pool. At most once a second
/// when called per call-out (one read per leftover).
fn sweep_leftovers_now_and_then() {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    {
        let mut last = lock(&LAST);
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        *last = Some(Instant::now());
    }
    sweep_leftovers();
}

fn sweep_leftovers() {
    let mut emptied = Vec::new();
    leftovers::lock().retain(|dir| match tasks_in(dir) {
        Ok(0) => {
            emptied.push(dir.clone());
            false
        }
        Ok(_) => true,
        Err(_) => false, // removed by someone else
    });
    for dir in emptied {
        park(Pooled {
            dir,
            max: None,
            starter: None,
        });
    }
}

/// On a clean stop: removes this process's empty call-out cgroups (the pool, and leftovers
/// whose helpers have ended), so a stopped flexd leaves no `call-<pid>-*` directories behind.
/// Cgroups still holding driver processes (a call-out in flight, a FUSE helper) stay, for the
/// next flexd's sweep. Returns how many were removed. Nothing to do where call-outs were never
/// capped, or no call-out ran (the hierarchy is not detected just for this).
pub fn remove_own_cgroups() -> usize {
    let Some(hierarchy) = cgroup::detected() else {
        return 0;
    };
    // Spawner threads live in their cgroups (v1): they must end before a cgroup can go.
    let pooled = std::mem::take(&mut *lock(&IDLE));
    // What the retirer was handed is gone (or a leftover) before we look.
    retirer_flush();
    let mut removed = 0;
    for Pooled { dir, starter, .. } in pooled {
        if let Some(starter) = starter {
            starter.retire();
        }
        removed += usize::from(remove_emptied(&dir));
    }
    for dir in cgroup::own_call_cgroups(&hierarchy.base) {
        removed += usize::from(remove_emptied(&dir));
    }
    tracing::debug!(removed, dir = %hierarchy.base.display(), "removed this process's call-out cgroups");
    removed
}

/// Removes a cgroup whose last task just ended. A joined spawner thread (v1) wakes its joiner
/// before the kernel takes it out of its cgroup, so the cgroup may be busy for a moment after:
/// seen on a loaded machine as a cgroup left behind at stop. Retried for up to a second.
fn remove_emptied(dir: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return true,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return false,
        }
    }
}

/// Puts an empty cgroup in the pool, or hands it to the retirer when the pool is full.
fn park(pooled: Pooled) {
    let mut idle = lock(&IDLE);
    if idle.len() < MAX_IDLE {
        idle.push(pooled);
        return;
    }
    drop(idle);
    retire_later(Retirement {
        dir: pooled.dir,
        starter: pooled.starter,
    });
}

/// An empty cgroup the pool has no room for: its starter to end, then the cgroup removed (kept
/// among the leftovers if it cannot be).
struct Retirement {
    dir: PathBuf,
    starter: Option<Starter>,
}

impl Retirement {
    fn carry_out(self) {
        if let Some(starter) = self.starter {
            starter.retire();
        }
        if !remove_emptied(&self.dir) {
            remember_leftover(self.dir);
        }
    }
}

enum RetirerJob {
    Retire(Retirement),
    /// Answered once every retirement sent before it is carried out.
    Flush(SyncSender<()>),
}

/// The retirer's inbox, `None` where its thread could not start.
static RETIRER: OnceLock<Option<Sender<RetirerJob>>> = OnceLock::new();

/// The retirer's inbox; its thread starts with the first retirement.
fn retirer() -> Option<&'static Sender<RetirerJob>> {
    RETIRER
        .get_or_init(|| {
            let (jobs, inbox) = mpsc::channel();
            std::thread::Builder::new()
                .name("flexd-retirer".into())
                .stack_size(64 * 1024)
                .spawn(move || retirer_main(&inbox))
                .map_err(|e| tracing::warn!(error = %e, "cannot start the call-out cgroup retirer; cgroups are retired in the call-outs"))
                .ok()
                .map(|_| jobs)
        })
        .as_ref()
}

fn retirer_main(inbox: &Receiver<RetirerJob>) {
    for job in inbox {
        match job {
            RetirerJob::Retire(retirement) => retirement.carry_out(),
            RetirerJob::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Hands the retirement to the retirer, or carries it out here when there is none.
fn retire_later(retirement: Retirement) {
    let Some(jobs) = retirer() else {
        return retirement.carry_out();
    };
    // Sending fails only if the retirer's thread died: then it is done here.
    if let Err(mpsc::SendError(RetirerJob::Retire(retirement))) =
        jobs.send(RetirerJob::Retire(retirement))
    {
        retirement.carry_out();
    }
}

/// Waits until every retirement handed over so far is carried out.
fn retirer_flush() {
    let Some(Some(jobs)) = RETIRER.get() else {
        return;
    };
    let (done, carried_out) = mpsc::sync_channel(1);
    if jobs.send(RetirerJob::Flush(done)).is_ok() {
        let _ = carried_out.recv();
    }
}

/// The driver processes in the cgroup `dir`. flexd itself is listed too on v1 while a spawner
/// thread lives there; it is never one of them.
fn members_of(dir: &Path) -> io::Result<Vec<Pid>> {
    let me = std::process::id() as i32;
    Ok(std::fs::read_to_string(dir.join("cgroup.procs"))?
        .lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter_map(Pid::from_raw)
        .collect())
}

/// Tasks charged to the cgroup `dir` (`pids.current`): processes, threads, and zombies not yet
/// reaped. A cgroup is reused only when nothing of an earlier call-out is charged to it, or the
/// next driver would start with part of its cap used up. (Orphans of a killed driver are
/// reaped by pid 1; where pid 1 does not reap, they stay charged, and their cgroup stays
/// aside.)
fn tasks_in(dir: &Path) -> io::Result<u64> {
    std::fs::read_to_string(dir.join("pids.current"))?
        .trim()
        .parse()
        .map_err(io::Error::other)
}

/// A thread living in one call-out cgroup, spawning the drivers of the call-outs that use it.
struct Spawner {
    jobs: Sender<(Request, SyncSender<io::Result<Process>>)>,
    thread: std::thread::JoinHandle<()>,
}

impl Spawner {
    /// Starts a thread and moves it into `dir` (the one move this costs).
    fn start(dir: &Path) -> io::Result<Self> {
        let (jobs, inbox) = mpsc::channel();
        let (ready_tx, ready) = mpsc::sync_channel(1);
        let tasks = dir.join("tasks");
        let thread = std::thread::Builder::new()
            .name("flexd-spawner".into())
            .stack_size(64 * 1024)
            .spawn(move || spawner_main(&tasks, &inbox, &ready_tx))?;
        match ready.recv() {
            Ok(Ok(())) => Ok(Self { jobs, thread }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::other("the spawner thread ended at start")),
        }
    }

    fn spawn(&self, request: &Request) -> io::Result<Process> {
        let (reply_tx, reply) = mpsc::sync_channel(1);
        self.jobs
            .send((request.clone(), reply_tx))
            .map_err(|_| io::Error::other("the spawner thread is gone"))?;
        reply
            .recv()
            .map_err(|_| io::Error::other("the spawner thread is gone"))?
    }

    /// Ends the thread, which leaves the cgroup as it ends.
    fn stop(self) {
        drop(self.jobs);
        let _ = self.thread.join();
    }
}

fn spawner_main(
    tasks: &Path,
    inbox: &Receiver<(Request, SyncSender<io::Result<Process>>)>,
    ready: &SyncSender<io::Result<()>>,
) {
    // "0" is the writing thread itself. Said so, the kernel moves it without the global lock
    // that a move by id takes (and whose write side waits for an RCU grace period): measured
    // here, 4 ms against 18 ms for a move every 200 ms.
    if let Err(e) = std::fs::write(tasks, "0") {
        let _ = ready.send(Err(e));
        return;
    }
    let _ = ready.send(Ok(()));
    for (request, reply) in inbox {
        // Born in this thread's cgroup.
        let _ = reply.send(request.spawn(Placement::Inherited));
    }
}

/// A cgroup directory, open for `CLONE_INTO_CGROUP` (which takes no `O_PATH` descriptor).
fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    Ok(rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The cgroup of one running call-out.
pub(crate) struct CallCgroup {
    dir: PathBuf,
    max: NonZeroU32,
    starter: Starter,
}

impl std::fmt::Debug for CallCgroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallCgroup")
            .field("dir", &self.dir)
            .finish()
    }
}

impl CallCgroup {
    /// An empty cgroup capped at `max` driver processes, or `None` when call-outs cannot be
    /// capped here (warned about).
    pub(crate) fn create(max: NonZeroU32) -> Option<Self> {
        let Ok(hierarchy) = hierarchy() else {
            return None;
        };
        sweep_leftovers_now_and_then();
        let reused = lock(&IDLE).pop();
        let Pooled {
            dir,
            max: had,
            starter,
        } = match reused {
            // Gone only if someone removed it by hand; then make a new one.
            Some(pooled) if pooled.dir.is_dir() => pooled,
            _ => {
                let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                let dir = hierarchy
                    .base
                    .join(format!("call-{}-{id}", std::process::id()));
                if let Err(e) = std::fs::create_dir(&dir) {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot create the process-cap cgroup; this call-out runs uncapped");
                    return None;
                }
                Pooled {
                    dir,
                    max: None,
                    starter: None,
                }
            }
        };
        let give_up = |dir: PathBuf, starter: Option<Starter>, e: io::Error, what: &str| {
            tracing::warn!(dir = %dir.display(), error = %e, "{what}; this call-out runs uncapped");
            park(Pooled {
                dir,
                max: None,
                starter,
            });
            None
        };
        if had != Some(max) {
            // On v1 the spawner thread counts as one task of the cgroup.
            let limit = if hierarchy.v2 {
                max.get()
            } else {
                max.get() + 1
            };
            if let Err(e) = std::fs::write(dir.join("pids.max"), limit.to_string()) {
                return give_up(dir, starter, e, "cannot set pids.max");
            }
        }
        // The hierarchy never changes while flexd runs: a pooled starter is of its kind.
        let starter = match starter {
            Some(starter) => starter,
            None if hierarchy.v2 => match open_dir(&dir) {
                Ok(handle) => Starter::Dir(handle),
                Err(e) => return give_up(dir, None, e, "cannot open the cgroup"),
            },
            None => match Spawner::start(&dir) {
                Ok(spawner) => Starter::Spawner(spawner),
                Err(e) => return give_up(dir, None, e, "cannot start a spawner in the cgroup"),
            },
        };
        Some(Self { dir, max, starter })
    }

    /// Starts the driver inside this cgroup, so that not even its first fork is outside it.
    pub(crate) fn spawn(&self, request: &Request) -> io::Result<Process> {
        match &self.starter {
            Starter::Spawner(spawner) => spawner.spawn(request),
            // The handle is ours until the call-out ends, so open for the whole spawn.
            Starter::Dir(handle) => request.spawn(Placement::Cgroup(handle.as_raw_fd())),
        }
    }

    /// The driver processes in this cgroup now.
    pub(crate) fn members(&self) -> Vec<Pid> {
        members_of(&self.dir).unwrap_or_default()
    }

    /// Sends `signal` to every driver process in the cgroup.
    pub(crate) fn signal_all(&self, signal: Signal) {
        for pid in self.members() {
            let _ = rustix::process::kill_process(pid, signal);
        }
    }

    /// Kills every driver process in the cgroup and waits (bounded) until none is left.
    pub(crate) fn kill_all(self) {
        let deadline = Instant::now() + KILL_DEADLINE;
        // cgroup.kill (v2, Linux 5.14) kills the whole cgroup at once, forks in flight
        // included; elsewhere a process may fork between our read and our kill, hence the loop.
        let v2 = matches!(self.starter, Starter::Dir(_));
        let killed_at_once = v2 && std::fs::write(self.dir.join("cgroup.kill"), "1").is_ok();
        loop {
            let members = self.members();
            if members.is_empty() || Instant::now() >= deadline {
                break;
            }
            if !killed_at_once {
                for pid in members {
                    let _ = rustix::process::kill_process(pid, Signal::KILL);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.release();
    }

    /// Done with the call-out: an empty cgroup goes back to the pool; one where helpers still
    /// run (FUSE daemons), or not yet reaped, is kept aside until they are gone, and its spawner
    /// retires.
    pub(crate) fn release(self) {
        // On v1 the spawner thread is one of the cgroup's tasks.
        let own = u64::from(matches!(self.starter, Starter::Spawner(_)));
        if tasks_in(&self.dir).is_ok_and(|n| n == own) {
            park(Pooled {
                dir: self.dir,
                max: Some(self.max),
                starter: Some(self.starter),
            });
        } else {
            self.starter.retire();
            remember_leftover(self.dir);
        }
    }
}
