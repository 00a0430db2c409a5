//! Atomic driver installation (docs/discovery.md#installation).
//!
//! A driver must never be executed half-written, nor a driver directory seen half-updated:
//! - a single executable is copied to `.<driver>` beside its final name (dot-names are invisible
//!   to the prober), fsync-ed, then renamed over `<driver>`: readers see the old or the new file;
//! - a whole directory (driver plus helper files) is staged as a hidden sibling of the driver
//!   directory and swapped in with `renameat2(RENAME_EXCHANGE)`: readers see the whole old set or
//!   the whole new set. On filesystems without RENAME_EXCHANGE the old directory is renamed away
//!   first, so for a moment the driver is absent (a remove and an add), never mixed;
//! - uninstall renames the directory to a hidden name first, so the prober sees one removal, then
//!   deletes it.
//!
//! Nothing is written through a symlink: the driver directory and the staged names are opened
//! with `O_NOFOLLOW` semantics, and an existing driver directory that is a symlink is refused.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{RenameFlags, CWD};

use crate::layout::{LayoutError, LayoutPolicy};
use flexvolume_protocol::name::DriverName;

/// Why an installation or removal did not happen. The live driver is untouched in every case.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("source {path}: {source}")]
    Source {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("source {path} is not executable (mode {mode:o}); a driver must be")]
    SourceNotExecutable { path: PathBuf, mode: u32 },
    #[error("source directory {path} has no executable named {executable:?}; a driver directory must contain it")]
    SourceMissingExecutable { path: PathBuf, executable: String },
    #[error("source {path} is neither a file nor a directory")]
    SourceKind { path: PathBuf },
    #[error(
        "{path} exists and is not a directory (or is a symlink); refusing to install through it"
    )]
    TargetNotADirectory { path: PathBuf },
    /// What was staged is not a driver discovery would accept (an executable that is a symlink
    /// resolving outside the plugin dir, not executable, missing...): discovery's own reason.
    #[error("{0}; discovery would refuse it, so it was not installed")]
    Refused(#[source] LayoutError),
    #[error("driver {name} is not installed in {plugin_dir}")]
    NotInstalled {
        name: DriverName,
        plugin_dir: PathBuf,
    },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> InstallError + 'a {
    move |source| InstallError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// What was installed where.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Installed {
    pub name: DriverName,
    /// `<plugin-dir>/<vendor~driver>`
    pub dir: PathBuf,
    /// `<plugin-dir>/<vendor~driver>/<driver>`
    pub path: PathBuf,
    /// Whether a previous version was replaced.
    pub replaced: bool,
    /// How the new version was made visible: `rename` (one file), `exchange` (directory swap),
    /// `rename-directory` (first install of a directory) or `replace-directory` (fallback).
    pub method: &'static str,
}

/// Installs `source` (an executable file, or a directory containing `<driver>`) as `name`.
/// What discovery would refuse under `policy` is refused before the live driver is touched.
pub fn install(
    plugin_dir: &Path,
    name: &DriverName,
    source: &Path,
    policy: LayoutPolicy,
) -> Result<Installed, InstallError> {
    let meta = fs::metadata(source).map_err(|e| InstallError::Source {
        path: source.to_owned(),
        source: e,
    })?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(plugin_dir)
        .map_err(io_err("create plugin dir", plugin_dir))?;
    if meta.is_file() {
        install_file(plugin_dir, name, source, &meta)
    } else if meta.is_dir() {
        install_dir(plugin_dir, name, source, policy)
    } else {
        Err(InstallError::SourceKind {
            path: source.to_owned(),
        })
    }
}

fn check_executable(path: &Path, meta: &fs::Metadata) -> Result<u32, InstallError> {
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o111 == 0 {
        return Err(InstallError::SourceNotExecutable {
            path: path.to_owned(),
            mode,
        });
    }
    // Never carry setuid/setgid bits from an image into the host's plugin dir.
    Ok(installed_mode(mode))
}

/// The mode a file or directory copied from `mode` is installed with: no setuid, setgid or
/// sticky bit, and writable by nobody but its owner, whatever the source's modes (a sloppy
/// image's 0777) or the umask. Discovery refuses what others may write
/// (docs/discovery.md#trust); exec and read bits are kept.
fn installed_mode(mode: u32) -> u32 {
    mode & 0o777 & !0o022
}

