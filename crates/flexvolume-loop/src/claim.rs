//! Which node a volume is attached to: its claim, `<imageDir>/.<volume>.claim`, holding that
//! node's name. In a cluster the image dir is shared storage, so the claim is what every node's
//! driver (and the controller's) sees; it is the only node-specific file the driver keeps
//! there. Loop devices are not: each node sets up its own (waitforattach, mountdevice).
//!
//! Every change is made holding the volume's lock, and is atomic (a temporary file renamed over
//! the claim, both fsync-ed): a reader sees the old claim or the new one, never half of one.
//! Neither is ever written through whatever another node planted at its name ([`files`]).

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use flexvolume_driver::{DriverError, DriverResult, ResultExt as _};

use crate::files;
use crate::volume::Volume;

/// Longest node name a claim holds (a Kubernetes node name is a DNS subdomain: 253).
pub const MAX_NODE_LEN: usize = 253;

/// A node name a claim can hold: 1-253 characters, none of them whitespace or a control
/// character (so the file's one line is the name, whatever reads it).
pub(crate) fn check_node(node: &str) -> DriverResult<()> {
    if usable_node(node) {
        Ok(())
    } else {
        Err(DriverError::invalid_argument(format!(
            "node name {node:?} is not usable: 1-{MAX_NODE_LEN} characters, no whitespace or \
             control characters"
        )))
    }
}

fn usable_node(node: &str) -> bool {
    !node.is_empty()
        && node.len() <= MAX_NODE_LEN
        && !node.chars().any(|c| c.is_whitespace() || c.is_control())
}

impl Volume {
    pub(crate) fn claim_path(&self) -> PathBuf {
        self.dir.join(format!(".{}.claim", self.name))
    }

    /// The node the claim names, or `None` when the volume is attached to no node. A claim
    /// that cannot be read, or that holds anything but one node name, is an error that says
    /// so: the driver never guesses who holds a volume.
    pub(crate) fn claimant(&self) -> DriverResult<Option<String>> {
        let path = self.claim_path();
        let text = match read_small_file(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(DriverError::failure(format!(
                    "cannot read the claim {} of volume {} (which node the volume is attached \
                     to): {e}; find out which node uses the volume, then remove the file (or \
                     write that node's name into it)",
                    path.display(),
                    self.name
                )))
            }
        };
        let node = text
            .as_deref()
            .map(|t| t.strip_suffix('\n').unwrap_or(t))
            .filter(|n| usable_node(n));
        match node {
            Some(node) => Ok(Some(node.to_owned())),
            None => Err(DriverError::failure(format!(
                "the claim {} of volume {} is corrupt: it holds {}, not a node name; find out \
                 which node uses the volume, then remove the file (or write that node's name \
                 into it)",
                path.display(),
                self.name,
                shown(text.as_deref())
            ))),
        }
    }

    /// Claims the volume for `node` (call holding the lock, after [`Volume::claimant`] said
    /// the volume is free or `node`'s already).
    pub(crate) fn claim_for(&self, node: &str) -> DriverResult<()> {
        check_node(node)?;
        let claim = self.claim_path();
        let written = files::write_atomically(
            &claim,
            &files::temp_beside(&claim),
            format!("{node}\n").as_bytes(),
            0o600,
        );
        if let Err(e) = written {
            return Err(DriverError::failure(format!(
                "cannot write the claim {} of volume {}: {e}",
                self.claim_path().display(),
                self.name
            )));
        }
        sync_dir(&self.dir)
    }

    /// Releases the claim (call holding the lock). Releasing no claim is done already.
    pub(crate) fn release_claim(&self) -> DriverResult<()> {
        match fs::remove_file(self.claim_path()) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(DriverError::failure(format!(
                "cannot remove the claim {} of volume {}: {e}",
                self.claim_path().display(),
                self.name
            ))),
        }
    }
}

/// The file's text (`None`: not UTF-8), read without following a symlink, from a regular file
/// only (a FIFO would block), and no more than a claim can hold.
fn read_small_file(path: &Path) -> io::Result<Option<String>> {
    let bytes = files::read_regular(path, MAX_NODE_LEN as u64 + 2)?;
    Ok(String::from_utf8(bytes).ok())
}

/// A claim's content as a message shows it: short, quoted, never raw bytes.
fn shown(text: Option<&str>) -> String {
    match text {
        None => "bytes that are not UTF-8".to_owned(),
        Some("") => "nothing".to_owned(),
        Some(text) => {
            let cut: String = text.chars().take(64).collect();
            let more = if cut.len() < text.len() { "…" } else { "" };
            format!("{cut:?}{more}")
        }
    }
}

/// Makes a rename or removal in `dir` durable.
fn sync_dir(dir: &Path) -> DriverResult<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .context(format_args!("cannot sync image dir {}", dir.display()))
}
