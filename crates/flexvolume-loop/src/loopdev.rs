//! Loop devices set up on, and found by, an image the driver holds open: the kernel's own loop
//! interface (`/dev/loop-control`, the loop ioctls), never a path.
//!
//! Why not `losetup`: it takes a path and opens it itself, so whatever is at the path when it
//! looks (a symlink planted in a shared image dir, to any file or disk of the host) is what it
//! backs the device with. Handing it `/proc/self/fd/N` instead would need the descriptor
//! inherited at that number, and losetup would still open the file again. `LOOP_CONFIGURE` takes
//! the descriptor itself: the device is backed by exactly the inode the driver checked is a
//! regular file, with no second open and no child process. The device already backing an image
//! is found the same way, by the backing file's device and inode (`LOOP_GET_STATUS64`), never by
//! comparing path strings. Detaching and resizing a device, which name only the device, still
//! go through `losetup` ([`crate::losetup`]).

use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, AsRawFd as _, OwnedFd};
use std::path::Path;

use flexvolume_driver::{DriverError, DriverResult};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::ioctl::{ioctl, Getter, IntegerSetter, Ioctl, IoctlOutput, NoArg, Opcode, Setter};

use crate::files::Identity;

// <linux/loop.h>
const LOOP_SET_FD: Opcode = 0x4C00;
const LOOP_CLR_FD: Opcode = 0x4C01;
const LOOP_SET_STATUS64: Opcode = 0x4C04;
const LOOP_GET_STATUS64: Opcode = 0x4C05;
const LOOP_CONFIGURE: Opcode = 0x4C0A;
const LOOP_CTL_GET_FREE: Opcode = 0x4C82;
const LO_NAME_SIZE: usize = 64;

/// What the driver writes in `lo_file_name` of each device it sets up (followed by as much of
/// the image's path as fits), so that `unmountdevice` knows a device of its own even when the
/// image's name no longer says which volume it is (the image was removed or renamed).
const MARKER: &[u8] = b"flexd-loop:";

