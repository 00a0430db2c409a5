//! `flexd migrate --apply` and `--rollback` with the rolling strategy, through the real binary
//! against a fake API server that keeps state (issue #51): a 3-replica Deployment on a
//! ReadWriteMany PV of a driver that does not attach is never scaled (no write to its `scale`),
//! its PV is deleted preconditioned on the journaled uid and its CSI twin created with the
//! claim's `claimRef` (uid included) while the pods run, and its pods are evicted one at a time,
//! each only once the one before is replaced, a PodDisruptionBudget's 429 waited out; the
//! rollback does the same the other way; a PDB that never allows stops the run, resumable.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use super::migrate_cluster::{list, status, FakeApi, Handler, Request, JOURNAL};

const PV: &str = "/api/v1/persistentvolumes/data";
const PODS: &str = "/api/v1/namespaces/shop/pods";
const REVIEW: &str = "POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews";

/// The cluster the fake API server keeps: objects by path, and what the controllers would do.
struct Cluster {
    objects: BTreeMap<String, Value>,
    /// The last resourceVersion and uid handed out.
    version: u64,
    made: u64,
    /// How many evictions are answered 429 (a PodDisruptionBudget allowing none) before one
    /// is allowed; `usize::MAX`: none ever is.
    not_now: usize,
    /// Whether this identity may evict pods (SelfSubjectAccessReview).
    may_evict: bool,
    /// How many reads of a Deployment whose template changed still show the rollout under way
    /// (its controller has not seen the new generation yet).
    rollout_lag: usize,
}

/// Where a path is: a collection, an object or a subresource of one, by its segments after
/// the group and version.
enum Target<'a> {
    Collection,
    Object,
    Subresource(&'a str),
}

fn target(path: &str) -> Target<'_> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let rest = match segments.first() {
        Some(&"api") => &segments[2..],
        _ => &segments[3.min(segments.len())..],
    };
    let rest = match rest {
        ["namespaces", _, rest @ ..] if !rest.is_empty() => rest,
        rest => rest,
    };
    match rest {
        [_] => Target::Collection,
        [_, _] => Target::Object,
        [_, _, sub] => Target::Subresource(sub),
        _ => Target::Collection,
    }
}

/// The path of the collection an object path is in, and of that collection across namespaces.
fn collections(object: &str) -> (String, String) {
    let parent = object.rsplit_once('/').map_or("", |(p, _)| p).to_owned();
    let mut parts: Vec<&str> = parent.split('/').collect();
    if let Some(i) = parts.iter().position(|p| *p == "namespaces") {
        parts.drain(i..i + 2);
    }
    let all = parts.join("/");
    (parent, all)
}

/// RFC 7386: what the API server does with a merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let map = target.as_object_mut().unwrap();
    for (key, value) in patch {
        if value.is_null() {
            map.remove(key);
        } else {
            merge(map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

fn pod(name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "uid": uid, "resourceVersion": "1",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                          "name": "web-1", "uid": "uid-rs", "controller": true}]},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "i"}],
                 "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

