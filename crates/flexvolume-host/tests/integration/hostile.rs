//! Hostile input, run in the normal test suite: every reply in tests/hostile/replies (plus a few
//! generated ones too big to commit) goes through a real driver process; hostile directory
//! names and symlink tricks go through the real plugin-dir scan; misbehaving drivers go through
//! the real runner. Each has an exact expected class of outcome, a bounded error message, and
//! leaves no process behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flexvolume_host::layout::{self, LayoutError, LayoutPolicy};
use flexvolume_host::prober;
use flexvolume_host::runner::{self, CallError, RunnerConfig};
use flexvolume_protocol::{CallOut, CallOutKind, ProtocolError, Status};

use test_support::{kill, proc_stat, read_pid, wait_dead as wait_gone, wait_until, write_exe};

/// Longest error message we accept: output quotes are truncated, so errors stay readable.
const MAX_ERROR_LEN: usize = 2048;

#[derive(Debug, PartialEq)]
enum Class {
    Success,
    Failure,
    NotSupported,
    NoReply,
}

fn classify(result: &Result<flexvolume_host::Reply, CallError>) -> Class {
    match result {
        Ok(r) => {
            assert_eq!(r.status, Status::Success);
            Class::Success
        }
        Err(CallError::Failure { .. }) => Class::Failure,
        Err(CallError::NotSupported { .. }) => Class::NotSupported,
        Err(CallError::Protocol {
            source: ProtocolError::NoReply { .. },
            ..
        }) => Class::NoReply,
        Err(other) => panic!("unexpected error class: {other:?}"),
    }
}

fn expected(file_name: &str) -> Class {
    match file_name.split('-').next() {
        Some("success") => Class::Success,
        Some("failure") => Class::Failure,
        Some("notsupported") => Class::NotSupported,
        Some("noreply") => Class::NoReply,
        _ => panic!("corpus file {file_name} has no expected-outcome prefix"),
    }
}

/// `script` as the executable `name` in `dir`: the driver a test runs directly.
fn driver_in(dir: &Path, name: &str, script: &str) -> PathBuf {
    let exe = dir.join(name);
    write_exe(&exe, script);
    exe
}

/// `mount <file> {}`: the call-out these drivers are run with; `file` names what they read or
/// where they write a pid.
fn mount_call(file: &Path) -> CallOut {
    CallOut::from_raw(CallOutKind::Mount, vec![file.into(), "{}".into()]).unwrap()
}

/// A driver that prints the file named by its first argument (`mount <file> {}`).
fn emitter(dir: &Path) -> PathBuf {
    driver_in(dir, "emit", "#!/bin/sh\ncat \"$2\"\n")
}

fn emit(exe: &Path, file: &Path) -> Result<flexvolume_host::Reply, CallError> {
    let call = mount_call(file);
    let config = RunnerConfig::default().with_timeout_for_all(Duration::from_secs(60));
    runner::call(&config, exe, &call)
}

