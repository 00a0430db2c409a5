//! `flexd migrate --plan | --resume | --rollback` through the real binary against a fake API
//! server that answers reads from canned objects and records every write (issue #51): a stale
//! `claimRef` joins no workload to the plan, and a journal that was tampered with, that
//! predates the digest, or whose objects are no longer those it recorded, is refused before
//! anything is written. The fake server also takes a handler of its own
//! ([`FakeApi::serve`]): `migrate_rolling` gives it one that keeps state.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use flexd::migrate::journal::{Journal, Step};
use flexd::migrate::plan::{PvMove, Unit};
use serde_json::{json, Value};
use test_support::{flexd_command, Sandbox};

/// A fake API server on 127.0.0.1, one request per connection, each answered by its handler;
/// every GET is recorded as a read, anything else as a write (with its body).
pub(super) struct FakeApi {
    port: u16,
    writes: Arc<Mutex<Vec<String>>>,
    bodies: Arc<Mutex<Vec<(String, Value)>>>,
    reads: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    dir: tempfile::TempDir,
}

/// One request as the fake API server read it.
pub(super) struct Request {
    pub method: String,
    /// Without the query.
    pub path: String,
    /// The body as JSON, null when there is none.
    pub body: Value,
}

/// What answers a request: status code and body.
pub(super) type Handler = Box<dyn FnMut(&Request) -> (u16, Value) + Send>;

/// The canned answers: a GET of a path in `objects` is answered with it, any other GET is 404,
/// anything else refused (403).
fn canned(objects: BTreeMap<String, Value>) -> Handler {
    Box::new(move |request| {
        if request.method != "GET" {
            return (403, status(403, "Forbidden"));
        }
        match objects.get(&request.path) {
            Some(object) => (200, object.clone()),
            None => (404, status(404, "NotFound")),
        }
    })
}

pub(super) fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": reason, "reason": reason, "code": code})
}

/// What [`FakeApi`] records.
#[derive(Clone, Default)]
struct Records {
    reads: Arc<Mutex<Vec<String>>>,
    writes: Arc<Mutex<Vec<String>>>,
    bodies: Arc<Mutex<Vec<(String, Value)>>>,
}

fn answer(stream: TcpStream, handler: &mut Handler, records: &Records) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("").to_owned();
    let mut length = 0;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let request = Request {
        method: method.to_owned(),
        path: path.clone(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    if method == "GET" {
        records.reads.lock().unwrap().push(path);
    } else {
        let write = format!("{method} {path}");
        records.writes.lock().unwrap().push(write.clone());
        (records.bodies.lock().unwrap()).push((write, request.body.clone()));
    }
    let (code, answer) = handler(&request);
    let text = answer.to_string();
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{text}",
        text.len()
    )?;
    stream.flush()
}

impl FakeApi {
    fn start(objects: BTreeMap<String, Value>) -> Self {
        Self::serve(canned(objects))
    }

    /// A fake API server answering with `handler`.
    pub(super) fn serve(mut handler: Handler) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let records = Records::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (records, stop) = (records.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = stream {
                        let _ = answer(stream, &mut handler, &records);
                    }
                }
            })
        };
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("kubeconfig"),
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"http://127.0.0.1:{port}\"}}}}]\n\
                 users: [{{name: u, user: {{token: t}}}}]\n\
                 contexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
            ),
        )
        .unwrap();
        Self {
            port,
            writes: records.writes,
            bodies: records.bodies,
            reads: records.reads,
            stop,
            thread: Some(thread),
            dir,
        }
    }

    /// `flexd migrate ARGS` against it: exit status, stdout, stderr.
    pub(super) fn migrate(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let sandbox = Sandbox::new();
        let kubeconfig = self.dir.path().join("kubeconfig");
        let out = flexd_command(&sandbox.plugin())
            .arg("migrate")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    }

    pub(super) fn writes(&self) -> Vec<String> {
        self.writes.lock().unwrap().clone()
    }

    /// Each write (`METHOD path`) with its body, in order.
    pub(super) fn bodies(&self) -> Vec<(String, Value)> {
        self.bodies.lock().unwrap().clone()
    }

    fn reads(&self) -> Vec<String> {
        self.reads.lock().unwrap().clone()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept up to see the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

pub(super) fn list(kind: &str, api_version: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": api_version, "kind": format!("{kind}List"),
           "metadata": {"resourceVersion": "1"}, "items": items})
}

