//! FlexVolume objects as their CSI equivalents served by `flexd serve` (`flexd migrate`).
//!
//! A PersistentVolume with `flexVolume` becomes one with `csi`, and an inline `flexVolume` in a
//! Pod or a workload's pod template becomes an inline `csi` volume. The conversion is exact for
//! what reaches the driver, so a migrated PV names the very volume the driver mounted before:
//! flexd serve makes the CSI volume id the FlexVolume volume name and the volume context the
//! options, so the `volumeHandle` is the PV's name (FlexVolume's `kubernetes.io/pvOrVolumeName`)
//! and the `volumeAttributes` are the options, unchanged.
//!
//! Typed Kubernetes objects in and out (k8s-openapi), text only at the edges. Everything is
//! converted before anything is returned: one refusal anywhere means no output at all, so a
//! cut-over never applies half a migration.

use std::collections::BTreeMap;

use flexvolume_host::DriverName;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, CSIVolumeSource, LocalObjectReference, PersistentVolume, Pod,
    PodSpec, SecretReference,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::naming;

mod graph;
pub mod guard;
pub mod journal;
mod nesting;
pub mod plan;
pub mod rolling;
pub mod strategy;
pub mod twin;
mod unique_keys;
pub mod workload;
mod yaml;

pub use yaml::to_yaml;

pub(crate) use nesting::MAX_NESTING;

/// Volume-context keys flexd serve takes for kubelet's (pod information), never the driver's:
/// an option under this prefix would not reach the driver after the migration.
pub const K8S_CONTEXT_PREFIX: &str = "csi.storage.k8s.io/";

/// What flexd serve accepts as a volume id (`serve/request.rs`, CSI's string limit): the
/// migrated PV's name must fit, since it is the volume handle.
pub(crate) const MAX_VOLUME_HANDLE_BYTES: usize = 128;
/// What flexd serve accepts as a volume context, keys and values together (CSI's map limit).
pub(crate) const MAX_CONTEXT_BYTES: usize = 4096;
/// The most kubelet adds to the volume context (podInfoOnMount): the keys `pod.name`,
/// `pod.namespace`, `pod.uid`, `serviceAccount.name` and `ephemeral` under
/// `csi.storage.k8s.io/` (151 bytes) with their longest values (253 + 63 + 36 + 253 + 5).
pub(crate) const MAX_POD_INFO_BYTES: usize = 151 + 253 + 63 + 36 + 253 + 5;

/// The annotation `kubectl apply` keeps the last applied object in: it still describes the
/// FlexVolume object, so a later apply would diff against the wrong thing.
pub(crate) const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Why an object, or one of its volumes, cannot be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    #[error("is not YAML or JSON: {0}")]
    NotYaml(String),
    #[error(
        "nests {{…}} or […] deeper than {MAX_NESTING} levels at line {line} column {column} \
         (the YAML parser's limit; no Kubernetes object nests that deep)"
    )]
    TooDeep { line: u64, column: u64 },
    #[error("is not a Kubernetes object (no apiVersion and kind)")]
    NotAnObject,
    #[error("is not a valid {kind}: {error}")]
    Invalid { kind: String, error: String },
    #[error("has no metadata.name (a migrated PersistentVolume's volumeHandle is its name)")]
    NoName,
    #[error("flexVolume.driver {driver:?} is not a driver name: {reason}")]
    DriverName { driver: String, reason: String },
    #[error("{0}")]
    CsiName(#[from] naming::CsiNameError),
    #[error(
        "driver {driver} attaches, and an inline CSI volume cannot be attached (kubelet never \
         calls ControllerPublish for it); make it a PersistentVolume and claim it"
    )]
    InlineAttaching { driver: String },
    #[error(
        "cannot tell whether driver {driver} attaches ({reason}); install it in the plugin dir \
         or say --attaching {driver} or --not-attaching {driver}"
    )]
    UnknownAttach { driver: String, reason: String },
    #[error(
        "option {key:?} would not reach the driver: flexd serve takes csi.storage.k8s.io/ keys \
         as kubelet's pod information"
    )]
    ReservedOption { key: String },
    #[error(
        "the name is {len} bytes and becomes the volume handle, which flexd serve takes up to \
         {MAX_VOLUME_HANDLE_BYTES} bytes (CSI's limit)"
    )]
    NameTooLong { len: usize },
    #[error(
        "the options are {len} bytes (keys and values); with kubelet's pod information (up to \
         {MAX_POD_INFO_BYTES}) they must fit in the {MAX_CONTEXT_BYTES} bytes of volume context \
         flexd serve accepts, so at most {}",
        MAX_CONTEXT_BYTES - MAX_POD_INFO_BYTES
    )]
    OptionsTooLong { len: usize },
    #[error("flexVolume.secretRef has no name")]
    SecretWithoutName,
    #[error(
        "flexVolume.secretRef {name:?} has no namespace and the PersistentVolume has no \
         claimRef: FlexVolume read it from the pod's namespace, CSI needs it named (set \
         secretRef.namespace)"
    )]
    SecretNamespaceUnknown { name: String },
    #[error("volumeMode is Block: FlexVolume drivers mount filesystems, and flexd serve refuses block access")]
    Block,
    #[error("has both flexVolume and csi")]
    BothSources,
    #[error("holds a flexVolume, and flexd migrate does not convert a {kind}; convert its owner or write the csi volume by hand")]
    UnsupportedKind { kind: String },
}

