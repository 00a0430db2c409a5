//! The controller records of replicas ([`flexvolume_host::controller_records`]) kept in the
//! API server: one `FlexdRecord` object (`flexd.io/v1alpha1`, in flexd's namespace) per
//! attachment and per provisioned volume, which every replica reads whichever node is lost
//! (docs/csi.md#controller-records).
//!
//! An object's name is a hash of its key (record kind, driver, volume, node); the key itself is
//! in the object and checked on every read. Every write is made from the `resourceVersion`
//! this replica last read or wrote, so a write from an out-of-date read (another replica wrote
//! in between) is refused with a conflict, which the CO retries.
//!
//! The lifecycle calls from blocking threads: each call runs on the serving runtime and is
//! waited for there, within [`CALL_TIMEOUT`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use flexvolume_host::controller_records::{ControllerRecords, RecordsError};
use flexvolume_host::lifecycle::ProvisionedVolume;
use flexvolume_host::state::VolumeRecord;
use flexvolume_host::DriverName;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde::{Deserialize, Serialize};

pub use flexd::controller_records::{DEFAULT_CREDENTIALS, GROUP, KIND, PLURAL, VERSION};
/// Which kind of record an object is (`attachment` or `provisioned`).
pub const RECORD_LABEL: &str = "flexd.io/record";
/// A hash of the driver's name (a label value cannot hold every driver name).
pub const DRIVER_LABEL: &str = "flexd.io/driver";

/// How long one call to the API server may take before the operation fails (UNAVAILABLE) and
/// the CO retries it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// The records in the API server, checked to be readable before anything is served: a
/// missing CRD or permission fails the start, not the first attach.
pub async fn connect(credentials: &Path) -> anyhow::Result<KubernetesRecords> {
    use anyhow::Context as _;
    let records = KubernetesRecords::in_cluster(credentials)
        .await
        .context("cannot reach the controller records in the API server")?;
    records.check().await.context(
        "cannot list the controller records (is the FlexdRecord CRD installed, and may this controller list them?)",
    )?;
    tracing::info!(records = %records.describe(), "controller records are kept in the API server");
    Ok(records)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Attachment,
    Provisioned,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Attachment => "attachment",
            Kind::Provisioned => "provisioned",
        }
    }
}

/// What a `FlexdRecord` holds: its key and the record as the state dir would keep it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    record: String,
    driver: String,
    volume: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    node: String,
    /// The record's JSON, as the state dir writes it.
    data: serde_json::Value,
}

#[derive(Debug)]
pub struct KubernetesRecords {
    api: Api<DynamicObject>,
    resource: ApiResource,
    namespace: String,
    runtime: tokio::runtime::Handle,
    /// What this replica last read or wrote of each object, by object name.
    versions: Mutex<HashMap<String, Known>>,
}

/// An object as this replica last read or wrote it: its `resourceVersion`, the precondition of
/// its next write, and the label selector of its kind and driver, so that a listing of them
/// forgets the objects another replica deleted since (the map stays as big as the records).
#[derive(Debug, Clone, PartialEq)]
struct Known {
    version: String,
    selector: String,
}

/// The label selector of one kind of record of one driver.
fn selector(kind: &str, driver_label: &str) -> String {
    format!("{RECORD_LABEL}={kind},{DRIVER_LABEL}={driver_label}")
}

/// Forgets the objects of `selector` that a complete listing of it did not return.
fn forget_unlisted(known: &mut HashMap<String, Known>, selector: &str, listed: &[&str]) {
    known.retain(|name, k| k.selector != selector || listed.contains(&name.as_str()));
}

fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// A stable 64-bit FNV-1a: object names and label values must not change between versions.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn driver_label(driver: &DriverName) -> String {
    format!("{:016x}", fnv(driver.as_str().as_bytes()))
}

/// The object name of a key: its kind's initial and two hashes of the key (128 bits), since a
/// name cannot hold every volume id.
fn object_name(kind: Kind, driver: &DriverName, volume: &str, node: &str) -> String {
    let key = format!("{}\0{}\0{}\0{}", kind.as_str(), driver, volume, node);
    let reversed: Vec<u8> = key.bytes().rev().collect();
    format!(
        "{}-{:016x}{:016x}",
        &kind.as_str()[..1],
        fnv(key.as_bytes()),
        fnv(&reversed)
    )
}