/// A Released FlexVolume PV whose claimRef names claim shop/data, now bound to the CSI PV
/// new-csi, and the Deployment using that claim.
fn stale_claim_cluster() -> BTreeMap<String, Value> {
    let old_flex = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "old-flex", "uid": "uid-old-flex"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain",
                 "claimRef": {"namespace": "shop", "name": "data", "uid": "uid-data"},
                 "flexVolume": {"driver": "acme/nfs", "options": {"share": "/old"}}},
        "status": {"phase": "Released"},
    });
    let new_csi = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "new-csi", "uid": "uid-new-csi"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "claimRef": {"namespace": "shop", "name": "data", "uid": "uid-data"},
                 "csi": {"driver": "flexvolume-acme--nfs", "volumeHandle": "new-csi"}},
        "status": {"phase": "Bound"},
    });
    let volumes = json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]);
    let pod_spec = json!({"containers": [{"name": "c", "image": "i"}], "volumes": volumes});
    BTreeMap::from([
        (
            "/api/v1/persistentvolumes".into(),
            list("PersistentVolume", "v1", vec![old_flex, new_csi]),
        ),
        (
            "/api/v1/namespaces/shop/persistentvolumeclaims/data".into(),
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                   "metadata": {"name": "data", "namespace": "shop", "uid": "uid-data"},
                   "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "new-csi"},
                   "status": {"phase": "Bound"}}),
        ),
        (
            "/api/v1/pods".into(),
            list(
                "Pod",
                "v1",
                vec![json!({
                    "metadata": {"name": "web-1-a", "namespace": "shop", "uid": "uid-pod",
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                      "name": "web-1", "uid": "uid-rs", "controller": true}]},
                    "spec": pod_spec.clone().as_object().unwrap().clone(),
                    "status": {"phase": "Running"},
                })],
            ),
        ),
        (
            "/apis/apps/v1/replicasets".into(),
            list(
                "ReplicaSet",
                "apps/v1",
                vec![json!({
                    "metadata": {"name": "web-1", "namespace": "shop", "uid": "uid-rs",
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                                      "name": "web", "uid": "uid-web", "controller": true}]},
                    "spec": {"selector": {}},
                })],
            ),
        ),
        (
            "/apis/apps/v1/deployments".into(),
            list(
                "Deployment",
                "apps/v1",
                vec![json!({
                    "metadata": {"name": "web", "namespace": "shop", "uid": "uid-web"},
                    "spec": {"selector": {}, "template": {"spec": pod_spec}},
                })],
            ),
        ),
        (
            "/apis/apps/v1/statefulsets".into(),
            list("StatefulSet", "apps/v1", vec![]),
        ),
        (
            "/apis/storage.k8s.io/v1/csidrivers".into(),
            list(
                "CSIDriver",
                "storage.k8s.io/v1",
                vec![json!({"metadata": {"name": "flexvolume-acme--nfs"},
                            "spec": {"attachRequired": false}})],
            ),
        ),
        (
            "/apis/storage.k8s.io/v1/csinodes".into(),
            list(
                "CSINode",
                "storage.k8s.io/v1",
                vec![json!({"metadata": {"name": "node-a"},
                            "spec": {"drivers": [{"name": "flexvolume-acme--nfs", "nodeID": "node-a"}]}})],
            ),
        ),
    ])
}

#[test]
fn a_stale_claim_ref_plans_the_pv_alone_and_says_why() {
    let api = FakeApi::start(stale_claim_cluster());
    let (code, stdout, stderr) = api.migrate(&["--plan", "--pv", "old-flex"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("  1. PersistentVolume old-flex\n"),
        "{stdout}"
    );
    assert!(!stdout.contains("Deployment shop/web"), "{stdout}");
    assert!(
        stdout.contains(
            "Notes:\n  - PersistentVolume old-flex: its claimRef names claim shop/data, which is \
             bound to PersistentVolume new-csi: planned without claim shop/data"
        ),
        "{stdout}"
    );
    assert_eq!(api.writes(), Vec::<String>::new());
}

pub(super) const JOURNAL: &str = "/api/v1/namespaces/flexd-system/configmaps/flexd-migration";

fn journal_map(text: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "flexd-migration", "namespace": "flexd-system",
                        "resourceVersion": "5", "uid": "uid-cm"},
           "data": {"journal.json": text}})
}

