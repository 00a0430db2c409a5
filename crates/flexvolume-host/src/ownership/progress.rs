//! Progress logs for a long ownership pass: an operator watching a pod stuck in
//! ContainerCreating must see that the pass moves, without a log line per second.

use std::path::Path;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::Counters;

/// Runs `work`, logging the entry count first after `first` and then every `every` until it
/// returns.
pub(crate) fn while_running<T>(
    root: &Path,
    counters: &Counters,
    first: Duration,
    every: Duration,
    work: impl FnOnce() -> T,
) -> T {
    let log = |counters: &Counters, elapsed: Duration| {
        tracing::info!(
            root = %root.display(),
            entries = counters.entries(),
            changed = counters.changed(),
            seconds = elapsed.as_secs(),
            "ownership pass in progress"
        )
    };
    reporting(counters, first, every, &log, work)
}

/// Runs `work`, calling `report` first after `first` and then every `every` until it returns.
fn reporting<T>(
    counters: &Counters,
    first: Duration,
    every: Duration,
    report: &(dyn Fn(&Counters, Duration) + Sync),
    work: impl FnOnce() -> T,
) -> T {
    let done = (Mutex::new(false), Condvar::new());
    std::thread::scope(|scope| {
        scope.spawn(|| report_until_done(counters, first, every, report, &done));
        let result = work();
        let (flag, signal) = &done;
        if let Ok(mut finished) = flag.lock() {
            *finished = true;
        }
        signal.notify_all();
        result
    })
}

fn report_until_done(
    counters: &Counters,
    first: Duration,
    every: Duration,
    report: &(dyn Fn(&Counters, Duration) + Sync),
    done: &(Mutex<bool>, Condvar),
) {
    let started = Instant::now();
    let (flag, signal) = done;
    let mut next = first;
    let Ok(mut finished) = flag.lock() else {
        return;
    };
    loop {
        let deadline = started + next;
        while !*finished {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            finished = match signal.wait_timeout(finished, left) {
                Ok((guard, _)) => guard,
                Err(_) => return,
            };
        }
        if *finished {
            return;
        }
        report(counters, started.elapsed());
        next += every;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_work_result_and_stops_the_reporter() {
        let counters = Counters::default();
        let result = while_running(
            Path::new("/v"),
            &counters,
            Duration::from_secs(3600),
            Duration::from_secs(3600),
            || 42,
        );
        // Returning at all proves the reporter thread was woken and joined.
        assert_eq!(result, 42);
    }

    #[test]
    fn reports_come_after_the_first_delay_then_at_every_interval() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let counters = Counters::default();
        let reports = AtomicU32::new(0);
        let times = Mutex::new(Vec::new());
        let report = |_: &Counters, elapsed: Duration| {
            times.lock().unwrap().push(elapsed);
            reports.fetch_add(1, Ordering::SeqCst);
        };
        let first = Duration::from_millis(50);
        let every = Duration::from_millis(100);
        reporting(&counters, first, every, &report, || {
            let deadline = Instant::now() + Duration::from_secs(20);
            while reports.load(Ordering::SeqCst) < 3 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let times = times.into_inner().unwrap();
        assert!(times.len() >= 3, "{times:?}");
        // Never early: the n-th report comes no sooner than first + (n-1) * every.
        for (n, t) in times.iter().enumerate() {
            assert!(*t >= first + every * n as u32, "report {n} at {t:?}");
        }
    }
}
