//! # The `loop` FlexVolume driver
//!
//! Real block volumes on any Linux machine, with no storage system: each volume is a sparse
//! image file under an image directory, attached as a loop device. Shipped with flexd
//! (`flexd install --builtin loop`), so a new user has a real driver to run, and written with
//! the [`flexvolume_driver`] SDK, so it doubles as that SDK's worked example.
//!
//! It is a shared-storage driver, the shape of every SAN, iSCSI or RBD one: the image dir is the
//! storage, which every node sees (shared between nodes in a multi-node cluster, one host's
//! directory on a single node). attach, in the controller, claims a volume for one node; the
//! node that mounts sets up its own loop device.
//!
//! | call-out | runs on | what it does |
//! |---|---|---|
//! | provision | controller | creates the image (sparse, `requestBytes`, else `size`, else 1Gi) and its marker `.<volume>.provisioned`; never adopts an image it did not make |
//! | delete | controller | removes the image, only one provision made (the marker names its inode); refused while the volume is claimed (attached to a node) or a loop device on this host backs it |
//! | attach | controller | with a `size` option, creates the image (sparse) or reuses it; without one, the image must exist (`NotFound` otherwise); claims the volume for the node: `.<volume>.claim` holds its name. Again for that node: done already; while another node holds the claim: a failure naming that node. Makes no loop device, and answers an empty device |
//! | isattached | controller | whether the claim names the node (no claim: not attached, whatever loop devices there are) |
//! | detach | controller | releases the node's claim (refused while this host mounts the volume); a volume claimed by another node, or by none, is success and keeps its claim. By the PV's name, as kubelet gives it (attach remembers which image that is), or by getvolumename's answer |
//! | waitforattach | node | the loop device backing the image on this node, set up when there is none (first use, or `unmountdevice` released it), whatever device it is given |
//! | mountdevice | node | the same device, set up or reused; formats only when `blkid -p` finds nothing (fsType, default ext4; xfs when installed), then mounts |
//! | unmountdevice | node | unmounts, and releases the loop device when nothing else mounts it |
//! | getvolumename | both | `<volume>`, or `<volume>@<image dir, %-escaped>` outside the default image dir |
//! | expandvolume | controller | grows the image |
//! | expandfs | node | refreshes the node's loop device's size, then grows the filesystem |
//! | mount, unmount | | Not supported: the host bind-mounts the device mount |
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
//! on `<imageDir>/.<volume>.lock`, so concurrent calls (kubelet retries, two pods, two nodes
//! on a shared image dir whose filesystem honours `flock` across them) are safe. The claim is
//! the only node-specific file in the image dir; it is written atomically under that lock.
//! A device is only ever formatted when it holds no signature at all, and only the loop device
//! backing the volume's own image is ever formatted or mounted, whatever device argument the
//! caller passes.
//!
//! Whoever else can write a shared image dir (another node's root, a client of the NFS export)
//! cannot make a node use one of its own files or disks: an image is used only when it is a
//! regular file, opened without following a symlink (a symlink, FIFO, device node or directory
//! is refused, saying which), and the loop device is set up on that open file, never on a path
//! (module `loopdev`). Every file the driver writes there is made anew and renamed into place, so
//! whatever was planted at its name is replaced, never written through (module `files`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub use claim::MAX_NODE_LEN;
use flexvolume_os::mount;
pub use image_dirs::{ImageDirs, ImageDirsError};

mod claim;
mod files;
pub mod image_dirs;
mod loopdev;
mod losetup;
mod volume;
use flexvolume_driver::{
    Capabilities, Driver, DriverError, DriverResult, Provisioned, ResultExt as _, VolumeOptions,
};
use volume::{
    file_holds_data, mounted_source, mounts_of, other_backing_file, size_of, Foreign, Image,
};
pub use volume::{image_holds_data, parse_size, Volume};

/// Where images live unless the volume's `imageDir` option says otherwise.
pub const DEFAULT_IMAGE_DIR: &str = "/var/lib/flexd-loop";
/// The size of a new image unless the volume's `size` option says otherwise.
pub const DEFAULT_SIZE: u64 = 1 << 30;
pub const VOLUME_ID_OPTION: &str = "volumeID";
pub const SIZE_OPTION: &str = "size";
pub const IMAGE_DIR_OPTION: &str = "imageDir";
/// Longest volume name: keeps `.<name>.lock` within any filesystem's 255-byte name limit.
pub const MAX_NAME_LEN: usize = 200;