#[test]
fn every_hostile_reply_has_its_exact_outcome_and_a_bounded_error() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile/replies");
    let work = tempfile::tempdir().unwrap();
    let exe = emitter(work.path());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&corpus)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();

    // Too big or too binary to commit: generated here.
    let generated = [
        ("noreply-10mb-string", {
            let mut v = br#"{"status":"Success","message":""#.to_vec();
            v.extend(std::iter::repeat_n(b'x', 10 * 1024 * 1024));
            v.extend(br#""}"#);
            v
        }),
        (
            "noreply-binary",
            (0..200_000u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
                .filter(|b| *b != b'{')
                .collect(),
        ),
        ("success-reply-then-10mb", {
            let mut v = br#"{"status":"Success"}"#.to_vec();
            v.extend(std::iter::repeat_n(b'{', 10 * 1024 * 1024));
            v
        }),
        ("noreply-1mb-of-braces", vec![b'{'; 1024 * 1024]),
        ("noreply-nested-strings", br#"{"a":""#.repeat(150_000)),
    ];
    for (name, bytes) in generated {
        let path = work.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        files.push(path);
    }
    assert!(files.len() >= 50, "the corpus has {} replies", files.len());
    files.sort();
    for file in files {
        let name = file.file_name().unwrap().to_str().unwrap().to_owned();
        let result = emit(&exe, &file);
        assert_eq!(classify(&result), expected(&name), "{name}: {result:?}");
        if let Err(e) = &result {
            let message = e.to_string();
            assert!(
                message.len() <= MAX_ERROR_LEN,
                "{name}: error of {} bytes",
                message.len()
            );
        }
    }
}

/// A driver executable that leaves a marker file when it is run: proof that it never was.
fn tripwire(path: &Path, marker: &Path) {
    write_exe(
        path,
        &format!(
            "#!/bin/sh\ntouch '{}'\necho '{{\"status\":\"Success\"}}'\n",
            marker.display()
        ),
    );
}

#[test]
fn hostile_directory_names_are_reported_and_never_executed() {
    use std::os::unix::ffi::OsStrExt;
    let plugin = tempfile::tempdir().unwrap();
    let marker = plugin.path().join(".ran");
    let long = "a".repeat(254);
    let names: Vec<&[u8]> = vec![
        b"-rf",
        b"a~~b",
        b"~x",
        b"x~",
        b"a b",
        b"a\nb",
        b"a$(touch pwned)",
        b"a;rm -rf x",
        "é".as_bytes(),
        long.as_bytes(),
        b"a\\b",
        b"a*b",
        b"a?b",
        b"a|b",
        b"a>b",
        b"a'b",
        b"a\"b",
        b"a`id`",
        b"a\tb",
        b"v~-x",
        b"v~.x",
        b"\x01ctl",
        b"\xff\xfe",
        b"v~x~-y",
    ];
    assert!(names.len() >= 20);
    for raw in &names {
        let dir = plugin.path().join(std::ffi::OsStr::from_bytes(raw));
        std::fs::create_dir(&dir).unwrap();
        // Put tripwires under every plausible executable name.
        let last = raw.rsplit(|b| *b == b'~').next().unwrap();
        let exe_name = if last.is_empty() {
            b"x".as_slice()
        } else {
            last
        };
        tripwire(&dir.join(std::ffi::OsStr::from_bytes(exe_name)), &marker);
    }
    // Hidden entries are invisible: never reported, never run.
    let hidden = plugin.path().join(".staging~drv");
    std::fs::create_dir(&hidden).unwrap();
    tripwire(&hidden.join("drv"), &marker);

    let probed = prober::probe_all(
        plugin.path(),
        LayoutPolicy::default(),
        &RunnerConfig::default(),
        8,
    )
    .unwrap();
    assert_eq!(
        probed.len(),
        names.len(),
        "every visible entry is reported once, hidden ones not at all"
    );
    for p in &probed {
        let err = p.result.as_ref().expect_err(&p.name).to_string();
        assert!(
            err.contains("not a valid driver name") || err.contains("not valid UTF-8"),
            "{:?}: {err}",
            p.name
        );
        assert!(err.len() <= MAX_ERROR_LEN);
    }
    assert!(!marker.exists(), "a hostile entry was executed");
}

#[test]
fn symlink_tricks_give_clear_errors_and_nothing_outside_runs() {
    let plugin = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let p = plugin.path();
    let marker = outside.path().join("ran");
    let escaped = outside.path().join("x");
    tripwire(&escaped, &marker);
    let symlink = |target: &Path, link: &Path| std::os::unix::fs::symlink(target, link).unwrap();

    // A valid driver, and an alias directory pointing at it (inside: allowed).
    std::fs::create_dir(p.join("acme~x")).unwrap();
    write_exe(
        &p.join("acme~x/x"),
        "#!/bin/sh\necho '{\"status\":\"Success\"}'\n",
    );
    symlink(Path::new("acme~x"), &p.join("alias~x"));
    // Loops, escapes, dangling links, wrong file types.
    symlink(Path::new("loop~x"), &p.join("loop~x"));
    std::fs::create_dir(p.join("esc~x")).unwrap();
    symlink(&escaped, &p.join("esc~x/x"));
    symlink(outside.path(), &p.join("escdir~x"));
    std::fs::create_dir(p.join("dangling~x")).unwrap();
    symlink(Path::new("/nonexistent/flexd"), &p.join("dangling~x/x"));
    std::fs::create_dir(p.join("devnull~x")).unwrap();
    symlink(Path::new("/dev/null"), &p.join("devnull~x/x"));
    std::fs::create_dir_all(p.join("isdir~x/x")).unwrap();
    std::fs::create_dir(p.join("fifo~x")).unwrap();
    test_support::make_fifo(&p.join("fifo~x/x"), 0o755);
    std::fs::create_dir(p.join("selfloop~x")).unwrap();
    symlink(Path::new("x"), &p.join("selfloop~x/x"));

    let entries = layout::scan(p, LayoutPolicy::default()).unwrap();
    let outcome = |name: &str| {
        entries
            .iter()
            .find(|e| e.dir_name == name)
            .unwrap()
            .outcome
            .clone()
    };
    assert!(outcome("acme~x").is_ok());
    assert!(
        outcome("alias~x").is_ok(),
        "a symlink inside the plugin dir is fine"
    );
    // Asserts that the entry named `$name` was refused with this error.
    macro_rules! assert_refused {
        ($name:literal, $error:pat) => {
            assert!(
                matches!(outcome($name), Err($error)),
                "{}: {:?}",
                $name,
                outcome($name)
            )
        };
    }
    assert_refused!("loop~x", LayoutError::Io { .. });
    assert_refused!("esc~x", LayoutError::Escapes { .. });
    assert_refused!("escdir~x", LayoutError::Escapes { .. });
    assert_refused!("dangling~x", LayoutError::MissingExecutable { .. });
    assert_refused!("devnull~x", LayoutError::NotAFile { .. });
    assert_refused!("isdir~x", LayoutError::NotAFile { .. });
    assert_refused!("fifo~x", LayoutError::NotAFile { .. });
    assert_refused!("selfloop~x", LayoutError::Io { .. });
    for e in &entries {
        if let Err(err) = &e.outcome {
            assert!(err.to_string().len() <= MAX_ERROR_LEN);
        }
    }
    // Probing everything runs only the valid drivers.
    let probed =
        prober::probe_all(p, LayoutPolicy::default(), &RunnerConfig::default(), 8).unwrap();
    assert_eq!(probed.iter().filter(|p| p.result.is_ok()).count(), 2);
    assert!(
        !marker.exists(),
        "an executable outside the plugin dir was run"
    );
}

/// Every process's pid, command name and stat fields after it (see `test_support::proc_stat`).
fn processes() -> Vec<(i32, String, Vec<String>)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_string_lossy().parse::<i32>().ok())
        .filter_map(|pid| proc_stat(pid).map(|(comm, fields)| (pid, comm, fields)))
        .collect()
}

