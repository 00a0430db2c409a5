//! `KubernetesStore` through the real kube client over HTTP, against a small in-memory stand-in
//! for the API server that keeps `resourceVersion` as the API server does: a write or a delete
//! from an out-of-date version is refused with 409, a create of a name that exists too, and
//! lists honour `limit` and `continue`. It counts what a correct client never sends: a delete
//! without a precondition, a list without a limit. Two instances over one server are two
//! replicas. The e2e's controller, fence and failover scenarios run the same code against a
//! real API server, where a conflict cannot be made on purpose; here it can.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use flexvolume_host::controller_records::{
    ControllerRecord, ControllerRecords, FenceSettings, RecordStore, RecordsError,
};
use flexvolume_host::lifecycle::ProvisionedVolume;
use flexvolume_host::DriverName;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use super::{KubernetesStore, PAGE_LIMIT};

const NAMESPACE: &str = "flexd-system";
const PREFIX: &str = "/apis/flexd.io/v1alpha1/namespaces/flexd-system/flexdrecords";

/// The objects the stand-in holds, by name, and the last resourceVersion it gave; what it was
/// asked that a correct client never asks.
#[derive(Default)]
struct Store {
    objects: BTreeMap<String, Value>,
    version: u64,
    unconditional_deletes: usize,
    unlimited_lists: usize,
    largest_limit: usize,
}

fn status(code: StatusCode, reason: &str) -> (StatusCode, Value) {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": reason, "reason": reason, "code": code.as_u16(),
    });
    (code, body)
}

fn version_of(object: &Value) -> Option<&str> {
    object["metadata"]["resourceVersion"].as_str()
}

/// The stand-in's answer to one request.
fn answer(
    store: &Mutex<Store>,
    method: &Method,
    path: &str,
    query: &str,
    body: &[u8],
) -> (StatusCode, Value) {
    let mut store = store.lock().unwrap();
    let name = path
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_prefix('/'));
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match (method, name) {
        (&Method::GET, None) => {
            let param = |key: &str| {
                query
                    .split('&')
                    .find_map(|p| p.strip_prefix(&format!("{key}=")))
                    .map(|s| {
                        s.replace("%3D", "=")
                            .replace("%2C", ",")
                            .replace("%2F", "/")
                    })
            };
            let selector = param("labelSelector");
            let limit = param("limit").and_then(|l| l.parse::<usize>().ok());
            match limit {
                Some(limit) => store.largest_limit = store.largest_limit.max(limit),
                None => store.unlimited_lists += 1,
            }
            // The continue token is the last name returned; "expired" is one the API server
            // has forgotten.
            let after = param("continue");
            if after.as_deref() == Some("expired") {
                return status(StatusCode::GONE, "Expired");
            }
            let mut items: Vec<Value> = store
                .objects
                .iter()
                .filter(|(name, _)| after.as_deref().is_none_or(|a| name.as_str() > a))
                .map(|(_, o)| o)
                .filter(|o| {
                    selector.as_deref().is_none_or(|s| {
                        s.split(',').all(|term| {
                            let (key, value) = term.split_once('=').unwrap_or((term, ""));
                            o["metadata"]["labels"][key].as_str() == Some(value)
                        })
                    })
                })
                .cloned()
                .collect();
            let mut next = String::new();
            if let Some(limit) = limit.filter(|l| *l > 0 && items.len() > *l) {
                items.truncate(limit);
                next = items
                    .last()
                    .and_then(|o| o["metadata"]["name"].as_str())
                    .unwrap_or_default()
                    .to_owned();
            }
            let version = store.version.to_string();
            let list = json!({"kind": "FlexdRecordList", "apiVersion": "flexd.io/v1alpha1",
                "metadata": {"resourceVersion": version, "continue": next}, "items": items});
            (StatusCode::OK, list)
        }
        (&Method::GET, Some(name)) => match store.objects.get(name) {
            Some(object) => (StatusCode::OK, object.clone()),
            None => status(StatusCode::NOT_FOUND, "NotFound"),
        },
        (&Method::POST, None) => {
            let name = body["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if store.objects.contains_key(&name) {
                return status(StatusCode::CONFLICT, "AlreadyExists");
            }
            store.version += 1;
            let mut object = body;
            object["metadata"]["resourceVersion"] = json!(store.version.to_string());
            store.objects.insert(name, object.clone());
            (StatusCode::CREATED, object)
        }
        (&Method::PUT, Some(name)) => {
            let Some(current) = store.objects.get(name) else {
                return status(StatusCode::NOT_FOUND, "NotFound");
            };
            if version_of(&body) != version_of(current) {
                return status(StatusCode::CONFLICT, "Conflict");
            }
            store.version += 1;
            let mut object = body;
            object["metadata"]["resourceVersion"] = json!(store.version.to_string());
            store.objects.insert(name.to_owned(), object.clone());
            (StatusCode::OK, object)
        }
        (&Method::DELETE, Some(name)) => {
            let Some(current) = store.objects.get(name) else {
                return status(StatusCode::NOT_FOUND, "NotFound");
            };
            let wanted = body["preconditions"]["resourceVersion"].as_str();
            let stale = wanted.is_some_and(|w| Some(w) != version_of(current));
            if wanted.is_none() {
                store.unconditional_deletes += 1;
            }
            if stale {
                return status(StatusCode::CONFLICT, "Conflict");
            }
            let gone = store.objects.remove(name).unwrap_or(Value::Null);
            (StatusCode::OK, gone)
        }
        _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
    }
}