/// One refusal: where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 1-based, in input order.
    pub document: usize,
    /// `Kind namespace/name`, or empty when the document is not an object.
    pub object: String,
    /// The pod volume, for an inline volume.
    pub volume: Option<String>,
    pub reason: Reason,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        let f = &mut Printable(f);
        where_in_input(f, self.document, &self.object)?;
        if let Some(volume) = &self.volume {
            write!(f, ", volume {volume:?}")?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// Writes text with its control characters escaped (`\u{1b}`, `\n`): refusals and notes
/// quote names from the input, and they go to a terminal, where an escape sequence in a name
/// would act rather than show.
struct Printable<'a, 'b>(&'a mut std::fmt::Formatter<'b>);

impl std::fmt::Write for Printable<'_, '_> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        for c in text.chars() {
            if c.is_control() {
                write!(self.0, "{}", c.escape_debug())?;
            } else {
                self.0.write_char(c)?;
            }
        }
        Ok(())
    }
}

/// `document N`, then the object when the document is one: how refusals and notes start.
fn where_in_input(f: &mut impl std::fmt::Write, document: usize, object: &str) -> std::fmt::Result {
    write!(f, "document {document}")?;
    if !object.is_empty() {
        write!(f, ", {object}")?;
    }
    Ok(())
}

/// What the conversion did with a document that is not a refusal, for the operator (stderr).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub document: usize,
    pub object: String,
    pub text: String,
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        let f = &mut Printable(f);
        where_in_input(f, self.document, &self.object)?;
        write!(f, ": {}", self.text)
    }
}

/// The converted objects (only those that held a flexVolume), in input order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Migration {
    pub objects: Vec<Value>,
    pub notes: Vec<Note>,
}

impl Migration {
    /// The objects as YAML documents separated by `---`, every string that a YAML 1.1
    /// reader (kubectl's) could take for something else quoted (see [`to_yaml`]).
    pub fn to_yaml(&self) -> String {
        let mut out = String::new();
        for (i, object) in self.objects.iter().enumerate() {
            if i > 0 {
                out.push_str("---\n");
            }
            out.push_str(&to_yaml(object));
        }
        out
    }

    /// The objects as one `v1` List (what `kubectl apply -f` takes as a single JSON document).
    pub fn to_json_list(&self) -> Value {
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": self.objects})
    }
}

/// Whether a driver attaches (`init`'s `attach` capability), or why that is not known. Asked
/// only for drivers of inline volumes: a PV converts the same either way.
pub type Attaches<'a> = dyn FnMut(&DriverName) -> Result<bool, String> + 'a;