/// The driver. Stateless: everything it knows is on disk (images, claims, the allowed image
/// dirs) or in the kernel (loop devices, mounts), so a restart forgets nothing.
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

impl LoopDriver {
    /// kubelet's detach names the volume by its PV name (it runs getvolumename and ignores the
    /// answer), and that name need not be the image's: a `volumeID` or `imageDir` option says
    /// otherwise. attach therefore leaves `<default dir>/.<PV name>.detach`, holding the name
    /// getvolumename would give; detach reads it back. Found by the e2e oracle scenario
    /// (docs/oracle.md), where kube-controller-manager's detach failed forever.
    fn detach_alias(&self, volume_name: &str) -> DriverResult<Option<PathBuf>> {
        if volume_name.contains('@') || volume::check_name(volume_name).is_err() {
            return Ok(None);
        }
        let dir = self.image_dirs()?.default_dir();
        Ok(Some(dir.join(format!(".{volume_name}.detach"))))
    }

    fn remember_detach_name(&self, options: &VolumeOptions, volume: &Volume) -> DriverResult<()> {
        let Some(pv_name) = options.pv_or_volume_name() else {
            return Ok(());
        };
        let Some(alias) = self.detach_alias(pv_name)? else {
            return Ok(());
        };
        let detach_name = volume.detach_name();
        if detach_name == pv_name && volume.dir == self.image_dirs()?.default_dir() {
            return Ok(());
        }
        // Atomically, and never through a symlink (or anything else) planted at the name.
        files::write_atomically(
            &alias,
            &files::temp_beside(&alias),
            detach_name.as_bytes(),
            0o600,
        )
        .context(format_args!("cannot write {}", alias.display()))?;
        Ok(())
    }

    fn forget_detach_name(&self, volume_name: &str) {
        if let Ok(Some(alias)) = self.detach_alias(volume_name) {
            let _ = fs::remove_file(alias);
        }
    }

    /// The volume a detach name means: getvolumename's answer (`name@dir`), a PV name that
    /// attach remembered, or a bare image name in the default image dir.
    fn volume_to_detach(&self, volume_name: &str) -> DriverResult<Volume> {
        if let Some(alias) = self.detach_alias(volume_name)? {
            match files::read_regular(&alias, 1 << 16) {
                Ok(remembered) => {
                    return Volume::from_detach_name(String::from_utf8_lossy(&remembered).trim())
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(DriverError::failure(format!(
                        "cannot read {}: {e}",
                        alias.display()
                    )))
                }
            }
            // A bare name from getvolumename means the builtin default dir; from kubelet, the
            // configured default dir. Usually they are the same dir.
            let in_default = Volume::new(volume_name, self.image_dirs()?.default_dir())?;
            if !in_default.image().exists() {
                if let Ok(legacy) = Volume::from_detach_name(volume_name) {
                    if legacy.image().exists() {
                        return Ok(legacy);
                    }
                }
            }
            return Ok(in_default);
        }
        Volume::from_detach_name(volume_name)
    }

    /// The volume whose image backs `device`, when it is one of ours: `<dir>/<name>.img` with
    /// its lock file beside it. (A device this driver set up says so itself, even once its image
    /// is gone: [`loopdev::set_up_by_driver`].)
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

