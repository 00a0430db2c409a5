//! Starting a driver process: the way `posix_spawn` does, and on cgroup v2 born straight inside
//! its call-out cgroup.
//!
//! Why not std's `Command`: a call-out needs steps between fork and exec (keep the operation's
//! locks open, join the call-out cgroup, enter the driver's mount namespace), and with any such
//! step std forks. A fork copies the page tables of the whole process with its memory map
//! locked for writing: in a daemon serving a burst with hundreds of threads, every page fault
//! of every other thread waits for it. And std has no way to start a child in a cgroup, so on
//! v2 the child had to move itself there, a move that waits for an RCU grace period (about
//! 8 ms on a quiet host, every time).
//!
//! So, like glibc's `posix_spawn`, the child shares flexd's memory (`CLONE_VM | CLONE_VFORK`):
//! nothing is copied, and the calling thread sleeps until the child has exec'd or failed. On
//! Linux 5.7+ (x86_64) it is made with `clone3`, which also starts it in its cgroup
//! (`CLONE_INTO_CGROUP`), hands back a pidfd (`CLONE_PIDFD`) and resets signal handlers
//! (`CLONE_CLEAR_SIGHAND`). Elsewhere (older kernels, other architectures, a seccomp filter
//! that refuses `clone3`) glibc's `clone` makes it and the child joins its cgroup itself.
//!
//! std's guarantees are kept (docs/protocol.md#execution): no shell, stdin `/dev/null`, stdout
//! and stderr piped, its own process group, `SIGPIPE` back to default and an empty signal mask,
//! no descriptor of flexd's but the ones asked for (flexd opens everything close-on-exec).
//!
//! The child runs on a small stack of its own in flexd's memory: it makes system calls only (no
//! allocation, no lock, no panic), and a step that fails writes its errno where the parent
//! reads it once the child is gone.

use std::ffi::{c_int, c_void, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};
use std::sync::OnceLock;

/// Where the child starts: nowhere special (flexd's own cgroup, or on v1 the spawning thread's),
/// or in the cgroup v2 directory open as this descriptor.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Placement {
    Inherited,
    Cgroup(RawFd),
}

/// Everything a spawn needs, allocated before it: the child may not allocate.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    /// Descriptors the driver inherits (flock-ed operation locks). The caller keeps them open
    /// until the spawn returns.
    inherit: Vec<RawFd>,
    /// A mount namespace (`/proc/PID/ns/mnt`) the child enters last; kept open by the caller.
    namespace: Option<RawFd>,
}

/// A running (or finished, not yet reaped) driver process.
#[derive(Debug)]
pub(crate) struct Process {
    pid: i32,
    pidfd: Option<OwnedFd>,
    pub(crate) stdout: Option<OwnedFd>,
    pub(crate) stderr: Option<OwnedFd>,
    status: Option<ExitStatus>,
}

/// flexd's environment as `KEY=value` strings, what a driver gets.
pub(crate) fn environment() -> Vec<CString> {
    std::env::vars_os()
        .filter_map(|(key, value)| {
            let mut pair = key.into_vec();
            pair.push(b'=');
            pair.extend_from_slice(value.as_bytes());
            CString::new(pair).ok()
        })
        .collect()
}