/// Serves the stand-in on a loopback port; returns its URL and what it holds.
async fn serve() -> (String, Arc<Mutex<Store>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let store = Arc::new(Mutex::new(Store::default()));
    let served = store.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let store = served.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                        let store = store.clone();
                        async move {
                            let (parts, body) = request.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let (code, value) = answer(
                                &store,
                                &parts.method,
                                parts.uri.path(),
                                parts.uri.query().unwrap_or(""),
                                &body,
                            );
                            let mut response =
                                Response::new(Full::new(Bytes::from(value.to_string())));
                            *response.status_mut() = code;
                            response.headers_mut().insert(
                                hyper::header::CONTENT_TYPE,
                                "application/json".parse().unwrap(),
                            );
                            Ok::<_, Infallible>(response)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, store)
}

/// A replica's store: a kube client of the URL.
fn replica(runtime: &tokio::runtime::Runtime, url: &str) -> KubernetesStore {
    let _entered = runtime.enter();
    let config = kube::Config::new(url.parse::<hyper::Uri>().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    KubernetesStore::new(client, NAMESPACE)
}

fn record(volume: &str, pool: &str) -> ControllerRecord {
    let d = DriverName::parse("acme/x").unwrap();
    let mut record = ControllerRecord::new(&d, volume);
    record.provisioned = Some(ProvisionedVolume {
        name: volume.into(),
        driver: "acme/x".into(),
        capacity_bytes: 1 << 20,
        fs_type: "ext4".into(),
        parameters: BTreeMap::new(),
        options: BTreeMap::from([("pool".to_owned(), pool.to_owned())]),
        done: false,
    });
    record
}

/// The write or delete was refused as a conflict.
fn expect_conflict<T: std::fmt::Debug>(result: &Result<T, RecordsError>) {
    assert!(
        matches!(result, Err(RecordsError::Conflict { .. })),
        "{result:?}"
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Issue #48's second finding: a replica's listing refreshed the versions it remembered, so a
/// write or a delete decided on an older read went through, and a delete whose version was
/// unknown went out with no precondition. Versions are now carried from each read to its own
/// write; a listing changes nothing of them.
#[test]
fn a_write_or_delete_decided_on_an_older_read_is_refused_whatever_was_listed() {
    let runtime = runtime();
    let (url, store) = runtime.block_on(serve());
    let (a, b) = (replica(&runtime, &url), replica(&runtime, &url));
    let d = DriverName::parse("acme/x").unwrap();

    let v1 = a.write(&record("pv-1", "first"), None).unwrap();
    let read = b.read(&d, "pv-1").unwrap().expect("B reads A's record");
    assert_eq!(read.version, v1);
    let mut done = read.record.clone();
    done.provisioned.as_mut().unwrap().done = true;
    let v2 = b.write(&done, Some(&read.version)).unwrap();

    // A lists (seeing B's write), then writes and deletes from what it read before: refused.
    let listed = a.page(&d, None, 10).unwrap();
    assert_eq!(listed.records.len(), 1);
    expect_conflict(&a.write(&record("pv-1", "stale"), Some(&v1)));
    expect_conflict(&a.delete(&d, "pv-1", &v1));
    let kept = b.read(&d, "pv-1").unwrap().unwrap();
    assert_eq!(
        (kept.version.clone(), kept.record.clone()),
        (v2.clone(), done)
    );

    // A record absent when listed, created since: a delete needs its version, never goes out
    // without one.
    assert!(a.page(&d, None, 10).unwrap().records.len() == 1);
    b.write(&record("pv-2", "b"), None).unwrap();
    expect_conflict(&a.delete(&d, "pv-2", &v1));
    assert!(a.read(&d, "pv-2").unwrap().is_some());

    // Two replicas creating the same record at once: one create wins, the other conflicts.
    a.write(&record("pv-3", "a"), None).unwrap();
    expect_conflict(&b.write(&record("pv-3", "b"), None));

    a.delete(&d, "pv-1", &v2).unwrap();
    assert_eq!(store.lock().unwrap().unconditional_deletes, 0);
}

/// Issue #48's fourth finding: listings read every record of a driver in one LIST. Each request
/// now asks for at most a page, and pages walk every record once.
#[test]
fn listings_are_pages_of_bounded_size_that_walk_every_record_once() {
    let runtime = runtime();
    let (url, store) = runtime.block_on(serve());
    let a = replica(&runtime, &url);
    let d = DriverName::parse("acme/x").unwrap();
    let total = PAGE_LIMIT * 2 + 37;
    for i in 0..total {
        a.write(&record(&format!("pv-{i}"), "p"), None).unwrap();
    }
    let y = DriverName::parse("acme/y").unwrap();
    let mut other = ControllerRecord::new(&y, "pv-y");
    other.fences = 1;
    a.write(&other, None).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let mut from = None;
    let mut pages = 0;
    loop {
        // Asking for more than a page gets a page.
        let page = a.page(&d, from.as_deref(), PAGE_LIMIT * 10).unwrap();
        pages += 1;
        for stored in page.records {
            let stored = stored.unwrap();
            assert_eq!(stored.record.driver, "acme/x");
            assert!(seen.insert(stored.record.volume), "listed twice");
        }
        match page.next {
            Some(next) => from = Some(next),
            None => break,
        }
    }
    assert_eq!((seen.len(), pages), (total, 3));
    let store = store.lock().unwrap();
    assert_eq!(store.unlimited_lists, 0);
    assert_eq!(store.largest_limit, PAGE_LIMIT);
    drop(store);
    let expired = a.page(&d, Some("expired"), 10);
    assert!(
        matches!(expired, Err(RecordsError::Expired { .. })),
        "{expired:?}"
    );
}

/// Issue #48's sixth finding: on a name-hash collision the other volume's record was read as
/// this one's version, and the next write replaced it. A record whose key is not the one asked
/// for is refused as corrupt, and never written over.
#[test]
fn a_record_under_another_key_is_corrupt_and_never_overwritten() {
    let runtime = runtime();
    let (url, store) = runtime.block_on(serve());
    let a = replica(&runtime, &url);
    let d = DriverName::parse("acme/x").unwrap();
    a.write(&record("pv-2", "theirs"), None).unwrap();
    // The object of pv-2 found under pv-1's name, as a collision would have it.
    {
        let mut store = store.lock().unwrap();
        let theirs = store.objects.values().next().cloned().unwrap();
        let name = super::object_name("acme/x", "pv-1");
        let mut moved = theirs;
        moved["metadata"]["name"] = json!(name);
        store.objects.insert(name, moved);
    }
    let records = ControllerRecords::new(Arc::new(a), FenceSettings::default());
    assert!(matches!(
        records.read(&d, "pv-1"),
        Err(RecordsError::Corrupt { .. })
    ));
    assert!(matches!(
        records.fence(&d, "pv-1", "provision"),
        Err(RecordsError::Corrupt { .. })
    ));
    let store = store.lock().unwrap();
    let kept = &store.objects[&super::object_name("acme/x", "pv-1")];
    assert_eq!(kept["spec"]["volume"], "pv-2");
    assert_eq!(kept["spec"]["provisioned"]["options"]["pool"], "theirs");
}

/// The fence through the API server: the other replica is refused while it is held, and the
/// record goes with the release when nothing is left in it.
#[test]
fn a_fence_held_through_the_api_server_refuses_the_other_replica() {
    let runtime = runtime();
    let (url, store) = runtime.block_on(serve());
    let d = DriverName::parse("acme/x").unwrap();
    let a = ControllerRecords::new(Arc::new(replica(&runtime, &url)), FenceSettings::default())
        .with_holder("a");
    let b = ControllerRecords::new(Arc::new(replica(&runtime, &url)), FenceSettings::default())
        .with_holder("b");
    let fence = a.fence(&d, "pv-1", "attach to node-1").unwrap();
    let refused = b.fence(&d, "pv-1", "detach from node-1");
    assert!(
        matches!(&refused, Err(RecordsError::Busy { holder, .. }) if holder == "a"),
        "{refused:?}"
    );
    fence.release().unwrap();
    assert!(store.lock().unwrap().objects.is_empty());
    let fence = b.fence(&d, "pv-1", "detach from node-1").unwrap();
    fence.release().unwrap();
    assert_eq!(store.lock().unwrap().unconditional_deletes, 0);
}

#[test]
fn an_api_server_out_of_reach_is_unavailable() {
    let runtime = runtime();
    // A port nothing listens on: bound, then closed.
    let url = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    });
    let records = replica(&runtime, &url);
    let d = DriverName::parse("acme/x").unwrap();
    let answer = records.read(&d, "pv-1");
    assert!(
        matches!(answer, Err(RecordsError::Unavailable { .. })),
        "{answer:?}"
    );
}