/// Processes still in a process group.
fn group_members(pgid: i32) -> Vec<i32> {
    processes()
        .into_iter()
        // fields[0] = state, fields[2] = pgrp
        .filter(|(_, _, fields)| {
            fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid)
                && fields.first().map(String::as_str) != Some("Z")
        })
        .map(|(pid, _, _)| pid)
        .collect()
}

fn wait_group_empty(pgid: i32) -> Vec<i32> {
    wait_until(Duration::from_secs(15), || group_members(pgid).is_empty());
    group_members(pgid)
}

/// Children of this test process (zombies included: an unreaped driver is a leak too) whose
/// command name starts with `prefix`. Other tests of this binary run drivers concurrently, so
/// only processes with our own names count.
fn our_children(prefix: &str) -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    processes()
        .into_iter()
        // fields[1] = ppid
        .filter(|(_, comm, fields)| {
            fields.get(1).and_then(|p| p.parse::<i32>().ok()) == Some(me)
                && comm.starts_with(prefix)
        })
        .map(|(pid, comm, fields)| (pid, format!("{comm} ({})", fields[0])))
        .collect()
}

/// The exact outcome a misbehaving driver must end with.
enum Want {
    /// Timed out, its process group killed.
    Timeout,
    /// No usable reply, with this exit status in the message.
    NoReply(&'static str),
    /// Claimed Success but died: a driver bug, reported as such.
    SuccessWithBadExit(&'static str),
}

#[test]
fn misbehaving_drivers_end_with_a_clear_error_and_leave_no_process() {
    let work = tempfile::tempdir().unwrap();
    // Each script writes its pid (= its process group) to $2 first. Names start with "mis-"
    // so that `our_children` can tell them from other tests' drivers. Grouped by the outcome
    // each must end with.
    let timeouts = [
        (
            "mis-children",
            "for i in $(seq 50); do sleep 100 & done\nwait\n",
        ),
        ("mis-flood", "yes flood\n"),
        ("mis-flood-stderr", "yes flood >&2\n"),
        (
            "mis-ignore-term",
            "trap '' TERM\nwhile :; do sleep 1; done\n",
        ),
        (
            "mis-child-ignores-term",
            "sh -c \"trap '' TERM; while :; do sleep 1; done\" &\nwait\n",
        ),
        ("mis-busy-loop", "while :; do :; done\n"),
        ("mis-hang", "sleep 1000\n"),
        (
            "mis-hang-after-reply",
            "echo '{\"status\":\"Success\"}'\nsleep 1000\n",
        ),
        ("mis-closed-stdout-hang", "exec 1>&- 2>&-\nsleep 1000\n"),
    ];
    let no_reply = [
        ("mis-segv", "kill -SEGV $$\n", "killed by signal 11"),
        (
            "mis-abort-mid-reply",
            "printf '{\"status\":\"Succ'\nkill -ABRT $$\n",
            "killed by signal 6",
        ),
        (
            "mis-closed-stdout-exit",
            "exec 1>&-\nexit 3\n",
            "exit status 3",
        ),
    ];
    let cases = timeouts
        .map(|(name, body)| (name, body, Want::Timeout))
        .into_iter()
        .chain(no_reply.map(|(name, body, exit)| (name, body, Want::NoReply(exit))))
        .chain([(
            "mis-success-then-kill",
            "echo '{\"status\":\"Success\"}'\nkill -KILL $$\n",
            Want::SuccessWithBadExit("killed by signal 9"),
        )]);
    let config = RunnerConfig {
        kill_grace: Duration::from_millis(300),
        ..RunnerConfig::default()
    }
    // Long enough that every driver has started and written its pid before it can time out,
    // even under emulation (the kernel 6.1 VM runs without KVM).
    .with_timeout_for_all(Duration::from_secs(2));
    for (name, body, want) in cases {
        let exe = driver_in(
            work.path(),
            name,
            &format!("#!/bin/sh\necho $$ > \"$2\"\n{body}"),
        );
        let pidfile = work.path().join(format!("{name}.pid"));
        let err = runner::call(&config, &exe, &mount_call(&pidfile)).unwrap_err();
        let message = err.to_string();
        let protocol = match &err {
            CallError::Protocol { source, .. } => Some(source),
            _ => None,
        };
        let (is_wanted, says) = match want {
            Want::Timeout => (matches!(err, CallError::Timeout { .. }), "timed out"),
            Want::NoReply(exit) => (
                matches!(protocol, Some(ProtocolError::NoReply { .. })),
                exit,
            ),
            Want::SuccessWithBadExit(exit) => (
                matches!(protocol, Some(ProtocolError::SuccessWithBadExit { .. })),
                exit,
            ),
        };
        assert!(is_wanted && message.contains(says), "{name}: {message}");
        assert!(
            message.len() <= MAX_ERROR_LEN,
            "{name}: {} bytes",
            message.len()
        );
        let pgid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let left = wait_group_empty(pgid);
        assert!(left.is_empty(), "{name}: processes left behind: {left:?}");
        let unreaped = our_children("mis-");
        assert!(unreaped.is_empty(), "{name}: children left: {unreaped:?}");
    }
}

/// Why the process-cap tests cannot run here, if they cannot.
fn process_cap_unavailable() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("needs root to create cgroups".into());
    }
    runner::process_cap()
        .err()
        .map(|why| format!("no process cap on this machine: {why}"))
}

