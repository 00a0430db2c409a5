//! The Prometheus metrics of `flexd serve` (served by [`super::http_listener`]).
//!
//! - `flexd_callout_duration_seconds{driver,callout,result}`: every executed call-out;
//! - `flexd_probe_events_total{event}`: add / update / remove / failed;
//! - `flexd_drivers{status}`: drivers served, ready or failed;
//! - `flexd_state_unusable_records{reason}`: entries of `<state-dir>/volumes/` named like a
//!   record that are skipped: `not-a-record` (a FIFO, link, directory, device, oversized
//!   file), `corrupt`, `unreadable` (an I/O error).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use flexvolume_host::runner::{CallObserver, CallOutcome};
use flexvolume_host::DriverName;
use flexvolume_protocol::CallOutKind;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    driver: String,
    callout: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    event: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

type HistogramFamily = Family<CallLabels, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Mutex<Registry>,
    calls: HistogramFamily,
    probe_events: Family<EventLabels, Counter>,
    drivers: Family<StatusLabels, Gauge>,
    lingering: Gauge,
    unusable_records: Family<ReasonLabels, Gauge>,
    /// A count of unusable records is under way (see [`Metrics::count_unusable_records`]).
    counting_records: std::sync::atomic::AtomicBool,
}

fn call_histogram() -> Histogram {
    // 5 ms … ~160 s: from a compiled driver's init to a slow attach.
    Histogram::new(exponential_buckets(0.005, 2.0, 16))
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("flexd");
        let calls: HistogramFamily = Family::new_with_constructor(call_histogram);
        let probe_events = Family::<EventLabels, Counter>::default();
        let drivers = Family::<StatusLabels, Gauge>::default();
        registry.register(
            "callout_duration_seconds",
            "Duration of driver call-outs",
            calls.clone(),
        );
        registry.register(
            "probe_events",
            "Processed driver changes",
            probe_events.clone(),
        );
        registry.register("drivers", "Drivers served, by status", drivers.clone());
        let lingering = Gauge::default();
        registry.register(
            "lingering_callout_cgroups",
            "Call-out cgroups where driver helpers still run after their call-out ended (FUSE daemons, or helpers that survived a kill)",
            lingering.clone(),
        );
        let unusable_records = Family::<ReasonLabels, Gauge>::default();
        registry.register(
            "state_unusable_records",
            "Entries of the state dir's volumes/ named like a record that are skipped, by reason: not-a-record (a FIFO, link, directory, device or oversized file), corrupt, unreadable",
            unusable_records.clone(),
        );
        Arc::new(Self {
            registry: Mutex::new(registry),
            calls,
            probe_events,
            drivers,
            lingering,
            unusable_records,
            counting_records: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn probe_event(&self, event: &str) {
        self.probe_events
            .get_or_create(&EventLabels {
                event: event.to_owned(),
            })
            .inc();
    }

    pub fn set_drivers(&self, ready: usize, failed: usize) {
        for (status, count) in [("ready", ready), ("failed", failed)] {
            self.drivers
                .get_or_create(&StatusLabels {
                    status: status.to_owned(),
                })
                .set(count as i64);
        }
    }

    /// Counts the record entries a listing skips, off the async runtime; a count still under
    /// way (the state dir's disk is slow) is not queued behind.
    pub fn count_unusable_records(self: &Arc<Self>, state: &flexvolume_host::state::StateDir) {
        use std::sync::atomic::Ordering;
        if self.counting_records.swap(true, Ordering::AcqRel) {
            return;
        }
        let (metrics, state) = (self.clone(), state.clone());
        tokio::task::spawn_blocking(move || {
            if let Ok(records) = state.list() {
                let mut counts = [("not-a-record", 0), ("corrupt", 0), ("unreadable", 0)];
                for record in records {
                    let index = match record {
                        // A torn record is no record (a listing never gives one).
                        Ok(_) | Err(flexvolume_host::state::StateError::Torn { .. }) => continue,
                        Err(flexvolume_host::state::StateError::NotARecord { .. }) => 0,
                        Err(flexvolume_host::state::StateError::Corrupt { .. }) => 1,
                        Err(flexvolume_host::state::StateError::Io { .. }) => 2,
                    };
                    counts[index].1 += 1;
                }
                for (reason, count) in counts {
                    metrics
                        .unusable_records
                        .get_or_create(&ReasonLabels {
                            reason: reason.to_owned(),
                        })
                        .set(count);
                }
            }
            metrics.counting_records.store(false, Ordering::Release);
        });
    }

    pub fn render(&self) -> String {
        self.lingering
            .set(flexvolume_host::runner::lingering().len() as i64);
        let mut text = String::new();
        if let Ok(registry) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        }
        text
    }
}

impl CallObserver for Metrics {
    fn call_finished(
        &self,
        driver: &DriverName,
        kind: CallOutKind,
        outcome: CallOutcome,
        elapsed: Duration,
    ) {
        let labels = CallLabels {
            driver: driver.to_string(),
            callout: kind.as_str().to_owned(),
            result: outcome.as_str().to_owned(),
        };
        self.calls
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }
}