fn unavailable(e: impl std::fmt::Display) -> RecordsError {
    RecordsError::Unavailable {
        store: "API server".to_owned(),
        message: e.to_string(),
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == code)
}

impl KubernetesRecords {
    /// A client of the API server at `$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT` (as
    /// every in-cluster client finds it) with the credentials in `credentials`.
    pub async fn in_cluster(credentials: &Path) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let host = std::env::var("KUBERNETES_SERVICE_HOST").context(
            "KUBERNETES_SERVICE_HOST is not set: --controller-records=kubernetes runs in a pod",
        )?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".to_owned());
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let file = |name: &str| -> anyhow::Result<PathBuf> {
            let path = credentials.join(name);
            anyhow::ensure!(
                path.is_file(),
                "{} is missing: the controller's records credentials (flexd manifests mounts them)",
                path.display()
            );
            Ok(path)
        };
        let namespace = std::fs::read_to_string(file("namespace")?)
            .with_context(|| format!("reading {}", credentials.join("namespace").display()))?
            .trim()
            .to_owned();
        anyhow::ensure!(
            !namespace.is_empty(),
            "{}/namespace is empty",
            credentials.display()
        );
        let kubeconfig = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "in-cluster", "cluster": {
                "server": format!("https://{host}:{port}"),
                "certificate-authority": file("ca.crt")?,
            }}],
            "users": [{"name": "flexd", "user": {"tokenFile": file("token")?}}],
            "contexts": [{"name": "flexd", "context": {
                "cluster": "in-cluster", "user": "flexd", "namespace": namespace,
            }}],
            "current-context": "flexd",
        });
        let kubeconfig: kube::config::Kubeconfig =
            serde_json::from_value(kubeconfig).context("building the in-cluster kubeconfig")?;
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .context("configuring the API server client")?;
        config.connect_timeout = Some(CALL_TIMEOUT);
        config.read_timeout = Some(CALL_TIMEOUT);
        let client = kube::Client::try_from(config).context("making the API server client")?;
        Ok(Self::new(client, &namespace))
    }

    pub fn new(client: kube::Client, namespace: &str) -> Self {
        let resource = resource();
        Self {
            api: Api::namespaced_with(client, namespace, &resource),
            resource,
            namespace: namespace.to_owned(),
            runtime: tokio::runtime::Handle::current(),
            versions: Mutex::default(),
        }
    }

    /// Checks once, at start, that the records can be listed: a missing CRD or permission is
    /// an error at start rather than at the first attach.
    async fn check(&self) -> Result<(), RecordsError> {
        let params = ListParams::default().limit(1);
        match tokio::time::timeout(CALL_TIMEOUT, self.api.list(&params)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(unavailable(e)),
            Err(_) => Err(unavailable(format!(
                "no answer within {}s",
                CALL_TIMEOUT.as_secs()
            ))),
        }
    }

    /// Runs an API call on the serving runtime and waits for it (from a blocking thread).
    fn wait<T: Send + 'static>(
        &self,
        call: impl std::future::Future<Output = Result<T, kube::Error>> + Send + 'static,
    ) -> Result<T, RecordsError> {
        let task = self
            .runtime
            .spawn(async move { tokio::time::timeout(CALL_TIMEOUT, call).await });
        match self.runtime.block_on(task) {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(e))) => Err(unavailable(e)),
            Ok(Err(_)) => Err(unavailable(format!(
                "no answer within {}s",
                CALL_TIMEOUT.as_secs()
            ))),
            Err(e) => Err(unavailable(e)),
        }
    }

    fn versions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Known>> {
        self.versions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `resourceVersion` this replica last read or wrote of the object.
    fn version(&self, name: &str) -> Option<String> {
        self.versions().get(name).map(|k| k.version.clone())
    }

    fn remember(&self, object: &DynamicObject) {
        let labels = object.metadata.labels.as_ref();
        let label = |key: &str| labels.and_then(|l| l.get(key)).map_or("", String::as_str);
        if let (Some(name), Some(version)) =
            (&object.metadata.name, &object.metadata.resource_version)
        {
            let selector = selector(label(RECORD_LABEL), label(DRIVER_LABEL));
            self.versions().insert(
                name.clone(),
                Known {
                    version: version.clone(),
                    selector,
                },
            );
        }
    }

    fn read(&self, name: &str) -> Result<Option<Spec>, RecordsError> {
        let api = self.api.clone();
        let owned = name.to_owned();
        let object = self.wait(async move { api.get_opt(&owned).await })?;
        match object {
            None => {
                self.versions().remove(name);
                Ok(None)
            }
            Some(object) => {
                self.remember(&object);
                spec_of(&object).map(Some)
            }
        }
    }

    fn write(
        &self,
        name: &str,
        kind: Kind,
        driver: &DriverName,
        spec: Spec,
    ) -> Result<(), RecordsError> {
        let mut object = DynamicObject::new(name, &self.resource).within(&self.namespace);
        object.metadata.labels = Some(
            [
                (RECORD_LABEL.to_owned(), kind.as_str().to_owned()),
                (DRIVER_LABEL.to_owned(), driver_label(driver)),
            ]
            .into(),
        );
        object.data = serde_json::json!({ "spec": spec });
        let known = self.version(name);
        let api = self.api.clone();
        let owned = name.to_owned();
        let written = match known {
            Some(version) => {
                object.metadata.resource_version = Some(version);
                self.wait(async move {
                    match api.replace(&owned, &PostParams::default(), &object).await {
                        Err(e) if is_status(&e, 409) || is_status(&e, 404) => Ok(Err(e)),
                        other => other.map(Ok),
                    }
                })?
            }
            None => self.wait(async move {
                match api.create(&PostParams::default(), &object).await {
                    Err(e) if is_status(&e, 409) => Ok(Err(e)),
                    other => other.map(Ok),
                }
            })?,
        };
        match written {
            Ok(object) => {
                self.remember(&object);
                Ok(())
            }
            Err(_) => {
                // Read again before the next write: the retry works from what is there now.
                self.versions().remove(name);
                Err(RecordsError::Conflict {
                    what: describe(kind, driver, &spec.volume, &spec.node),
                })
            }
        }
    }

    fn delete(
        &self,
        name: &str,
        kind: Kind,
        driver: &DriverName,
        volume: &str,
        node: &str,
    ) -> Result<(), RecordsError> {
        let known = self.version(name);
        let api = self.api.clone();
        let owned = name.to_owned();
        let params = DeleteParams {
            preconditions: known.map(|version| Preconditions {
                resource_version: Some(version),
                uid: None,
            }),
            ..Default::default()
        };
        let deleted = self.wait(async move {
            match api.delete(&owned, &params).await {
                Ok(_) => Ok(Ok(())),
                Err(e) if is_status(&e, 404) => Ok(Ok(())),
                Err(e) if is_status(&e, 409) => Ok(Err(e)),
                Err(e) => Err(e),
            }
        })?;
        self.versions().remove(name);
        deleted.map_err(|_| RecordsError::Conflict {
            what: describe(kind, driver, volume, node),
        })
    }

    fn list(
        &self,
        kind: Kind,
        driver: &DriverName,
    ) -> Result<Vec<Result<Spec, RecordsError>>, RecordsError> {
        let api = self.api.clone();
        let selector = selector(kind.as_str(), &driver_label(driver));
        let params = ListParams::default().labels(&selector);
        let list = self.wait(async move { api.list(&params).await })?;
        let listed: Vec<&str> = list
            .items
            .iter()
            .filter_map(|object| object.metadata.name.as_deref())
            .collect();
        forget_unlisted(&mut self.versions(), &selector, &listed);
        Ok(list
            .items
            .iter()
            .map(|object| {
                self.remember(object);
                spec_of(object)
            })
            // Another driver whose name hashes alike is not this one's.
            .filter(|spec| spec.as_ref().map_or(true, |s| s.driver == driver.as_str()))
            .collect())
    }
}