/// The call-out cgroup `pid` is in, read from /proc: the line of the hierarchy that holds
/// flexd's call-out cgroups.
fn call_cgroup_of(pid: i32) -> Option<PathBuf> {
    let base = runner::process_cap().ok()?;
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    cgroups.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        let (_, call) = path.split_once(&format!("/{}/", runner::CALLOUTS_DIR))?;
        Some(base.join(call))
    })
}

/// A driver that forks without end runs as root, where RLIMIT_NPROC does not hold; flexd's
/// per-call-out cgroup holds it to `max_processes`, and the timeout kills all of it.
#[test]
fn a_fork_bomb_is_held_to_the_process_cap_and_killed_at_the_timeout() {
    if let Some(why) = process_cap_unavailable() {
        test_support::skip!(why);
    }
    const CAP: u32 = 64;
    let work = tempfile::tempdir().unwrap();
    let exe = driver_in(
        work.path(),
        "forkbomb",
        // Each bomb process forks twice and becomes a sleeper, so the count stays at the cap
        // (a shell whose fork fails exits, freeing a slot for another fork). The driver itself
        // forks only once, into an empty cgroup, and then waits: under load its children can
        // fill the cgroup before a second fork of its own, and dash exits 2 when fork fails,
        // which would end the call-out before its timeout.
        "#!/bin/sh\necho $$ > \"$2\"\nb() { b & b & exec sleep 1000; }\nb 2>/dev/null &\nexec sleep 1000\n",
    );
    let pidfile = work.path().join("bomb.pid");
    let call = mount_call(&pidfile);
    let config = RunnerConfig {
        kill_grace: Duration::from_millis(300),
        max_processes: std::num::NonZeroU32::new(CAP),
        ..RunnerConfig::default()
    }
    .with_timeout_for_all(Duration::from_secs(3));

    // Watch the bomb grow, and learn its cgroup, while the runner waits for it.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (done, pidfile) = (done.clone(), pidfile.clone());
        std::thread::spawn(move || {
            let (mut most, mut refused, mut cgroup, mut driver) = (0, 0, None::<PathBuf>, None);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                match &cgroup {
                    Some(dir) => {
                        // The driver's processes in its cgroup (on cgroup v1 a flexd thread
                        // lives there too, to spawn into it), and the kernel's count of forks
                        // it refused at the cap (pids.events "max").
                        let read = |f: &str| std::fs::read_to_string(dir.join(f));
                        let me = std::process::id().to_string();
                        let procs = read("cgroup.procs").unwrap_or_default();
                        let drivers = procs.lines().filter(|p| p.trim() != me).count();
                        most = most.max(drivers);
                        let events = read("pids.events").unwrap_or_default();
                        let max_events = events.lines().find_map(|l| l.strip_prefix("max "));
                        let count = max_events.and_then(|n| n.trim().parse::<u64>().ok());
                        refused = refused.max(count.unwrap_or(0));
                    }
                    None => {
                        driver = std::fs::read_to_string(&pidfile)
                            .ok()
                            .and_then(|s| s.trim().parse::<i32>().ok());
                        cgroup = driver.and_then(call_cgroup_of);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (most, refused, cgroup, driver)
        })
    };
    let err = runner::call(&config, &exe, &call).unwrap_err();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (most, refused, cgroup, driver) = sampler.join().unwrap();
    assert!(matches!(err, CallError::Timeout { .. }), "{err}");
    eprintln!("fork bomb: at most {most} processes under a cap of {CAP}, {refused} forks refused");
    assert!(most >= 16, "the bomb never grew: at most {most} processes");
    assert!(
        most <= CAP as usize,
        "the cap did not hold: {most} processes"
    );
    assert!(
        refused > 0,
        "the cap never refused a fork: it was not what held the bomb"
    );

    // flexd empties the cgroup before the call returns (it keeps it for the next call-out).
    let cgroup = cgroup.expect("the driver ran in a call-out cgroup");
    let left = std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap_or_default();
    assert!(
        left.trim().is_empty(),
        "processes left in {}: {left}",
        cgroup.display()
    );
    let driver = driver.expect("the driver wrote its pid");
    assert!(
        wait_gone(driver, Duration::from_secs(10)),
        "driver {driver} survived"
    );
}

/// The driver script of the escape tests: a helper leaves the process group (`setsid`),
/// ignores SIGTERM, and the driver hangs once the helper has said its pid (so the timeout
/// never comes before the helper exists, however slow the machine).
const ESCAPING_DRIVER: &str = "#!/bin/sh\n\
    setsid sh -c 'trap \"\" TERM; echo $$ > \"$0\"; while :; do sleep 1; done' \"$2.escaped\" &\n\
    until [ -s \"$2.escaped\" ]; do sleep 0.05; done\n\
    sleep 1000\n";

fn run_escaping_driver(max_processes: Option<std::num::NonZeroU32>) -> (CallError, i32) {
    let work = tempfile::tempdir().unwrap();
    let exe = driver_in(work.path(), "escaper", ESCAPING_DRIVER);
    let call = mount_call(&work.path().join("helper"));
    let config = RunnerConfig {
        kill_grace: Duration::from_millis(300),
        max_processes,
        ..RunnerConfig::default()
    }
    // Generous: in a VM without KVM, with the other tests of this file running, the driver
    // and its helper took more than 1.5 s to start (three execs and a fork).
    .with_timeout_for_all(Duration::from_secs(5));
    let err = runner::call(&config, &exe, &call).unwrap_err();
    (err, read_pid(&work.path().join("helper.escaped")))
}

/// A process-group kill cannot reach a helper that called `setsid`; the call-out's cgroup can.
/// The same driver without the cap shows the helper would otherwise survive.
#[test]
fn a_helper_that_leaves_the_process_group_is_killed_at_the_timeout_too() {
    if let Some(why) = process_cap_unavailable() {
        test_support::skip!(why);
    }
    let (err, helper) = run_escaping_driver(Some(runner::DEFAULT_MAX_PROCESSES));
    assert!(matches!(err, CallError::Timeout { .. }), "{err}");
    assert!(
        wait_gone(helper, Duration::from_secs(10)),
        "the escaped helper {helper} survived the timeout"
    );

    let (err, helper) = run_escaping_driver(None);
    assert!(matches!(err, CallError::Timeout { .. }), "{err}");
    let survived = !wait_gone(helper, Duration::from_millis(500));
    kill(helper);
    assert!(
        survived,
        "without the cgroup the escaped helper was killed anyway: the test proves nothing"
    );
}

/// FUSE drivers leave a daemon running after a successful mount: it must keep running (still
/// capped), be reported as lingering while it runs, and stop being reported once it ends.
#[test]
fn a_daemon_left_by_a_successful_call_out_keeps_running_and_is_reported_until_it_ends() {
    if let Some(why) = process_cap_unavailable() {
        test_support::skip!(why);
    }
    let work = tempfile::tempdir().unwrap();
    let exe = driver_in(
        work.path(),
        "daemonizer",
        "#!/bin/sh\n\
         setsid sh -c 'echo $$ > \"$0\"; exec sleep 1000' \"$2.daemon\" >/dev/null 2>&1 &\n\
         echo '{\"status\":\"Success\"}'\n",
    );
    let call = mount_call(&work.path().join("fuse"));
    let config = RunnerConfig {
        max_processes: std::num::NonZeroU32::new(100),
        ..RunnerConfig::default()
    };
    runner::call(&config, &exe, &call).unwrap();
    let daemon = read_pid(&work.path().join("fuse.daemon"));
    let cgroup = call_cgroup_of(daemon).expect("the daemon is in its call-out's cgroup");
    let kill_daemon = || kill(daemon);
    let still_running = !wait_gone(daemon, Duration::from_millis(300));
    let cap = std::fs::read_to_string(cgroup.join("pids.max")).unwrap_or_default();
    // 101 on cgroup v1, where flexd's spawner thread is one of the cgroup's tasks.
    if !still_running || !["100", "101"].contains(&cap.trim()) {
        kill_daemon();
        panic!("daemon running: {still_running}, pids.max of its cgroup: {cap:?}");
    }
    // Asked while the daemon runs: once it is killed, how soon its cgroup empties depends on
    // how soon pid 1 reaps it (at once in a VM, later on some hosts).
    if !runner::lingering().contains(&cgroup) {
        kill_daemon();
        panic!("a cgroup with a running helper is reported as lingering");
    }

    kill_daemon();
    assert!(wait_gone(daemon, Duration::from_secs(10)));
    // Later call-outs notice that the daemon ended (at most once a second).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while runner::lingering().contains(&cgroup) && std::time::Instant::now() < deadline {
        let quick = driver_in(
            work.path(),
            "quick",
            "#!/bin/sh\necho '{\"status\":\"Success\"}'\n",
        );
        runner::call(&config, &quick, &call).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !runner::lingering().contains(&cgroup),
        "{} is still reported after its daemon ended",
        cgroup.display()
    );
}

