//! Loop devices by name, through util-linux's `losetup`: detaching one, refreshing its size.
//! Output is always captured: a driver's stdout is its reply. Setting a device up on an image, and
//! finding the one backing an image, never go through a path: [`crate::loopdev`].

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use flexvolume_driver::{DriverError, DriverResult, ResultExt as _};

pub(crate) fn run(args: &[&std::ffi::OsStr]) -> DriverResult<String> {
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
pub(crate) fn backing_file_text(device: &str) -> Option<String> {
    let name = Path::new(device).file_name()?.to_str()?;
    if !name.starts_with("loop") {
        return None;
    }
    fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()
}
