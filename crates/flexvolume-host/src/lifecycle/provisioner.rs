//! Dynamic provisioning: CSI CreateVolume / DeleteVolume as the `provision` / `delete`
//! call-outs of the Kubernetes flex provisioner's convention.
//!
//! `provision <json>` receives the StorageClass parameters, `kubernetes.io/pvOrVolumeName` (the
//! volume's name, which is also its CSI volume id) and the requested size (`requestBytes`,
//! `requestMiB`, `requestGiB`); its reply may carry `options`, which the volume keeps beside
//! the parameters as its flexVolume options (CSI: the volume context). `delete <json>`
//! receives those options.
//!
//! Every provisioned volume has a record under `<state-dir>/provisioned/<vendor~driver>/`,
//! written (atomically, fsync-ed) before the driver runs and marked done after. The record is
//! what makes CreateVolume idempotent across restarts (the same name and size is the same
//! volume; the same name with another size or other parameters is a conflict), what gives
//! ControllerPublish the options when the CO sends none, and what DeleteVolume deletes.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::{Lifecycle, LifecycleError};
use crate::plugin::Plugin;
use crate::runner::CallError;
use crate::state::{Role, StateError};
use flexvolume_protocol::name::DriverName;
use flexvolume_protocol::options::{is_host_key, Options};
use flexvolume_protocol::spec::VolumeSpec;
use flexvolume_protocol::{CallOut, ErrorCode};

/// Longest record file name built from a volume name; longer names are hashed.
const MAX_FILE_NAME: usize = 200;

/// A volume flexd provisioned, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProvisionedVolume {
    /// The CreateVolume name: the CSI volume id and `kubernetes.io/pvOrVolumeName`.
    pub name: String,
    pub driver: String,
    /// The size the driver reported making (`volumeNewSize` in its reply), else what was
    /// asked for (0: the driver's default size, which it did not report).
    pub capacity_bytes: u64,
    pub fs_type: String,
    /// The StorageClass parameters, as given.
    pub parameters: BTreeMap<String, String>,
    /// The volume's options: the parameters, overlaid with what `provision` replied.
    pub options: BTreeMap<String, String>,
    /// False from the moment the record is written until `provision` succeeded: a crash in
    /// between leaves a record that the next CreateVolume (or a DeleteVolume) completes.
    pub done: bool,
}

/// A CreateVolume.
pub struct ProvisionRequest<'a> {
    pub plugin: &'a Plugin,
    pub name: &'a str,
    /// 0: no size asked for (the driver picks its default).
    pub required_bytes: u64,
    /// 0: no limit.
    pub limit_bytes: u64,
    pub fs_type: &'a str,
    pub parameters: &'a BTreeMap<String, String>,
    /// Passed to the driver (base64, as mount gets them); never recorded.
    pub secrets: &'a BTreeMap<String, Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error("volume {name} already exists with {existing}; this request asks for {requested}")]
    Conflict {
        name: String,
        existing: String,
        requested: String,
    },
    #[error("volume {name} is still in use ({what}); unpublish it first")]
    InUse { name: String, what: String },
    /// A parameter under a key the host sets itself (see [`flexvolume_protocol::options::is_host_key`]).
    #[error("parameter {key:?} is flexd's own option (the volume's name, size or fsType, the pod, a secret); a StorageClass cannot set it")]
    HostKey { key: String },
}

impl From<StateError> for ProvisionError {
    fn from(e: StateError) -> Self {
        Self::Lifecycle(e.into())
    }
}

/// What a CreateVolume did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionOutcome {
    pub volume: ProvisionedVolume,
    /// False when the volume existed already (the driver was not called).
    pub provisioned_now: bool,
}

fn state_err(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `bytes` to `path` atomically: a temp file, fsync, rename, fsync of the directory.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    crate::state::create_private_dir_all(dir).map_err(state_err(dir))?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = crate::state::create_fresh(&temp)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        })
        .map_err(state_err(&temp))
        .and_then(|()| fs::rename(&temp, path).map_err(state_err(path)));
    if let Err(e) = written {
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    crate::state::open_dir(dir)
        .and_then(|d| d.sync_all())
        .map_err(state_err(dir))
}

impl ProvisionedVolume {
    /// The volume as a FlexVolume spec (for `delete`, attach, mount).
    pub fn spec(&self, driver: &DriverName) -> VolumeSpec {
        let mut spec = VolumeSpec::new(self.name.clone(), driver.clone());
        spec.fs_type = self.fs_type.clone();
        spec.options = self.options.clone();
        spec
    }

    /// Whether a repeated CreateVolume asks for this very volume.
    fn matches(&self, request: &ProvisionRequest<'_>) -> Result<(), String> {
        if &self.parameters != request.parameters {
            return Err("other parameters".to_owned());
        }
        if self.fs_type != request.fs_type {
            return Err(format!("fsType {:?}", self.fs_type));
        }
        let fits = (request.required_bytes == 0 || self.capacity_bytes >= request.required_bytes)
            && (request.limit_bytes == 0 || self.capacity_bytes <= request.limit_bytes);
        if !fits {
            return Err(format!("{} bytes", self.capacity_bytes));
        }
        Ok(())
    }
}