fn describe(kind: Kind, driver: &DriverName, volume: &str, node: &str) -> String {
    match kind {
        Kind::Attachment => format!("volume {volume} of driver {driver} attached to node {node}"),
        Kind::Provisioned => format!("provisioned volume {volume} of driver {driver}"),
    }
}

fn spec_of(object: &DynamicObject) -> Result<Spec, RecordsError> {
    let name = object.metadata.name.clone().unwrap_or_default();
    serde_json::from_value(object.data.get("spec").cloned().unwrap_or_default()).map_err(|e| {
        RecordsError::Corrupt {
            what: format!("{PLURAL}/{name}"),
            message: e.to_string(),
        }
    })
}

/// The record a spec holds, checked to be the one asked for (a hash collision is not).
fn data<T: serde::de::DeserializeOwned>(
    spec: Spec,
    kind: Kind,
    driver: &DriverName,
    volume: &str,
    node: &str,
) -> Result<Option<T>, RecordsError> {
    if spec.record != kind.as_str()
        || spec.driver != driver.as_str()
        || spec.volume != volume
        || spec.node != node
    {
        return Ok(None);
    }
    serde_json::from_value(spec.data)
        .map(Some)
        .map_err(|e| RecordsError::Corrupt {
            what: describe(kind, driver, volume, node),
            message: e.to_string(),
        })
}

