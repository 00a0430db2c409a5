//! # The `loop` FlexVolume driver
//!
//! Real block volumes on any Linux machine, with no storage system: each volume is a sparse
//! image file under an image directory, attached as a loop device. Shipped with flexd
//! (`flexd install --builtin loop`), so a new user has a real driver to run, and written with
//! the [`flexvolume_driver`] SDK, so it doubles as that SDK's worked example.
//!
//! | call-out | what it does |
//! |---|---|
//! | provision | creates the image (sparse, `requestBytes`, else `size`, else 1Gi) and its marker `.<volume>.provisioned`; never adopts an image it did not make |
//! | delete | removes the image, only one provision made (the marker names its inode); refused while a loop device backs it, i.e. attached or mounted |
//! | attach | with a `size` option, creates the image (sparse) or reuses it; without one, the image must exist (`NotFound` otherwise); sets up a loop device or reuses the one already backing it |
//! | waitforattach | the loop device backing the image, set up again if `unmountdevice` released it (the volume is still attached) |
//! | isattached | whether a loop device backs the image |
//! | mountdevice | formats only when `blkid -p` finds nothing (fsType, default ext4; xfs when installed), then mounts |
//! | unmountdevice | unmounts, and releases the loop device when nothing else mounts it |
//! | detach | releases the loop device (refused while it is mounted) |
//! | getvolumename | `<volume>`, or `<volume>@<image dir, %-escaped>` outside the default image dir |
//! | expandvolume, expandfs | grow the image and the loop device, then the filesystem |
//! | mount, unmount | Not supported: the host bind-mounts the device mount |
//!
//! Options: `volumeID` (default: `kubernetes.io/pvOrVolumeName`; not for provision, where the
//! name is the CreateVolume name), `size` (default 1Gi; bytes or 512Mi, 10Gi, 1G …), `imageDir`
//! (default: the first of the operator's [`ImageDirs`], [`DEFAULT_IMAGE_DIR`] unless configured),
//! which must be one of the operator's [`ImageDirs`] (a file
//! beside the executable): a volume's options never choose where files are made. An allowed dir
//! that does not exist is created, one level deep (its parent must exist). A static volume with a
//! `size` is created on first attach (the quick start's `flexd volume mount --options
//! '{"size":…}'`); a provisioned one carries no `size`, so a deleted or missing image is a
//! `NotFound` error, never a fresh empty volume.
//!
//! Every step is idempotent, and steps on one volume are serialised by an exclusive `flock`
//! on `<imageDir>/.<volume>.lock`, so concurrent calls (kubelet retries, two pods) are safe.
//! A device is only ever formatted when it holds no signature at all, and only the loop device
//! backing the volume's own image is ever formatted or mounted, whatever device argument the
//! caller passes.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use flexvolume::mount;
pub use image_dirs::{ImageDirs, ImageDirsError};

pub mod image_dirs;
use flexvolume_driver::{
    Capabilities, Driver, DriverError, DriverResult, Provisioned, ResultExt as _, VolumeOptions,
};

/// Where images live unless the volume's `imageDir` option says otherwise.
pub const DEFAULT_IMAGE_DIR: &str = "/var/lib/flexd-loop";
/// The size of a new image unless the volume's `size` option says otherwise.
pub const DEFAULT_SIZE: u64 = 1 << 30;
pub const VOLUME_ID_OPTION: &str = "volumeID";
pub const SIZE_OPTION: &str = "size";
pub const IMAGE_DIR_OPTION: &str = "imageDir";
/// Longest volume name: keeps `.<name>.lock` within any filesystem's 255-byte name limit.
pub const MAX_NAME_LEN: usize = 200;

/// The driver. Stateless: everything it knows is on disk (images, the allowed image dirs) or
/// in the kernel (loop devices, mounts).
#[derive(Debug)]
pub struct LoopDriver {
    /// The allowed image dirs, or why they cannot be known (then every call-out fails).
    image_dirs: Result<ImageDirs, ImageDirsError>,
}

impl Default for LoopDriver {
    /// The default image dir only.
    fn default() -> Self {
        Self::new(ImageDirs::default())
    }
}

impl LoopDriver {
    pub fn new(image_dirs: ImageDirs) -> Self {
        Self {
            image_dirs: Ok(image_dirs),
        }
    }

    /// The driver as installed: the image dirs configured beside its executable.
    pub fn configured() -> Self {
        Self {
            image_dirs: ImageDirs::beside_executable(),
        }
    }

    fn image_dirs(&self) -> DriverResult<&ImageDirs> {
        self.image_dirs
            .as_ref()
            .map_err(|e| DriverError::failure(format!("the allowed image dirs: {e}")))
    }