/// Converts every document of `text` (YAML or JSON, `---`-separated, `kind: List` unpacked).
/// Either every object converts, or the refusals are returned and nothing else.
pub fn migrate(text: &str, attaches: &mut Attaches<'_>) -> Result<Migration, Vec<Refusal>> {
    let mut run = Run {
        attaches,
        migration: Migration::default(),
        refusals: Vec::new(),
        document: 0,
    };
    // JSON, as `kubectl get -o json` prints it: serde_json reads it in one linear pass, with
    // the same 128-level limit, where YAML would need the nesting check's scan and the parse's.
    // Anything serde_json does not take (YAML, several documents, a key given twice) is read
    // as YAML, which says what is wrong.
    if let Ok(unique_keys::UniqueKeys(value)) = serde_json::from_str(text) {
        run.document = 1;
        if !value.is_null() {
            run.object(value);
        }
        return run.finish();
    }
    // Before the parse, which would spend time quadratic in the nesting to refuse it.
    if let Err(deep) = nesting::check_flow_nesting(text, MAX_NESTING) {
        run.document = deep.document;
        run.refuse(
            "",
            None,
            Reason::TooDeep {
                line: deep.line,
                column: deep.column,
            },
        );
        return Err(run.refusals);
    }
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        run.document += 1;
        match unique_keys::UniqueKeys::deserialize(document).map(|v| v.0) {
            // An empty document (a leading or trailing `---`).
            Ok(Value::Null) => {}
            Ok(value) => run.object(value),
            Err(e) => {
                run.refuse("", None, Reason::NotYaml(e.to_string()));
                // The parser cannot resynchronise after a syntax error.
                break;
            }
        }
    }
    run.finish()
}

struct Run<'a, 'b> {
    attaches: &'a mut Attaches<'b>,
    migration: Migration,
    refusals: Vec<Refusal>,
    document: usize,
}

/// `Kind namespace/name` (or `Kind name`).
/// An object that runs pods: where its pod spec is, the only part migrated.
trait Workload {
    fn pod_spec(&mut self) -> Option<&mut PodSpec>;
}

impl Workload for Pod {
    fn pod_spec(&mut self) -> Option<&mut PodSpec> {
        self.spec.as_mut()
    }
}

/// The workloads whose pods come from `spec.template`.
macro_rules! templated_workloads {
    ($($kind:ty),*) => {
        $(impl Workload for $kind {
            fn pod_spec(&mut self) -> Option<&mut PodSpec> {
                self.spec.as_mut().and_then(|s| s.template.spec.as_mut())
            }
        })*
    };
}

templated_workloads!(Deployment, StatefulSet, DaemonSet, Job);

impl Workload for CronJob {
    fn pod_spec(&mut self) -> Option<&mut PodSpec> {
        self.spec
            .as_mut()
            .and_then(|s| s.job_template.spec.as_mut())
            .and_then(|s| s.template.spec.as_mut())
    }
}

fn describe(kind: &str, meta: &ObjectMeta) -> String {
    let name = meta.name.as_deref().unwrap_or("(no name)");
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{kind} {ns}/{name}"),
        _ => format!("{kind} {name}"),
    }
}

fn contains_flex_volume(value: &Value) -> bool {
    match value {
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| k == "flexVolume" || contains_flex_volume(v)),
        Value::Array(items) => items.iter().any(contains_flex_volume),
        _ => false,
    }
}