impl Cluster {
    /// Deployment shop/web, 3 replicas, on claim shop/data bound to the ReadWriteMany PV
    /// `data` of acme/nfs, which does not attach.
    fn new() -> Self {
        let volumes = json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]);
        let template =
            json!({"spec": {"containers": [{"name": "c", "image": "i"}], "volumes": volumes}});
        let mut objects = BTreeMap::from([
            (
                PV.to_owned(),
                json!({
                    "apiVersion": "v1", "kind": "PersistentVolume",
                    "metadata": {"name": "data", "uid": "uid-flex", "resourceVersion": "1",
                                 "finalizers": ["kubernetes.io/pv-protection"]},
                    "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                             "persistentVolumeReclaimPolicy": "Delete",
                             "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                          "namespace": "shop", "name": "data", "uid": "uid-claim"},
                             "flexVolume": {"driver": "acme/nfs", "options": {"share": "/exports/web"}}},
                    "status": {"phase": "Bound"},
                }),
            ),
            (
                "/api/v1/namespaces/shop/persistentvolumeclaims/data".to_owned(),
                json!({
                    "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "data", "namespace": "shop", "uid": "uid-claim"},
                    "spec": {"accessModes": ["ReadWriteMany"], "volumeName": "data"},
                    "status": {"phase": "Bound"},
                }),
            ),
            (
                "/apis/apps/v1/namespaces/shop/deployments/web".to_owned(),
                json!({
                    "apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "web", "namespace": "shop", "uid": "uid-web",
                                 "resourceVersion": "1", "generation": 1},
                    "spec": {"replicas": 3, "selector": {}, "template": template},
                    "status": {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3,
                               "readyReplicas": 3},
                }),
            ),
            (
                "/apis/apps/v1/namespaces/shop/replicasets/web-1".to_owned(),
                json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {"name": "web-1", "namespace": "shop", "uid": "uid-rs",
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                                      "name": "web", "uid": "uid-web", "controller": true}]},
                    "spec": {"replicas": 3, "selector": {}},
                }),
            ),
            (
                "/apis/storage.k8s.io/v1/csidrivers/flexvolume-acme--nfs".to_owned(),
                json!({
                    "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                    "metadata": {"name": "flexvolume-acme--nfs"}, "spec": {"attachRequired": false},
                }),
            ),
            (
                "/apis/storage.k8s.io/v1/csinodes/node-a".to_owned(),
                json!({
                    "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                    "metadata": {"name": "node-a"},
                    "spec": {"drivers": [{"name": "flexvolume-acme--nfs", "nodeID": "node-a"}]},
                }),
            ),
        ]);
        for name in ["web-1-a", "web-1-b", "web-1-c"] {
            let uid = format!("uid-{name}");
            objects.insert(format!("{PODS}/{name}"), pod(name, &uid));
        }
        Self {
            objects,
            version: 1,
            made: 0,
            not_now: 0,
            may_evict: true,
            rollout_lag: 0,
        }
    }

    /// Adds Deployment shop/cache, 2 replicas, with an inline flexVolume of acme/nfs.
    fn with_inline_cache(mut self) -> Self {
        let volumes = json!([{"name": "v", "flexVolume": {"driver": "acme/nfs",
                                                          "options": {"share": "/exports/cache"}}}]);
        let template = json!({"spec": {"containers": [{"name": "c", "image": "i"}],
                                       "volumes": volumes.clone()}});
        self.objects.insert(
            "/apis/apps/v1/namespaces/shop/deployments/cache".to_owned(),
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "cache", "namespace": "shop", "uid": "uid-cache",
                             "resourceVersion": "1", "generation": 1},
                "spec": {"replicas": 2, "selector": {}, "template": template},
                "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2,
                           "readyReplicas": 2},
            }),
        );
        self.objects.insert(
            "/apis/apps/v1/namespaces/shop/replicasets/cache-1".to_owned(),
            json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": "cache-1", "namespace": "shop", "uid": "uid-cache-rs",
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                                  "name": "cache", "uid": "uid-cache",
                                                  "controller": true}]},
                "spec": {"replicas": 2, "selector": {}},
            }),
        );
        for name in ["cache-1-a", "cache-1-b"] {
            let mut pod = pod(name, &format!("uid-{name}"));
            pod["metadata"]["ownerReferences"][0]["name"] = json!("cache-1");
            pod["metadata"]["ownerReferences"][0]["uid"] = json!("uid-cache-rs");
            pod["spec"]["volumes"] = volumes.clone();
            self.objects.insert(format!("{PODS}/{name}"), pod);
        }
        self
    }

    fn next_version(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }

    /// A conflict when `preconditions` (uid, resourceVersion) do not hold for `object`.
    fn unmet(object: &Value, preconditions: &Value) -> Option<(u16, Value)> {
        for key in ["uid", "resourceVersion"] {
            let wanted = preconditions[key].as_str();
            if wanted.is_some() && wanted != object["metadata"][key].as_str() {
                return Some((409, status(409, "Conflict")));
            }
        }
        None
    }

    fn answer(&mut self, request: &Request) -> (u16, Value) {
        let path = request.path.as_str();
        match (request.method.as_str(), target(path)) {
            ("GET", Target::Object | Target::Subresource(_)) => match self.objects.get(path) {
                // Its controller has not seen the new template yet.
                Some(object) if self.rollout_lag > 0 && path.contains("/deployments/") => {
                    self.rollout_lag -= 1;
                    let mut stale = object.clone();
                    let generation = stale["metadata"]["generation"].as_i64().unwrap_or(1);
                    stale["status"]["observedGeneration"] = json!(generation - 1);
                    stale["status"]["updatedReplicas"] = json!(0);
                    (200, stale)
                }
                Some(object) => (200, object.clone()),
                None => (404, status(404, "NotFound")),
            },
            ("GET", Target::Collection) => {
                let items: Vec<Value> = (self.objects.iter())
                    .filter(|(p, _)| {
                        let (parent, all) = collections(p);
                        parent == path || all == path
                    })
                    .map(|(_, o)| o.clone())
                    .collect();
                (200, list("", "v1", items))
            }
            ("POST", Target::Collection) if path.ends_with("/selfsubjectaccessreviews") => {
                let mut review = request.body.clone();
                review["status"] = json!({"allowed": self.may_evict});
                (201, review)
            }
            ("POST", Target::Collection) => {
                let mut object = request.body.clone();
                let name = object["metadata"]["name"].as_str().unwrap_or("").to_owned();
                let at = format!("{path}/{name}");
                if self.objects.contains_key(&at) {
                    return (409, status(409, "AlreadyExists"));
                }
                self.made += 1;
                object["metadata"]["uid"] = json!(format!("uid-made-{}", self.made));
                object["metadata"]["resourceVersion"] = json!(self.next_version());
                if at == PV {
                    object["status"] = json!({"phase": "Bound"});
                }
                self.objects.insert(at, object.clone());
                (201, object)
            }
            ("POST", Target::Subresource("eviction")) => self.evict(path, &request.body),
            ("PUT", Target::Object) => {
                let Some(current) = self.objects.get(path) else {
                    return (404, status(404, "NotFound"));
                };
                let mut object = request.body.clone();
                let version = &object["metadata"]["resourceVersion"];
                if version != &current["metadata"]["resourceVersion"] {
                    return (409, status(409, "Conflict"));
                }
                object["metadata"]["uid"] = current["metadata"]["uid"].clone();
                object["metadata"]["resourceVersion"] = json!(self.next_version());
                self.objects.insert(path.to_owned(), object.clone());
                (200, object)
            }
            ("PATCH", Target::Object) => {
                let Some(mut object) = self.objects.get(path).cloned() else {
                    return (404, status(404, "NotFound"));
                };
                if let Some(conflict) = Self::unmet(&object, &request.body["metadata"]) {
                    return conflict;
                }
                merge(&mut object, &request.body);
                object["metadata"]["resourceVersion"] = json!(self.next_version());
                // A new template: the Deployment controller rolls it out (seen after a lag).
                if path.contains("/deployments/") && !request.body["spec"]["template"].is_null() {
                    let generation = object["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
                    object["metadata"]["generation"] = json!(generation);
                    object["status"]["observedGeneration"] = json!(generation);
                    self.rollout_lag = 2;
                }
                self.objects.insert(path.to_owned(), object.clone());
                (200, object)
            }
            ("DELETE", Target::Object) => {
                let Some(object) = self.objects.get(path).cloned() else {
                    return (404, status(404, "NotFound"));
                };
                if let Some(conflict) = Self::unmet(&object, &request.body["preconditions"]) {
                    return conflict;
                }
                // Finalizers are stripped by flexd right after: gone at once here.
                self.objects.remove(path);
                (200, object)
            }
            _ => (405, status(405, "MethodNotAllowed")),
        }
    }

    /// An eviction: 429 while the PDB allows none, else the pod goes and its ReplicaSet's
    /// replacement is there, Ready.
    fn evict(&mut self, path: &str, body: &Value) -> (u16, Value) {
        let pod_path = path.trim_end_matches("/eviction");
        let Some(object) = self.objects.get(pod_path).cloned() else {
            return (404, status(404, "NotFound"));
        };
        if let Some(conflict) = Self::unmet(&object, &body["deleteOptions"]["preconditions"]) {
            return conflict;
        }
        if self.not_now > 0 {
            self.not_now = self
                .not_now
                .saturating_sub(usize::from(self.not_now != usize::MAX));
            return (
                429,
                status(
                    429,
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                ),
            );
        }
        self.objects.remove(pod_path);
        self.made += 1;
        let name = format!("web-1-r{}", self.made);
        let uid = format!("uid-{name}");
        self.objects
            .insert(format!("{PODS}/{name}"), pod(&name, &uid));
        (
            201,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
        )
    }
}