#[test]
fn a_driver_that_closes_stdout_early_is_still_heard_on_stderr() {
    let work = tempfile::tempdir().unwrap();
    let exe = driver_in(
        work.path(),
        "closer",
        "#!/bin/sh\nexec 1>&-\nsleep 0.2\necho '{\"status\":\"Success\",\"message\":\"late, on stderr\"}' >&2\n",
    );
    let reply = runner::call(&RunnerConfig::default(), &exe, &CallOut::init()).unwrap();
    assert_eq!(reply.message, "late, on stderr");
}

/// Sets the permission bits of `path` exactly (the umask plays no part).
fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A plugin dir with `good~x`, a driver with nothing wrong with it, and the hidden marker
/// the untrusted drivers a test puts there touch if they are run.
fn plugin_with_a_good_driver() -> (tempfile::TempDir, PathBuf) {
    let plugin = tempfile::tempdir().unwrap();
    let marker = plugin.path().join(".ran");
    std::fs::create_dir(plugin.path().join("good~x")).unwrap();
    tripwire(&plugin.path().join("good~x/x"), &trusted_ran(plugin.path()));
    (plugin, marker)
}

/// The marker that trusted drivers touch: they are run, and must not set off the tripwire.
fn trusted_ran(plugin: &Path) -> PathBuf {
    plugin.join(".trusted-ran")
}