    /// Claims the volume for `node` (the claim file `.<volume>.claim`): the image, created
    /// first when there is a `size` option (else it must be there), is `node`'s until `node`'s
    /// detach. Again for the same node is done already; while another node holds it, attach
    /// fails naming that node. No loop device is made here: attach runs wherever the
    /// controller runs, and the node that mounts sets up its own (waitforattach, mountdevice).
    /// The device answered is therefore empty; kubelet hands it to waitforattach as is.
    fn attach(&self, options: &VolumeOptions, node: &str) -> DriverResult<String> {
        let volume = self.volume(options)?;
        claim::check_node(node)?;
        let create = options.get(SIZE_OPTION).is_some_and(|s| !s.is_empty());
        let size = size_of(options)?;
        let _lock = volume.lock()?;
        if create {
            volume.create_or_reuse_image(size)?;
        }
        volume.require_image(&format!(
            "; give a {SIZE_OPTION} option to create it on attach"
        ))?;
        let holder = volume.claimant()?;
        if let Some(holder) = holder.as_deref().filter(|h| *h != node) {
            return Err(DriverError::failure(format!(
                "volume {} is attached to node {holder}, not {node}: detach it from {holder} \
                 first (it is claimed in {})",
                volume.name,
                volume.claim_path().display()
            )));
        }
        self.remember_detach_name(options, &volume)?;
        if holder.is_none() {
            volume.claim_for(node)?;
        }
        Ok(String::new())
    }

    /// The loop device backing the image on this node, set up when there is none, whatever
    /// `device` says (attach answers none; a device named elsewhere means nothing here). A
    /// loop device is local to the machine, and `unmountdevice` releases it once nothing mounts
    /// it, while the volume stays attached in Kubernetes' eyes: the next pod on this node that
    /// uses the volume comes here first (kubelet's MountDevice), and must find a device. Found
    /// by Kubernetes' storage e2e suite (two pods using one volume one after the other).
    fn wait_for_attach(&self, _device: &str, options: &VolumeOptions) -> DriverResult<String> {
        let volume = self.volume(options)?;
        let _lock = volume.lock()?;
        let image = volume.open_image()?;
        volume.device_or_attach(&image)
    }

    /// Whether the claim names `node`: the claim is the attachment, as a SAN's mapping of a LUN
    /// is, whatever loop devices some host still has.
    ///
    /// No claim is "not attached", also for a volume the driver before claims attached (it
    /// set up a loop device where attach ran and kept no claim): Kubernetes then attaches it
    /// again, which claims it (docs/driver-guide.md#loop-shared-storage). Answering from a
    /// loop device on this host would answer for the controller's node, not `node`, and would
    /// hide a volume the storage released behind Kubernetes' back.
    fn is_attached(&self, options: &VolumeOptions, node: &str) -> DriverResult<bool> {
        let volume = self.volume(options)?;
        Ok(volume.claimant()?.is_some_and(|holder| holder == node))
    }

    fn mount_device(&self, dir: &Path, device: &str, options: &VolumeOptions) -> DriverResult<()> {
        let volume = self.volume(options)?;
        let _lock = volume.lock()?;
        let image = volume.open_image()?;
        // Only the device backing this volume's image is ever formatted or mounted: set up
        // here (or reused) whatever device the caller names. A loop device that backs another
        // image is a caller's mix-up, and said so.
        if let Some(other) = other_backing_file(device, &image.identity) {
            return Err(DriverError::failure(format!(
                "device {device} does not back volume {} (it backs {}); refusing to mount it",
                volume.name,
                other.display()
            )));
        }
        let actual = volume.device_or_attach(&image)?;
        let mounted = mount_device_on(&volume, &image, &actual, dir, options);
        // A device this node set up for a mount that failed would stay behind (detach, in the
        // controller, never releases a node's loop device): released when nothing mounts it,
        // as unmountdevice does. The retry sets one up again.
        if mounted.is_err() && mounts_of(&actual).is_ok_and(|m| m.is_empty()) {
            let _ = losetup::detach(&actual);
        }
        mounted
    }