fn listed<T: serde::de::DeserializeOwned>(
    spec: Result<Spec, RecordsError>,
    kind: Kind,
) -> Option<Result<T, RecordsError>> {
    let spec = match spec {
        Ok(spec) if spec.record == kind.as_str() => spec,
        Ok(_) => return None,
        Err(e) => return Some(Err(e)),
    };
    let what = format!(
        "{} {} of driver {}",
        kind.as_str(),
        spec.volume,
        spec.driver
    );
    Some(
        serde_json::from_value(spec.data).map_err(|e| RecordsError::Corrupt {
            what,
            message: e.to_string(),
        }),
    )
}

fn to_value<T: Serialize>(record: &T) -> Result<serde_json::Value, RecordsError> {
    serde_json::to_value(record).map_err(|e| RecordsError::Corrupt {
        what: "a record to write".to_owned(),
        message: e.to_string(),
    })
}

impl ControllerRecords for KubernetesRecords {
    fn describe(&self) -> String {
        format!("{PLURAL}.{GROUP} in namespace {}", self.namespace)
    }

    fn attachment(
        &self,
        driver: &DriverName,
        volume: &str,
        node: &str,
    ) -> Result<Option<VolumeRecord>, RecordsError> {
        let name = object_name(Kind::Attachment, driver, volume, node);
        match self.read(&name)? {
            Some(spec) => data(spec, Kind::Attachment, driver, volume, node),
            None => Ok(None),
        }
    }

    fn save_attachment(&self, record: &VolumeRecord) -> Result<(), RecordsError> {
        let name = object_name(
            Kind::Attachment,
            &record.driver,
            &record.volume_name,
            &record.node,
        );
        let spec = Spec {
            record: Kind::Attachment.as_str().to_owned(),
            driver: record.driver.to_string(),
            volume: record.volume_name.clone(),
            node: record.node.clone(),
            data: to_value(record)?,
        };
        self.write(&name, Kind::Attachment, &record.driver, spec)
    }

    fn remove_attachment(
        &self,
        driver: &DriverName,
        volume: &str,
        node: &str,
    ) -> Result<(), RecordsError> {
        let name = object_name(Kind::Attachment, driver, volume, node);
        self.delete(&name, Kind::Attachment, driver, volume, node)
    }

    fn attachments(
        &self,
        driver: &DriverName,
    ) -> Result<Vec<Result<VolumeRecord, RecordsError>>, RecordsError> {
        Ok(self
            .list(Kind::Attachment, driver)?
            .into_iter()
            .filter_map(|spec| listed(spec, Kind::Attachment))
            .collect())
    }

