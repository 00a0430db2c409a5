//! Questions about the recorded volumes, answered from the records alone: where a volume is on
//! this node, and which nodes it is attached to. The CSI server asks them before it touches a
//! path or detaches; they are here, beside the records, so that every reader agrees on them.

use std::path::{Path, PathBuf};

use super::{Role, StateDir, StateError, VolumeRecord};
use flexvolume_os::mount::safe_path::{self, PathError};
use flexvolume_protocol::name::DriverName;

/// Why [`StateDir::volume_at`] has no record to answer with.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The volume has no stage or publish record here.
    #[error("volume {volume} is not staged or published on this node")]
    NotHere { volume: String },
    /// A relative path can name no recorded volume.
    #[error("volume {volume} is not at {path:?} (a relative path)")]
    Relative { volume: String, path: PathBuf },
    /// A path that could never name anything (NUL, `..`, over PATH_MAX).
    #[error(transparent)]
    Malformed(PathError),
    /// The volume is recorded, at other paths.
    #[error("volume {volume} is not at {}; flexd has it at {}", .path.display(), shown(.recorded))]
    Elsewhere {
        volume: String,
        path: PathBuf,
        recorded: Vec<PathBuf>,
    },
    #[error(transparent)]
    State(StateError),
}

fn shown(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl StateDir {
    /// The stage or publish record of `driver`'s volume `volume` at `path`. The path names a
    /// place to look the volume up, not one to create: an unrecorded volume or path is
    /// [`LookupError::NotHere`] or [`LookupError::Elsewhere`], never an error of the path.
    pub fn volume_at(
        &self,
        driver: &DriverName,
        volume: &str,
        path: &Path,
    ) -> Result<VolumeRecord, LookupError> {
        let mut here: Vec<VolumeRecord> = self
            .list()
            .map_err(LookupError::State)?
            .into_iter()
            .flatten()
            .filter(|r| r.driver == *driver && r.volume_name == volume && r.role != Role::Attach)
            .collect();
        if here.is_empty() {
            return Err(LookupError::NotHere {
                volume: volume.to_owned(),
            });
        }
        let normal = match safe_path::check(path) {
            Ok(normal) => normal,
            Err(PathError::NotAbsolute { .. }) => {
                return Err(LookupError::Relative {
                    volume: volume.to_owned(),
                    path: path.to_owned(),
                })
            }
            Err(e) => return Err(LookupError::Malformed(e)),
        };
        match here.iter().position(|r| r.target == normal) {
            Some(i) => Ok(here.swap_remove(i)),
            None => Err(LookupError::Elsewhere {
                volume: volume.to_owned(),
                path: normal,
                recorded: here.into_iter().map(|r| r.target).collect(),
            }),
        }
    }
}
