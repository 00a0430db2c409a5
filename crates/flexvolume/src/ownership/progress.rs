//! Progress logs for a long ownership pass: an operator watching a pod stuck in
//! ContainerCreating must see that the pass moves, without a log line per second.

use std::path::Path;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::Counters;

/// Runs `work`, logging the entry count first after `first` and then every `every` until it
/// returns.
pub fn while_running<T>(
    root: &Path,
    counters: &Counters,
    first: Duration,
    every: Duration,
    work: impl FnOnce() -> T,
) -> T {
    let done = (Mutex::new(false), Condvar::new());
    std::thread::scope(|scope| {
        scope.spawn(|| report_until_done(root, counters, first, every, &done));
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
    root: &Path,
    counters: &Counters,
    first: Duration,
    every: Duration,
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
        tracing::info!(
            root = %root.display(),
            entries = counters.entries(),
            changed = counters.changed(),
            seconds = started.elapsed().as_secs(),
            "ownership pass in progress"
        );
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
}