    fn provisioned(
        &self,
        driver: &DriverName,
        name: &str,
    ) -> Result<Option<ProvisionedVolume>, RecordsError> {
        let object = object_name(Kind::Provisioned, driver, name, "");
        match self.read(&object)? {
            Some(spec) => data(spec, Kind::Provisioned, driver, name, ""),
            None => Ok(None),
        }
    }

    fn save_provisioned(
        &self,
        driver: &DriverName,
        volume: &ProvisionedVolume,
    ) -> Result<(), RecordsError> {
        let name = object_name(Kind::Provisioned, driver, &volume.name, "");
        let spec = Spec {
            record: Kind::Provisioned.as_str().to_owned(),
            driver: driver.to_string(),
            volume: volume.name.clone(),
            node: String::new(),
            data: to_value(volume)?,
        };
        self.write(&name, Kind::Provisioned, driver, spec)
    }

    fn remove_provisioned(&self, driver: &DriverName, name: &str) -> Result<(), RecordsError> {
        let object = object_name(Kind::Provisioned, driver, name, "");
        self.delete(&object, Kind::Provisioned, driver, name, "")
    }

    fn all_provisioned(
        &self,
        driver: &DriverName,
    ) -> Result<Vec<Result<ProvisionedVolume, RecordsError>>, RecordsError> {
        Ok(self
            .list(Kind::Provisioned, driver)?
            .into_iter()
            .filter_map(|spec| listed(spec, Kind::Provisioned))
            .collect())
    }
}

#[cfg(test)]
#[path = "kubernetes_records_tests.rs"]
mod api_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_forgets_only_its_own_unlisted_objects() {
        let attachments = selector("attachment", "aaaa");
        let known = |version: &str, selector: &str| Known {
            version: version.into(),
            selector: selector.into(),
        };
        let mut map = HashMap::from([
            ("kept".to_owned(), known("1", &attachments)),
            ("deleted-elsewhere".to_owned(), known("2", &attachments)),
            (
                "provisioned".to_owned(),
                known("3", &selector("provisioned", "aaaa")),
            ),
            (
                "other-driver".to_owned(),
                known("4", &selector("attachment", "bbbb")),
            ),
        ]);
        forget_unlisted(&mut map, &attachments, &["kept", "new-elsewhere"]);
        let mut left: Vec<&str> = map.keys().map(String::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["kept", "other-driver", "provisioned"]);
        assert_eq!(map["kept"], known("1", &attachments));
    }

    #[test]
    fn object_names_are_valid_stable_and_distinct() {
        let d = DriverName::parse("acme/x").unwrap();
        let a = object_name(Kind::Attachment, &d, "pv-1", "node-a");
        assert_eq!(a, object_name(Kind::Attachment, &d, "pv-1", "node-a"));
        assert_ne!(a, object_name(Kind::Attachment, &d, "pv-1", "node-b"));
        assert_ne!(a, object_name(Kind::Provisioned, &d, "pv-1", "node-a"));
        // The separators keep ("pv-1", "") and ("pv-", "1") apart.
        assert_ne!(
            object_name(Kind::Provisioned, &d, "pv-1", ""),
            object_name(Kind::Provisioned, &d, "pv-", "1")
        );
        for name in [a, object_name(Kind::Provisioned, &d, &"é".repeat(500), "")] {
            assert!(name.len() <= 63, "{name}");
            assert!(name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
        }
        assert_eq!(driver_label(&d).len(), 16);
    }

    #[test]
    fn a_record_under_another_key_is_not_the_one_asked_for() {
        let d = DriverName::parse("acme/x").unwrap();
        let spec = Spec {
            record: "provisioned".into(),
            driver: "acme/x".into(),
            volume: "pvc-1".into(),
            node: String::new(),
            data: serde_json::json!({"not": "read"}),
        };
        let other: Option<ProvisionedVolume> =
            data(spec.clone(), Kind::Provisioned, &d, "pvc-2", "").unwrap();
        assert!(other.is_none());
        let corrupt = data::<ProvisionedVolume>(spec, Kind::Provisioned, &d, "pvc-1", "");
        assert!(matches!(corrupt, Err(RecordsError::Corrupt { .. })));
    }
}
