//! One volume (`<dir>/<name>.img` with its lock, marker and claim beside it) and the checks and
//! escapes its names and sizes go through.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use flexvolume_driver::{DriverError, DriverResult, ResultExt as _, VolumeOptions};
use flexvolume_os::mount;

use crate::{
    image_dirs, losetup, DEFAULT_IMAGE_DIR, DEFAULT_SIZE, IMAGE_DIR_OPTION, MAX_NAME_LEN,
    SIZE_OPTION, VOLUME_ID_OPTION,
};

/// A file of the driver's own beside an image (a lock, a marker), opened for writing and
/// created when absent; never through a symlink a caller planted at its name.
pub(crate) fn open_own_file(path: &Path, truncate: bool) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(truncate)
        .write(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
}

/// One volume: `<dir>/<name>.img`.
/// What an image that no provision of its name made means to the caller: delete refuses to
/// remove someone else's image, provision reports the name as taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Foreign {
    RefuseDelete,
    AlreadyExists,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    pub dir: PathBuf,
}

impl Volume {
    /// The volume the options describe (in `default_dir` when they name no `imageDir`). Names
    /// and directories are checked before any path is built from them.
    pub fn from_options(options: &VolumeOptions, default_dir: &Path) -> DriverResult<Self> {
        let name = options
            .get(VOLUME_ID_OPTION)
            .filter(|n| !n.is_empty())
            .or(options.pv_or_volume_name())
            .ok_or_else(|| {
                DriverError::invalid_argument(format!(
                    "the volume has no name: set the {VOLUME_ID_OPTION} option (or a PV name)"
                ))
            })?;
        let dir = options
            .get(IMAGE_DIR_OPTION)
            .filter(|d| !d.is_empty())
            .map_or(default_dir, Path::new);
        Self::new(name, dir)
    }

    pub fn new(name: &str, dir: &Path) -> DriverResult<Self> {
        check_name(name)?;
        // Normalised (`//a/./b/` is `/a/b`), so one directory always gives one detach name.
        let dir = image_dirs::normalise(dir).ok_or_else(|| {
            DriverError::invalid_argument(format!(
                "{IMAGE_DIR_OPTION} {dir:?} must be an absolute path without '..'"
            ))
        })?;
        Ok(Self {
            name: name.to_owned(),
            dir,
        })
    }

    /// The name getvolumename gives: stable for the same options, and enough to find the image
    /// again (detach gets no options). kubelet's detach gets the PV's name instead; attach
    /// remembers this name under it.
    pub fn detach_name(&self) -> String {
        if self.dir == Path::new(DEFAULT_IMAGE_DIR) {
            self.name.clone()
        } else {
            format!("{}@{}", self.name, escape(&self.dir.to_string_lossy()))
        }
    }

    /// The inverse of [`Volume::detach_name`]; `~` (kubelet's `/`) never occurs in it.
    pub fn from_detach_name(detach_name: &str) -> DriverResult<Self> {
        match detach_name.split_once('@') {
            None => Self::new(detach_name, Path::new(DEFAULT_IMAGE_DIR)),
            Some((name, dir)) => {
                let dir = unescape(dir).ok_or_else(|| {
                    DriverError::failure(format!(
                        "{detach_name:?} is not a volume name this driver gave"
                    ))
                })?;
                Self::new(name, Path::new(&dir))
            }
        }
    }

    pub fn image(&self) -> PathBuf {
        self.dir.join(format!("{}.img", self.name))
    }

    pub(crate) fn lock_path(&self) -> PathBuf {
        self.dir.join(format!(".{}.lock", self.name))
    }

    /// Where provision records that it made the image: the image's device and inode.
    pub(crate) fn marker_path(&self) -> PathBuf {
        self.dir.join(format!(".{}.provisioned", self.name))
    }