/// A driver dir `dir_name` in `plugin` whose executable `x` is a tripwire; its path.
fn tripwire_driver(plugin: &Path, dir_name: &str, marker: &Path) -> PathBuf {
    let dir = plugin.join(dir_name);
    std::fs::create_dir(&dir).unwrap();
    let exe = dir.join("x");
    tripwire(&exe, marker);
    exe
}

/// Asserts that every entry but the listed good ones was refused as untrusted, with a reason
/// that names `why`, and that probing the plugin dir runs none of the untrusted ones.
fn assert_only_trusted_run(
    plugin: &Path,
    policy: LayoutPolicy,
    good: &[&str],
    refused: &[(&str, &str)],
) {
    let entries = layout::scan(plugin, policy).unwrap();
    assert_eq!(entries.len(), good.len() + refused.len());
    for e in &entries {
        match refused.iter().find(|(name, _)| *name == e.dir_name) {
            Some((name, why)) => {
                let err = e.outcome.clone().expect_err(name);
                assert!(
                    matches!(err, LayoutError::Untrusted { .. }),
                    "{name}: {err:?}"
                );
                let message = err.to_string();
                assert!(
                    message.contains(why) && message.contains("chown root and chmod go-w"),
                    "{name}: {message}"
                );
                assert!(message.len() <= MAX_ERROR_LEN);
            }
            None => assert!(
                good.contains(&e.dir_name.as_str()) && e.outcome.is_ok(),
                "{}: {:?}",
                e.dir_name,
                e.outcome
            ),
        }
    }
    let probed = prober::probe_all(plugin, policy, &RunnerConfig::default(), 8).unwrap();
    let ready: Vec<&str> = probed
        .iter()
        .filter(|p| p.result.is_ok())
        .map(|p| p.dir.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(ready, good, "only the trusted drivers were run");
}

/// A driver, or a directory on the way to it, that someone other than root (or flexd's own
/// user) may write is never run: whoever can write it could run code as root.
#[test]
fn drivers_anyone_may_write_are_refused_and_never_executed() {
    let (plugin, marker) = plugin_with_a_good_driver();
    let p = plugin.path();
    let outside = tempfile::tempdir().unwrap();
    let o = outside.path();

    chmod(&tripwire_driver(p, "world~x", &marker), 0o777);
    chmod(&tripwire_driver(p, "group~x", &marker), 0o775);
    chmod(&tripwire_driver(p, "others~x", &marker), 0o757);
    tripwire_driver(p, "opendir~x", &marker);
    chmod(&p.join("opendir~x"), 0o777);
    tripwire_driver(p, "groupdir~x", &marker);
    chmod(&p.join("groupdir~x"), 0o775);
    // With --allow-symlinks, where a symlink leads is held to the same rule: a target in a
    // directory anyone may write is refused...
    std::fs::create_dir(o.join("open")).unwrap();
    tripwire(&o.join("open/x"), &marker);
    chmod(&o.join("open"), 0o777);
    std::fs::create_dir(p.join("openlink~x")).unwrap();
    std::os::unix::fs::symlink(o.join("open/x"), p.join("openlink~x/x")).unwrap();
    // ...and so is a driver dir that is a symlink to one.
    std::os::unix::fs::symlink(o.join("open"), p.join("opendirlink~x")).unwrap();
    // A directory with the sticky bit (as /tmp) may be writable by all: nobody can rename or
    // remove an entry in it they do not own.
    std::fs::create_dir(o.join("sticky")).unwrap();
    let trusted = trusted_ran(p);
    tripwire_driver(&o.join("sticky"), "d", &trusted);
    chmod(&o.join("sticky"), 0o1777);
    std::os::unix::fs::symlink(o.join("sticky/d"), p.join("sticky~x")).unwrap();
    // Setgid, or no write bit for anyone, is fine.
    chmod(&tripwire_driver(p, "setgid~x", &trusted), 0o2755);
    chmod(&tripwire_driver(p, "readonly~x", &trusted), 0o555);

    let allow = LayoutPolicy {
        allow_symlinks: true,
    };
    assert_only_trusted_run(
        p,
        allow,
        &["good~x", "readonly~x", "setgid~x", "sticky~x"],
        &[
            ("world~x", "writable by group and others (mode 777)"),
            ("group~x", "writable by group (mode 775)"),
            ("others~x", "writable by others (mode 757)"),
            (
                "opendir~x",
                "opendir~x: writable by group and others (mode 777)",
            ),
            ("groupdir~x", "groupdir~x: writable by group (mode 775)"),
            (
                "openlink~x",
                "open: writable by group and others (mode 777)",
            ),
            (
                "opendirlink~x",
                "open: writable by group and others (mode 777)",
            ),
        ],
    );
    assert!(!marker.exists(), "an untrusted driver was executed");

    // Without --allow-symlinks, a symlink leading out keeps its own error.
    let entries = layout::scan(p, LayoutPolicy::default()).unwrap();
    let openlink = entries.iter().find(|e| e.dir_name == "openlink~x").unwrap();
    assert!(
        matches!(openlink.outcome, Err(LayoutError::Escapes { .. })),
        "{:?}",
        openlink.outcome
    );
}

/// A plugin dir anyone may write (or one below such a directory) makes every driver in it
/// untrusted: whoever can write it can swap any driver dir.
#[test]
fn every_driver_in_a_plugin_dir_anyone_may_write_is_refused() {
    let (plugin, marker) = plugin_with_a_good_driver();
    tripwire_driver(plugin.path(), "acme~x", &marker);
    let plugin_dir = plugin.path().canonicalize().unwrap();
    chmod(&plugin_dir, 0o777);
    let why = format!("{}: writable by group and others", plugin_dir.display());
    assert_only_trusted_run(
        &plugin_dir,
        LayoutPolicy::default(),
        &[],
        &[("acme~x", why.as_str()), ("good~x", why.as_str())],
    );

    // One level down: the plugin dir is fine, its parent is not.
    let parent = tempfile::tempdir().unwrap();
    let parent_dir = parent.path().canonicalize().unwrap();
    let inner = parent_dir.join("exec");
    std::fs::create_dir(&inner).unwrap();
    tripwire_driver(&inner, "good~x", &marker);
    chmod(&parent_dir, 0o775);
    let why = format!("{}: writable by group (mode 775)", parent_dir.display());
    assert_only_trusted_run(
        &inner,
        LayoutPolicy::default(),
        &[],
        &[("good~x", why.as_str())],
    );
    assert!(!marker.exists(), "an untrusted driver was executed");
    // locate (`flexd call`, `flexd check`) refuses it too.
    let name = flexvolume_host::DriverName::from_dir_name("good~x").unwrap();
    let err = layout::locate(&inner, &name, LayoutPolicy::default()).unwrap_err();
    assert!(matches!(err, LayoutError::Untrusted { .. }), "{err:?}");
}

/// Drivers, and directories on the way to them, owned by someone else than root are refused,
/// however their modes look.
#[test]
fn drivers_owned_by_another_user_are_refused_and_never_executed() {
    test_support::require_root!("needs root to chown files to another user");
    const STRANGER: u32 = 12345;
    let chown = |path: &Path| std::os::unix::fs::chown(path, Some(STRANGER), None).unwrap();
    let (plugin, marker) = plugin_with_a_good_driver();
    let p = plugin.path();
    let outside = tempfile::tempdir().unwrap();
    let o = outside.path();

    chown(&tripwire_driver(p, "theirs~x", &marker));
    tripwire_driver(p, "theirdir~x", &marker);
    chown(&p.join("theirdir~x"));
    // The sticky bit does not help a directory owned by someone else: they can do anything in it.
    std::fs::create_dir(o.join("sticky")).unwrap();
    tripwire_driver(&o.join("sticky"), "d", &marker);
    chmod(&o.join("sticky"), 0o1777);
    chown(&o.join("sticky"));
    std::os::unix::fs::symlink(o.join("sticky/d"), p.join("sticky~x")).unwrap();

    let by_stranger = format!("owned by uid {STRANGER}, not root");
    assert_only_trusted_run(
        p,
        LayoutPolicy {
            allow_symlinks: true,
        },
        &["good~x"],
        &[
            ("theirs~x", format!("theirs~x/x: {by_stranger}").as_str()),
            ("theirdir~x", &format!("theirdir~x: {by_stranger}")),
            ("sticky~x", &format!("sticky: {by_stranger}")),
        ],
    );
    assert!(!marker.exists(), "an untrusted driver was executed");
}