/// `struct loop_info64`.
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config`.
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

impl LoopInfo64 {
    const ZERO: Self = Self {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: 0,
        lo_file_name: [0; LO_NAME_SIZE],
        lo_crypt_name: [0; LO_NAME_SIZE],
        lo_encrypt_key: [0; 32],
        lo_init: [0; 2],
    };

    /// Status naming the driver (see [`MARKER`]) and `image`.
    fn marked(image: &Path) -> Self {
        let mut info = Self::ZERO;
        let name = MARKER
            .iter()
            .chain(image.as_os_str().as_encoded_bytes())
            .take(LO_NAME_SIZE - 1);
        for (slot, byte) in info.lo_file_name.iter_mut().zip(name) {
            *slot = *byte;
        }
        info
    }

    /// The backing file's identity (the kernel encodes its device as `new_encode_dev`).
    fn backing(&self) -> Identity {
        let dev = self.lo_device;
        Identity {
            major: ((dev >> 8) & 0xfff) as u32,
            minor: ((dev & 0xff) | ((dev >> 12) & 0xfff00)) as u32,
            ino: self.lo_inode,
        }
    }
}

/// `LOOP_CTL_GET_FREE`, whose answer is the ioctl's return value.
struct GetFree;

// SAFETY: LOOP_CTL_GET_FREE takes no argument and touches no user memory; it returns the number
// of a free loop device.
unsafe impl Ioctl for GetFree {
    type Output = IoctlOutput;
    const IS_MUTATING: bool = false;

    fn opcode(&self) -> Opcode {
        LOOP_CTL_GET_FREE
    }

    fn as_ptr(&mut self) -> *mut std::ffi::c_void {
        std::ptr::null_mut()
    }

    unsafe fn output_from_ptr(
        out: IoctlOutput,
        _: *mut std::ffi::c_void,
    ) -> rustix::io::Result<IoctlOutput> {
        Ok(out)
    }
}

fn get_status(device: impl AsFd) -> rustix::io::Result<LoopInfo64> {
    // SAFETY: LOOP_GET_STATUS64 fills a `struct loop_info64`, which `LoopInfo64` is.
    unsafe { ioctl(device, Getter::<LOOP_GET_STATUS64, LoopInfo64>::new()) }
}

/// The name (`loop3`) of `device` when it is a loop device's path (`/dev/loop3`).
fn loop_name(device: &str) -> Option<&str> {
    let name = device.strip_prefix("/dev/")?;
    let number = name.strip_prefix("loop")?;
    (!number.is_empty() && number.bytes().all(|b| b.is_ascii_digit())).then_some(name)
}

/// The status of loop device `name` (`loop3`); `None` when it backs nothing (or is gone).
/// `Err(Errno)` when the device cannot be opened (without root, say).
fn status_of(name: &str) -> Result<io::Result<Option<LoopInfo64>>, Errno> {
    let path = format!("/dev/{name}");
    let device = match rustix::fs::open(
        path.as_str(),
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    ) {
        Ok(device) => device,
        Err(Errno::NOENT | Errno::NXIO | Errno::NODEV) => return Ok(Ok(None)),
        Err(e) => return Err(e),
    };
    Ok(status_of_open(&path, &device))
}

fn status_of_open(path: &str, device: &OwnedFd) -> io::Result<Option<LoopInfo64>> {
    match get_status(device) {
        Ok(info) => Ok(Some(info)),
        Err(Errno::NXIO) => Ok(None),
        Err(e) => Err(io::Error::other(format!(
            "cannot read the status of {path}: {e}"
        ))),
    }
}

/// The loop devices that back something now (`loop3`, …), lowest number first.
fn bound_devices() -> Vec<String> {
    let mut found: Vec<(u32, String)> = fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let number = name.strip_prefix("loop")?.parse().ok()?;
            entry
                .path()
                .join("loop/backing_file")
                .exists()
                .then_some((number, name))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, name)| name).collect()
}

/// The identity of the file backing loop device `name` (`loop3`); `None` when it backs nothing.
/// From the kernel (`LOOP_GET_STATUS64`); when the device cannot be opened (without root), from
/// the path sysfs gives, looked at without following a symlink.
fn backing_of(name: &str) -> io::Result<Option<Identity>> {
    match status_of(name) {
        Ok(status) => Ok(status?.map(|info| info.backing())),
        Err(Errno::ACCESS | Errno::PERM) => {
            let Ok(text) = fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
            else {
                return Ok(None);
            };
            let path = text.trim_end_matches('\n');
            if path.ends_with(" (deleted)") {
                return Ok(None);
            }
            Ok(fs::symlink_metadata(path).ok().map(|m| Identity::of(&m)))
        }
        Err(e) => Err(io::Error::other(format!("cannot open /dev/{name}: {e}"))),
    }
}

/// The loop device (`/dev/loopN`) backed by the file `image` is, if any: compared by device and
/// inode, so a device on another path to the same file counts, and one on another file at the
/// same path does not.
pub(crate) fn find(image: &Identity) -> DriverResult<Option<String>> {
    for name in bound_devices() {
        let backing = backing_of(&name)
            .map_err(|e| DriverError::failure(format!("cannot list loop devices: {e}")))?;
        if backing == Some(*image) {
            return Ok(Some(format!("/dev/{name}")));
        }
    }
    Ok(None)
}

/// The identity of the file backing loop device `device` (`/dev/loopN`); `None` when it is not
/// a loop device or backs nothing.
pub(crate) fn backing_identity(device: &str) -> Option<Identity> {
    backing_of(loop_name(device)?).ok()?
}

/// Whether loop device `device` was set up by this driver (see [`MARKER`]).
pub(crate) fn set_up_by_driver(device: &str) -> bool {
    loop_name(device)
        .and_then(|name| status_of(name).ok()?.ok()?)
        .is_some_and(|info| info.lo_file_name.starts_with(MARKER))
}

/// A new loop device backed by the open `image` (found at `path`, which only names it in the
/// device's status), its path answered. Read-only when `image` is open read-only.
pub(crate) fn attach(image: &File, path: &Path) -> DriverResult<String> {
    let failed = |what: String| {
        DriverError::failure(format!(
            "cannot set up a loop device for {}: {what}",
            path.display()
        ))
    };
    let control = rustix::fs::open(
        "/dev/loop-control",
        OFlags::RDWR | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| failed(format!("cannot open /dev/loop-control: {e}")))?;
    // The free device may be taken by someone else before it is configured (EBUSY): ask again.
    for _ in 0..64 {
        // SAFETY: see `GetFree`.
        let number = unsafe { ioctl(&control, GetFree) }
            .map_err(|e| failed(format!("no free loop device: {e}")))?;
        let device_path = format!("/dev/loop{number}");
        let device = rustix::fs::open(
            device_path.as_str(),
            OFlags::RDWR | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| failed(format!("cannot open {device_path}: {e}")))?;
        match configure(&device, image, path) {
            Ok(()) => return Ok(device_path),
            Err(Errno::BUSY) => continue,
            Err(e) => return Err(failed(format!("{device_path}: {e}"))),
        }
    }
    Err(failed(
        "every free loop device was taken before it could be set up; retry".to_owned(),
    ))
}

/// Backs `device` with `image`: `LOOP_CONFIGURE` (Linux 5.8), else `LOOP_SET_FD` then
/// `LOOP_SET_STATUS64`, as losetup does.
fn configure(device: &OwnedFd, image: &File, path: &Path) -> rustix::io::Result<()> {
    let fd = u32::try_from(image.as_raw_fd()).map_err(|_| Errno::BADF)?;
    let config = LoopConfig {
        fd,
        block_size: 0,
        info: LoopInfo64::marked(path),
        reserved: [0; 8],
    };
    // SAFETY: LOOP_CONFIGURE reads a `struct loop_config`, which `LoopConfig` is; the image's
    // descriptor in it is open for the whole call.
    match unsafe { ioctl(device, Setter::<LOOP_CONFIGURE, LoopConfig>::new(config)) } {
        // A kernel without LOOP_CONFIGURE: the two older calls.
        Err(Errno::INVAL | Errno::NOTTY) => configure_in_two_steps(device, image, path),
        done => done,
    }
}

/// [`configure`] before Linux 5.8.
fn configure_in_two_steps(device: &OwnedFd, image: &File, path: &Path) -> rustix::io::Result<()> {
    let fd = usize::try_from(image.as_raw_fd()).map_err(|_| Errno::BADF)?;
    // SAFETY: LOOP_SET_FD takes the backing file's descriptor as its integer argument.
    unsafe { ioctl(device, IntegerSetter::<LOOP_SET_FD>::new_usize(fd)) }?;
    // SAFETY: LOOP_SET_STATUS64 reads a `struct loop_info64`, which `LoopInfo64` is.
    let info = LoopInfo64::marked(path);
    let status = unsafe { ioctl(device, Setter::<LOOP_SET_STATUS64, LoopInfo64>::new(info)) };
    if let Err(e) = status {
        // SAFETY: LOOP_CLR_FD takes no argument.
        let _ = unsafe { ioctl(device, NoArg::<LOOP_CLR_FD>::new()) };
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_device_names() {
        assert_eq!(loop_name("/dev/loop3"), Some("loop3"));
        assert_eq!(loop_name("/dev/loop12"), Some("loop12"));
        for not in [
            "/dev/loop",
            "/dev/loop-control",
            "/dev/sda",
            "loop3",
            "/dev/loop3p1",
        ] {
            assert_eq!(loop_name(not), None, "{not}");
        }
    }

    #[test]
    fn the_marker_holds_as_much_of_the_path_as_fits() {
        let info = LoopInfo64::marked(Path::new("/srv/images/v.img"));
        assert!(info
            .lo_file_name
            .starts_with(b"flexd-loop:/srv/images/v.img\0"));
        let long = format!("/{}", "x".repeat(100));
        let info = LoopInfo64::marked(Path::new(&long));
        assert!(info.lo_file_name.starts_with(MARKER));
        assert_eq!(info.lo_file_name[LO_NAME_SIZE - 1], 0, "NUL-terminated");
    }

    /// Both ways of setting a device up (`LOOP_CONFIGURE`, and the two calls before Linux 5.8)
    /// give a device backed by the open file, marked as the driver's, and found again by the
    /// file's identity.
    #[test]
    fn a_device_set_up_either_way_is_found_by_the_files_identity() {
        test_support::require_root!("needs root (loop devices)");
        let sandbox = test_support::Sandbox::new();
        for (name, two_steps) in [("new.img", false), ("old.img", true)] {
            let path = sandbox.path(name);
            let file = File::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .unwrap();
            file.set_len(8 << 20).unwrap();
            let identity = crate::files::look(&path).unwrap().identity;
            assert_eq!(find(&identity).unwrap(), None);
            let device = if two_steps {
                let control = rustix::fs::open(
                    "/dev/loop-control",
                    OFlags::RDWR | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .unwrap();
                // SAFETY: see `GetFree`.
                let number = unsafe { ioctl(&control, GetFree) }.unwrap();
                let device = format!("/dev/loop{number}");
                let fd = rustix::fs::open(
                    device.as_str(),
                    OFlags::RDWR | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .unwrap();
                configure_in_two_steps(&fd, &file, &path).unwrap();
                device
            } else {
                attach(&file, &path).unwrap()
            };
            assert_eq!(find(&identity).unwrap().as_deref(), Some(device.as_str()));
            assert_eq!(backing_identity(&device), Some(identity));
            assert!(set_up_by_driver(&device), "{device}: marked");
            assert_eq!(
                crate::losetup::backing_file(&device).as_deref(),
                Some(path.as_path())
            );
            crate::losetup::detach(&device).unwrap();
            assert_eq!(find(&identity).unwrap(), None);
        }
    }

    #[test]
    fn the_backing_device_is_decoded_as_the_kernel_encodes_it() {
        let mut info = LoopInfo64::ZERO;
        // new_encode_dev(major 259, minor 300): (minor & 0xff) | major << 8 | (minor & ~0xff) << 12
        info.lo_device = (300 & 0xff) | (259 << 8) | ((300 & !0xff) << 12);
        info.lo_inode = 42;
        let id = info.backing();
        assert_eq!((id.major, id.minor, id.ino), (259, 300, 42));
        let dev = rustix::fs::makedev(259, 300);
        assert_eq!((rustix::fs::major(dev), rustix::fs::minor(dev)), (259, 300));
    }
}