    /// Takes the volume's exclusive lock (waits for it), creating the image dir if needed:
    /// one level only, never a chain of parents. The lock is released when the returned file
    /// is closed.
    pub(crate) fn lock(&self) -> DriverResult<File> {
        match fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(DriverError::failure(format!(
                    "cannot create image dir {} (only the dir itself is made, its parent must exist): {e}",
                    self.dir.display()
                )))
            }
        }
        let path = self.lock_path();
        loop {
            let file = open_own_file(&path, false)
                .context(format_args!("cannot open lock {}", path.display()))?;
            rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
                .context(format_args!("cannot lock {}", path.display()))?;
            // The holder before us may have removed the file (a delete, a failed provision):
            // a lock on an unlinked file excludes no one, so take the one at the path now.
            if same_file(&file, &path)? {
                return Ok(file);
            }
        }
    }

    /// Removes the lock file; call holding the lock, as the last step on a volume that is gone.
    pub(crate) fn remove_lock_file(&self) {
        let _ = fs::remove_file(self.lock_path());
    }

    /// Whether the image is the one a provision of this name made (the marker names its inode).
    pub(crate) fn provisioned_here(&self) -> DriverResult<bool> {
        let marker = match fs::read_to_string(self.marker_path()) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => {
                return Err(DriverError::failure(format!(
                    "cannot read {}: {e}",
                    self.marker_path().display()
                )))
            }
        };
        let image = match fs::symlink_metadata(self.image()) {
            Ok(meta) if meta.is_file() => meta,
            _ => return Ok(false),
        };
        Ok(marker.trim() == identity(&image))
    }

    /// Whether the image exists; one that no provision of this name made is refused, with the
    /// error `foreign` says.
    pub(crate) fn has_provisioned_image(&self, foreign: Foreign) -> DriverResult<bool> {
        if fs::symlink_metadata(self.image()).is_err() {
            return Ok(false);
        }
        if !self.provisioned_here()? {
            let image = self.image();
            return Err(match foreign {
                Foreign::RefuseDelete => DriverError::failure(format!(
                    "image {} was not made by a provision of volume {}; refusing to delete it",
                    image.display(),
                    self.name
                )),
                Foreign::AlreadyExists => DriverError::already_exists(format!(
                    "image {} exists and was not made by a provision of volume {}",
                    image.display(),
                    self.name
                )),
            });
        }
        Ok(true)
    }

    /// Records that provision made the image (written after the image, fsync-ed).
    pub(crate) fn mark_provisioned(&self, image: &File) -> DriverResult<()> {
        let meta = image
            .metadata()
            .context(format_args!("cannot stat {}", self.image().display()))?;
        let marker = self.marker_path();
        let written = open_own_file(&marker, true).and_then(|mut f| {
            use std::io::Write as _;
            f.write_all(identity(&meta).as_bytes())?;
            f.sync_all()
        });
        written.context(format_args!("cannot write {}", marker.display()))
    }

    /// Creates the image (sparse, exclusive) or reuses the one there. Returns the new image's
    /// file when it was created.
    pub(crate) fn create_or_reuse_image(&self, size: u64) -> DriverResult<Option<File>> {
        self.check_size(size)?;
        let image = self.image();
        let created = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&image);
        match created {
            Ok(file) => {
                // set_len makes a hole: no block is written until the filesystem writes one.
                if let Err(e) = file.set_len(size).and_then(|()| file.sync_all()) {
                    let _ = fs::remove_file(&image);
                    let message =
                        format!("cannot size image {} to {size} bytes: {e}", image.display());
                    return Err(match e.raw_os_error() {
                        Some(code) if code == rustix::io::Errno::FBIG.raw_os_error() => {
                            DriverError::out_of_range(message)
                        }
                        Some(code) if code == rustix::io::Errno::NOSPC.raw_os_error() => {
                            DriverError::out_of_capacity(message)
                        }
                        _ => DriverError::failure(message),
                    });
                }
                Ok(Some(file))
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let meta = fs::symlink_metadata(&image)
                    .context(format_args!("cannot stat {}", image.display()))?;
                if !meta.is_file() {
                    return Err(DriverError::failure(format!(
                        "{} exists and is not a regular file; refusing to use it",
                        image.display()
                    )));
                }
                Ok(None)
            }
            Err(e) => Err(DriverError::failure(format!(
                "cannot create image {}: {e}",
                image.display()
            ))),
        }
    }

    /// A size no image here can have is refused before anything is made: more than a CSI
    /// capacity can say, or more than the image dir's whole filesystem (sparse images may
    /// overcommit the free space, but not the filesystem itself).
    pub(crate) fn check_size(&self, size: u64) -> DriverResult<()> {
        if i64::try_from(size).is_err() {
            return Err(DriverError::out_of_range(format!(
                "{size} bytes is more than a volume can have ({} at most)",
                i64::MAX
            )));
        }
        let fs = rustix::fs::statvfs(&self.dir).context(format_args!(
            "cannot read the filesystem of {}",
            self.dir.display()
        ))?;
        let total = fs.f_blocks.saturating_mul(fs.f_frsize);
        if total > 0 && size > total {
            return Err(DriverError::out_of_range(format!(
                "{size} bytes is more than the whole filesystem of {} ({total} bytes)",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// Provision's work, under the lock: the size of the image there now.
    pub(crate) fn provision_locked(&self, size: u64) -> DriverResult<u64> {
        if self.has_provisioned_image(Foreign::AlreadyExists)? {
            let existing = fs::metadata(self.image())
                .context(format_args!("cannot stat {}", self.image().display()))?
                .len();
            if existing < size {
                return Err(DriverError::already_exists(format!(
                    "image {} exists with {existing} bytes, less than the {size} asked for",
                    self.image().display()
                )));
            }
            return Ok(existing);
        }
        let Some(file) = self.create_or_reuse_image(size)? else {
            // Made by someone else between our look and our create (not under our lock).
            return Err(DriverError::already_exists(format!(
                "image {} appeared while provisioning volume {}",
                self.image().display(),
                self.name
            )));
        };
        if let Err(e) = self.mark_provisioned(&file) {
            let _ = fs::remove_file(self.image());
            return Err(e);
        }
        Ok(size)
    }

    /// The loop device backing the image on this host, if any.
    pub(crate) fn device(&self) -> DriverResult<Option<String>> {
        if !self.image().exists() {
            return Ok(None);
        }
        losetup::device_of(&self.image())
    }

    /// The loop device backing the image on this host, set up when there is none
    /// (waitforattach and mountdevice, under the volume's lock). An image that is not there is
    /// NOT_FOUND; `remedy` ends the message (what would create it, or nothing).
    pub(crate) fn device_or_attach(&self, remedy: &str) -> DriverResult<String> {
        self.require_image(remedy)?;
        match self.device()? {
            Some(device) => Ok(device),
            None => losetup::attach(&self.image()),
        }
    }

    /// NOT_FOUND unless the image is there; `remedy` ends the message (what would create it,
    /// or nothing).
    pub(crate) fn require_image(&self, remedy: &str) -> DriverResult<()> {
        if self.image().exists() {
            return Ok(());
        }
        Err(DriverError::not_found(format!(
            "volume {} does not exist (no image {}){remedy}",
            self.name,
            self.image().display()
        )))
    }

    pub(crate) fn attached_device(&self) -> DriverResult<String> {
        self.device()?.ok_or_else(|| {
            DriverError::failure(format!(
                "volume {} is not attached (no loop device backs {})",
                self.name,
                self.image().display()
            ))
        })
    }
}

/// What the marker holds: the image's device, inode and birth time. Inode numbers are reused
/// at once (ext4 hands a removed image's number to the next file made), so the birth time
/// (statx, to the nanosecond) tells a file put in the image's place from the image; a
/// filesystem that keeps none leaves device and inode alone.
pub(crate) fn identity(meta: &fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    let born = meta
        .created()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| format!(":{}.{:09}", d.as_secs(), d.subsec_nanos()))
        .unwrap_or_default();
    format!("{}:{}{born}", meta.dev(), meta.ino())
}

/// Whether the open `file` is still the one at `path` (same device and inode).
pub(crate) fn same_file(file: &File, path: &Path) -> DriverResult<bool> {
    use std::os::unix::fs::MetadataExt;
    let held = file
        .metadata()
        .context(format_args!("cannot stat {}", path.display()))?;
    Ok(match fs::symlink_metadata(path) {
        Ok(now) => now.dev() == held.dev() && now.ino() == held.ino(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => {
            return Err(DriverError::failure(format!(
                "cannot stat {}: {e}",
                path.display()
            )))
        }
    })
}

pub(crate) fn check_name(name: &str) -> DriverResult<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(DriverError::invalid_argument(format!(
            "volume name {name:?} is not usable: 1-{MAX_NAME_LEN} characters of A-Z a-z 0-9 . _ -, \
             not starting with '.' or '-'"
        )))
    }
}

/// %-escapes everything but `[A-Za-z0-9._-]`, so the result has no `/`, `~` or `@`.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(crate) fn unescape(text: &str) -> Option<String> {
    let mut out = Vec::new();
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            let hex = std::str::from_utf8(&hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

/// Whether any byte of the image is not zero. Only the data extents are read (SEEK_DATA /
/// SEEK_HOLE), so a fresh sparse image costs nothing whatever its size.
pub fn image_holds_data(image: &Path) -> io::Result<bool> {
    use rustix::fs::SeekFrom;
    use std::io::Read as _;
    let mut file = File::open(image)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0;
    loop {
        let start = match rustix::fs::seek(&file, SeekFrom::Data(pos)) {
            Ok(start) => start,
            Err(rustix::io::Errno::NXIO) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let end = rustix::fs::seek(&file, SeekFrom::Hole(start))?;
        rustix::fs::seek(&file, SeekFrom::Start(start))?;
        let mut left = end - start;
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = file.read(&mut buf[..want])?;
            if n == 0 {
                return Ok(false);
            }
            if buf[..n].iter().any(|b| *b != 0) {
                return Ok(true);
            }
            left -= n as u64;
        }
        pos = end;
    }
}

/// A volume size (see [`flexvolume_protocol::spec::parse_quantity`]); zero is not a size.
pub fn parse_size(text: &str) -> Option<u64> {
    flexvolume_protocol::spec::parse_quantity(text).filter(|n| *n > 0)
}

pub(crate) fn size_of(options: &VolumeOptions) -> DriverResult<u64> {
    let Some(text) = options.get(SIZE_OPTION).filter(|s| !s.is_empty()) else {
        return Ok(DEFAULT_SIZE);
    };
    if let Some(size) = parse_size(text) {
        return Ok(size);
    }
    let zero = flexvolume_protocol::spec::parse_quantity(text) == Some(0);
    if !zero && flexvolume_protocol::spec::is_quantity_shaped(text) {
        return Err(DriverError::out_of_range(format!(
            "{SIZE_OPTION} {text:?} is more bytes than any file can have"
        )));
    }
    Err(DriverError::invalid_argument(format!(
        "{SIZE_OPTION} {text:?} is not a size (write 1073741824, 512Mi or 1Gi)"
    )))
}

/// The mount source at `dir`, if something is mounted exactly there.
pub(crate) fn mounted_source(dir: &Path) -> DriverResult<Option<String>> {
    let resolved = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let table = mount::mount_table().context("cannot read the mount table")?;
    Ok(table
        .into_iter()
        .rev()
        .find(|m| m.mount_point == resolved)
        .map(|m| m.source))
}

/// The file backing `device` when it is a loop device backed by a file other than `image`
/// (compared by device and inode, as losetup does). A device that is no loop device, or a free
/// one, backs nothing.
pub(crate) fn other_backing_file(device: &str, image: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let backing = losetup::backing_file(device)?;
    let same = match (fs::metadata(&backing), fs::metadata(image)) {
        (Ok(b), Ok(i)) => (b.dev(), b.ino()) == (i.dev(), i.ino()),
        _ => false,
    };
    (!same).then_some(backing)
}

/// Where `device` is mounted (bind mounts of it included).
pub(crate) fn mounts_of(device: &str) -> DriverResult<Vec<PathBuf>> {
    let table = mount::mount_table().context("cannot read the mount table")?;
    Ok(table
        .into_iter()
        .filter(|m| m.source == device)
        .map(|m| m.mount_point)
        .collect())
}