/// The fake API server over `cluster`.
fn serve(cluster: &Arc<Mutex<Cluster>>) -> FakeApi {
    let shared = Arc::clone(cluster);
    let handler: Handler = Box::new(move |request| shared.lock().unwrap().answer(request));
    FakeApi::serve(handler)
}

/// The evictions sent, in order: pod name and the uid they were preconditioned on.
fn evictions(api: &FakeApi) -> Vec<(String, String)> {
    api.bodies()
        .into_iter()
        .filter(|(write, _)| write.ends_with("/eviction"))
        .map(|(write, body)| {
            let name = write
                .trim_end_matches("/eviction")
                .rsplit('/')
                .next()
                .unwrap_or("");
            let uid = body["deleteOptions"]["preconditions"]["uid"]
                .as_str()
                .unwrap_or("");
            (name.to_owned(), uid.to_owned())
        })
        .collect()
}

fn evicted(pod: &str, times: usize) -> Vec<(String, String)> {
    vec![(pod.to_owned(), format!("uid-{pod}")); times]
}

/// The journal as the fake API server holds it.
fn journal(cluster: &Arc<Mutex<Cluster>>) -> Value {
    let cluster = cluster.lock().unwrap();
    let text = cluster.objects[JOURNAL]["data"]["journal.json"]
        .as_str()
        .unwrap_or("{}")
        .to_owned();
    serde_json::from_str(&text).unwrap()
}