fn install_file(
    plugin_dir: &Path,
    name: &DriverName,
    source: &Path,
    meta: &fs::Metadata,
) -> Result<Installed, InstallError> {
    let mode = check_executable(source, meta)?;
    let dir = plugin_dir.join(name.dir_name());
    ensure_real_dir(&dir)?;
    let exe = name.executable_name();
    let path = dir.join(exe);
    let staged = dir.join(format!(".{exe}"));
    let replaced = path.exists();
    let placed = copy_file_synced(source, &staged, mode)
        .and_then(|()| {
            // Discovery's trust rule, before the live driver is touched: the staged file is
            // ours and installed_mode, so only a directory on its way (the plugin dir, an
            // ancestor, the driver dir) can fail it.
            crate::layout::check_trusted(&staged).map_err(InstallError::Refused)
        })
        .and_then(|()| fs::rename(&staged, &path).map_err(io_err("rename into place", &path)));
    if let Err(e) = placed {
        // A full disk: the old version stays in place, and no partial copy is left behind.
        let _ = fs::remove_file(&staged);
        return Err(e);
    }
    sync_dir(&dir)?;
    Ok(Installed {
        name: name.clone(),
        dir,
        path,
        replaced,
        method: "rename",
    })
}

fn install_dir(
    plugin_dir: &Path,
    name: &DriverName,
    source: &Path,
    policy: LayoutPolicy,
) -> Result<Installed, InstallError> {
    let exe = name.executable_name();
    let source_exe = source.join(exe);
    match fs::metadata(&source_exe) {
        Ok(meta) if meta.is_file() => {
            check_executable(&source_exe, &meta)?;
        }
        _ => {
            return Err(InstallError::SourceMissingExecutable {
                path: source.to_owned(),
                executable: exe.to_owned(),
            })
        }
    }
    let dir_name = name.dir_name();
    let dir = plugin_dir.join(&dir_name);
    let staging = plugin_dir.join(format!(".{dir_name}.staging-{}", std::process::id()));
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(io_err("remove stale staging dir", &staging))?;
    }
    let result = stage_and_swap(plugin_dir, source, &staging, &dir, name, policy);
    if staging.exists() {
        // Either a failed stage or the old version after an exchange: it goes either way.
        let _ = fs::remove_dir_all(&staging);
    }
    let (replaced, method) = result?;
    Ok(Installed {
        name: name.clone(),
        path: dir.join(exe),
        dir,
        replaced,
        method,
    })
}

fn stage_and_swap(
    plugin_dir: &Path,
    source: &Path,
    staging: &Path,
    dir: &Path,
    name: &DriverName,
    policy: LayoutPolicy,
) -> Result<(bool, &'static str), InstallError> {
    copy_tree_synced(source, staging)?;
    // Checked on the staged copy, where symlinks resolve as they will once swapped in (a
    // relative link resolves against its new home, not the source's).
    crate::layout::check_staged(plugin_dir, staging, name, policy)
        .map_err(InstallError::Refused)?;
    sync_dir(plugin_dir)?;
    let result = match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::rename(staging, dir).map_err(io_err("rename into place", dir))?;
            (false, "rename-directory")
        }
        Err(e) => return Err(io_err("inspect", dir)(e)),
        Ok(meta) if !meta.is_dir() => {
            return Err(InstallError::TargetNotADirectory {
                path: dir.to_owned(),
            })
        }
        Ok(_) => match rustix::fs::renameat_with(CWD, staging, CWD, dir, RenameFlags::EXCHANGE) {
            Ok(()) => (true, "exchange"),
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => {
                // No RENAME_EXCHANGE here: move the old set away, then the new one in.
                let old = staging.with_extension("old");
                fs::rename(dir, &old).map_err(io_err("move old version away", dir))?;
                fs::rename(staging, dir).map_err(io_err("rename into place", dir))?;
                let _ = fs::remove_dir_all(&old);
                (true, "replace-directory")
            }
            Err(e) => return Err(io_err("exchange directories", dir)(e.into())),
        },
    };
    sync_dir(plugin_dir)?;
    Ok(result)
}

