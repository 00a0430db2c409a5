//! The controller records of replicas ([`flexvolume_host::controller_records`]) kept in the
//! API server: one `FlexdRecord` object (`flexd.io/v1alpha1`, in flexd's namespace) per volume,
//! which every replica reads whichever node is lost (docs/csi.md#controller-records).
//!
//! A store and nothing more: the rules (fences, keys checked) are the library's. An object's
//! name is a hash of its key (driver, volume); its `spec` is the record. A write names the
//! `resourceVersion` the caller read (`None`: a create) and a delete carries it as a
//! precondition, so a write decided on an out-of-date read is refused with a conflict; this
//! store remembers no version of its own. Listings are pages of [`PAGE_LIMIT`] objects at most,
//! each object's spec parsed on its own (a corrupt one is reported, not the whole page lost).
//!
//! The lifecycle calls from blocking threads: each call runs on the serving runtime and is
//! waited for there, within [`CALL_TIMEOUT`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use flexvolume_host::controller_records::{
    ControllerRecord, Page, RecordStore, RecordsError, Stored, Version,
};
use flexvolume_host::DriverName;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::core::object::{NotUsed, Object};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::value::RawValue;

pub use flexd::controller_records::{DEFAULT_CREDENTIALS, GROUP, KIND, PLURAL, VERSION};
/// A hash of the driver's name (a label value cannot hold every driver name).
pub const DRIVER_LABEL: &str = "flexd.io/driver";

/// How long one call to the API server may take before the operation fails (UNAVAILABLE) and
/// the CO retries it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// The most objects one listing asks the API server for: what a page costs in memory whatever
/// the number of records (ListVolumes' own pages are no larger).
pub const PAGE_LIMIT: usize = 500;

/// The records in the API server, checked to be readable before anything is served: a
/// missing CRD or permission fails the start, not the first attach.
pub async fn connect(credentials: &Path) -> anyhow::Result<KubernetesStore> {
    use anyhow::Context as _;
    let records = KubernetesStore::in_cluster(credentials)
        .await
        .context("cannot reach the controller records in the API server")?;
    records.check().await.context(
        "cannot list the controller records (is the FlexdRecord CRD installed, and may this controller list them?)",
    )?;
    tracing::info!(records = %records.describe(), "controller records are kept in the API server");
    Ok(records)
}

/// A `FlexdRecord` as read: the spec kept raw until it is parsed on its own.
type RawObject = Object<Box<RawValue>, NotUsed>;
/// A `FlexdRecord` as written.
type RecordObject = Object<ControllerRecord, NotUsed>;

