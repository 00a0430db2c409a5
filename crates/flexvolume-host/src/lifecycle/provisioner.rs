//! Dynamic provisioning: CSI CreateVolume / DeleteVolume as the `provision` / `delete`
//! call-outs of the Kubernetes flex provisioner's convention.
//!
//! `provision <json>` receives the StorageClass parameters, `kubernetes.io/pvOrVolumeName` (the
//! volume's name, which is also its CSI volume id) and the requested size (`requestBytes`,
//! `requestMiB`, `requestGiB`); its reply may carry `options`, which the volume keeps beside
//! the parameters as its flexVolume options (CSI: the volume context). `delete <json>`
//! receives those options.
//!
//! Every provisioned volume has a controller record ([`crate::controller_records`]), written
//! before the driver runs and marked done after. The record is what makes CreateVolume
//! idempotent across restarts and replicas (the same name and size is the same volume; the
//! same name with another size or other parameters is a conflict), what gives
//! ControllerPublish the options when the CO sends none, and what DeleteVolume deletes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{Lifecycle, LifecycleError};
use crate::plugin::Plugin;
use crate::runner::CallError;
use crate::state::{Role, StateError};
use flexvolume_protocol::name::DriverName;
use flexvolume_protocol::options::{is_host_key, Options};
use flexvolume_protocol::spec::VolumeSpec;
use flexvolume_protocol::{CallOut, ErrorCode};

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
    /// The name a provisioned volume's record is locked (and, in the state dir, kept) under.
    pub(crate) fn provisioned_path(
        &self,
        driver: &DriverName,
        name: &str,
    ) -> Result<PathBuf, LifecycleError> {
        Ok(crate::controller_records::provisioned_path(
            &self.state.root,
            driver,
            name,
        )?)
    }

    /// The record of a volume flexd provisioned, if any.
    pub fn provisioned(
        &self,
        driver: &DriverName,
        name: &str,
    ) -> Result<Option<ProvisionedVolume>, LifecycleError> {
        Ok(self.controller_records.provisioned(driver, name)?)
    }

    /// CSI CreateVolume: `provision`, under the volume's fence, recorded. A volume recorded as
    /// done under the same name is returned as it is when the request matches it, and is a
    /// conflict when it does not.
    ///
    /// A provision that did not finish blocks nothing: when the driver answered `Failure` its
    /// record goes at once; one cut short (a timeout, a crash, a fence lost) is completed by a
    /// matching retry, and deleted (`delete` with its options) before a retry that asks for
    /// another volume under the same name. Another replica's provision in flight holds the
    /// fence: this one is refused until it ends, never run beside it.
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
        let records = &self.controller_records;
        // Made already, and no call in flight: answered from the record alone.
        if let Some(existing) = records
            .read(driver, request.name)
            .map_err(LifecycleError::from)?
            .filter(|s| s.record.fence.is_none())
            .and_then(|s| s.record.provisioned)
            .filter(|v| v.done)
        {
            return match existing.matches(request) {
                Ok(()) => Ok(ProvisionOutcome {
                    volume: existing,
                    provisioned_now: false,
                }),
                Err(requested_other) => Err(ProvisionError::Conflict {
                    name: request.name.to_owned(),
                    existing: requested_other,
                    requested: describe(request),
                }),
            };
        }
        let fence = records
            .fence(driver, request.name, "provision")
            .map_err(LifecycleError::from)?;
        let lc = self.fenced(&[&lock], &fence);
        if let Some(existing) = fence.record().provisioned {
            match existing.matches(request) {
                Ok(()) if existing.done => {
                    fence.release().map_err(LifecycleError::from)?;
                    return Ok(ProvisionOutcome {
                        volume: existing,
                        provisioned_now: false,
                    });
                }
                Ok(()) => {}
                Err(requested_other) if existing.done => {
                    fence.release().map_err(LifecycleError::from)?;
                    return Err(ProvisionError::Conflict {
                        name: request.name.to_owned(),
                        existing: requested_other,
                        requested: describe(request),
                    });
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
        fence
            .update(|r| r.provisioned = Some(volume.clone()))
            .map_err(LifecycleError::from)?;
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
                    fence
                        .release_with(|r| r.provisioned = None)
                        .map_err(LifecycleError::from)?;
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
        fence
            .release_with(|r| r.provisioned = Some(volume.clone()))
            .map_err(LifecycleError::from)?;
        Ok(ProvisionOutcome {
            volume,
            provisioned_now: true,
        })
    }

    /// CSI DeleteVolume: `delete` of a volume flexd provisioned, under its fence, then its
    /// record goes. A volume flexd has no record of is gone already (success, `false`); one
    /// still attached (its record says where), staged or published on this flexd is refused.
    /// A driver that answers `NotFound` has nothing left to delete.
    pub fn delete_provisioned(
        &self,
        plugin: &Plugin,
        name: &str,
        secrets: &BTreeMap<String, Vec<u8>>,
    ) -> Result<bool, ProvisionError> {
        let driver = &plugin.driver.name;
        let records = &self.controller_records;
        match records.read(driver, name).map_err(LifecycleError::from)? {
            Some(s) if s.record.provisioned.is_some() || s.record.fence.is_some() => {}
            _ => return Ok(false),
        }
        let path = self.provisioned_path(driver, name)?;
        let lock = self.state.lock(&path)?;
        let fence = records
            .fence(driver, name, "delete")
            .map_err(LifecycleError::from)?;
        let lc = self.fenced(&[&lock], &fence);
        let record = fence.record();
        let Some(volume) = record.provisioned.clone() else {
            fence.release().map_err(LifecycleError::from)?;
            return Ok(false);
        };
        // Attached anywhere (the volume's record), or staged or published by this flexd.
        let local = self.state.list()?;
        let users: Vec<String> = record
            .attachments
            .values()
            .cloned()
            .chain(local.into_iter().flatten())
            .filter(|r| r.driver == *driver && r.volume_name == name)
            .map(|r| match r.role {
                Role::Attach => format!("attached to node {}", r.node),
                _ => format!("{:?} at {}", r.role, r.target.display()).to_lowercase(),
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !users.is_empty() {
            fence.release().map_err(LifecycleError::from)?;
            return Err(ProvisionError::InUse {
                name: name.to_owned(),
                what: users.join(", "),
            });
        }
        delete_call(&lc, plugin, &volume, secrets)?;
        fence
            .release_with(|r| r.provisioned = None)
            .map_err(LifecycleError::from)?;
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
}