impl Request {
    /// `program` run with `argv` (after argv[0], which is `program`) in flexd's environment.
    /// A `program` without a slash is looked up in `PATH`, as std does.
    pub(crate) fn new(
        program: &Path,
        argv: &[&OsStr],
        envp: Vec<CString>,
        inherit: Vec<RawFd>,
        namespace: Option<RawFd>,
    ) -> io::Result<Self> {
        let c = |s: &OsStr| {
            CString::new(s.as_bytes()).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "argument contains a NUL byte")
            })
        };
        let resolved = resolve(program);
        let mut args = Vec::with_capacity(argv.len() + 1);
        args.push(c(program.as_os_str())?);
        for arg in argv {
            args.push(c(arg)?);
        }
        Ok(Self {
            program: c(resolved.as_os_str())?,
            argv: args,
            envp,
            inherit,
            namespace,
        })
    }

    /// Starts the process in `placement`. Returns once it has exec'd; a step that failed
    /// before (the exec included) is the error, and that child is already reaped.
    pub(crate) fn spawn(&self, placement: Placement) -> io::Result<Process> {
        self.spawn_by(placement, true)
    }

    /// [`Request::spawn`], with `clone3` or (`try_clone3` false, for tests) the fallback.
    fn spawn_by(&self, placement: Placement, try_clone3: bool) -> io::Result<Process> {
        let (stdout_read, stdout_write) = pipe()?;
        let (stderr_read, stderr_write) = pipe()?;
        let stdin = dev_null()?;
        let argv = null_terminated(&self.argv);
        let envp = null_terminated(&self.envp);
        let mut shared = Shared {
            program: self.program.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            stdio: [
                stdin.as_raw_fd(),
                stdout_write.as_raw_fd(),
                stderr_write.as_raw_fd(),
            ],
            inherit: self.inherit.as_ptr(),
            inherit_len: self.inherit.len(),
            join: -1,
            namespace: self.namespace.unwrap_or(-1),
            reset_handlers: false,
            open_files: flexvolume_os::open_files::original().map(|(soft, hard)| {
                let limit = |value: Option<u64>| value.unwrap_or(libc::RLIM_INFINITY);
                libc::rlimit {
                    rlim_cur: limit(soft),
                    rlim_max: limit(hard),
                }
            }),
            failed_step: AtomicU8::new(Step::None as u8),
            errno: AtomicI32::new(0),
        };
        let stack = Stack::new()?;
        // Set only where the child joins by itself (no clone3): keeps cgroup.procs open.
        let mut procs = None;
        let cgroup = match placement {
            Placement::Inherited => None,
            Placement::Cgroup(dir) => Some(dir),
        };
        let mut started = None;
        if try_clone3 {
            if let Some(result) = clone3_spawn(&mut shared, &stack, cgroup) {
                started = Some(result?);
            }
        }
        let (pid, pidfd) = match started {
            Some(started) => started,
            None => {
                if let Some(dir) = cgroup {
                    // SAFETY: the caller keeps the cgroup directory open for the spawn.
                    let dir = unsafe { BorrowedFd::borrow_raw(dir) };
                    let file = rustix::fs::openat(
                        dir,
                        "cgroup.procs",
                        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                        rustix::fs::Mode::empty(),
                    )?;
                    shared.join = file.as_raw_fd();
                    procs = Some(file);
                }
                shared.reset_handlers = true;
                (clone_spawn(&mut shared, &stack)?, None)
            }
        };
        drop(procs);
        drop(stack);
        // The write ends are the driver's now; ours would keep the pipes from ever closing.
        drop(stdout_write);
        drop(stderr_write);
        let mut process = Process {
            pid,
            pidfd,
            stdout: Some(stdout_read),
            stderr: Some(stderr_read),
            status: None,
        };
        let step = shared.failed_step.load(Ordering::Acquire);
        if step != Step::None as u8 {
            let errno = shared.errno.load(Ordering::Acquire);
            let _ = process.wait();
            let error = io::Error::from_raw_os_error(errno);
            return Err(match Step::describe(step) {
                // The exec's own error says it best ("No such file or directory").
                None => error,
                Some(what) => io::Error::new(error.kind(), format!("{what}: {error}")),
            });
        }
        Ok(process)
    }
}

impl Process {
    pub(crate) fn id(&self) -> u32 {
        self.pid as u32
    }

    /// The pidfd made with the process, where the kernel gave one.
    pub(crate) fn take_pidfd(&mut self) -> Option<OwnedFd> {
        self.pidfd.take()
    }

    /// Waits for the process to exit and reaps it (once; later calls return the same status).
    pub(crate) fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.status {
                return Ok(status);
            }
            self.reap(0)?;
        }
    }

    /// Reaps the process if it has exited.
    pub(crate) fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.reap(libc::WNOHANG)?;
        }
        Ok(self.status)
    }

    fn reap(&mut self, flags: c_int) -> io::Result<()> {
        let mut status = 0;
        // SAFETY: plain waitpid on our own child.
        let ret = unsafe { libc::waitpid(self.pid, &mut status, flags) };
        match ret {
            -1 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    Ok(())
                } else {
                    Err(e)
                }
            }
            0 => Ok(()),
            _ => {
                self.status = Some(ExitStatus::from_raw(status));
                Ok(())
            }
        }
    }
}