impl Lifecycle {
    /// Where the record of a provisioned volume lives.
    pub(crate) fn provisioned_path(
        &self,
        driver: &DriverName,
        name: &str,
    ) -> Result<PathBuf, LifecycleError> {
        let component = super::path_component(name)?;
        // `%h` never starts an escaped name (escapes are upper-case hex), so the two forms
        // cannot collide.
        let file = if component.len() <= MAX_FILE_NAME {
            component
        } else {
            format!("%h{:016x}", crate::state::stable_hash(name.as_bytes()))
        };
        Ok(self
            .state
            .root
            .join("provisioned")
            .join(driver.dir_name())
            .join(format!("{file}.json")))
    }

    /// The record of a volume flexd provisioned, if any.
    pub fn provisioned(
        &self,
        driver: &DriverName,
        name: &str,
    ) -> Result<Option<ProvisionedVolume>, LifecycleError> {
        let path = self.provisioned_path(driver, name)?;
        // The state dir's one reader of record files: never waits on a FIFO nor reads a link.
        let Some(bytes) = crate::state::read_record_file(&path)? else {
            return Ok(None);
        };
        let volume: ProvisionedVolume =
            serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
                path: path.clone(),
                message: e.to_string(),
            })?;
        // A hashed file name of another (over-long) name is not this volume.
        Ok(Some(volume).filter(|v| v.name == name && v.driver == driver.as_str()))
    }

    /// CSI CreateVolume: `provision`, recorded. A volume recorded as done under the same name
    /// is returned as it is when the request matches it, and is a conflict when it does not.
    ///
    /// A provision that did not finish blocks nothing: when the driver answered `Failure` its
    /// record goes at once; one cut short (a timeout, a crash) is completed by a matching
    /// retry, and deleted (`delete` with its options) before a retry that asks for another
    /// volume under the same name.
    pub fn provision(
        &self,
        request: &ProvisionRequest<'_>,
    ) -> Result<ProvisionOutcome, ProvisionError> {
        if let Some(key) = request.parameters.keys().find(|k| is_host_key(k)) {
            return Err(ProvisionError::HostKey { key: key.clone() });
        }
        let driver = &request.plugin.driver.name;
        let path = self.provisioned_path(driver, request.name)?;
        let lock = self.state.lock(&path)?;
        let lc = self.holding(&[&lock]);
        if let Some(existing) = self.provisioned(driver, request.name)? {
            match existing.matches(request) {
                Ok(()) if existing.done => {
                    return Ok(ProvisionOutcome {
                        volume: existing,
                        provisioned_now: false,
                    })
                }
                Ok(()) => {}
                Err(requested_other) if existing.done => {
                    return Err(ProvisionError::Conflict {
                        name: request.name.to_owned(),
                        existing: requested_other,
                        requested: describe(request),
                    })
                }
                // Half-made under other settings: whatever it left goes before the new one.
                Err(_) => delete_call(&lc, request.plugin, &existing, request.secrets)?,
            }
        }
        let mut volume = ProvisionedVolume {
            name: request.name.to_owned(),
            driver: driver.to_string(),
            capacity_bytes: request.required_bytes,
            fs_type: request.fs_type.to_owned(),
            parameters: request.parameters.clone(),
            options: request.parameters.clone(),
            done: false,
        };
        save(&path, &volume)?;
        let mut spec = volume.spec(driver);
        spec.secrets = request.secrets.clone();
        let options =
            Options::for_provision(&spec, Some(request.required_bytes).filter(|b| *b > 0));
        let reply = match request
            .plugin
            .call(&lc.runner, &CallOut::provision(&options))
        {
            Ok(reply) => reply,
            Err(e) => {
                // The driver answered: nothing was made, and nothing may block a corrected
                // retry. Anything else (a timeout) may have left a half-made volume.
                if matches!(e, CallError::Failure { .. }) {
                    remove_record(&path)?;
                }
                return Err(LifecycleError::from(e).into());
            }
        };
        // A driver's reply cannot set the host's own keys either.
        let replied = reply.options.unwrap_or_default();
        volume
            .options
            .extend(replied.into_iter().filter(|(k, _)| !is_host_key(k)));
        if let Some(bytes) = reply.volume_new_size.filter(|b| *b > 0) {
            volume.capacity_bytes = bytes;
        }
        volume.done = true;
        save(&path, &volume)?;
        Ok(ProvisionOutcome {
            volume,
            provisioned_now: true,
        })
    }

    /// CSI DeleteVolume: `delete` of a volume flexd provisioned, then its record goes. A
    /// volume flexd has no record of is gone already (success, `false`); one still attached,
    /// staged or published on this flexd is refused. A driver that answers `NotFound` has
    /// nothing left to delete.
    pub fn delete_provisioned(
        &self,
        plugin: &Plugin,
        name: &str,
        secrets: &BTreeMap<String, Vec<u8>>,
    ) -> Result<bool, ProvisionError> {
        let driver = &plugin.driver.name;
        let path = self.provisioned_path(driver, name)?;
        let lock = self.state.lock(&path)?;
        let lc = self.holding(&[&lock]);
        let Some(volume) = self.provisioned(driver, name)? else {
            return Ok(false);
        };
        let users: Vec<String> = self
            .state
            .list()?
            .into_iter()
            .flatten()
            .filter(|r| r.driver == *driver && r.volume_name == name)
            .map(|r| match r.role {
                Role::Attach => format!("attached to node {}", r.node),
                _ => format!("{:?} at {}", r.role, r.target.display()).to_lowercase(),
            })
            .collect();
        if !users.is_empty() {
            return Err(ProvisionError::InUse {
                name: name.to_owned(),
                what: users.join(", "),
            });
        }
        delete_call(&lc, plugin, &volume, secrets)?;
        remove_record(&path)?;
        Ok(true)
    }
}

