//! The plugin dir on disk: `<plugin-dir>/<vendor~driver>/<driver>`.
//!
//! Everything here reads the filesystem but decides nothing about *when* to read it; the prober
//! and the one-shot probe call it. Dot-names are invisible (atomic installs stage files as
//! `.<name>`), and an executable that resolves outside the plugin dir is refused unless the
//! operator allowed symlinks, so a writable subdirectory can never make us run `/tmp/evil`.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::name::{DriverName, NameError};

/// Default plugin dir of kubelet (`--volume-plugin-dir`).
pub const DEFAULT_PLUGIN_DIR: &str = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec";

/// How strictly the layout is read.
#[derive(Debug, Clone, Copy, Default)]
pub struct LayoutPolicy {
    /// Accept executables (or driver dirs) that are symlinks resolving outside the plugin dir.
    pub allow_symlinks: bool,
}

/// A driver executable located in the plugin dir: a valid name and an executable file. Not
/// yet run: once its `init` succeeded it is a [`crate::Plugin`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstalledDriver {
    pub name: DriverName,
    /// `<plugin-dir>/<vendor~driver>`
    pub dir: PathBuf,
    /// `<plugin-dir>/<vendor~driver>/<driver>`
    pub path: PathBuf,
}

/// Why a plugin-dir entry is not a usable driver.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LayoutError {
    #[error("{path}: a plain file at the top of the plugin dir; drivers live in <vendor~driver>/<driver>")]
    NotADirectory { path: PathBuf },
    #[error("{dir}: directory name is not a valid driver name: {source}")]
    BadName {
        dir: PathBuf,
        #[source]
        source: NameError,
    },
    #[error("{dir}: directory name is not valid UTF-8")]
    NotUtf8 { dir: PathBuf },
    #[error("{path}: missing; the driver executable must be named after the driver")]
    MissingExecutable { path: PathBuf },
    #[error("{path}: not a regular file")]
    NotAFile { path: PathBuf },
    #[error("{path}: not executable (mode {mode:o}); chmod +x it")]
    NotExecutable { path: PathBuf, mode: u32 },
    #[error("{path} resolves to {target}, outside the plugin dir {plugin_dir}; refused (flexd --allow-symlinks accepts it)")]
    Escapes {
        path: PathBuf,
        target: PathBuf,
        plugin_dir: PathBuf,
    },
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
}

impl LayoutError {
    fn io(path: &Path, e: &io::Error) -> Self {
        Self::Io {
            path: path.to_owned(),
            message: e.to_string(),
        }
    }
}

/// One visible entry of the plugin dir and what it turned out to be.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The entry's file name, e.g. `vendor~driver` (lossy if not UTF-8).
    pub dir_name: String,
    pub dir: PathBuf,
    /// The driver name the entry's file name stands for, read once here: whatever else is
    /// wrong with the entry, this is who it is reported as.
    pub name: Result<DriverName, NameError>,
    pub outcome: Result<InstalledDriver, LayoutError>,
}

/// Whether the prober must ignore this file name.
pub fn is_hidden(file_name: &std::ffi::OsStr) -> bool {
    file_name.as_encoded_bytes().first() == Some(&b'.')
}

/// Reads every visible top-level entry, sorted by name. Fails only if the plugin dir itself
/// cannot be read.
pub fn scan(plugin_dir: &Path, policy: LayoutPolicy) -> io::Result<Vec<Entry>> {
    let canonical_root = plugin_dir.canonicalize()?;
    let mut entries = Vec::new();
    for dirent in std::fs::read_dir(plugin_dir)? {
        let dirent = dirent?;
        let file_name = dirent.file_name();
        if is_hidden(&file_name) {
            continue;
        }
        entries.push(read_entry(plugin_dir, &canonical_root, &file_name, policy));
    }
    entries.sort_by(|a, b| a.dir_name.cmp(&b.dir_name));
    Ok(entries)
}

/// Reads one top-level entry by file name; `None` if it is hidden or does not exist (any more).
pub fn entry(
    plugin_dir: &Path,
    file_name: &std::ffi::OsStr,
    policy: LayoutPolicy,
) -> Option<Entry> {
    if is_hidden(file_name) {
        return None;
    }
    let canonical_root = plugin_dir.canonicalize().ok()?;
    std::fs::symlink_metadata(plugin_dir.join(file_name)).ok()?;
    Some(read_entry(plugin_dir, &canonical_root, file_name, policy))
}