/// The child's steps, in order, as reported when one fails.
#[repr(u8)]
#[derive(Clone, Copy)]
enum Step {
    None = 0,
    Signals,
    ProcessGroup,
    Stdio,
    Inherit,
    JoinCgroup,
    EnterNamespace,
    Exec,
}

impl Step {
    fn describe(step: u8) -> Option<&'static str> {
        Some(match step {
            s if s == Self::Signals as u8 => "resetting signal handlers in the child",
            s if s == Self::ProcessGroup as u8 => "making the child's process group",
            s if s == Self::Stdio as u8 => "setting up the child's stdin, stdout and stderr",
            s if s == Self::Inherit as u8 => "keeping the operation's locks open in the child",
            s if s == Self::JoinCgroup as u8 => "joining the call-out cgroup",
            s if s == Self::EnterNamespace as u8 => "entering the driver mount namespace",
            _ => return None,
        })
    }
}

/// What parent and child share: read by the child, its failure written back. Lives on the
/// parent's stack, which stays put while the child runs (the parent waits for its exec).
#[repr(C)]
struct Shared {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    stdio: [RawFd; 3],
    inherit: *const RawFd,
    inherit_len: usize,
    /// `cgroup.procs` to write to (when not born in the cgroup), or -1.
    join: RawFd,
    namespace: RawFd,
    /// Signal handlers to reset by hand (no `CLONE_CLEAR_SIGHAND`).
    reset_handlers: bool,
    /// The open-file limit flexd was started with, put back before the exec (flexd raised its
    /// own: see `flexvolume_os::open_files`).
    open_files: Option<libc::rlimit>,
    failed_step: AtomicU8,
    errno: AtomicI32,
}

/// The child, from its birth to its exec. System calls only.
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's `Shared`, alive until this child execs or exits.
    let shared = unsafe { &*(arg as *const Shared) };
    let fail = |step: Step| -> ! {
        // SAFETY: reading errno and exiting are async-signal-safe.
        unsafe {
            shared
                .errno
                .store(*libc::__errno_location(), Ordering::Release);
            shared.failed_step.store(step as u8, Ordering::Release);
            libc::_exit(127)
        }
    };
    // SAFETY: every call below is a system call wrapper, async-signal-safe, on memory the parent
    // keeps alive (see `Shared`).
    unsafe {
        // Born with every signal blocked (the parent blocked them around the clone): a handler
        // of flexd's must not run here, in flexd's memory.
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        if shared.reset_handlers {
            for signal in 1..=libc::SIGRTMAX() {
                let mut old: libc::sigaction = std::mem::zeroed();
                // Signals glibc keeps for itself fail here; nobody sends them to this process.
                if libc::sigaction(signal, std::ptr::null(), &mut old) == 0
                    && old.sa_sigaction != libc::SIG_DFL
                    && old.sa_sigaction != libc::SIG_IGN
                {
                    libc::sigaction(signal, &default, std::ptr::null_mut());
                }
            }
        }
        // Rust ignores SIGPIPE; a driver expects the default, as std gives it.
        if libc::sigaction(libc::SIGPIPE, &default, std::ptr::null_mut()) != 0 {
            fail(Step::Signals);
        }
        if libc::setpgid(0, 0) != 0 {
            fail(Step::ProcessGroup);
        }
        // The sources are all >= 3 (see `pipe`), so no dup2 overwrites another's source.
        for (target, source) in shared.stdio.iter().enumerate() {
            if libc::dup2(*source, target as c_int) < 0 {
                fail(Step::Stdio);
            }
        }
        for i in 0..shared.inherit_len {
            if libc::fcntl(*shared.inherit.add(i), libc::F_SETFD, 0) != 0 {
                fail(Step::Inherit);
            }
        }
        if shared.join >= 0 && libc::write(shared.join, b"0".as_ptr().cast(), 1) != 1 {
            fail(Step::JoinCgroup);
        }
        // Lowering a soft limit never fails; a driver started with the raised one still runs.
        if let Some(limit) = &shared.open_files {
            libc::setrlimit(libc::RLIMIT_NOFILE, limit);
        }
        // Last, so everything above resolved in flexd's namespace.
        if shared.namespace >= 0 && libc::setns(shared.namespace, libc::CLONE_NEWNS) != 0 {
            fail(Step::EnterNamespace);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execve(shared.program, shared.argv, shared.envp);
        fail(Step::Exec)
    }
}

