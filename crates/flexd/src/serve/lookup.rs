//! Where a volume is on this node, from flexd's records: the answer NodeGetVolumeStats and
//! NodeExpandVolume need before they touch a path.
//!
//! Their `volume_path` names a place to look a volume up, not one to create: a volume flexd has
//! no stage or publish record of is NOT_FOUND, and so is a path the volume is not recorded at,
//! a relative one included (no volume can be there). Only a path that could never name
//! anything (NUL, `..`, over PATH_MAX) is INVALID_ARGUMENT.

use std::sync::Arc;

use flexvolume::lifecycle::Lifecycle;
use flexvolume::mount::safe_path::{self, PathError};
use flexvolume::state::{Role, VolumeRecord};
use flexvolume::DriverName;
use tonic::Status;

/// The record of `volume_id` at `volume_path` (a staging path or a target).
pub async fn volume_at(
    lifecycle: &Arc<Lifecycle>,
    driver: &DriverName,
    volume_id: &str,
    volume_path: &str,
) -> Result<VolumeRecord, Status> {
    let lc = lifecycle.clone();
    let driver = driver.clone();
    let id = volume_id.to_owned();
    let records = tokio::task::spawn_blocking(move || lc.state.list())
        .await
        .map_err(|e| Status::internal(format!("state lookup did not finish: {e}")))?
        .map_err(|e| Status::internal(format!("cannot read the state dir: {e}")))?;
    let mut here: Vec<VolumeRecord> = records
        .into_iter()
        .flatten()
        .filter(|r| r.driver == driver && r.volume_name == id && r.role != Role::Attach)
        .collect();
    if here.is_empty() {
        return Err(Status::not_found(format!(
            "volume {volume_id} is not staged or published on this node"
        )));
    }
    let normal = match safe_path::check(std::path::Path::new(volume_path)) {
        Ok(normal) => normal,
        Err(PathError::NotAbsolute { .. }) => {
            return Err(Status::not_found(format!(
                "volume {volume_id} is not at {volume_path:?} (a relative path)"
            )))
        }
        Err(e) => return Err(Status::invalid_argument(format!("volume_path: {e}"))),
    };
    match here.iter().position(|r| r.target == normal) {
        Some(i) => Ok(here.swap_remove(i)),
        None => Err(Status::not_found(format!(
            "volume {volume_id} is not at {}; flexd has it at {}",
            normal.display(),
            here.iter()
                .map(|r| r.target.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}