/// The `delete` call-out of a recorded volume; `NotFound` is deleted already.
fn delete_call(
    lc: &Lifecycle,
    plugin: &Plugin,
    volume: &ProvisionedVolume,
    secrets: &BTreeMap<String, Vec<u8>>,
) -> Result<(), ProvisionError> {
    let mut spec = volume.spec(&plugin.driver.name);
    spec.secrets = secrets.clone();
    match plugin.call(
        &lc.runner,
        &CallOut::delete(&Options::for_provision(&spec, None)),
    ) {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some(ErrorCode::NotFound) => Ok(()),
        Err(e) => Err(LifecycleError::from(e).into()),
    }
}

fn remove_record(path: &Path) -> Result<(), StateError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(state_err(path)(e)),
    }
}

fn save(path: &Path, volume: &ProvisionedVolume) -> Result<(), StateError> {
    let json = serde_json::to_vec_pretty(volume).map_err(|e| StateError::Corrupt {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    write_atomic(path, &json)
}

fn describe(request: &ProvisionRequest<'_>) -> String {
    match (request.required_bytes, request.limit_bytes) {
        (0, 0) => "no particular size".to_owned(),
        (r, 0) => format!("at least {r} bytes"),
        (0, l) => format!("at most {l} bytes"),
        (r, l) => format!("{r} to {l} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(
        plugin: &'a Plugin,
        params: &'a BTreeMap<String, String>,
        secrets: &'a BTreeMap<String, Vec<u8>>,
        required: u64,
        limit: u64,
    ) -> ProvisionRequest<'a> {
        ProvisionRequest {
            plugin,
            name: "pvc-1",
            required_bytes: required,
            limit_bytes: limit,
            fs_type: "",
            parameters: params,
            secrets,
        }
    }

    #[test]
    fn a_repeat_matches_only_the_same_size_and_parameters() {
        let params = BTreeMap::from([("tier".to_owned(), "gold".to_owned())]);
        let volume = ProvisionedVolume {
            name: "pvc-1".into(),
            driver: "acme/x".into(),
            capacity_bytes: 1 << 30,
            fs_type: String::new(),
            parameters: params.clone(),
            options: params.clone(),
            done: true,
        };
        let driver = crate::layout::InstalledDriver {
            name: DriverName::parse("acme/x").unwrap(),
            path: PathBuf::from("/nonexistent"),
            dir: PathBuf::from("/nonexistent"),
        };
        let plugin = Plugin::from_init_reply(
            driver,
            &flexvolume_protocol::find_reply(br#"{"status":"Success"}"#).unwrap(),
        );
        let none = BTreeMap::new();
        assert!(volume
            .matches(&request(&plugin, &params, &none, 1 << 30, 0))
            .is_ok());
        assert!(volume
            .matches(&request(&plugin, &params, &none, 0, 0))
            .is_ok());
        assert!(volume
            .matches(&request(&plugin, &params, &none, 2 << 30, 0))
            .is_err());
        assert!(volume
            .matches(&request(&plugin, &params, &none, 0, 1 << 20))
            .is_err());
        let other = BTreeMap::new();
        assert!(volume
            .matches(&request(&plugin, &other, &none, 1 << 30, 0))
            .is_err());
    }

    #[test]
    fn record_names_are_safe_and_long_names_are_hashed() {
        let lc = Lifecycle {
            runner: Default::default(),
            state: crate::state::StateDir::new("/s"),
            node: "n".into(),
        };
        let driver = DriverName::parse("acme/x").unwrap();
        let short = lc.provisioned_path(&driver, "pvc-1").unwrap();
        assert_eq!(short, Path::new("/s/provisioned/acme~x/pvc-1.json"));
        let hostile = lc.provisioned_path(&driver, "../../etc/passwd").unwrap();
        assert!(hostile.starts_with("/s/provisioned/acme~x/"));
        assert_eq!(hostile.components().count(), short.components().count());
        let long = lc.provisioned_path(&driver, &"é".repeat(128)).unwrap();
        let file = long.file_name().unwrap().to_string_lossy().into_owned();
        assert!(file.starts_with("%h") && file.len() < 40, "{file}");
        assert!(lc.provisioned_path(&driver, "").is_err());
    }
}
