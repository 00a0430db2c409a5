//! The plugin dir on disk: `<plugin-dir>/<vendor~driver>/<driver>`.
//!
//! Everything here reads the filesystem but decides nothing about *when* to read it; the prober
//! and the one-shot probe call it. Dot-names are invisible (atomic installs stage files as
//! `.<name>`), and an executable that resolves outside the plugin dir is refused unless the
//! operator allowed symlinks, so a writable subdirectory can never make us run `/tmp/evil`.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

use flexvolume_protocol::name::{DriverName, NameError};

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
    /// The executable, or a directory looked up on the way to it, could be written by someone
    /// other than root (or flexd's own user): see docs/discovery.md#trust.
    #[error("{path}: {reason}; refused: anyone who can write it could run code as root (chown root and chmod go-w)")]
    Untrusted { path: PathBuf, reason: String },
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
pub(crate) fn is_hidden(file_name: &std::ffi::OsStr) -> bool {
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
pub(crate) fn check_staged(
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
    // Resolved paths (an escape's target, an untrusted directory) start with the staged dir's
    // real path, which differs from `staged` when the plugin dir was named through a symlink.
    let staged_resolved = staged
        .file_name()
        .map(|name| canonical_root.join(name))
        .unwrap_or_else(|| staged.to_owned());
    let rename = |path: PathBuf| match path
        .strip_prefix(staged)
        .or_else(|_| path.strip_prefix(&staged_resolved))
    {
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
            LayoutError::Untrusted { path, reason } => LayoutError::Untrusted {
                path: rename(path),
                reason,
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
    check_trusted(&path)?;
    Ok(InstalledDriver {
        name,
        dir: dir.to_owned(),
        path,
    })
}

/// Why an inode flexd would execute, or look a name up in on the way to it, is not to be
/// trusted; `None` if it is (docs/discovery.md#trust). Only root, or the user flexd runs as,
/// may own it, and nobody else may write it: whoever can write the executable or any directory
/// on its path can make flexd run their code. A directory with the sticky bit (as /tmp) may be
/// writable by all: in it nobody can rename or remove an entry they do not own.
pub(crate) fn distrust(uid: u32, mode: u32, is_dir: bool, euid: u32) -> Option<String> {
    if uid != 0 && uid != euid {
        return Some(if euid == 0 {
            format!("owned by uid {uid}, not root")
        } else {
            format!("owned by uid {uid}, neither root nor flexd's uid {euid}")
        });
    }
    let sticky = is_dir && mode & 0o1000 != 0;
    let writers = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        _ if sticky => return None,
        (true, true) => "group and others",
        (true, false) => "group",
        (false, true) => "others",
        (false, false) => return None,
    };
    Some(format!("writable by {writers} (mode {:o})", mode & 0o7777))
}

/// Refuses `path` unless it, and every directory the kernel looks a name up in to resolve it
/// (from `/`, through every symlink on the way, to the executable's own directory), pass
/// [`distrust`]. So the plugin dir and its ancestors are checked, and with `--allow-symlinks`
/// both where a symlink lies and where it leads.
pub(crate) fn check_trusted(path: &Path) -> Result<(), LayoutError> {
    let euid = rustix::process::geteuid().as_raw();
    let (resolved, dirs) = resolve(path).map_err(|e| LayoutError::io(path, &e))?;
    let judge = |at: &Path, is_dir: bool| -> Result<(), LayoutError> {
        let meta = std::fs::symlink_metadata(at).map_err(|e| LayoutError::io(at, &e))?;
        match distrust(meta.uid(), meta.mode(), is_dir, euid) {
            Some(reason) => Err(LayoutError::Untrusted {
                path: at.to_owned(),
                reason,
            }),
            None => Ok(()),
        }
    };
    for dir in &dirs {
        judge(dir, true)?;
    }
    judge(&resolved, false)
}

/// Resolves `path` as the kernel does, symlink by symlink: the real path it leads to, and
/// every directory a name was looked up in on the way, outermost first, each once.
fn resolve(path: &Path) -> io::Result<(PathBuf, Vec<PathBuf>)> {
    use std::ffi::OsString;
    use std::path::Component;
    /// The kernel's limit on symlinks followed in one lookup.
    const MAX_SYMLINKS: usize = 40;
    enum Step {
        Root,
        Parent,
        Name(OsString),
    }
    // The steps still to take, the next one last; a symlink's target takes its place.
    fn push(pending: &mut Vec<Step>, path: &Path) {
        let steps = path.components().filter_map(|c| match c {
            Component::RootDir => Some(Step::Root),
            Component::ParentDir => Some(Step::Parent),
            Component::Normal(name) => Some(Step::Name(name.to_owned())),
            Component::CurDir | Component::Prefix(_) => None,
        });
        let at = pending.len();
        pending.extend(steps);
        pending[at..].reverse();
    }
    let mut pending = Vec::new();
    push(&mut pending, &std::path::absolute(path)?);
    let mut current = PathBuf::from("/");
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut followed = 0;
    while let Some(step) = pending.pop() {
        match step {
            Step::Root => current = PathBuf::from("/"),
            Step::Parent => {
                current.pop();
            }
            Step::Name(name) => {
                if !dirs.contains(&current) {
                    dirs.push(current.clone());
                }
                let next = current.join(name);
                if std::fs::symlink_metadata(&next)?.file_type().is_symlink() {
                    followed += 1;
                    if followed > MAX_SYMLINKS {
                        return Err(io::Error::from_raw_os_error(libc::ELOOP));
                    }
                    push(&mut pending, &std::fs::read_link(&next)?);
                } else {
                    current = next;
                }
            }
        }
    }
    Ok((current, dirs))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: u32 = 0;
    const ME: u32 = 1000;

    #[test]
    fn only_root_or_flexd_s_own_user_may_own_what_it_runs() {
        assert_eq!(distrust(ROOT, 0o100755, false, ROOT), None);
        assert_eq!(
            distrust(ME, 0o100755, false, ROOT).as_deref(),
            Some("owned by uid 1000, not root")
        );
        // A developer running flexd as themselves, on their own files.
        assert_eq!(distrust(ME, 0o100755, false, ME), None);
        assert_eq!(distrust(ROOT, 0o40755, true, ME), None);
        assert_eq!(
            distrust(1001, 0o40755, true, ME).as_deref(),
            Some("owned by uid 1001, neither root nor flexd's uid 1000")
        );
    }

    #[test]
    fn nobody_else_may_write_it_but_in_a_sticky_directory() {
        for (mode, is_dir, want) in [
            (0o100755, false, None),
            (0o100555, false, None),
            (0o102755, false, None),
            (0o100700, false, None),
            (0o100775, false, Some("writable by group (mode 775)")),
            (0o100757, false, Some("writable by others (mode 757)")),
            (
                0o100777,
                false,
                Some("writable by group and others (mode 777)"),
            ),
            (
                0o104777,
                false,
                Some("writable by group and others (mode 4777)"),
            ),
            // The sticky bit means nothing on a file.
            (
                0o101777,
                false,
                Some("writable by group and others (mode 1777)"),
            ),
            (0o40755, true, None),
            (
                0o40777,
                true,
                Some("writable by group and others (mode 777)"),
            ),
            (0o42775, true, Some("writable by group (mode 2775)")),
            (0o41777, true, None),
            (0o41775, true, None),
        ] {
            assert_eq!(
                distrust(ROOT, mode, is_dir, ROOT).as_deref(),
                want,
                "{mode:o}"
            );
        }
        // The sticky bit does not excuse a directory owned by someone else.
        assert!(distrust(ME, 0o41777, true, ROOT).is_some());
    }

    #[test]
    fn resolving_names_every_directory_looked_in_through_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path().canonicalize().unwrap();
        for d in ["plugins/acme~x", "real/bin", "elsewhere"] {
            std::fs::create_dir_all(t.join(d)).unwrap();
        }
        std::fs::write(t.join("real/bin/x"), "").unwrap();
        // plugins/acme~x/x -> ../../elsewhere/hop -> real/bin/x (relative to elsewhere/..)
        std::os::unix::fs::symlink("../../elsewhere/hop", t.join("plugins/acme~x/x")).unwrap();
        std::os::unix::fs::symlink("../real/./bin/x", t.join("elsewhere/hop")).unwrap();
        let (resolved, dirs) = resolve(&t.join("plugins/acme~x/x")).unwrap();
        assert_eq!(resolved, t.join("real/bin/x"));
        let mut want: Vec<PathBuf> = t.ancestors().map(Path::to_owned).collect();
        want.reverse();
        want.extend(
            ["plugins", "plugins/acme~x", "elsewhere", "real", "real/bin"].map(|d| t.join(d)),
        );
        assert_eq!(dirs, want);

        std::os::unix::fs::symlink("loop", t.join("loop")).unwrap();
        let err = resolve(&t.join("loop")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        assert!(resolve(&t.join("missing/x")).is_err());
    }
}