/// The JSON line of `event` in `-o json`'s output.
fn event(stdout: &str, event: &str) -> Value {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == event)
        .unwrap_or_else(|| panic!("no {event} event in:\n{stdout}"))
}

fn assert_never_scaled(api: &FakeApi) {
    let writes = api.writes();
    assert!(
        !writes
            .iter()
            .any(|w| w.ends_with("/scale") || w.contains("/deployments/")),
        "the Deployment was written to: {writes:?}"
    );
}

#[test]
fn a_rolling_apply_swaps_the_pv_under_the_running_pods_and_evicts_them_one_at_a_time() {
    let cluster = Arc::new(Mutex::new(Cluster::new()));
    // The PodDisruptionBudget allows none three times first.
    cluster.lock().unwrap().not_now = 3;
    let api = serve(&cluster);

    let (code, plan, stderr) = api.migrate(&["--plan", "--all", "-o", "json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let plan: Value = serde_json::from_str(plan.trim()).unwrap();
    assert_eq!(plan["units"][0]["strategy"], "rolling", "{plan}");
    assert_eq!(
        plan["units"][0]["downtime"],
        "none: a pod of each workload stays up throughout"
    );
    // Only asked whether it may evict there (a SelfSubjectAccessReview changes nothing).
    assert_eq!(api.writes(), [REVIEW]);

    let (code, stdout, stderr) = api.migrate(&["--apply", "--all", "--yes", "-o", "json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert_never_scaled(&api);

    // The FlexVolume PV deleted only as the object the journal recorded, while the pods ran;
    // its twin created with the claim's claimRef, uid included, before any eviction.
    let bodies = api.bodies();
    let position = |what: &str| bodies.iter().position(|(w, _)| w == what);
    let delete = position(&format!("DELETE {PV}")).expect("the PV deleted");
    assert_eq!(bodies[delete].1["preconditions"]["uid"], "uid-flex");
    let create = position("POST /api/v1/persistentvolumes").expect("the twin created");
    let twin = &bodies[create].1;
    assert_eq!(twin["metadata"]["name"], "data");
    assert_eq!(twin["spec"]["claimRef"]["uid"], "uid-claim");
    assert_eq!(twin["spec"]["csi"]["driver"], "flexvolume-acme--nfs");
    assert_eq!(twin["spec"]["csi"]["volumeHandle"], "data");
    assert_eq!(
        twin["metadata"]["annotations"]["migrate.flexd.io/replaces"],
        "uid-flex"
    );
    let first_eviction = bodies.iter().position(|(w, _)| w.ends_with("/eviction"));
    assert!(
        delete < create && Some(create) < first_eviction,
        "{bodies:?}"
    );

    // One pod at a time, each by its uid; web-1-a waited out the PDB's three 429s.
    let expected: Vec<(String, String)> = [
        evicted("web-1-a", 4),
        evicted("web-1-b", 1),
        evicted("web-1-c", 1),
    ]
    .concat();
    assert_eq!(evictions(&api), expected);

    let summary = event(&stdout, "summary");
    let unit = &summary["units"][0];
    assert_eq!(unit["strategy"], "rolling", "{summary}");
    assert_eq!(unit["step"], "done");
    assert_eq!(unit["downtime_seconds"], Value::Null);
    assert_eq!(
        unit["pods_replaced"],
        json!(["shop/web-1-a", "shop/web-1-b", "shop/web-1-c"])
    );
    let replaced: Vec<Value> = (stdout.lines())
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "replaced")
        .map(|e| e["pod"].clone())
        .collect();
    assert_eq!(
        replaced,
        [
            json!("shop/web-1-a"),
            json!("shop/web-1-b"),
            json!("shop/web-1-c")
        ]
    );
    let journal = journal(&cluster);
    assert_eq!(journal["version"], 3);
    assert_eq!(journal["units"][0]["step"], "done");
    assert_eq!(
        journal["units"][0]["uids"]["PersistentVolume data"],
        "uid-made-2"
    );

    // And back, the same way: the CSI PV swapped for the FlexVolume one under the claim, the
    // replacements evicted one at a time; still never scaled.
    let before = api.bodies().len();
    let (code, stdout, stderr) = api.migrate(&["--rollback", "--yes", "-o", "json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert_never_scaled(&api);
    let back = &api.bodies()[before..];
    let delete = back
        .iter()
        .find(|(w, _)| w == &format!("DELETE {PV}"))
        .expect("deleted");
    assert_eq!(delete.1["preconditions"]["uid"], "uid-made-2");
    let create = back
        .iter()
        .find(|(w, _)| w == "POST /api/v1/persistentvolumes")
        .expect("created");
    assert_eq!(create.1["spec"]["flexVolume"]["driver"], "acme/nfs");
    assert_eq!(create.1["spec"]["claimRef"]["uid"], "uid-claim");
    assert_eq!(create.1["spec"]["persistentVolumeReclaimPolicy"], "Delete");
    let pods_back: Vec<String> = evictions(&api)[expected.len()..]
        .iter()
        .map(|(name, _)| name.clone())
        .collect();
    assert_eq!(pods_back, ["web-1-r3", "web-1-r4", "web-1-r5"]);
    assert_eq!(event(&stdout, "summary")["units"][0]["step"], "rolled-back");
    assert_eq!(journal_step(&cluster), "rolled-back");
}

fn journal_step(cluster: &Arc<Mutex<Cluster>>) -> String {
    journal(cluster)["units"][0]["step"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

#[test]
fn a_pdb_that_allows_no_eviction_stops_the_run_naming_the_pod_and_resume_goes_on() {
    let cluster = Arc::new(Mutex::new(Cluster::new()));
    cluster.lock().unwrap().not_now = usize::MAX;
    let api = serve(&cluster);
    let (code, _, stderr) = api.migrate(&["--apply", "--all", "--yes", "--wait-timeout", "2s"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("stopped at step swapped; nothing is lost: --resume goes on"),
        "{stderr}"
    );
    assert!(
        stderr.contains("waited 2s for the eviction of Pod shop/web-1-a to be allowed"),
        "{stderr}"
    );
    assert!(stderr.contains("PodDisruptionBudget"), "{stderr}");
    assert_never_scaled(&api);
    assert_eq!(journal_step(&cluster), "swapped");

    // The budget allows again: --resume evicts from where it stopped; the swap is not redone.
    cluster.lock().unwrap().not_now = 0;
    let deletes = |api: &FakeApi| {
        api.writes()
            .iter()
            .filter(|w| w.starts_with("DELETE"))
            .count()
    };
    let before = deletes(&api);
    let (code, stdout, stderr) = api.migrate(&["--resume", "--yes"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("(rolling, 0 of 3 replaced)"), "{stderr}");
    assert!(
        stderr.contains(
            "flexd: [1/1] Deployment shop/web, PersistentVolume data: Pod shop/web-1-c replaced \
             (3/3)"
        ),
        "{stderr}"
    );
    assert_eq!(
        stdout,
        "Deployment shop/web: migrated, rolling: 3 pods replaced one at a time\n"
    );
    assert_eq!(deletes(&api), before);
    assert_never_scaled(&api);
    assert_eq!(journal_step(&cluster), "done");
}

#[test]
fn where_this_identity_may_not_evict_auto_scales_down_and_rolling_is_refused() {
    let cluster = Arc::new(Mutex::new(Cluster::new()));
    cluster.lock().unwrap().may_evict = false;
    let api = serve(&cluster);
    let (code, plan, stderr) = api.migrate(&["--plan", "--all", "-o", "json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let plan: Value = serde_json::from_str(plan.trim()).unwrap();
    assert_eq!(plan["units"][0]["strategy"], "scale-down", "{plan}");
    assert_eq!(
        plan["units"][0]["strategy_reason"],
        "this identity may not evict pods in namespace shop (create on pods/eviction)"
    );

    let (code, stdout, stderr) =
        api.migrate(&["--apply", "--all", "--yes", "--strategy", "rolling"]);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(
            "Refused (not migrated):\n  - Deployment shop/web, PersistentVolume data: \
             --strategy rolling: this identity may not evict pods in namespace shop"
        ),
        "{stdout}"
    );
    assert!(stderr.contains("nothing to migrate"), "{stderr}");
    assert_eq!(api.writes(), [REVIEW, REVIEW]);
}

#[test]
fn an_inline_volume_rolls_through_the_deployments_own_rollout_never_scaled_nor_evicted() {
    let cluster = Arc::new(Mutex::new(Cluster::new().with_inline_cache()));
    let api = serve(&cluster);
    let cache = "--workload=shop/deployment/cache";
    let (code, stdout, stderr) = api.migrate(&["--apply", cache, "--yes", "-o", "json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let writes = api.writes();
    assert!(!writes.iter().any(|w| w.ends_with("/scale")), "{writes:?}");
    // Its own rollout replaces the pods: flexd evicts none (and so asks no review).
    assert_eq!(evictions(&api), []);
    assert!(!writes.contains(&REVIEW.to_owned()), "{writes:?}");
    let patch = (api.bodies().into_iter())
        .find(|(w, _)| w == "PATCH /apis/apps/v1/namespaces/shop/deployments/cache")
        .expect("the template rewritten");
    assert_eq!(patch.1["metadata"]["uid"], "uid-cache");
    let volume = &patch.1["spec"]["template"]["spec"]["volumes"][0];
    assert_eq!(volume["csi"]["driver"], "flexvolume-acme--nfs");
    assert!(volume.get("flexVolume").is_none(), "{volume}");
    let summary = event(&stdout, "summary");
    assert_eq!(summary["units"][0]["strategy"], "rolling", "{summary}");
    assert_eq!(
        summary["units"][0]["rollouts"],
        json!(["Deployment shop/cache"])
    );
    assert_eq!(summary["units"][0]["pods_replaced"], json!([]));
}
