//! The supervision loop's paths a whole call cannot choose: no pidfd (kernels < 5.3), no
//! eventfd for a cancellation (out of descriptors).

use super::*;
use std::ffi::OsStr;
use std::thread;

use super::super::spawn::{environment, Placement};

/// Patience for anything that should happen at once, on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// `sh` that says it started (a line on stdout) and then sleeps for a minute, in its own group.
fn sleeper() -> (Process, Capture, Capture) {
    let argv: Vec<&OsStr> = ["-c", "echo started; exec sleep 60"]
        .into_iter()
        .map(OsStr::new)
        .collect();
    let request = Request::new(Path::new("/bin/sh"), &argv, environment(), Vec::new(), None)
        .expect("request");
    let mut child = request.spawn(Placement::Inherited).expect("spawn");
    let out = Capture::new(child.stdout.take(), 1024).expect("stdout");
    let err = Capture::new(child.stderr.take(), 1024).expect("stderr");
    (child, out, err)
}

/// Waits (pumping the pipes) until the sleeper said it started; no pidfd.
fn started(child: &mut Process, out: &mut Capture, err: &mut Capture) {
    let deadline = Instant::now() + PATIENCE;
    while !out.buf.starts_with(b"started") {
        let waited = wait_until(
            child,
            None,
            None,
            out,
            err,
            (Instant::now() + Duration::from_millis(50)).min(deadline),
        )
        .expect("wait");
        assert!(matches!(waited, Waited::Deadline), "the sleeper exited");
        assert!(Instant::now() < deadline, "the sleeper never started");
    }
}

/// Cancels from another thread while `wait_until` (without a pidfd) waits; the cancel must end
/// the wait, and the sleeper is then killed without a pidfd either.
fn cancelled_without_pidfd(eventfd: bool) {
    let (mut child, mut out, mut err) = sleeper();
    started(&mut child, &mut out, &mut err);
    let cancel = Cancel::new();
    let watch = Watch {
        cancel: &cancel,
        wake: if eventfd { cancel.waker() } else { None },
    };
    assert_eq!(watch.wake.is_some(), eventfd);
    let canceller = {
        let cancel = cancel.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(200));
            cancel.cancel("fence lost");
        })
    };
    let waited = wait_until(
        &mut child,
        None,
        Some(&watch),
        &mut out,
        &mut err,
        Instant::now() + PATIENCE,
    )
    .expect("wait");
    canceller.join().expect("canceller");
    assert!(
        matches!(&waited, Waited::Cancelled(why) if why == "fence lost"),
        "the cancel did not end the wait"
    );
    kill_group(
        &mut child,
        None,
        None,
        &mut out,
        &mut err,
        Duration::from_millis(200),
    );
    let status = child.try_wait().expect("reaped");
    assert!(
        status.is_some_and(|s| s.signal() == Some(libc::SIGTERM)),
        "{status:?}"
    );
}

#[test]
fn a_cancel_ends_the_wait_without_a_pidfd() {
    cancelled_without_pidfd(true);
}

#[test]
fn a_cancel_ends_the_wait_without_a_pidfd_or_an_eventfd() {
    cancelled_without_pidfd(false);
}

#[test]
fn a_watched_cancellation_never_fired_lets_the_driver_exit() {
    let argv: Vec<&OsStr> = ["-c", "exit 3"].into_iter().map(OsStr::new).collect();
    let request = Request::new(Path::new("/bin/sh"), &argv, environment(), Vec::new(), None)
        .expect("request");
    let mut child = request.spawn(Placement::Inherited).expect("spawn");
    let mut out = Capture::new(child.stdout.take(), 1024).expect("stdout");
    let mut err = Capture::new(child.stderr.take(), 1024).expect("stderr");
    let cancel = Cancel::new();
    let watch = Watch::new(&cancel);
    let waited = wait_until(
        &mut child,
        None,
        Some(&watch),
        &mut out,
        &mut err,
        Instant::now() + PATIENCE,
    )
    .expect("wait");
    assert!(matches!(waited, Waited::Exited));
    assert_eq!(child.wait().expect("reaped").code(), Some(3));
}
