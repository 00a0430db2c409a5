//! Rate limit without loss (docs/discovery.md#rate-limit), as pure logic with the clock passed in.
//!
//! Per key (a driver directory), changes are processed at most once per interval. The first
//! change after a quiet interval is processed at once (leading edge); changes inside the
//! interval are folded into one processing when it ends (trailing edge). Nothing is dropped: a
//! change always leads to a processing that starts after it. Kubernetes' v1.8 implementation
//! simply ignored changes inside the interval, which lost the last version of a driver written
//! twice in quick succession.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
struct Slot {
    last_processed: Instant,
    pending: bool,
}

/// One slot per key seen in the last interval; quiet keys are forgotten, so memory is bounded
/// by the number of directories that changed recently, not by the number of events.
#[derive(Debug)]
pub(crate) struct Coalescer<K> {
    interval: Duration,
    slots: HashMap<K, Slot>,
}

impl<K: Hash + Eq + Clone> Coalescer<K> {
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            slots: HashMap::new(),
        }
    }

    /// Records a change of `key` at `now`. True: process it now (and it counts as processed
    /// now). False: it is scheduled for the end of the current interval.
    pub fn change(&mut self, key: &K, now: Instant) -> bool {
        match self.slots.get_mut(key) {
            Some(slot) if now.saturating_duration_since(slot.last_processed) < self.interval => {
                slot.pending = true;
                false
            }
            Some(slot) if slot.pending => {
                // Its trailing edge is due: take it now.
                slot.pending = false;
                slot.last_processed = now;
                true
            }
            _ => {
                self.slots.insert(
                    key.clone(),
                    Slot {
                        last_processed: now,
                        pending: false,
                    },
                );
                true
            }
        }
    }

    /// Keys whose trailing edge is due at `now`, each now counted as processed. Also forgets
    /// keys that have been quiet for a whole interval.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<K> {
        let interval = self.interval;
        let mut due = Vec::new();
        self.slots.retain(|key, slot| {
            let quiet_for = now.saturating_duration_since(slot.last_processed);
            if slot.pending && quiet_for >= interval {
                slot.pending = false;
                slot.last_processed = now;
                due.push(key.clone());
                true
            } else {
                slot.pending || quiet_for < interval
            }
        });
        due
    }

    /// When the next trailing edge is due; `None` when nothing is pending (then the caller may
    /// sleep until the next filesystem event).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.slots
            .values()
            .filter(|s| s.pending)
            .map(|s| s.last_processed + self.interval)
            .min()
    }

    /// How many keys are remembered (for tests of the memory bound).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    /// A coalescer an interval wide that has just processed a first change of `key`, at once
    /// (nothing was pending: a leading edge).
    fn after_a_first_change(key: &'static str) -> (Instant, Coalescer<&'static str>) {
        let t0 = Instant::now();
        let mut c = Coalescer::new(SECOND);
        assert!(c.change(&key, t0));
        (t0, c)
    }

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn first_change_after_quiet_is_processed_at_once() {
        let (t0, mut c) = after_a_first_change("a");
        assert_eq!(
            c.next_deadline(),
            None,
            "nothing pending: sleep until the next event"
        );
        assert!(
            c.change(&"a", at(t0, 1000)),
            "a whole interval later: leading edge again"
        );
    }

    #[test]
    fn changes_inside_the_interval_fold_into_one_trailing_processing() {
        let (t0, mut c) = after_a_first_change("a");
        for ms in [1, 10, 100, 500, 999] {
            assert!(!c.change(&"a", at(t0, ms)));
        }
        assert_eq!(c.next_deadline(), Some(at(t0, 1000)));
        assert!(c.due(at(t0, 999)).is_empty());
        assert_eq!(c.due(at(t0, 1000)), vec!["a"]);
        assert!(c.due(at(t0, 1500)).is_empty(), "processed once, not again");
        assert_eq!(c.next_deadline(), None);
    }

    #[test]
    fn a_change_right_after_a_trailing_edge_is_not_lost() {
        let (t0, mut c) = after_a_first_change("a");
        assert!(!c.change(&"a", at(t0, 200)));
        assert_eq!(c.due(at(t0, 1000)), vec!["a"]);
        // Right after the trailing processing started: scheduled for the next interval end.
        assert!(!c.change(&"a", at(t0, 1001)));
        assert_eq!(c.next_deadline(), Some(at(t0, 2000)));
        assert_eq!(c.due(at(t0, 2000)), vec!["a"]);
    }

    #[test]
    fn a_late_caller_takes_a_due_trailing_edge_as_a_leading_one() {
        let (t0, mut c) = after_a_first_change("a");
        assert!(!c.change(&"a", at(t0, 500)));
        // Nobody called due() in time; the next change processes at once and clears it.
        assert!(c.change(&"a", at(t0, 1200)));
        assert_eq!(c.next_deadline(), None);
    }

    #[test]
    fn keys_are_independent() {
        let (t0, mut c) = after_a_first_change("storm");
        for ms in 1..900 {
            assert!(!c.change(&"storm", at(t0, ms)));
        }
        assert!(
            c.change(&"quiet", at(t0, 900)),
            "another driver is not delayed by a storm"
        );
    }

    #[test]
    fn a_storm_is_processed_at_most_once_per_interval() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(SECOND);
        let mut processed = 0;
        // 10 s of a change every millisecond, with due() polled every 10 ms.
        for ms in 0..10_000u64 {
            if c.change(&"a", at(t0, ms)) {
                processed += 1;
            }
            if ms % 10 == 0 {
                processed += c.due(at(t0, ms)).len();
            }
        }
        processed += c.due(at(t0, 11_000)).len();
        assert!((10..=11).contains(&processed), "{processed}");
    }

    #[test]
    fn memory_is_bounded_by_recently_changed_keys() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(SECOND);
        for i in 0..1000 {
            c.change(&i, t0);
        }
        assert_eq!(c.len(), 1000);
        assert!(c.due(at(t0, 1000)).is_empty());
        assert!(c.is_empty(), "quiet keys are forgotten");
    }
}
