//! The HTTP listener of `/metrics` and `/healthz`, bounded so that whoever reaches its port
//! cannot take descriptors or memory from the CSI sockets.
//!
//! By default it listens on the loopback only (`--metrics-address`): on a `hostNetwork` pod
//! that is the node's loopback, where kubelet's probes (`host: 127.0.0.1`) reach it and the
//! network does not. Where the operator exposes it, these bounds hold:
//! - at most [`MAX_CONNECTIONS`] connections; at the cap, a new connection closes the oldest
//!   one, so a flood of idle connections cannot keep a probe out (an answer takes
//!   microseconds; the connections a flood holds are older);
//! - the request's headers within [`HEADER_TIMEOUT`] of its first byte, in at most 8 KiB;
//! - no connection lives longer than [`CONNECTION_LIFETIME`], a scraper's keep-alive included;
//! - an accept that fails (out of descriptors) is retried after a growing pause, up to one
//!   second, and said at most once per [`LOG_EVERY`] with the count since, instead of spinning
//!   and logging millions of lines.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::health::Health;
use super::metrics::Metrics;

/// Connections open at once, at most. A kubelet probes with one at a time per probe, and a
/// Prometheus scraper keeps one; 64 leaves room for several of each.
pub const MAX_CONNECTIONS: usize = 64;
/// A request's headers must arrive within this of their first byte.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest life of one connection; a scraper reconnects at its next scrape.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// How often a repeated failure or eviction is logged, at most.
pub const LOG_EVERY: Duration = Duration::from_secs(10);
/// The request's buffer: the smallest hyper takes, far above a probe's or a scrape's request.
const MAX_REQUEST_BUFFER: usize = 8192;

/// Binds the metrics address; failing here stops start-up with a clear error.
pub async fn bind(address: std::net::SocketAddr) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for metrics on {address}: {e}"))?;
    tracing::info!(
        address = %listener.local_addr()?,
        max_connections = MAX_CONNECTIONS,
        "metrics and health endpoint"
    );
    Ok(listener)
}

/// The open connections, oldest first, each with the means to close it.
#[derive(Default)]
struct Open {
    next: u64,
    connections: BTreeMap<u64, oneshot::Sender<()>>,
}

impl Open {
    /// Admits a connection, closing the oldest when at the cap; its id and how it is closed.
    fn admit(&mut self) -> (u64, oneshot::Receiver<()>, bool) {
        let evicted = self.connections.len() >= MAX_CONNECTIONS;
        if evicted {
            if let Some((_, close)) = self.connections.pop_first() {
                let _ = close.send(());
            }
        }
        let (close, closed) = oneshot::channel();
        let id = self.next;
        self.next += 1;
        self.connections.insert(id, close);
        (id, closed, evicted)
    }
}

/// Counts repeated events and says so at most once per [`LOG_EVERY`].
struct Throttled {
    last: Option<Instant>,
    since: u64,
}

impl Throttled {
    fn new() -> Self {
        Self {
            last: None,
            since: 0,
        }
    }

    /// The count to log now (this event included), or `None` while it is too soon.
    fn tick(&mut self) -> Option<u64> {
        self.since += 1;
        if self.last.is_some_and(|last| last.elapsed() < LOG_EVERY) {
            return None;
        }
        self.last = Some(Instant::now());
        Some(std::mem::take(&mut self.since))
    }
}

/// Serves `/metrics` and `/healthz` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, health: Arc<Health>) {
    let open = Arc::new(Mutex::new(Open::default()));
    let mut failures = Throttled::new();
    let mut evictions = Throttled::new();
    let mut pause = Duration::from_millis(10);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                pause = Duration::from_millis(10);
                stream
            }
            Err(e) => {
                // Out of descriptors (EMFILE), or memory: retrying at once would spin.
                if let Some(count) = failures.tick() {
                    tracing::warn!(error = %e, failures = count, retry_in_ms = pause.as_millis() as u64, "cannot accept a metrics connection");
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let (id, closed, evicted) = match open.lock() {
            Ok(mut open) => open.admit(),
            Err(_) => return,
        };
        if evicted {
            if let Some(count) = evictions.tick() {
                tracing::warn!(
                    max_connections = MAX_CONNECTIONS,
                    evicted = count,
                    "metrics connection cap reached: the oldest connections were closed"
                );
            }
        }
        let (metrics, health, open) = (metrics.clone(), health.clone(), open.clone());
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let (metrics, health) = (metrics.clone(), health.clone());
                    async move {
                        Ok::<_, std::convert::Infallible>(respond(
                            request.uri().path(),
                            &metrics,
                            &health,
                        ))
                    }
                });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_REQUEST_BUFFER)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                _ = closed => {}
                () = tokio::time::sleep(CONNECTION_LIFETIME) => {}
            }
            if let Ok(mut open) = open.lock() {
                open.connections.remove(&id);
            }
        });
    }
}

/// The answer to one request's path.
fn respond(path: &str, metrics: &Metrics, health: &Health) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(),
        ),
        "/healthz" => {
            let (status, body) = health.report();
            (status, "text/plain", body)
        }
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_answers_with_the_health_report() {
        let (metrics, health) = (Metrics::new(), Health::default());
        assert_eq!(
            respond("/healthz", &metrics, &health).status(),
            StatusCode::OK
        );
        health.set_problems(vec!["the driver watcher stopped".to_owned()]);
        let response = respond("/healthz", &metrics, &health);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn at_the_cap_the_oldest_connection_is_closed() {
        let mut open = Open::default();
        let mut receivers: Vec<_> = (0..MAX_CONNECTIONS)
            .map(|_| {
                let (_, closed, evicted) = open.admit();
                assert!(!evicted);
                closed
            })
            .collect();
        let (id, _, evicted) = open.admit();
        assert!(evicted);
        assert_eq!(id, MAX_CONNECTIONS as u64);
        assert_eq!(open.connections.len(), MAX_CONNECTIONS);
        assert!(
            receivers[0].try_recv().is_ok(),
            "the oldest was told to close"
        );
        assert!(receivers[1].try_recv().is_err(), "the others were not");
    }

    #[test]
    fn a_repeated_failure_is_said_once_then_counted() {
        let mut throttled = Throttled::new();
        assert_eq!(throttled.tick(), Some(1));
        for _ in 0..1000 {
            assert_eq!(throttled.tick(), None);
        }
        throttled.last = Some(Instant::now() - LOG_EVERY);
        assert_eq!(throttled.tick(), Some(1001));
    }
}
