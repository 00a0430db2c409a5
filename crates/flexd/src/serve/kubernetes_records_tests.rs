//! `KubernetesRecords` through the real kube client over HTTP, against a small in-memory stand-in
//! for the API server that keeps `resourceVersion` as the API server does: a write or a delete
//! from an out-of-date version is refused with 409, a create of a name that exists too. Two
//! instances over one server are two replicas. The e2e's controller, upgrade and failover
//! scenarios run the same code against a real API server, where a conflict cannot be made on
//! purpose; here it can.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use flexvolume_host::controller_records::{ControllerRecords, RecordsError};
use flexvolume_host::lifecycle::ProvisionedVolume;
use flexvolume_host::DriverName;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use super::KubernetesRecords;

const NAMESPACE: &str = "flexd-system";
const PREFIX: &str = "/apis/flexd.io/v1alpha1/namespaces/flexd-system/flexdrecords";

/// The objects the stand-in holds, by name, and the last resourceVersion it gave.
#[derive(Default)]
struct Store {
    objects: BTreeMap<String, Value>,
    version: u64,
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
            let selector = query
                .split('&')
                .find_map(|p| p.strip_prefix("labelSelector="))
                .map(|s| {
                    s.replace("%3D", "=")
                        .replace("%2C", ",")
                        .replace("%2F", "/")
                });
            let items: Vec<Value> = store
                .objects
                .values()
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
            let version = store.version.to_string();
            let list = json!({"kind": "FlexdRecordList", "apiVersion": "flexd.io/v1alpha1",
                "metadata": {"resourceVersion": version}, "items": items});
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
            if wanted.is_some_and(|w| Some(w) != version_of(current)) {
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

/// A replica's records: a kube client of the URL.
fn replica(runtime: &tokio::runtime::Runtime, url: &str) -> KubernetesRecords {
    let _entered = runtime.enter();
    let config = kube::Config::new(url.parse::<hyper::Uri>().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    KubernetesRecords::new(client, NAMESPACE)
}

fn provisioned(name: &str, pool: &str) -> ProvisionedVolume {
    ProvisionedVolume {
        name: name.into(),
        driver: "acme/x".into(),
        capacity_bytes: 1 << 20,
        fs_type: "ext4".into(),
        parameters: BTreeMap::new(),
        options: BTreeMap::from([("pool".to_owned(), pool.to_owned())]),
        done: false,
    }
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

#[test]
fn replicas_never_overwrite_each_other() {
    let runtime = runtime();
    let (url, store) = runtime.block_on(serve());
    let (a, b) = (replica(&runtime, &url), replica(&runtime, &url));
    let d = DriverName::parse("acme/x").unwrap();

    // A provisions; B reads what A wrote and finishes it.
    a.save_provisioned(&d, &provisioned("pv-1", "first"))
        .unwrap();
    let mut read = b
        .provisioned(&d, "pv-1")
        .unwrap()
        .expect("B reads A's record");
    assert_eq!(read.options["pool"], "first");
    read.done = true;
    b.save_provisioned(&d, &read).unwrap();

    // A writes from the version it last saw: refused, and the object is B's.
    let stale = a.save_provisioned(&d, &provisioned("pv-1", "stale"));
    expect_conflict(&stale);
    let kept = b.provisioned(&d, "pv-1").unwrap().unwrap();
    assert!(kept.done && kept.options["pool"] == "first", "{kept:?}");

    // A conflict makes A read again before its next write, which then succeeds.
    let fresh = a.provisioned(&d, "pv-1").unwrap().unwrap();
    assert!(fresh.done);
    a.save_provisioned(
        &d,
        &ProvisionedVolume {
            capacity_bytes: 2 << 20,
            ..fresh
        },
    )
    .unwrap();
    // (Checked in the stand-in: a read by B would bring B up to date.)
    let held = store
        .lock()
        .unwrap()
        .objects
        .values()
        .next()
        .cloned()
        .unwrap();
    assert_eq!(
        held["spec"]["data"]["capacity_bytes"],
        json!(2 << 20),
        "{held}"
    );

    // B's delete from its out-of-date version is refused; after a read it goes.
    let refused = b.remove_provisioned(&d, "pv-1");
    expect_conflict(&refused);
    assert!(b.provisioned(&d, "pv-1").unwrap().is_some());
    b.remove_provisioned(&d, "pv-1").unwrap();
    assert_eq!(a.provisioned(&d, "pv-1").unwrap(), None);
    assert!(store.lock().unwrap().objects.is_empty());

    // Two replicas creating the same record at once: one create wins, the other conflicts.
    a.save_provisioned(&d, &provisioned("pv-2", "a")).unwrap();
    let second = b.save_provisioned(&d, &provisioned("pv-2", "b"));
    expect_conflict(&second);
    assert_eq!(
        b.provisioned(&d, "pv-2").unwrap().unwrap().options["pool"],
        "a"
    );
}

#[test]
fn listings_select_by_driver_and_forget_what_went() {
    let runtime = runtime();
    let (url, _store) = runtime.block_on(serve());
    let (a, b) = (replica(&runtime, &url), replica(&runtime, &url));
    let d = DriverName::parse("acme/x").unwrap();
    for name in ["pv-1", "pv-2"] {
        a.save_provisioned(&d, &provisioned(name, "p")).unwrap();
    }
    let y = DriverName::parse("acme/y").unwrap();
    let mut other = provisioned("pv-3", "p");
    other.driver = y.to_string();
    a.save_provisioned(&y, &other).unwrap();
    let names = |records: &KubernetesRecords| -> Vec<String> {
        let mut names: Vec<String> = records
            .all_provisioned(&d)
            .unwrap()
            .into_iter()
            .map(|r| r.unwrap().name)
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&b), ["pv-1", "pv-2"]);
    assert_eq!(b.versions().len(), 2, "B remembers what it listed");
    a.remove_provisioned(&d, "pv-2").unwrap();
    assert_eq!(names(&b), ["pv-1"]);
    assert_eq!(b.versions().len(), 1, "B forgot the record A removed");
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
    let answer = records.provisioned(&d, "pv-1");
    assert!(
        matches!(answer, Err(RecordsError::Unavailable { .. })),
        "{answer:?}"
    );
}