#[derive(Debug)]
pub struct KubernetesStore {
    raw: Api<RawObject>,
    typed: Api<RecordObject>,
    resource: ApiResource,
    namespace: String,
    runtime: tokio::runtime::Handle,
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

/// The object name of a volume's record: `v-` and two hashes of the key (128 bits), since a
/// name cannot hold every volume id. A collision is caught where the record is read: its key
/// is not the one asked for, and the record is refused as corrupt, never overwritten.
fn object_name(driver: &str, volume: &str) -> String {
    let key = format!("{driver}\0{volume}");
    let reversed: Vec<u8> = key.bytes().rev().collect();
    format!("v-{:016x}{:016x}", fnv(key.as_bytes()), fnv(&reversed))
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

fn conflict(driver: &str, volume: &str) -> RecordsError {
    RecordsError::Conflict {
        what: format!("volume {volume} of driver {driver}"),
    }
}

impl KubernetesStore {
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
            raw: Api::namespaced_with(client.clone(), namespace, &resource),
            typed: Api::namespaced_with(client, namespace, &resource),
            resource,
            namespace: namespace.to_owned(),
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// Checks once, at start, that the records can be listed: a missing CRD or permission is
    /// an error at start rather than at the first attach.
    async fn check(&self) -> Result<(), RecordsError> {
        let params = ListParams::default().limit(1);
        match tokio::time::timeout(CALL_TIMEOUT, self.raw.list(&params)).await {
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
}

/// The record an object holds, with its version.
fn stored(object: &RawObject) -> Result<Stored, RecordsError> {
    let name = object.metadata.name.clone().unwrap_or_default();
    let corrupt = |message: String| RecordsError::Corrupt {
        what: format!("{PLURAL}/{name}"),
        message,
    };
    let record: ControllerRecord =
        serde_json::from_str(object.spec.get()).map_err(|e| corrupt(e.to_string()))?;
    let version = object
        .metadata
        .resource_version
        .clone()
        .ok_or_else(|| corrupt("it has no resourceVersion".to_owned()))?;
    Ok(Stored {
        version: Version(version),
        record,
    })
}

impl RecordStore for KubernetesStore {
    fn describe(&self) -> String {
        format!("{PLURAL}.{GROUP} in namespace {}", self.namespace)
    }

    fn read(&self, driver: &DriverName, volume: &str) -> Result<Option<Stored>, RecordsError> {
        let api = self.raw.clone();
        let name = object_name(driver.as_str(), volume);
        let object = self.wait(async move { api.get_opt(&name).await })?;
        object.as_ref().map(stored).transpose()
    }

    fn write(
        &self,
        record: &ControllerRecord,
        expected: Option<&Version>,
    ) -> Result<Version, RecordsError> {
        flexvolume_host::controller_records::check_name(&record.volume)?;
        let driver = DriverName::parse(&record.driver).map_err(|e| RecordsError::Corrupt {
            what: format!("of volume {}", record.volume),
            message: format!("driver name {:?}: {e}", record.driver),
        })?;
        let name = object_name(&record.driver, &record.volume);
        let mut object =
            RecordObject::new(&name, &self.resource, record.clone()).within(&self.namespace);
        object.metadata.labels = Some([(DRIVER_LABEL.to_owned(), driver_label(&driver))].into());
        let api = self.typed.clone();
        let written = match expected {
            Some(version) => {
                object.metadata.resource_version = Some(version.0.clone());
                self.wait(async move {
                    match api.replace(&name, &PostParams::default(), &object).await {
                        Err(e) if is_status(&e, 409) || is_status(&e, 404) => Ok(None),
                        other => other.map(Some),
                    }
                })?
            }
            None => self.wait(async move {
                match api.create(&PostParams::default(), &object).await {
                    Err(e) if is_status(&e, 409) => Ok(None),
                    other => other.map(Some),
                }
            })?,
        };
        match written.and_then(|o| o.metadata.resource_version) {
            Some(version) => Ok(Version(version)),
            None => Err(conflict(&record.driver, &record.volume)),
        }
    }

    fn delete(
        &self,
        driver: &DriverName,
        volume: &str,
        expected: &Version,
    ) -> Result<(), RecordsError> {
        let api = self.raw.clone();
        let name = object_name(driver.as_str(), volume);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(expected.0.clone()),
                uid: None,
            }),
            ..Default::default()
        };
        let deleted = self.wait(async move {
            match api.delete(&name, &params).await {
                Ok(_) => Ok(true),
                Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(false),
                Err(e) => Err(e),
            }
        })?;
        if deleted {
            Ok(())
        } else {
            Err(conflict(driver.as_str(), volume))
        }
    }

    fn page(
        &self,
        driver: &DriverName,
        from: Option<&str>,
        limit: usize,
    ) -> Result<Page, RecordsError> {
        let api = self.raw.clone();
        let limit = limit.clamp(1, PAGE_LIMIT) as u32;
        let mut params = ListParams::default()
            .labels(&format!("{DRIVER_LABEL}={}", driver_label(driver)))
            .limit(limit);
        if let Some(from) = from {
            params = params.continue_token(from);
        }
        let listed = self.wait(async move {
            match api.list(&params).await {
                // The continue token is too old (410) or not one the API server made (400).
                Err(e) if is_status(&e, 410) || is_status(&e, 400) => Ok(Err(e)),
                other => other.map(Ok),
            }
        })?;
        let list = listed.map_err(|e| RecordsError::Expired {
            message: match e {
                kube::Error::Api(status) => status.message,
                other => other.to_string(),
            },
        })?;
        Ok(Page {
            records: list.items.iter().map(stored).collect(),
            next: list.metadata.continue_.filter(|c| !c.is_empty()),
        })
    }
}

#[cfg(test)]
#[path = "kubernetes_records_tests.rs"]
mod api_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_are_valid_stable_and_distinct() {
        let a = object_name("acme/x", "pv-1");
        assert_eq!(a, object_name("acme/x", "pv-1"));
        assert_ne!(a, object_name("acme/x", "pv-2"));
        assert_ne!(a, object_name("acme/y", "pv-1"));
        // The separator keeps ("acme/x", "1") and ("acme/x1", "") apart.
        assert_ne!(object_name("acme/x", "1"), object_name("acme/x1", ""));
        for name in [a, object_name("acme/x", &"é".repeat(500))] {
            assert!(name.len() <= 63, "{name}");
            assert!(name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
        }
        let d = DriverName::parse("acme/x").unwrap();
        assert_eq!(driver_label(&d).len(), 16);
    }
}