/// Finds the driver for a name, for callers that know what they want (`flexd call`).
pub fn locate(
    plugin_dir: &Path,
    name: &DriverName,
    policy: LayoutPolicy,
) -> Result<InstalledDriver, LayoutError> {
    let dir_name = name.dir_name();
    let canonical_root = plugin_dir
        .canonicalize()
        .map_err(|e| LayoutError::io(plugin_dir, &e))?;
    let dir = plugin_dir.join(&dir_name);
    if let Err(e) = std::fs::symlink_metadata(&dir) {
        return Err(match e.kind() {
            io::ErrorKind::NotFound => LayoutError::MissingExecutable {
                path: dir.join(name.executable_name()),
            },
            _ => LayoutError::io(&dir, &e),
        });
    }
    read_entry(plugin_dir, &canonical_root, dir_name.as_ref(), policy).outcome
}

/// Checks a driver directory staged at `staged` (a hidden sibling inside the plugin dir) by
/// the rules discovery applies once it is renamed to `name`'s directory, so that an installer
/// refuses exactly what discovery would refuse, for the same reason. Errors name the final
/// paths, as discovery will.
pub fn check_staged(
    plugin_dir: &Path,
    staged: &Path,
    name: &DriverName,
    policy: LayoutPolicy,
) -> Result<InstalledDriver, LayoutError> {
    let canonical_root = plugin_dir
        .canonicalize()
        .map_err(|e| LayoutError::io(plugin_dir, &e))?;
    let dir_name = name.dir_name();
    let dir = plugin_dir.join(&dir_name);
    let rename = |path: PathBuf| match path.strip_prefix(staged) {
        Ok(rest) => dir.join(rest),
        Err(_) => path,
    };
    let outcome = check_entry(
        staged,
        std::ffi::OsStr::new(&dir_name),
        &Ok(name.clone()),
        &canonical_root,
        policy,
    );
    outcome
        .map(|driver| InstalledDriver {
            path: rename(driver.path),
            dir: dir.clone(),
            ..driver
        })
        .map_err(|error| match error {
            LayoutError::NotADirectory { path } => {
                LayoutError::NotADirectory { path: rename(path) }
            }
            LayoutError::BadName { dir, source } => LayoutError::BadName {
                dir: rename(dir),
                source,
            },
            LayoutError::NotUtf8 { dir } => LayoutError::NotUtf8 { dir: rename(dir) },
            LayoutError::MissingExecutable { path } => {
                LayoutError::MissingExecutable { path: rename(path) }
            }
            LayoutError::NotAFile { path } => LayoutError::NotAFile { path: rename(path) },
            LayoutError::NotExecutable { path, mode } => LayoutError::NotExecutable {
                path: rename(path),
                mode,
            },
            LayoutError::Escapes {
                path,
                target,
                plugin_dir,
            } => LayoutError::Escapes {
                path: rename(path),
                target: rename(target),
                plugin_dir,
            },
            LayoutError::Io { path, message } => LayoutError::Io {
                path: rename(path),
                message,
            },
        })
}

fn read_entry(
    plugin_dir: &Path,
    canonical_root: &Path,
    file_name: &std::ffi::OsStr,
    policy: LayoutPolicy,
) -> Entry {
    let dir = plugin_dir.join(file_name);
    let dir_name = file_name.to_string_lossy().into_owned();
    let name = DriverName::from_dir_name(&dir_name);
    let outcome = check_entry(&dir, file_name, &name, canonical_root, policy);
    Entry {
        dir_name,
        dir,
        name,
        outcome,
    }
}

fn check_entry(
    dir: &Path,
    file_name: &std::ffi::OsStr,
    name: &Result<DriverName, NameError>,
    canonical_root: &Path,
    policy: LayoutPolicy,
) -> Result<InstalledDriver, LayoutError> {
    let meta = std::fs::metadata(dir).map_err(|e| LayoutError::io(dir, &e))?;
    if !meta.is_dir() {
        return Err(LayoutError::NotADirectory {
            path: dir.to_owned(),
        });
    }
    if file_name.to_str().is_none() {
        return Err(LayoutError::NotUtf8 {
            dir: dir.to_owned(),
        });
    }
    let name = name.clone().map_err(|source| LayoutError::BadName {
        dir: dir.to_owned(),
        source,
    })?;
    let path = dir.join(name.executable_name());
    let meta = match std::fs::metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LayoutError::MissingExecutable { path })
        }
        Err(e) => return Err(LayoutError::io(&path, &e)),
    };
    if !meta.is_file() {
        return Err(LayoutError::NotAFile { path });
    }
    let mode = meta.permissions().mode();
    if mode & 0o111 == 0 {
        return Err(LayoutError::NotExecutable {
            path,
            mode: mode & 0o7777,
        });
    }
    if !policy.allow_symlinks {
        let target = path
            .canonicalize()
            .map_err(|e| LayoutError::io(&path, &e))?;
        if !target.starts_with(canonical_root) {
            return Err(LayoutError::Escapes {
                path,
                target,
                plugin_dir: canonical_root.to_owned(),
            });
        }
    }
    Ok(InstalledDriver {
        name,
        dir: dir.to_owned(),
        path,
    })
}