    /// The volume the options describe, in an allowed image dir.
    fn volume(&self, options: &VolumeOptions) -> DriverResult<Volume> {
        let default_dir = self.image_dirs()?.default_dir();
        self.allowed(Volume::from_options(options, default_dir)?)
    }

    fn allowed(&self, volume: Volume) -> DriverResult<Volume> {
        let dirs = self.image_dirs()?;
        if dirs.contains(&volume.dir) {
            return Ok(volume);
        }
        Err(DriverError::invalid_argument(format!(
            "{IMAGE_DIR_OPTION} {} is not an image dir this node allows ({}); the node's \
             operator sets them with flexd install --builtin loop --image-dir DIR",
            volume.dir.display(),
            dirs.describe()
        )))
    }
}

/// One volume: `<dir>/<name>.img`.
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

    /// The name getvolumename gives and detach receives: stable for the same options, and
    /// enough to find the image again (detach gets no options).
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

    fn lock_path(&self) -> PathBuf {
        self.dir.join(format!(".{}.lock", self.name))
    }

    /// Where provision records that it made the image: the image's device and inode.
    fn marker_path(&self) -> PathBuf {
        self.dir.join(format!(".{}.provisioned", self.name))
    }

    /// Takes the volume's exclusive lock (waits for it), creating the image dir if needed:
    /// one level only, never a chain of parents. The lock is released when the returned file
    /// is closed.
    fn lock(&self) -> DriverResult<File> {
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
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                .open(&path)
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
    fn remove_lock_file(&self) {
        let _ = fs::remove_file(self.lock_path());
    }

    /// Whether the image is the one a provision of this name made (the marker names its inode).
    fn provisioned_here(&self) -> DriverResult<bool> {
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

    /// Records that provision made the image (written after the image, fsync-ed).
    fn mark_provisioned(&self, image: &File) -> DriverResult<()> {
        let meta = image
            .metadata()
            .context(format_args!("cannot stat {}", self.image().display()))?;
        let marker = self.marker_path();
        let written = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&marker)
            .and_then(|mut f| {
                use std::io::Write as _;
                f.write_all(identity(&meta).as_bytes())?;
                f.sync_all()
            });
        written.context(format_args!("cannot write {}", marker.display()))
    }

    /// Creates the image (sparse, exclusive) or reuses the one there. Returns the new image's
    /// file when it was created.
    fn create_or_reuse_image(&self, size: u64) -> DriverResult<Option<File>> {
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
    fn check_size(&self, size: u64) -> DriverResult<()> {
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
    fn provision_locked(&self, size: u64) -> DriverResult<u64> {
        if fs::symlink_metadata(self.image()).is_ok() {
            if !self.provisioned_here()? {
                return Err(DriverError::already_exists(format!(
                    "image {} exists and was not made by a provision of volume {}",
                    self.image().display(),
                    self.name
                )));
            }
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

    /// The loop device backing the image, if any.
    fn device(&self) -> DriverResult<Option<String>> {
        if !self.image().exists() {
            return Ok(None);
        }
        losetup::device_of(&self.image())
    }

    fn attached_device(&self) -> DriverResult<String> {
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
fn identity(meta: &fs::Metadata) -> String {
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
fn same_file(file: &File, path: &Path) -> DriverResult<bool> {
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

fn check_name(name: &str) -> DriverResult<()> {
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
fn escape(text: &str) -> String {
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

fn unescape(text: &str) -> Option<String> {
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

/// A volume size (see [`flexvolume::spec::parse_quantity`]); zero is not a size.
pub fn parse_size(text: &str) -> Option<u64> {
    flexvolume::spec::parse_quantity(text).filter(|n| *n > 0)
}

fn size_of(options: &VolumeOptions) -> DriverResult<u64> {
    let Some(text) = options.get(SIZE_OPTION).filter(|s| !s.is_empty()) else {
        return Ok(DEFAULT_SIZE);
    };
    if let Some(size) = parse_size(text) {
        return Ok(size);
    }
    let zero = flexvolume::spec::parse_quantity(text) == Some(0);
    if !zero && flexvolume::spec::is_quantity_shaped(text) {
        return Err(DriverError::out_of_range(format!(
            "{SIZE_OPTION} {text:?} is more bytes than any file can have"
        )));
    }
    Err(DriverError::invalid_argument(format!(
        "{SIZE_OPTION} {text:?} is not a size (write 1073741824, 512Mi or 1Gi)"
    )))
}

/// The mount source at `dir`, if something is mounted exactly there.
fn mounted_source(dir: &Path) -> DriverResult<Option<String>> {
    let resolved = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let table = mount::mount_table().context("cannot read the mount table")?;
    Ok(table
        .into_iter()
        .rev()
        .find(|m| m.mount_point == resolved)
        .map(|m| m.source))
}

/// Where `device` is mounted (bind mounts of it included).
fn mounts_of(device: &str) -> DriverResult<Vec<PathBuf>> {
    let table = mount::mount_table().context("cannot read the mount table")?;
    Ok(table
        .into_iter()
        .filter(|m| m.source == device)
        .map(|m| m.mount_point)
        .collect())
}

/// Loop devices, through util-linux's `losetup`. Output is always captured: a driver's stdout
/// is its reply.
mod losetup {
    use super::*;

    fn run(args: &[&std::ffi::OsStr]) -> DriverResult<String> {
        let out = Command::new("losetup")
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .context("cannot run losetup (util-linux)")?;
        if !out.status.success() {
            let shown: Vec<_> = args.iter().map(|a| a.to_string_lossy()).collect();
            return Err(DriverError::failure(format!(
                "losetup {} failed ({}): {}",
                shown.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// The loop device backing `image` (compared by inode, as `losetup -j` does).
    pub fn device_of(image: &Path) -> DriverResult<Option<String>> {
        let out = run(&[
            "--list".as_ref(),
            "--noheadings".as_ref(),
            "--output".as_ref(),
            "NAME".as_ref(),
            "--associated".as_ref(),
            image.as_os_str(),
        ])?;
        Ok(out.lines().next().map(|l| l.trim().to_owned()))
    }

    /// A new loop device for `image`, or the one already backing it (`--nooverlap`).
    pub fn attach(image: &Path) -> DriverResult<String> {
        run(&[
            "--find".as_ref(),
            "--show".as_ref(),
            "--nooverlap".as_ref(),
            image.as_os_str(),
        ])
    }

    /// Detaches `device` and waits (up to 5 s) until the kernel has let it go. While anyone
    /// still has it open (udev's or another tool's `blkid` probe, for a moment), the kernel only
    /// marks it to be cleared on last close; the next attach or a caller's check would see a
    /// device that is still busy. Past the deadline the clear is left to the kernel.
    pub fn detach(device: &str) -> DriverResult<()> {
        run(&["--detach".as_ref(), device.as_ref()])?;
        // With another opener (a blkid probe, a deferred close after umount) the kernel only
        // sets autoclear and frees the device at the last close. Detach answers once it is
        // free, or fails so that the caller retries: "detached" must mean the image is let go.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while backing_file_text(device).is_some() {
            if std::time::Instant::now() >= deadline {
                return Err(DriverError::failure(format!(
                    "{device} is still in use 30 s after detach; retry"
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(())
    }

    /// Makes the loop device see its image's new size.
    pub fn refresh_capacity(device: &str) -> DriverResult<()> {
        run(&["--set-capacity".as_ref(), device.as_ref()]).map(drop)
    }

    /// The image behind a loop device, from sysfs (`/dev/loop3` → `/sys/block/loop3/…`).
    pub fn backing_file(device: &str) -> Option<PathBuf> {
        let text = backing_file_text(device)?;
        let text = text.trim_end_matches('\n');
        (!text.ends_with(" (deleted)")).then(|| PathBuf::from(text))
    }

    /// sysfs' `backing_file` of a loop device, as is; `None` once the device is free.
    fn backing_file_text(device: &str) -> Option<String> {
        let name = Path::new(device).file_name()?.to_str()?;
        if !name.starts_with("loop") {
            return None;
        }
        fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()
    }
}

impl LoopDriver {
    /// The volume whose image backs `device`, when it is one of ours: `<dir>/<name>.img` with
    /// its lock file beside it.
    fn volume_of_device(device: &str) -> Option<Volume> {
        let image = losetup::backing_file(device)?;
        let name = image.file_name()?.to_str()?.strip_suffix(".img")?;
        let volume = Volume::new(name, image.parent()?).ok()?;
        volume.lock_path().exists().then_some(volume)
    }
}

impl Driver for LoopDriver {
    fn init(&self) -> DriverResult<Capabilities> {
        // A broken allowed-dirs file shows at init (`flexd drivers`), not at first use.
        self.image_dirs()?;
        Ok(Capabilities {
            attach: true,
            supports_metrics: true,
            requires_fs_resize: true,
            provision: true,
            ..Capabilities::default()
        })
    }

    fn get_volume_name(&self, options: &VolumeOptions) -> DriverResult<String> {
        Ok(self.volume(options)?.detach_name())
    }

    /// The node is ignored: loop devices are local, so this driver attaches where it runs.
    /// Only a `size` option creates the image; otherwise it must be there.
    fn attach(&self, options: &VolumeOptions, _node: &str) -> DriverResult<String> {
        let volume = self.volume(options)?;
        let create = options.get(SIZE_OPTION).is_some_and(|s| !s.is_empty());
        let size = size_of(options)?;
        let _lock = volume.lock()?;
        if create {
            volume.create_or_reuse_image(size)?;
        } else if !volume.image().exists() {
            return Err(DriverError::not_found(format!(
                "volume {} does not exist (no image {}); give a {SIZE_OPTION} option to create it on attach",
                volume.name,
                volume.image().display()
            )));
        }
        match volume.device()? {
            Some(device) => Ok(device),
            None => losetup::attach(&volume.image()),
        }
    }

    /// The loop device backing the image, set up again when there is none. A loop device is
    /// local to the machine, and `unmountdevice` releases it once nothing mounts it, while the
    /// volume stays attached in Kubernetes' eyes: the next pod on this node that uses the volume
    /// comes here first (kubelet's MountDevice), and must find a device. Found by Kubernetes'
    /// storage e2e suite (two pods using one volume one after the other).
    fn wait_for_attach(&self, _device: &str, options: &VolumeOptions) -> DriverResult<String> {
        let volume = self.volume(options)?;
        let _lock = volume.lock()?;
        if !volume.image().exists() {
            return Err(DriverError::not_found(format!(
                "volume {} does not exist (no image {})",
                volume.name,
                volume.image().display()
            )));
        }
        match volume.device()? {
            Some(device) => Ok(device),
            None => losetup::attach(&volume.image()),
        }
    }

    fn is_attached(&self, options: &VolumeOptions, _node: &str) -> DriverResult<bool> {
        Ok(self.volume(options)?.device()?.is_some())
    }

    fn mount_device(&self, dir: &Path, device: &str, options: &VolumeOptions) -> DriverResult<()> {
        let volume = self.volume(options)?;
        let _lock = volume.lock()?;
        // Only the device backing this volume's image is ever formatted or mounted.
        let actual = volume.attached_device()?;
        if !device.is_empty() && device != actual {
            return Err(DriverError::failure(format!(
                "device {device} does not back volume {} (its device is {actual})",
                volume.name
            )));
        }
        fs::create_dir_all(dir).context(format_args!("cannot create {}", dir.display()))?;
        match mounted_source(dir)? {
            Some(source) if source == actual => return Ok(()),
            Some(other) => {
                return Err(DriverError::failure(format!(
                    "{} already has {other} mounted on it",
                    dir.display()
                )))
            }
            None => {}
        }
        // blkid knows filesystems, not data: an image someone filled with bytes it cannot
        // name (a raw dump, an unknown format) is refused rather than formatted over.
        let unrecognised = mount::filesystem_of(Path::new(&actual))
            .context("cannot inspect the device")?
            .is_none();
        if unrecognised && image_holds_data(&volume.image()).context("cannot read the image")? {
            return Err(DriverError::failure(format!(
                "image {} holds data but no filesystem blkid recognises; refusing to format it \
                 (wipe it yourself if it is really unused)",
                volume.image().display()
            )));
        }
        let fs_type = options.fs_type().unwrap_or("ext4");
        mount::format_and_mount(Path::new(&actual), dir, fs_type, options.read_only())
            .context(format_args!("cannot mount volume {}", volume.name))?;
        Ok(())
    }

    fn unmount_device(&self, dir: &Path) -> DriverResult<()> {
        let Some(device) = mounted_source(dir)? else {
            return Ok(());
        };
        let volume = Self::volume_of_device(&device);
        let _lock = volume.as_ref().map(Volume::lock).transpose()?;
        // A concurrent call may have finished first while we waited, and the loop device may
        // even back another image by now: look again under the lock.
        if mounted_source(dir)?.as_deref() != Some(device.as_str()) {
            return Ok(());
        }
        mount::unmount(dir).context("cannot unmount the device")?;
        // Ours and mounted nowhere else (a target's bind mount, another device dir): release.
        if volume.is_some() && mounts_of(&device)?.is_empty() {
            losetup::detach(&device)?;
        }
        Ok(())
    }

    /// The image, of the requested size (or `size`, or 1Gi), named after the CreateVolume name.
    /// An image already there is reused only when a provision of this name made it (a retry
    /// after a crash) and it is at least that big; anyone else's is `AlreadyExists`. A failed
    /// provision leaves nothing behind, not even its lock file.
    fn provision(&self, options: &VolumeOptions) -> DriverResult<Provisioned> {
        if options.get(VOLUME_ID_OPTION).is_some() {
            return Err(DriverError::invalid_argument(format!(
                "{VOLUME_ID_OPTION} cannot be a parameter: a provisioned volume is named after its CreateVolume name"
            )));
        }
        let name = options.pv_or_volume_name().unwrap_or_default();
        let dir = options
            .get(IMAGE_DIR_OPTION)
            .filter(|d| !d.is_empty())
            .map_or(self.image_dirs()?.default_dir(), Path::new);
        let volume = self.allowed(Volume::new(name, dir)?)?;
        let size = match options.request_bytes().filter(|b| *b > 0) {
            Some(bytes) => bytes,
            None => size_of(options)?,
        };
        let _lock = volume.lock()?;
        let made = volume.provision_locked(size);
        if made.is_err() && !volume.image().exists() && !volume.marker_path().exists() {
            volume.remove_lock_file();
        }
        Ok(Provisioned {
            options: [(VOLUME_ID_OPTION.to_owned(), volume.name.clone())].into(),
            capacity_bytes: Some(made?),
        })
    }

    /// Removes the image a provision made, its marker and its lock file; refused while a loop
    /// device backs it (attached, maybe mounted), and for an image no provision of this name
    /// made (a static volume's, or one put in its place).
    fn delete(&self, options: &VolumeOptions) -> DriverResult<()> {
        let volume = self.volume(options)?;
        if !volume.dir.exists() {
            return Ok(());
        }
        let _lock = volume.lock()?;
        if fs::symlink_metadata(volume.image()).is_ok() {
            if !volume.provisioned_here()? {
                return Err(DriverError::failure(format!(
                    "image {} was not made by a provision of volume {}; refusing to delete it",
                    volume.image().display(),
                    volume.name
                )));
            }
            if let Some(device) = volume.device()? {
                return Err(DriverError::failure(format!(
                    "volume {} is still attached as {device}; detach it first",
                    volume.name
                )));
            }
            match fs::remove_file(volume.image()) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(DriverError::failure(format!(
                        "cannot remove {}: {e}",
                        volume.image().display()
                    )))
                }
            }
        }
        let _ = fs::remove_file(volume.marker_path());
        volume.remove_lock_file();
        Ok(())
    }

    fn detach(&self, volume_name: &str, _node: &str) -> DriverResult<()> {
        let volume = self.allowed(Volume::from_detach_name(volume_name)?)?;
        if !volume.dir.exists() {
            return Ok(());
        }
        let _lock = volume.lock()?;
        let Some(device) = volume.device()? else {
            return Ok(());
        };
        let mounts = mounts_of(&device)?;
        if let Some(first) = mounts.first() {
            return Err(DriverError::failure(format!(
                "volume {} is still mounted on {} ({} mount(s)); unmount it first",
                volume.name,
                first.display(),
                mounts.len()
            )));
        }
        losetup::detach(&device)
    }

    fn expand_volume(
        &self,
        options: &VolumeOptions,
        _dir: &Path,
        new_bytes: u64,
        _old_bytes: u64,
    ) -> DriverResult<u64> {
        let volume = self.volume(options)?;
        let _lock = volume.lock()?;
        let image = volume.image();
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&image)
            .context(format_args!("cannot open image {}", image.display()))?;
        let len = file
            .metadata()
            .context(format_args!("cannot stat {}", image.display()))?
            .len();
        // Never shrink: a smaller size would cut the filesystem off.
        if new_bytes > len {
            file.set_len(new_bytes)
                .and_then(|()| file.sync_all())
                .context(format_args!(
                    "cannot grow {} to {new_bytes} bytes",
                    image.display()
                ))?;
        }
        if let Some(device) = volume.device()? {
            losetup::refresh_capacity(&device)?;
        }
        Ok(new_bytes.max(len))
    }

    fn expand_fs(
        &self,
        options: &VolumeOptions,
        _device: &str,
        dir: &Path,
        _new_bytes: u64,
        _old_bytes: u64,
    ) -> DriverResult<()> {
        let volume = self.volume(options)?;
        let _lock = volume.lock()?;
        let device = volume.attached_device()?;
        mount::grow_filesystem(Path::new(&device), dir).context(format_args!(
            "cannot grow the filesystem of volume {}",
            volume.name
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(json: &str) -> VolumeOptions {
        VolumeOptions::parse(json).unwrap()
    }

    #[test]
    fn names_and_dirs_are_checked_before_any_path_is_built() {
        let v = Volume::from_options(
            &options(r#"{"kubernetes.io/pvOrVolumeName":"pv-1"}"#),
            Path::new(DEFAULT_IMAGE_DIR),
        )
        .unwrap();
        assert_eq!(v.image(), Path::new("/var/lib/flexd-loop/pv-1.img"));
        let v = Volume::from_options(&options(
            r#"{"kubernetes.io/pvOrVolumeName":"pv-1","volumeID":"data","imageDir":"/srv/img"}"#,
        ), Path::new(DEFAULT_IMAGE_DIR))
        .unwrap();
        assert_eq!(v.image(), Path::new("/srv/img/data.img"));
        for bad in [
            r#"{"volumeID":"../etc/passwd"}"#,
            r#"{"volumeID":"a/b"}"#,
            r#"{"volumeID":".hidden"}"#,
            r#"{"volumeID":"-rf"}"#,
            r#"{"volumeID":"a b"}"#,
            r#"{"volumeID":"a@b"}"#,
            r#"{}"#,
            r#"{"volumeID":"v","imageDir":"relative"}"#,
            r#"{"volumeID":"v","imageDir":"/srv/../etc"}"#,
        ] {
            assert!(
                Volume::from_options(&options(bad), Path::new(DEFAULT_IMAGE_DIR)).is_err(),
                "{bad}"
            );
        }
        let v = Volume::from_options(
            &options(r#"{"volumeID":"v","imageDir":"//srv/./x/"}"#),
            Path::new(DEFAULT_IMAGE_DIR),
        );
        assert_eq!(v.unwrap().dir, Path::new("/srv/x"));
        let long = format!(r#"{{"volumeID":"{}"}}"#, "a".repeat(MAX_NAME_LEN + 1));
        assert!(Volume::from_options(&options(&long), Path::new(DEFAULT_IMAGE_DIR)).is_err());
    }

    #[test]
    fn the_detach_name_is_stable_and_finds_the_image_again() {
        for (json, want) in [
            (r#"{"volumeID":"v1"}"#, "v1"),
            (
                r#"{"volumeID":"v1","imageDir":"/tmp/a b~c@d%"}"#,
                "v1@%2Ftmp%2Fa%20b%7Ec%40d%25",
            ),
        ] {
            let volume =
                Volume::from_options(&options(json), Path::new(DEFAULT_IMAGE_DIR)).unwrap();
            let name = volume.detach_name();
            assert_eq!(name, want);
            assert!(!name.contains(['/', '~']));
            assert_eq!(Volume::from_detach_name(&name).unwrap(), volume);
        }
        for bad in ["v@%2", "v@%zz", "v@relative", "../x", "v@%2Fa%2F..%2Fb"] {
            assert!(Volume::from_detach_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1Gi"), Some(1 << 30));
        assert_eq!(parse_size("512Mi"), Some(512 << 20));
        assert_eq!(parse_size("1G"), Some(1_000_000_000));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("1Ei"), Some(1 << 60));
        for bad in ["", "0", "-1", "1 Gi", "lots", "99999999999Ti", "16Ei"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        assert_eq!(size_of(&options("{}")).unwrap(), DEFAULT_SIZE);
        assert!(size_of(&options(r#"{"size":"big"}"#)).is_err());
    }

    #[test]
    fn a_new_image_is_sparse_and_an_existing_one_is_reused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let volume = Volume::new("v", dir.path()).unwrap();
        let _lock = volume.lock().unwrap();
        assert!(volume.create_or_reuse_image(1 << 30).unwrap().is_some());
        let meta = fs::metadata(volume.image()).unwrap();
        assert_eq!(meta.len(), 1 << 30);
        use std::os::unix::fs::MetadataExt;
        assert!(
            meta.blocks() * 512 < 1 << 20,
            "sparse: {} blocks",
            meta.blocks()
        );
        fs::write(volume.image(), b"data").unwrap();
        assert!(volume.create_or_reuse_image(1 << 30).unwrap().is_none());
        assert_eq!(fs::read(volume.image()).unwrap(), b"data");
        // A symlink where the image should be is refused, not followed.
        let other = Volume::new("w", dir.path()).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", other.image()).unwrap();
        assert!(other.create_or_reuse_image(1 << 20).is_err());
    }

    #[test]
    fn data_is_found_anywhere_in_a_sparse_image_and_zeros_are_not_data() {
        use std::io::{Seek, SeekFrom, Write};
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("i.img");
        let mut f = File::create(&image).unwrap();
        f.set_len(64 << 20).unwrap();
        assert!(!image_holds_data(&image).unwrap(), "fresh sparse image");
        f.seek(SeekFrom::Start(10 << 20)).unwrap();
        f.write_all(&[0u8; 8192]).unwrap();
        f.sync_all().unwrap();
        assert!(!image_holds_data(&image).unwrap(), "written zeros");
        f.seek(SeekFrom::Start(40 << 20)).unwrap();
        f.write_all(b"x").unwrap();
        f.sync_all().unwrap();
        assert!(image_holds_data(&image).unwrap(), "one byte deep inside");
        assert!(image_holds_data(&dir.path().join("absent")).is_err());
    }

    #[test]
    fn provision_sizes_the_image_delete_removes_it_and_attach_without_size_needs_it() {
        let dir = tempfile::tempdir().unwrap();
        let driver = LoopDriver::new(ImageDirs::new([dir.path()]).unwrap());
        let images = dir.path().display().to_string();
        let json = |extra: &str| {
            options(&format!(
                r#"{{"imageDir":"{images}","kubernetes.io/pvOrVolumeName":"pvc-1"{extra}}}"#
            ))
        };
        let image = dir.path().join("pvc-1.img");
        // Attaching a volume that was never created names the error, and creates nothing.
        let err = driver.attach(&json(""), "node-1").unwrap_err();
        assert!(
            matches!(
                &err,
                DriverError::Named {
                    code: flexvolume_driver::ErrorCode::NotFound,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(!image.exists());
        let made = driver
            .provision(&json(r#","requestBytes":"5242880""#))
            .unwrap();
        assert_eq!(
            made.options.get(VOLUME_ID_OPTION).map(String::as_str),
            Some("pvc-1")
        );
        assert_eq!(made.capacity_bytes, Some(5 << 20));
        assert_eq!(fs::metadata(&image).unwrap().len(), 5 << 20);
        // Repeated (a retry after a crash): the same image.
        driver
            .provision(&json(r#","requestBytes":"5242880""#))
            .unwrap();
        let bigger = driver
            .provision(&json(r#","requestBytes":"10485760""#))
            .unwrap_err();
        assert!(matches!(
            bigger,
            DriverError::Named {
                code: flexvolume_driver::ErrorCode::AlreadyExists,
                ..
            }
        ));
        if which("losetup") {
            driver.delete(&json("")).unwrap();
            assert!(!image.exists());
        }
        // Deleting what is not there is done already.
        fs::remove_file(&image).ok();
        driver.delete(&json("")).unwrap();
    }

    fn code_of(error: &DriverError) -> Option<flexvolume_driver::ErrorCode> {
        match error {
            DriverError::Named { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Every entry of `dir`, sorted: what a call left behind.
    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn only_the_operators_image_dirs_are_used_and_none_is_made_deep() {
        use flexvolume_driver::ErrorCode;
        let root = tempfile::tempdir().unwrap();
        let allowed = root.path().join("images");
        let driver = LoopDriver::new(ImageDirs::new([&allowed]).unwrap());
        let provision = |dir: &Path| {
            driver.provision(&options(&format!(
                r#"{{"imageDir":"{}","kubernetes.io/pvOrVolumeName":"v","requestBytes":"1048576"}}"#,
                dir.display()
            )))
        };
        for refused in [
            PathBuf::from("/etc"),
            PathBuf::from("/"),
            root.path().to_owned(),
            allowed.join("deeper"),
        ] {
            let err = provision(&refused).unwrap_err();
            assert_eq!(code_of(&err), Some(ErrorCode::InvalidArgument), "{err}");
            assert!(err.to_string().contains("not an image dir"), "{err}");
        }
        assert!(!Path::new("/etc/v.img").exists() && !Path::new("/etc/.v.lock").exists());
        assert!(!Path::new("/v.img").exists());
        assert_eq!(entries(root.path()), Vec::<String>::new());
        // Every other call-out refuses it too: attach would make an image, detach a lock.
        let static_options = options(r#"{"imageDir":"/etc","volumeID":"v","size":"1Mi"}"#);
        assert!(driver.attach(&static_options, "n").is_err());
        assert!(driver.get_volume_name(&static_options).is_err());
        assert!(driver.detach("v@%2Fetc", "n").is_err());
        assert!(!Path::new("/etc/.v.lock").exists());
        // The allowed dir itself is made, one level; its parent must exist.
        provision(&allowed).unwrap();
        assert!(allowed.join("v.img").is_file());
        let orphan = root.path().join("missing/images");
        let driver = LoopDriver::new(ImageDirs::new([&orphan]).unwrap());
        let err = driver
            .provision(&options(&format!(
                r#"{{"imageDir":"{}","kubernetes.io/pvOrVolumeName":"v"}}"#,
                orphan.display()
            )))
            .unwrap_err();
        assert!(err.to_string().contains("its parent must exist"), "{err}");
        assert!(!root.path().join("missing").exists());
        // No imageDir: the operator's first dir, not the driver's built-in default.
        let driver = LoopDriver::new(ImageDirs::new([&allowed]).unwrap());
        driver
            .provision(&options(
                r#"{"kubernetes.io/pvOrVolumeName":"w","requestBytes":"1048576"}"#,
            ))
            .unwrap();
        assert!(allowed.join("w.img").is_file());
        assert!(!Path::new(DEFAULT_IMAGE_DIR).join("w.img").exists());
    }

    #[test]
    fn provision_names_the_volume_itself_and_never_adopts_or_deletes_anothers_image() {
        use flexvolume_driver::ErrorCode;
        let dir = tempfile::tempdir().unwrap();
        let driver = LoopDriver::new(ImageDirs::new([dir.path()]).unwrap());
        let json = |name: &str, extra: &str| {
            options(&format!(
                r#"{{"imageDir":"{}","kubernetes.io/pvOrVolumeName":"{name}"{extra}}}"#,
                dir.path().display()
            ))
        };
        // A static volume's image, made by attach.
        let victim = dir.path().join("victim.img");
        fs::write(&victim, b"someone's data").unwrap();
        let err = driver
            .provision(&json("new", r#","volumeID":"victim""#))
            .unwrap_err();
        assert_eq!(code_of(&err), Some(ErrorCode::InvalidArgument), "{err}");
        let err = driver.provision(&json("victim", "")).unwrap_err();
        assert_eq!(code_of(&err), Some(ErrorCode::AlreadyExists), "{err}");
        assert!(err.to_string().contains("not made by a provision"), "{err}");
        let err = driver
            .delete(&json("victim", r#","volumeID":"victim""#))
            .unwrap_err();
        assert!(err.to_string().contains("not made by a provision"), "{err}");
        assert_eq!(fs::read(&victim).unwrap(), b"someone's data");
        // An image put in the place of a provisioned one is not the one provision made.
        driver.provision(&json("mine", "")).unwrap();
        let mine = dir.path().join("mine.img");
        assert_eq!(fs::metadata(&mine).unwrap().len(), DEFAULT_SIZE);
        fs::remove_file(&mine).unwrap();
        fs::write(&mine, b"planted").unwrap();
        assert!(driver.delete(&json("mine", "")).is_err());
        assert_eq!(fs::read(&mine).unwrap(), b"planted");
        assert_eq!(
            code_of(&driver.provision(&json("mine", "")).unwrap_err()),
            Some(ErrorCode::AlreadyExists)
        );
    }

    #[test]
    fn a_failed_provision_names_its_reason_and_leaves_nothing_behind() {
        use flexvolume_driver::ErrorCode;
        let dir = tempfile::tempdir().unwrap();
        let driver = LoopDriver::new(ImageDirs::new([dir.path()]).unwrap());
        let json = |extra: &str| {
            options(&format!(
                r#"{{"imageDir":"{}","kubernetes.io/pvOrVolumeName":"v"{extra}}}"#,
                dir.path().display()
            ))
        };
        for (extra, code) in [
            (r#","size":"1Ei""#, ErrorCode::OutOfRange),
            (r#","size":"16Ei""#, ErrorCode::OutOfRange),
            (r#","size":"0""#, ErrorCode::InvalidArgument),
            (r#","size":"big""#, ErrorCode::InvalidArgument),
            (
                r#","requestBytes":"9223372036854775808""#,
                ErrorCode::OutOfRange,
            ),
        ] {
            let err = driver.provision(&json(extra)).unwrap_err();
            assert_eq!(code_of(&err), Some(code), "{extra}: {err}");
            assert_eq!(entries(dir.path()), Vec::<String>::new(), "{extra}");
        }
        let err = driver
            .provision(&options(&format!(
                r#"{{"imageDir":"{}","kubernetes.io/pvOrVolumeName":"../x"}}"#,
                dir.path().display()
            )))
            .unwrap_err();
        assert_eq!(code_of(&err), Some(ErrorCode::InvalidArgument), "{err}");
        // The corrected retry under the same name.
        let made = driver.provision(&json(r#","size":"2Mi""#)).unwrap();
        assert_eq!(made.capacity_bytes, Some(2 << 20));
        assert_eq!(entries(dir.path()), [".v.lock", ".v.provisioned", "v.img"]);
        if which("losetup") {
            driver.delete(&json("")).unwrap();
            assert_eq!(entries(dir.path()), Vec::<String>::new());
        }
    }

    #[test]
    fn a_lock_whose_file_was_removed_meanwhile_is_taken_again() {
        let dir = tempfile::tempdir().unwrap();
        let volume = Volume::new("v", dir.path()).unwrap();
        let held = volume.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let volume = volume.clone();
            std::thread::spawn(move || {
                let lock = volume.lock().unwrap();
                tx.send(()).unwrap();
                same_file(&lock, &volume.lock_path()).unwrap()
            })
        };
        // Give the waiter time to open the old file and block on it.
        std::thread::sleep(std::time::Duration::from_millis(200));
        volume.remove_lock_file();
        drop(held);
        rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap();
        assert!(
            waiter.join().unwrap(),
            "the waiter holds the file at the path"
        );
    }

    fn which(tool: &str) -> bool {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }

    #[test]
    fn init_reports_attach_and_metrics() {
        let caps = LoopDriver::default().init().unwrap();
        assert!(caps.attach && caps.supports_metrics && caps.requires_fs_resize);
        assert!(caps.provision);
    }
}