    fn unmount_device(&self, dir: &Path) -> DriverResult<()> {
        let Some(device) = mounted_source(dir)? else {
            return Ok(());
        };
        let volume = Self::volume_of_device(&device);
        // Released below when it is ours: an image's, or one this driver set up (its image may
        // have been removed or renamed since).
        let ours = volume.is_some() || loopdev::set_up_by_driver(&device);
        let _lock = volume.as_ref().map(Volume::lock).transpose()?;
        // A concurrent call may have finished first while we waited, and the loop device may
        // even back another image by now: look again under the lock.
        if mounted_source(dir)?.as_deref() != Some(device.as_str()) {
            return Ok(());
        }
        mount::unmount(dir).context("cannot unmount the device")?;
        // Ours and mounted nowhere else (a target's bind mount, another device dir): release.
        if ours && mounts_of(&device)?.is_empty() {
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

    /// Removes the image a provision made, its marker and its lock file; refused while the
    /// volume is attached to a node (its claim) or a loop device on this host backs it, and for
    /// an image no provision of this name made (a static volume's, or one put in its place).
    fn delete(&self, options: &VolumeOptions) -> DriverResult<()> {
        let volume = self.volume(options)?;
        if !volume.dir.exists() {
            return Ok(());
        }
        let _lock = volume.lock()?;
        if let Some(holder) = volume.claimant()? {
            return Err(DriverError::failure(format!(
                "volume {} is still attached to node {holder}; detach it first",
                volume.name
            )));
        }
        if volume.has_provisioned_image(Foreign::RefuseDelete)? {
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

    /// Releases `node`'s claim. A volume attached to another node, or to none, has nothing to
    /// detach from `node`: success, and the claim stays. Loop devices are the nodes' own
    /// (`unmountdevice` releases them), but a detach run on the node that holds the claim while
    /// this host still mounts the volume is refused: releasing it then would let another node
    /// mount the same filesystem.
    fn detach(&self, volume_name: &str, node: &str) -> DriverResult<()> {
        let volume = self.allowed(self.volume_to_detach(volume_name)?)?;
        if !volume.dir.exists() {
            return Ok(());
        }
        let _lock = volume.lock()?;
        match volume.claimant()? {
            None => {
                self.forget_detach_name(volume_name);
                return Ok(());
            }
            // The PV name stays remembered for the holder's own detach.
            Some(holder) if holder != node => return Ok(()),
            Some(_) => {}
        }
        if let Some(device) = volume.device()? {
            let mounts = mounts_of(&device)?;
            if let Some(first) = mounts.first() {
                return Err(DriverError::failure(format!(
                    "volume {} is still mounted on {} ({} mount(s)); unmount it first",
                    volume.name,
                    first.display(),
                    mounts.len()
                )));
            }
        }
        volume.release_claim()?;
        self.forget_detach_name(volume_name);
        Ok(())
    }

    /// Grows the image (never shrinks it); runs in the controller, so no loop device is
    /// touched: the node's expandfs refreshes its own.
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
        volume.require_image("")?;
        let file = files::open_regular(&image, rustix::fs::OFlags::WRONLY)
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
        Ok(new_bytes.max(len))
    }

    /// Makes this node's loop device see the image's new size, then grows the filesystem.
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
        // The image grew in the controller (expandvolume); this node's loop device, set up by
        // waitforattach, learns its new size only when asked.
        losetup::refresh_capacity(&device)?;
        mount::grow_filesystem(Path::new(&device), dir).context(format_args!(
            "cannot grow the filesystem of volume {}",
            volume.name
        ))
    }
}

/// mountdevice's work once the volume's own device `device` is set up: mounts it on `dir`,
/// formatting it only when it holds nothing at all.
fn mount_device_on(
    volume: &Volume,
    image: &Image,
    device: &str,
    dir: &Path,
    options: &VolumeOptions,
) -> DriverResult<()> {
    fs::create_dir_all(dir).context(format_args!("cannot create {}", dir.display()))?;
    match mounted_source(dir)? {
        Some(source) if source == device => return Ok(()),
        Some(other) => {
            return Err(DriverError::failure(format!(
                "{} already has {other} mounted on it",
                dir.display()
            )))
        }
        None => {}
    }
    // blkid knows filesystems, not data: an image someone filled with bytes it cannot name (a
    // raw dump, an unknown format) is refused rather than formatted over.
    let unrecognised = mount::filesystem_of(Path::new(device))
        .context("cannot inspect the device")?
        .is_none();
    if unrecognised && file_holds_data(&image.file).context("cannot read the image")? {
        return Err(DriverError::failure(format!(
            "image {} holds data but no filesystem blkid recognises; refusing to format it \
             (wipe it yourself if it is really unused)",
            volume.image().display()
        )));
    }
    let fs_type = options.fs_type().unwrap_or("ext4");
    mount::format_and_mount(Path::new(device), dir, fs_type, options.read_only())
        .context(format_args!("cannot mount volume {}", volume.name))?;
    Ok(())
}

#[cfg(test)]
mod tests;