/// Blocks every signal in the calling thread until dropped, so the child is born with them
/// blocked.
struct SignalsBlocked(libc::sigset_t);

impl SignalsBlocked {
    fn new() -> Self {
        // SAFETY: sigset manipulation on local values; pthread_sigmask on the calling thread.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            Self(old)
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut());
        }
    }
}

/// The child's stack: mapped, with a guard page below, for one spawn.
struct Stack {
    base: *mut c_void,
    len: usize,
}

impl Stack {
    /// The child calls a handful of system calls; 64 KiB is plenty, in debug builds too.
    const SIZE: usize = 64 * 1024;

    fn new() -> io::Result<Self> {
        let page = rustix::param::page_size();
        let len = Self::SIZE + page;
        // SAFETY: a fresh anonymous private mapping, unmapped in Drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Self { base, len };
        // SAFETY: the lowest page of our own mapping becomes the guard.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The lowest usable byte, above the guard page.
    fn bottom(&self) -> *mut c_void {
        // SAFETY: within the mapping.
        unsafe { self.base.add(rustix::param::page_size()) }
    }

    /// One past the highest byte, 16-byte aligned (the mapping is page-aligned).
    fn top(&self) -> *mut c_void {
        // SAFETY: one past the end of the mapping.
        unsafe { self.base.add(self.len) }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: our own mapping; the child that used it has exec'd or exited.
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

/// Which way of cloning works on this kernel, learnt at the first spawn.
static CLONE3: AtomicU8 = AtomicU8::new(CLONE3_UNKNOWN);
const CLONE3_UNKNOWN: u8 = 0;
const CLONE3_WORKS: u8 = 1;
const CLONE3_MISSING: u8 = 2;

/// Starts the child with `clone3`, into `cgroup` if given. `None` when this kernel (or a
/// seccomp filter) has no usable `clone3`; then the caller uses [`clone_spawn`].
fn clone3_spawn(
    shared: &mut Shared,
    stack: &Stack,
    cgroup: Option<RawFd>,
) -> Option<io::Result<(i32, Option<OwnedFd>)>> {
    if CLONE3.load(Ordering::Relaxed) == CLONE3_MISSING {
        return None;
    }
    let mut pidfd: c_int = -1;
    let mut flags = CLONE_VM | CLONE_VFORK | CLONE_PIDFD | CLONE_CLEAR_SIGHAND;
    if cgroup.is_some() {
        flags |= CLONE_INTO_CGROUP;
    }
    let mut args = CloneArgs {
        flags,
        pidfd: std::ptr::addr_of_mut!(pidfd) as u64,
        exit_signal: libc::SIGCHLD as u64,
        stack: stack.bottom() as u64,
        stack_size: (stack.top() as usize - stack.bottom() as usize) as u64,
        cgroup: cgroup.map_or(0, |fd| fd as u64),
        ..CloneArgs::default()
    };
    let ret = {
        let _blocked = SignalsBlocked::new();
        // SAFETY: `args` describes a valid stack; the child runs `child_main` on it with
        // `shared`, which outlives it (CLONE_VFORK: we resume after its exec or exit).
        unsafe { raw_clone3(&mut args, child_main, std::ptr::from_mut(shared).cast()) }
    };
    if ret < 0 {
        let errno = -ret as i32;
        // ENOSYS: before 5.3, or refused by seccomp (older container runtimes' default
        // profile). EINVAL/E2BIG: a flag or the size unknown before 5.7.
        if matches!(errno, libc::ENOSYS | libc::EINVAL | libc::E2BIG)
            && CLONE3.load(Ordering::Relaxed) != CLONE3_WORKS
        {
            CLONE3.store(CLONE3_MISSING, Ordering::Relaxed);
            tracing::debug!(errno, "clone3 into a cgroup is not available; drivers are started with clone and join their cgroup");
            return None;
        }
        return Some(Err(io::Error::from_raw_os_error(errno)));
    }
    CLONE3.store(CLONE3_WORKS, Ordering::Relaxed);
    // SAFETY: the kernel wrote a new descriptor into `pidfd` (CLONE_PIDFD), ours to own.
    let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    Some(Ok((ret as i32, pidfd)))
}

/// Starts the child with glibc's `clone`: no pidfd, no cgroup, handlers reset by the child.
fn clone_spawn(shared: &mut Shared, stack: &Stack) -> io::Result<i32> {
    let _blocked = SignalsBlocked::new();
    // SAFETY: as in `clone3_spawn`; glibc's wrapper calls `child_main` on the given stack.
    let pid = unsafe {
        libc::clone(
            child_main,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::from_mut(shared).cast(),
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(pid)
}

const CLONE_VM: u64 = libc::CLONE_VM as u64;
const CLONE_VFORK: u64 = libc::CLONE_VFORK as u64;
const CLONE_PIDFD: u64 = 0x1000;
const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `clone3`, with the child calling `main(arg)` on its new stack and never coming back here:
/// the child cannot return through Rust code whose frame lives on the parent's stack, so the
/// call is made in the same few instructions as the system call. Returns the child's pid, or
/// `-errno`.
#[cfg(target_arch = "x86_64")]
unsafe fn raw_clone3(
    args: &mut CloneArgs,
    main: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
) -> isize {
    let ret: isize;
    // The kernel starts the child at the instruction after `syscall`, with rsp at the top of
    // its stack (16-byte aligned, so after `call` it is as the ABI wants) and every register but
    // rax, rcx and r11 as the parent had them. `main` exits; `ud2` is never reached.
    std::arch::asm!(
        "syscall",
        "test rax, rax",
        "jnz 2f",
        "xor ebp, ebp",
        "mov rdi, r12",
        "call r13",
        "ud2",
        "2:",
        inlateout("rax") libc::SYS_clone3 as isize => ret,
        in("rdi") std::ptr::from_mut(args),
        in("rsi") std::mem::size_of::<CloneArgs>(),
        in("r12") arg,
        in("r13") main,
        lateout("rcx") _,
        lateout("r11") _,
        options(nostack),
    );
    ret
}

/// Elsewhere, no `clone3` (untested here): glibc's `clone` is used.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn raw_clone3(
    _args: &mut CloneArgs,
    _main: extern "C" fn(*mut c_void) -> c_int,
    _arg: *mut c_void,
) -> isize {
    -(libc::ENOSYS as isize)
}

/// A close-on-exec pipe whose ends are both above stderr, so the child's `dup2`s onto 0, 1 and
/// 2 never overwrite a source still to be copied (flexd may run with a stdio stream closed).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    Ok((above_stdio(read)?, above_stdio(write)?))
}

fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, 3)?)
}

/// `/dev/null`, opened once for every driver's stdin.
fn dev_null() -> io::Result<BorrowedFd<'static>> {
    static NULL: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(fd) = NULL.get() {
        return Ok(fd.as_fd());
    }
    let file = std::fs::File::open("/dev/null")?;
    let fd = above_stdio(file.into())?;
    Ok(NULL.get_or_init(|| fd).as_fd())
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Where exec finds `program`: itself when it names a path, else the first executable file of
/// that name in `PATH` (left as is when none, so the exec reports "not found").
fn resolve(program: &Path) -> PathBuf {
    if program.as_os_str().as_bytes().contains(&b'/') {
        return program.to_owned();
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| {
            rustix::fs::access(candidate, rustix::fs::Access::EXEC_OK).is_ok()
                && candidate.is_file()
        })
        .unwrap_or_else(|| program.to_owned())
}

#[cfg(test)]
mod tests;