/// A finished migration of Deployment shop/web and PV data: the PV swapped for the CSI PV of
/// uid uid-csi.
fn finished_journal() -> Journal {
    let unit = Unit {
        workloads: vec!["Deployment shop/web".parse().unwrap()],
        pvs: vec![PvMove {
            name: "data".into(),
            driver: "acme/nfs".into(),
            csi_driver: "flexvolume-acme--nfs".into(),
            claim: Some("shop/data".into()),
            attaches: false,
            reclaim_policy: Some("Delete".into()),
            nodes: Default::default(),
            access_modes: vec!["ReadWriteOnce".into()],
        }],
        uids: BTreeMap::from([
            ("Deployment shop/web".into(), "uid-web".into()),
            ("PersistentVolume data".into(), "uid-flex".into()),
        ]),
        ..Unit::default()
    };
    let mut journal = Journal::new(vec![unit], "2026-01-01T00:00:00Z".into(), "me".into());
    let record = &mut journal.units[0];
    record.step = Step::Done;
    record.replicas.insert("Deployment shop/web".into(), 1);
    record.old_pvs.insert(
        "data".into(),
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
               "metadata": {"name": "data", "uid": "uid-flex"},
               "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "claimRef": {"namespace": "shop", "name": "data", "uid": "uid-data"},
                        "flexVolume": {"driver": "acme/nfs", "options": {"share": "/x"}}}}),
    );
    record
        .uids
        .insert("PersistentVolume data".into(), "uid-csi".into());
    journal.finished = true;
    journal
}

#[test]
fn a_journal_changed_by_hand_is_refused_before_anything_is_read_or_written() {
    let tampered = finished_journal().to_text().replace(
        "\"Deployment shop/web\"",
        "\"Deployment kube-system/coredns\"",
    );
    let api = FakeApi::start(BTreeMap::from([(JOURNAL.into(), journal_map(&tampered))]));
    for mode in [&["--resume", "--yes"][..], &["--rollback", "--yes"]] {
        let (code, _, stderr) = api.migrate(mode);
        assert_eq!(code, Some(1), "{mode:?}: {stderr}");
        assert!(stderr.contains("is not followed"), "{mode:?}: {stderr}");
        assert!(
            stderr.contains("something other than flexd migrate changed it"),
            "{mode:?}: {stderr}"
        );
    }
    assert_eq!(api.reads(), [JOURNAL, JOURNAL]);
    assert_eq!(api.writes(), Vec::<String>::new());
}

#[test]
fn a_version_1_journal_in_progress_is_not_acted_on() {
    let mut value: Value = serde_json::from_str(&finished_journal().to_text()).unwrap();
    let map = value.as_object_mut().unwrap();
    map.remove("digest");
    map.insert("version".into(), json!(1));
    map.insert("finished".into(), json!(false));
    let api = FakeApi::start(BTreeMap::from([(
        JOURNAL.into(),
        journal_map(&value.to_string()),
    )]));
    let (code, _, stderr) = api.migrate(&["--rollback", "--yes"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("journal version 1"), "{stderr}");
    assert_eq!(api.writes(), Vec::<String>::new());
}

#[test]
fn a_rollback_refuses_a_pv_whose_name_was_reused_and_changes_nothing() {
    let text = finished_journal().to_text();
    let someone_elses = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "data", "uid": "uid-someone"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "csi": {"driver": "other.csi.example", "volumeHandle": "h"}},
    });
    let web = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "uid": "uid-web"},
        "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "c"}]}}},
    });
    let api = FakeApi::start(BTreeMap::from([
        (JOURNAL.into(), journal_map(&text)),
        ("/api/v1/persistentvolumes/data".into(), someone_elses),
        ("/apis/apps/v1/namespaces/shop/deployments/web".into(), web),
    ]));
    let (code, _, stderr) = api.migrate(&["--rollback", "--yes"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "PersistentVolume data is not the object the journal recorded: its uid is \
             uid-someone, the journal's uid-csi"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("nothing changed"), "{stderr}");
    assert_eq!(api.writes(), Vec::<String>::new());
}