/// Removes an installed driver: one rename to a hidden name (one event for the prober), then
/// the deletion.
pub fn uninstall(plugin_dir: &Path, name: &DriverName) -> Result<PathBuf, InstallError> {
    let dir_name = name.dir_name();
    let dir = plugin_dir.join(&dir_name);
    match fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(InstallError::NotInstalled {
                name: name.clone(),
                plugin_dir: plugin_dir.to_owned(),
            })
        }
        Err(e) => return Err(io_err("inspect", &dir)(e)),
        Ok(_) => {}
    }
    let doomed = plugin_dir.join(format!(".{dir_name}.removing-{}", std::process::id()));
    fs::rename(&dir, &doomed).map_err(io_err("move aside", &dir))?;
    sync_dir(plugin_dir)?;
    let meta = fs::symlink_metadata(&doomed).map_err(io_err("inspect", &doomed))?;
    if meta.is_dir() {
        fs::remove_dir_all(&doomed).map_err(io_err("remove", &doomed))?;
    } else {
        fs::remove_file(&doomed).map_err(io_err("remove", &doomed))?;
    }
    Ok(dir)
}

/// The driver directory must be a real directory (not a symlink that could point anywhere).
fn ensure_real_dir(dir: &Path) -> Result<(), InstallError> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(InstallError::TargetNotADirectory {
            path: dir.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            match fs::DirBuilder::new().mode(0o755).create(dir) {
                Ok(()) => Ok(()),
                // Another installer made it meanwhile.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => ensure_real_dir(dir),
                Err(e) => Err(io_err("create driver dir", dir)(e)),
            }
        }
        Err(e) => Err(io_err("inspect", dir)(e)),
    }
}

fn copy_file_synced(source: &Path, dest: &Path, mode: u32) -> Result<(), InstallError> {
    let mut input = File::open(source).map_err(|e| InstallError::Source {
        path: source.to_owned(),
        source: e,
    })?;
    let mut output = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(dest)
        .map_err(io_err("create", dest))?;
    io::copy(&mut input, &mut output).map_err(io_err("write", dest))?;
    // The mode given to open() is masked by the umask; set it exactly.
    output
        .set_permissions(fs::Permissions::from_mode(mode))
        .map_err(io_err("chmod", dest))?;
    output.flush().map_err(io_err("write", dest))?;
    output.sync_all().map_err(io_err("fsync", dest))?;
    Ok(())
}

/// Copies a directory tree (files, directories, symlinks as symlinks), fsync-ing everything.
fn copy_tree_synced(source: &Path, dest: &Path) -> Result<(), InstallError> {
    let src_err = |e| InstallError::Source {
        path: source.to_owned(),
        source: e,
    };
    let meta = fs::metadata(source).map_err(src_err)?;
    fs::create_dir(dest).map_err(io_err("create", dest))?;
    fs::set_permissions(
        dest,
        fs::Permissions::from_mode(installed_mode(meta.permissions().mode())),
    )
    .map_err(io_err("chmod", dest))?;
    for entry in fs::read_dir(source).map_err(src_err)? {
        let entry = entry.map_err(|e| InstallError::Source {
            path: source.to_owned(),
            source: e,
        })?;
        let from = entry.path();
        let to = dest.join(entry.file_name());
        let kind = entry.file_type().map_err(|e| InstallError::Source {
            path: from.clone(),
            source: e,
        })?;
        if kind.is_symlink() {
            let target = fs::read_link(&from).map_err(|e| InstallError::Source {
                path: from.clone(),
                source: e,
            })?;
            std::os::unix::fs::symlink(&target, &to).map_err(io_err("symlink", &to))?;
        } else if kind.is_dir() {
            copy_tree_synced(&from, &to)?;
        } else if kind.is_file() {
            let mode = fs::metadata(&from)
                .map_err(|e| InstallError::Source {
                    path: from.clone(),
                    source: e,
                })?
                .permissions()
                .mode();
            copy_file_synced(&from, &to, installed_mode(mode))?;
        } else {
            return Err(InstallError::SourceKind { path: from });
        }
    }
    sync_dir(dest)
}

fn sync_dir(dir: &Path) -> Result<(), InstallError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", dir))
}
