//! One volume (`<dir>/<name>.img` with its lock, marker and claim beside it) and the checks and
//! escapes its names and sizes go through.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use flexvolume_driver::{DriverError, DriverResult, ResultExt as _, VolumeOptions};
use flexvolume_os::mount;
use rustix::fs::OFlags;

use crate::files::{self, Identity};
use crate::{
    image_dirs, loopdev, losetup, DEFAULT_IMAGE_DIR, DEFAULT_SIZE, IMAGE_DIR_OPTION, MAX_NAME_LEN,
    SIZE_OPTION, VOLUME_ID_OPTION,
};

/// A volume's image, open: the regular file at `<dir>/<name>.img`, reached without following a
/// symlink (see [`files`]). What the node's loop device is set up on, and what is read to tell a
/// raw dump from a fresh image.
#[derive(Debug)]
pub(crate) struct Image {
    pub file: File,
    pub identity: Identity,
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
            let file = files::open_or_create(&path, 0o600)
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
        let marker = match files::read_regular(&self.marker_path(), 256) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
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
        files::write_atomically(
            &marker,
            &files::temp_beside(&marker),
            identity(&meta).as_bytes(),
            0o600,
        )
        .context(format_args!("cannot write {}", marker.display()))
    }

    /// Creates the image (sparse, exclusive) or reuses the one there. Returns the new image's
    /// file when it was created.
    pub(crate) fn create_or_reuse_image(&self, size: u64) -> DriverResult<Option<File>> {
        self.check_size(size)?;
        let image = self.image();
        // O_EXCL: a name already taken (an image, or a symlink planted there) is never opened.
        let created = files::create_new(&image, 0o600);
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
                        "cannot use image {}: {}; refusing to use it",
                        image.display(),
                        files::not_regular(meta.file_type())
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
            let existing = fs::symlink_metadata(self.image())
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

    /// The loop device backing the image on this host, if any (by the image's device and
    /// inode). An image that is not a regular file is an error: no loop device of this driver
    /// can back it.
    pub(crate) fn device(&self) -> DriverResult<Option<String>> {
        let image = self.image();
        match files::look(&image) {
            Ok(found) => loopdev::find(&found.identity),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.unusable_image(&e)),
        }
    }

    /// The image, open for reading and writing (read-only when the file refuses writing, as
    /// losetup falls back): the regular file at the image's path, never what a symlink there
    /// points to, nor a FIFO, a device or a directory. NOT_FOUND when there is nothing.
    pub(crate) fn open_image(&self) -> DriverResult<Image> {
        let path = self.image();
        let found = match files::look(&path) {
            Ok(found) => found,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(self.not_found("")),
            Err(e) => return Err(self.unusable_image(&e)),
        };
        let file = found
            .open(OFlags::RDWR)
            .or_else(|e| match e.raw_os_error() {
                Some(code)
                    if code == rustix::io::Errno::ROFS.raw_os_error()
                        || code == rustix::io::Errno::ACCESS.raw_os_error() =>
                {
                    found.open(OFlags::RDONLY)
                }
                _ => Err(e),
            })
            .map_err(|e| self.unusable_image(&e))?;
        Ok(Image {
            file,
            identity: found.identity,
        })
    }

    /// The loop device backing `image` (this volume's, open) on this host, set up on the open
    /// file when there is none (waitforattach and mountdevice, under the volume's lock).
    pub(crate) fn device_or_attach(&self, image: &Image) -> DriverResult<String> {
        match loopdev::find(&image.identity)? {
            Some(device) => Ok(device),
            None => loopdev::attach(&image.file, &self.image()),
        }
    }

    /// NOT_FOUND unless the image is there; `remedy` ends the message (what would create it,
    /// or nothing). Anything but a regular file there (a symlink, a FIFO, a device) is refused.
    pub(crate) fn require_image(&self, remedy: &str) -> DriverResult<()> {
        match fs::symlink_metadata(self.image()) {
            Ok(meta) if meta.is_file() => Ok(()),
            Ok(meta) => Err(self.unusable_image(&files::not_regular(meta.file_type()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(self.not_found(remedy)),
            Err(e) => Err(self.unusable_image(&e)),
        }
    }

    fn not_found(&self, remedy: &str) -> DriverError {
        DriverError::not_found(format!(
            "volume {} does not exist (no image {}){remedy}",
            self.name,
            self.image().display()
        ))
    }

    /// The error for an image that cannot be used: `error` says why (what it is, when not a
    /// regular file).
    fn unusable_image(&self, error: &io::Error) -> DriverError {
        DriverError::failure(format!(
            "cannot use image {} of volume {}: {error}; an image must be a regular file, and \
             a symlink is never followed",
            self.image().display(),
            self.name
        ))
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
/// SEEK_HOLE), so a fresh sparse image costs nothing whatever its size. The image must be a
/// regular file, and a symlink is never followed.
pub fn image_holds_data(image: &Path) -> io::Result<bool> {
    file_holds_data(&files::open_regular(image, OFlags::RDONLY)?)
}

/// [`image_holds_data`] of an image already open.
pub(crate) fn file_holds_data(file: &File) -> io::Result<bool> {
    use rustix::fs::SeekFrom;
    use std::io::Read as _;
    let mut file = file;
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0;
    loop {
        let start = match rustix::fs::seek(file, SeekFrom::Data(pos)) {
            Ok(start) => start,
            Err(rustix::io::Errno::NXIO) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let end = rustix::fs::seek(file, SeekFrom::Hole(start))?;
        rustix::fs::seek(file, SeekFrom::Start(start))?;
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
/// (compared by the backing file's device and inode, which the kernel gives, never by path). A
/// device that is no loop device, or a free one, backs nothing.
pub(crate) fn other_backing_file(device: &str, image: &Identity) -> Option<PathBuf> {
    let backing = losetup::backing_file(device)?;
    let same = loopdev::backing_identity(device).is_some_and(|b| b == *image);
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