/// What `kubectl get -o yaml` adds that a new object must not carry (`kubectl create` refuses
/// a resourceVersion) or that describes the old object.
fn fresh_metadata(meta: &mut ObjectMeta) {
    meta.uid = None;
    meta.resource_version = None;
    meta.creation_timestamp = None;
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.generation = None;
    meta.managed_fields = None;
    meta.self_link = None;
    if let Some(annotations) = &mut meta.annotations {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

impl Run<'_, '_> {
    /// All or nothing: the objects when nothing was refused.
    fn finish(self) -> Result<Migration, Vec<Refusal>> {
        if self.refusals.is_empty() {
            Ok(self.migration)
        } else {
            Err(self.refusals)
        }
    }

    fn refuse(&mut self, object: &str, volume: Option<&str>, reason: Reason) {
        self.refusals.push(Refusal {
            document: self.document,
            object: object.to_owned(),
            volume: volume.map(str::to_owned),
            reason,
        });
    }

    /// A document that is not the `kind` it says it is.
    fn invalid(&mut self, object: &str, kind: &str, error: impl std::fmt::Display) {
        let error = error.to_string();
        let kind = kind.to_owned();
        self.refuse(object, None, Reason::Invalid { kind, error });
    }

    fn note(&mut self, object: &str, text: impl Into<String>) {
        self.migration.notes.push(Note {
            document: self.document,
            object: object.to_owned(),
            text: text.into(),
        });
    }

    fn object(&mut self, value: Value) {
        let api_version = value.get("apiVersion").and_then(Value::as_str);
        let kind = value.get("kind").and_then(Value::as_str);
        let (Some(api_version), Some(kind)) = (api_version, kind) else {
            return self.refuse("", None, Reason::NotAnObject);
        };
        let (api_version, kind) = (api_version.to_owned(), kind.to_owned());
        match (api_version.as_str(), kind.as_str()) {
            // `kubectl get -o yaml` prints a List; the API's own lists (PersistentVolumeList, …)
            // hold their items the same way.
            (_, list) if list.ends_with("List") => {
                let items = match value {
                    Value::Object(mut map) => map.remove("items"),
                    _ => None,
                };
                match items {
                    Some(Value::Array(items)) => items.into_iter().for_each(|i| self.object(i)),
                    None | Some(Value::Null) => {}
                    Some(_) => self.invalid(&kind, &kind, "items is not a list"),
                }
            }
            ("v1", "PersistentVolume") => self.typed(value, Self::persistent_volume),
            ("v1", "Pod") => self.typed(value, Self::workload::<Pod>),
            ("apps/v1", "Deployment") => self.typed(value, Self::workload::<Deployment>),
            ("apps/v1", "StatefulSet") => self.typed(value, Self::workload::<StatefulSet>),
            ("apps/v1", "DaemonSet") => self.typed(value, Self::workload::<DaemonSet>),
            ("batch/v1", "Job") => self.typed(value, Self::workload::<Job>),
            ("batch/v1", "CronJob") => self.typed(value, Self::workload::<CronJob>),
            _ => {
                let meta: ObjectMeta = value
                    .get("metadata")
                    .and_then(|m| serde_json::from_value(m.clone()).ok())
                    .unwrap_or_default();
                let what = describe(&kind, &meta);
                if !contains_flex_volume(&value) {
                    self.note(&what, "skipped: no flexVolume");
                } else if let Some(owner) = controller(&meta) {
                    self.note(&what, format!("skipped: owned by {owner}; migrate that"));
                } else {
                    self.refuse(&what, None, Reason::UnsupportedKind { kind });
                }
            }
        }
    }

    /// Parses `value` as `T`, converts it with `convert` (which says whether it changed
    /// anything, or pushed refusals), and keeps it if it changed.
    fn typed<T>(&mut self, value: Value, convert: impl FnOnce(&mut Self, &mut T, &str) -> bool)
    where
        T: DeserializeOwned + Serialize + k8s_openapi::Metadata<Ty = ObjectMeta>,
    {
        let kind = T::KIND;
        let meta: ObjectMeta = value
            .get("metadata")
            .and_then(|m| serde_json::from_value(m.clone()).ok())
            .unwrap_or_default();
        let what = describe(kind, &meta);
        let mut object: T = match serde_json::from_value(value) {
            Ok(object) => object,
            Err(e) => return self.invalid(&what, kind, e),
        };
        if let Some(owner) = controller(object.metadata()) {
            // Its controller recreates it from the owner's template.
            return self.note(&what, format!("skipped: owned by {owner}; migrate that"));
        }
        let refused = self.refusals.len();
        if !convert(self, &mut object, &what) {
            if self.refusals.len() == refused {
                self.note(&what, "skipped: no flexVolume");
            }
            return;
        }
        if self.refusals.len() > refused {
            return;
        }
        fresh_metadata(object.metadata_mut());
        let mut value = match serde_json::to_value(&object) {
            Ok(value) => value,
            Err(e) => return self.invalid(&what, kind, e),
        };
        // The old object's status says nothing true about the new one.
        if let Value::Object(map) = &mut value {
            map.remove("status");
        }
        self.migration.objects.push(value);
    }

    fn driver(
        &mut self,
        what: &str,
        volume: Option<&str>,
        driver: &str,
    ) -> Option<(DriverName, String)> {
        let name = match DriverName::parse(driver) {
            Ok(name) => name,
            Err(e) => {
                self.refuse(
                    what,
                    volume,
                    Reason::DriverName {
                        driver: driver.to_owned(),
                        reason: e.to_string(),
                    },
                );
                return None;
            }
        };
        match naming::csi_name(&name) {
            Ok(csi) => Some((name, csi)),
            Err(e) => {
                self.refuse(what, volume, e.into());
                None
            }
        }
    }

    /// The options as volume attributes, all of them (or refusals for those serve would drop).
    fn attributes(
        &mut self,
        what: &str,
        volume: Option<&str>,
        options: Option<BTreeMap<String, String>>,
    ) -> Option<Option<BTreeMap<String, String>>> {
        let options = options.unwrap_or_default();
        let mut ok = true;
        for key in options.keys().filter(|k| k.starts_with(K8S_CONTEXT_PREFIX)) {
            self.refuse(what, volume, Reason::ReservedOption { key: key.clone() });
            ok = false;
        }
        let len: usize = options.iter().map(|(k, v)| k.len() + v.len()).sum();
        if len > MAX_CONTEXT_BYTES - MAX_POD_INFO_BYTES {
            self.refuse(what, volume, Reason::OptionsTooLong { len });
            ok = false;
        }
        ok.then(|| (!options.is_empty()).then_some(options))
    }

    fn persistent_volume(&mut self, pv: &mut PersistentVolume, what: &str) -> bool {
        let Some(spec) = pv.spec.as_mut() else {
            return false;
        };
        let Some(flex) = spec.flex_volume.take() else {
            return false;
        };
        let Some(name) = pv.metadata.name.clone().filter(|n| !n.is_empty()) else {
            self.refuse(what, None, Reason::NoName);
            return true;
        };
        if spec.csi.is_some() {
            self.refuse(what, None, Reason::BothSources);
        }
        // Kubernetes names never hold `/` or control characters, which serve also refuses.
        if name.len() > MAX_VOLUME_HANDLE_BYTES {
            self.refuse(what, None, Reason::NameTooLong { len: name.len() });
        }
        if spec.volume_mode.as_deref() == Some("Block") {
            self.refuse(what, None, Reason::Block);
        }
        let driver = self.driver(what, None, &flex.driver);
        let attributes = self.attributes(what, None, flex.options);
        let secret = match flex.secret_ref {
            None => Some(None),
            Some(SecretReference { name: None, .. }) => {
                self.refuse(what, None, Reason::SecretWithoutName);
                None
            }
            Some(SecretReference {
                name: Some(secret),
                namespace,
            }) => {
                let claim_namespace = spec
                    .claim_ref
                    .as_ref()
                    .and_then(|c| c.namespace.clone())
                    .filter(|ns| !ns.is_empty());
                match (namespace.filter(|ns| !ns.is_empty()), claim_namespace) {
                    (Some(ns), _) => Some(Some((secret, ns))),
                    (None, Some(ns)) => {
                        self.note(
                            what,
                            format!(
                                "secret {secret:?} has no namespace: named in {ns:?}, its claim's namespace, where FlexVolume read it (the pod's)"
                            ),
                        );
                        Some(Some((secret, ns)))
                    }
                    (None, None) => {
                        self.refuse(what, None, Reason::SecretNamespaceUnknown { name: secret });
                        None
                    }
                }
            }
        };
        let (Some((driver, csi)), Some(volume_attributes), Some(secret)) =
            (driver, attributes, secret)
        else {
            return true;
        };
        // kubelet's CSI access mode is the PV's first; a reader-only one makes serve mount
        // read-only where FlexVolume went by readOnly alone.
        let first_mode = spec
            .access_modes
            .iter()
            .flatten()
            .next()
            .map(String::as_str);
        if first_mode == Some("ReadOnlyMany") && flex.read_only != Some(true) {
            self.note(
                what,
                "accessModes starts with ReadOnlyMany: the driver now gets kubernetes.io/readwrite ro",
            );
        }
        spec.csi = Some(CSIPersistentVolumeSource {
            driver: csi.clone(),
            volume_handle: name,
            fs_type: flex.fs_type,
            read_only: flex.read_only,
            volume_attributes,
            // mount is the only call-out FlexVolume gives secrets to, and serve hands it
            // NodePublishVolume's; attach gets none, so no controllerPublishSecretRef.
            node_publish_secret_ref: secret.map(|(name, namespace)| SecretReference {
                name: Some(name),
                namespace: Some(namespace),
            }),
            ..Default::default()
        });
        self.note(
            what,
            format!("migrated: driver {driver} is CSI driver {csi}"),
        );
        true
    }

    /// Converts the inline flexVolumes of a pod spec; false when it has none.
    fn workload<W: Workload>(&mut self, object: &mut W, what: &str) -> bool {
        self.pod_spec(object.pod_spec(), what)
    }

    fn pod_spec(&mut self, spec: Option<&mut PodSpec>, what: &str) -> bool {
        let Some(volumes) = spec.and_then(|s| s.volumes.as_mut()) else {
            return false;
        };
        let mut changed = false;
        for volume in volumes.iter_mut() {
            let Some(flex) = volume.flex_volume.take() else {
                continue;
            };
            changed = true;
            let name = volume.name.clone();
            let name = Some(name.as_str());
            if volume.csi.is_some() {
                self.refuse(what, name, Reason::BothSources);
            }
            let Some((driver, csi)) = self.driver(what, name, &flex.driver) else {
                continue;
            };
            match (self.attaches)(&driver) {
                Ok(false) => {}
                Ok(true) => {
                    self.refuse(
                        what,
                        name,
                        Reason::InlineAttaching {
                            driver: driver.to_string(),
                        },
                    );
                    continue;
                }
                Err(reason) => {
                    self.refuse(
                        what,
                        name,
                        Reason::UnknownAttach {
                            driver: driver.to_string(),
                            reason,
                        },
                    );
                    continue;
                }
            }
            let Some(volume_attributes) = self.attributes(what, name, flex.options) else {
                continue;
            };
            volume.csi = Some(CSIVolumeSource {
                driver: csi.clone(),
                fs_type: flex.fs_type,
                read_only: flex.read_only,
                volume_attributes,
                // A pod's secret, in the pod's namespace, as FlexVolume read it.
                node_publish_secret_ref: flex
                    .secret_ref
                    .map(|s| LocalObjectReference { name: s.name }),
            });
            // kubelet names an inline CSI volume itself, per pod (`csi-` and a hash of the pod
            // UID and the volume's name), and that is the volume id serve passes on.
            self.note(
                what,
                format!(
                    "migrated: volume {:?}: driver {driver} is CSI driver {csi}; its \
                     kubernetes.io/pvOrVolumeName becomes kubelet's per-pod volume id",
                    volume.name
                ),
            );
        }
        changed
    }
}

/// The controller that owns an object (`Kind name`), if any.
fn controller(meta: &ObjectMeta) -> Option<String> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| format!("{} {}", o.kind, o.name))
}
