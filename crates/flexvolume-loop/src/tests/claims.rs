//! The loop driver as a shared-storage driver: two "nodes" (two node names) against one image
//! dir, claims, and where loop devices are (and are not) made. Real images, real loop devices,
//! real mkfs and mounts: what needs root skips visibly without it, and the sandbox unmounts
//! and frees every loop device backed by its files, even when a test fails.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use flexvolume_driver::{Driver, DriverError, ErrorCode, VolumeOptions};
use test_support::Sandbox;

use crate::{ImageDirs, LoopDriver};

/// One image dir, in a sandbox, as two nodes of a cluster see it (the dir is shared storage).
struct SharedImages {
    sandbox: Sandbox,
    dir: PathBuf,
}

impl SharedImages {
    fn new() -> Self {
        let sandbox = Sandbox::new();
        let dir = sandbox.path("images");
        fs::create_dir(&dir).unwrap();
        Self { sandbox, dir }
    }

    /// The driver as a node runs it: a new one each time, as each call-out is a new process.
    fn driver(&self) -> LoopDriver {
        LoopDriver::new(ImageDirs::new([&self.dir]).unwrap())
    }

    /// The options of PV `pv`, its image in the shared dir; `extra` is more JSON members.
    fn options(&self, pv: &str, extra: &str) -> VolumeOptions {
        VolumeOptions::parse(&format!(
            r#"{{"imageDir":"{}","kubernetes.io/pvOrVolumeName":"{pv}"{extra}}}"#,
            self.dir.display()
        ))
        .unwrap()
    }

    fn image(&self, volume: &str) -> PathBuf {
        self.dir.join(format!("{volume}.img"))
    }

    fn claim(&self, volume: &str) -> PathBuf {
        self.dir.join(format!(".{volume}.claim"))
    }

    /// The loop devices on this host backed by the volume's image.
    fn devices_of(&self, volume: &str) -> Vec<String> {
        let image = self.image(volume);
        self.sandbox
            .loop_devices()
            .into_iter()
            .filter(|(_, file)| *file == image)
            .map(|(device, _)| device)
            .collect()
    }

    fn is_attached(&self, options: &VolumeOptions, node: &str) -> bool {
        self.driver().is_attached(options, node).unwrap()
    }
}

fn has_losetup() -> bool {
    Command::new("losetup")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn message(error: &DriverError) -> String {
    error.to_string()
}

#[test]
fn a_second_node_cannot_attach_until_the_first_detaches() {
    let s = SharedImages::new();
    let options = s.options("pv-1", r#","size":"8Mi""#);
    let (a, b) = ("node-a", "node-b");
    assert_eq!(s.driver().attach(&options, a).unwrap(), "", "no device");
    assert_eq!(fs::read_to_string(s.claim("pv-1")).unwrap(), "node-a\n");
    // Again for the same node: done already.
    assert_eq!(s.driver().attach(&options, a).unwrap(), "");

    let refused = s.driver().attach(&options, b).unwrap_err();
    assert!(
        matches!(refused, DriverError::Failure(_)),
        "a plain failure: no named code fits: {refused:?}"
    );
    let text = message(&refused);
    assert!(text.contains("attached to node node-a"), "{text}");
    assert!(text.contains("detach it from node-a first"), "{text}");
    assert_eq!(fs::read_to_string(s.claim("pv-1")).unwrap(), "node-a\n");

    assert!(s.is_attached(&options, a));
    assert!(!s.is_attached(&options, b));

    // A detach by the node that does not hold it changes nothing, and succeeds.
    s.driver().detach("pv-1", b).unwrap();
    assert_eq!(fs::read_to_string(s.claim("pv-1")).unwrap(), "node-a\n");
    assert!(s.is_attached(&options, a));

    s.driver().detach("pv-1", a).unwrap();
    assert!(!s.claim("pv-1").exists());
    assert!(!s.is_attached(&options, a) && !s.is_attached(&options, b));
    // Detached from a node that no longer holds it: done already.
    s.driver().detach("pv-1", a).unwrap();

    assert_eq!(s.driver().attach(&options, b).unwrap(), "");
    assert!(s.is_attached(&options, b));
    assert!(!s.is_attached(&options, a));
    let refused = s.driver().attach(&options, a).unwrap_err();
    assert!(message(&refused).contains("attached to node node-b"));
    // Nothing but the image, its lock, its claim and the PV name's detach name (the image
    // dir is not the built-in default) is in the shared dir: no temporary file.
    assert_eq!(
        super::entries(&s.dir),
        [".pv-1.claim", ".pv-1.detach", ".pv-1.lock", "pv-1.img"]
    );
}

/// The claim is a file, not a process's memory: a driver started afresh (every call-out is a
/// new process) sees it, and so does one on another node sharing the image dir.
#[test]
fn a_claim_survives_a_restart_of_the_driver() {
    let s = SharedImages::new();
    let options = s.options("pv-1", r#","size":"8Mi""#);
    let first = s.driver();
    first.attach(&options, "node-a").unwrap();
    drop(first);
    let restarted = s.driver();
    assert!(restarted.is_attached(&options, "node-a").unwrap());
    assert!(!restarted.is_attached(&options, "node-b").unwrap());
    assert!(restarted.attach(&options, "node-b").is_err());
    restarted.detach("pv-1", "node-a").unwrap();
    assert!(!s.driver().is_attached(&options, "node-a").unwrap());
}

/// kube-controller-manager detaches by the PV's name; the image may have another name (a
/// `volumeID`): attach remembered which image that is, and a detach by the PV's name releases
/// that image's claim. A non-holder's detach by PV name keeps both the claim and the memory.
#[test]
fn detach_by_the_pv_name_releases_the_claim_of_the_right_image() {
    let s = SharedImages::new();
    let options = s.options("pv-of-image", r#","volumeID":"image-of-pv","size":"8Mi""#);
    s.driver().attach(&options, "node-a").unwrap();
    assert!(s.claim("image-of-pv").exists());
    assert!(!s.claim("pv-of-image").exists());
    s.driver().detach("pv-of-image", "node-b").unwrap();
    assert!(s.claim("image-of-pv").exists(), "node-b held nothing");
    s.driver().detach("pv-of-image", "node-a").unwrap();
    assert!(!s.claim("image-of-pv").exists(), "released");
    s.driver().detach("pv-of-image", "node-a").unwrap();
    // getvolumename's answer detaches too.
    s.driver().attach(&options, "node-b").unwrap();
    let name = s.driver().get_volume_name(&options).unwrap();
    s.driver().detach(&name, "node-b").unwrap();
    assert!(!s.claim("image-of-pv").exists());
}

#[test]
fn only_usable_node_names_are_claimed() {
    let s = SharedImages::new();
    let options = s.options("pv-1", r#","size":"8Mi""#);
    let long = "n".repeat(crate::MAX_NODE_LEN + 1);
    for bad in ["", "node a", "node\na", "node\u{7f}", long.as_str()] {
        let err = s.driver().attach(&options, bad).unwrap_err();
        assert!(
            matches!(
                err,
                DriverError::Named {
                    code: ErrorCode::InvalidArgument,
                    ..
                }
            ),
            "{bad:?}: {err:?}"
        );
        assert!(!s.claim("pv-1").exists(), "{bad:?}");
    }
    let longest = "n".repeat(crate::MAX_NODE_LEN);
    s.driver().attach(&options, &longest).unwrap();
    assert!(s.is_attached(&options, &longest));
}

/// Eight nodes attach one volume at once: exactly one gets it, the others are told who.
#[test]
fn concurrent_attaches_from_different_nodes_claim_for_exactly_one() {
    let s = SharedImages::new();
    let options = s.options("pv-1", r#","size":"8Mi""#);
    let results: Vec<(String, Result<String, DriverError>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (s, options) = (&s, &options);
                scope.spawn(move || {
                    let node = format!("node-{i}");
                    let result = s.driver().attach(options, &node);
                    (node, result)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winners: Vec<&String> = results
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(node, _)| node)
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let winner = winners[0];
    assert_eq!(
        fs::read_to_string(s.claim("pv-1")).unwrap(),
        format!("{winner}\n")
    );
    for (_, result) in &results {
        if let Err(e) = result {
            assert!(
                message(e).contains(&format!("attached to node {winner}")),
                "{e}"
            );
        }
    }
}

/// A claim the driver cannot read, or that holds no node name, is never guessed about:
/// attach, isattached, detach and delete each fail saying which file and what to do.
#[test]
fn a_corrupt_or_unreadable_claim_is_a_clear_error_never_a_guess() {
    let s = SharedImages::new();
    let options = s.options("pv-1", r#","size":"8Mi""#);
    s.driver().attach(&options, "node-a").unwrap();
    let claim = s.claim("pv-1");
    let too_long = format!("{}\n", "n".repeat(crate::MAX_NODE_LEN + 1));
    let contents: [&[u8]; 7] = [
        b"",
        b"\n",
        b"node a\n",
        b"node-a\nnode-b\n",
        b"\xff\xfe\x00garbage",
        b"node-a\0",
        too_long.as_bytes(),
    ];
    for content in contents {
        fs::write(&claim, content).unwrap();
        expect_claim_error(&s, &options, "is corrupt", &format!("{content:?}"));
        assert_eq!(fs::read(&claim).unwrap(), content, "left as it was");
    }
    // Not a file to read: a directory, a symlink (never followed), a FIFO (would block).
    fs::remove_file(&claim).unwrap();
    fs::create_dir(&claim).unwrap();
    expect_claim_error(&s, &options, "cannot read the claim", "a directory");
    fs::remove_dir(&claim).unwrap();
    let elsewhere = s.sandbox.write("elsewhere", "node-a\n");
    std::os::unix::fs::symlink(&elsewhere, &claim).unwrap();
    expect_claim_error(&s, &options, "symlink", "a symlink");
    fs::remove_file(&claim).unwrap();
    test_support::make_fifo(&claim, 0o600);
    expect_claim_error(&s, &options, "not a regular file", "a FIFO");
    fs::remove_file(&claim).unwrap();
    // Repaired by hand: the driver goes on.
    fs::write(&claim, "node-a").unwrap();
    assert!(s.is_attached(&options, "node-a"), "a name without newline");
    s.driver().detach("pv-1", "node-a").unwrap();
    assert!(!claim.exists());
}

fn expect_claim_error(s: &SharedImages, options: &VolumeOptions, says: &str, case: &str) {
    let driver = s.driver();
    let errors = [
        ("attach", driver.attach(options, "node-b").unwrap_err()),
        (
            "isattached",
            driver.is_attached(options, "node-a").unwrap_err(),
        ),
        ("detach", driver.detach("pv-1", "node-a").unwrap_err()),
        ("delete", driver.delete(options).unwrap_err()),
    ];
    for (call, error) in errors {
        let text = message(&error);
        assert!(
            matches!(error, DriverError::Failure(_)),
            "{case}: {call}: {error:?}"
        );
        assert!(text.contains(says), "{case}: {call}: {text}");
        assert!(text.contains(".pv-1.claim"), "{case}: {call}: {text}");
    }
}

#[test]
fn delete_is_refused_while_the_volume_is_claimed_and_succeeds_after_detach() {
    if !has_losetup() {
        test_support::skip!("losetup (util-linux) is not installed");
    }
    let s = SharedImages::new();
    let options = s.options("pvc-1", r#","requestBytes":"8388608""#);
    let driver = s.driver();
    driver.provision(&options).unwrap();
    let volume = s.options("pvc-1", r#","volumeID":"pvc-1""#);
    driver.attach(&volume, "node-a").unwrap();
    let refused = s.driver().delete(&volume).unwrap_err();
    assert!(
        message(&refused).contains("still attached to node node-a"),
        "{refused}"
    );
    assert!(s.image("pvc-1").exists());
    // Another node's detach releases nothing; the holder's does.
    s.driver().detach("pvc-1", "node-b").unwrap();
    assert!(s.driver().delete(&volume).is_err());
    s.driver().detach("pvc-1", "node-a").unwrap();
    s.driver().delete(&volume).unwrap();
    assert!(!s.image("pvc-1").exists());
    assert_eq!(super::entries(&s.dir), Vec::<String>::new());
}

#[test]
fn attach_makes_no_loop_device_and_the_node_makes_its_own_whatever_device_it_is_given() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    let s = SharedImages::new();
    let options = s.options("pv-1", r#","size":"16Mi""#);
    let other = s.options("pv-2", r#","size":"16Mi""#);
    let driver = s.driver();
    assert_eq!(driver.attach(&options, "node-a").unwrap(), "");
    assert_eq!(driver.attach(&other, "node-a").unwrap(), "");
    assert!(s.devices_of("pv-1").is_empty(), "attach made a loop device");

    // kubelet passes attach's answer ("") on; any other device means nothing to this node.
    let device = driver.wait_for_attach("", &options).unwrap();
    assert_eq!(s.devices_of("pv-1"), vec![device.clone()]);
    for given in ["/dev/loop-that-is-not-there", "/dev/sda", &device] {
        assert_eq!(driver.wait_for_attach(given, &options).unwrap(), device);
    }
    let other_device = driver.wait_for_attach("/dev/bogus", &other).unwrap();
    assert_ne!(other_device, device);
    assert_eq!(s.devices_of("pv-1"), vec![device.clone()], "one device");
    assert_eq!(s.devices_of("pv-2"), vec![other_device.clone()]);

    // mountdevice mounts the volume's own device: another volume's is refused, a bogus name
    // ignored; with no device at all (unmountdevice freed it), it sets one up.
    let dir = s.sandbox.target("device-mount");
    let err = driver
        .mount_device(&dir, &other_device, &options)
        .unwrap_err();
    assert!(message(&err).contains("does not back volume pv-1"), "{err}");
    assert!(!test_support::is_mounted(&dir));
    driver.mount_device(&dir, "/dev/bogus", &options).unwrap();
    assert!(test_support::is_mounted(&dir));
    driver.unmount_device(&dir).unwrap();
    assert!(s.devices_of("pv-1").is_empty(), "unmountdevice released it");
    driver.mount_device(&dir, "", &options).unwrap();
    let remade = s.devices_of("pv-1");
    assert_eq!(remade.len(), 1);
    driver.unmount_device(&dir).unwrap();
    assert!(s.devices_of("pv-1").is_empty());

    // Detach is the claim's business only: it leaves this node's devices alone.
    driver.detach("pv-2", "node-a").unwrap();
    assert_eq!(s.devices_of("pv-2"), [other_device]);
    assert!(!s.claim("pv-2").exists());
}

/// detach runs in the controller and never releases a node's loop device: a mountdevice that
/// fails releases the one it set up (or found unmounted), so a refused image leaves none.
#[test]
fn a_failed_mountdevice_leaves_no_loop_device_behind() {
    test_support::require_root!("needs root (loop devices, mounts)");
    let s = SharedImages::new();
    let options = s.options("dump", r#","size":"16Mi""#);
    let driver = s.driver();
    driver.attach(&options, "node-a").unwrap();
    // Bytes blkid cannot name: refused rather than formatted over.
    use std::os::unix::fs::FileExt;
    fs::File::options()
        .write(true)
        .open(s.image("dump"))
        .unwrap()
        .write_all_at(b"customer records", 5 << 20)
        .unwrap();
    let device = driver.wait_for_attach("", &options).unwrap();
    let dir = s.sandbox.target("device-mount");
    let err = driver.mount_device(&dir, &device, &options).unwrap_err();
    assert!(message(&err).contains("refusing to format"), "{err}");
    assert!(s.devices_of("dump").is_empty(), "released");
    let err = driver.mount_device(&dir, "", &options).unwrap_err();
    assert!(message(&err).contains("refusing to format"), "{err}");
    assert!(s.devices_of("dump").is_empty(), "released again");
    assert!(s.claim("dump").exists(), "the claim is detach's business");
}

/// A detach by the claim's holder while this host still mounts the volume would let another
/// node mount the same filesystem: refused, and the claim stays.
#[test]
fn the_holders_detach_is_refused_while_this_host_mounts_the_volume() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    let s = SharedImages::new();
    let options = s.options("pv-1", r#","size":"16Mi""#);
    let driver = s.driver();
    driver.attach(&options, "node-a").unwrap();
    let device = driver.wait_for_attach("", &options).unwrap();
    let dir = s.sandbox.target("device-mount");
    driver.mount_device(&dir, &device, &options).unwrap();
    let err = driver.detach("pv-1", "node-a").unwrap_err();
    assert!(message(&err).contains("still mounted"), "{err}");
    assert!(s.claim("pv-1").exists());
    // Another node's detach has nothing to release.
    driver.detach("pv-1", "node-b").unwrap();
    driver.unmount_device(&dir).unwrap();
    driver.detach("pv-1", "node-a").unwrap();
    assert!(!s.claim("pv-1").exists());
}

/// The driver before claims attached by setting up a loop device where attach ran, and kept no
/// claim. After an upgrade such a volume is "not attached" for every node, its loop device
/// notwithstanding (that device could be any host's, and the storage may have released the
/// volume): Kubernetes attaches it again, which claims it, and the node reuses its device.
#[test]
fn a_volume_without_a_claim_is_not_attached_until_attached_again() {
    test_support::require_root!("needs root (loop devices)");
    let s = SharedImages::new();
    let options = s.options("old", "");
    let image = s.image("old");
    fs::File::create(&image).unwrap().set_len(16 << 20).unwrap();
    let out = Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&image)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let device = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(!s.claim("old").exists());
    assert!(
        !s.is_attached(&options, "node-a"),
        "a loop device is not a claim"
    );
    assert!(!s.is_attached(&options, "node-b"));
    // Kubernetes attaches it again: the claim is written, the node's device reused.
    s.driver().attach(&options, "node-a").unwrap();
    assert!(s.is_attached(&options, "node-a"));
    assert!(!s.is_attached(&options, "node-b"));
    assert_eq!(s.driver().wait_for_attach("", &options).unwrap(), device);
    assert_eq!(s.devices_of("old"), vec![device], "no second device");
}

/// Kubernetes' volume expansion: the controller's expandvolume grows the image (and nothing
/// on any node), then the node's expandfs makes its own loop device see the new size and grows
/// the mounted filesystem.
#[test]
fn controller_expandvolume_then_node_expandfs_grows_the_mounted_filesystem() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    // ext4 grows online only with CAP_SYS_RESOURCE (containers often lack it); xfs always.
    let ext4 = flexvolume_os::mount::has_capability(flexvolume_os::mount::CAP_SYS_RESOURCE);
    if !ext4 && !test_support::has_mkfs_xfs() {
        test_support::skip!("neither CAP_SYS_RESOURCE (ext4) nor mkfs.xfs (xfs) is here");
    }
    // XFS needs 300 MB at least; the image is sparse.
    let (fs_type, mb) = if ext4 { ("ext4", 64) } else { ("xfs", 320) };
    let s = SharedImages::new();
    let options = s.options(
        "grow",
        &format!(r#","size":"{mb}Mi","kubernetes.io/fsType":"{fs_type}""#),
    );
    let driver = s.driver();
    driver.attach(&options, "node-a").unwrap();
    let device = driver.wait_for_attach("", &options).unwrap();
    let dir = s.sandbox.target("device-mount");
    driver.mount_device(&dir, &device, &options).unwrap();
    fs::write(dir.join("keep"), "data").unwrap();
    let before = fs_bytes(&dir);

    let new_bytes = (2 * mb) << 20;
    let grown = s
        .driver()
        .expand_volume(&options, &dir, new_bytes, before)
        .unwrap();
    assert_eq!(grown, new_bytes);
    assert_eq!(fs::metadata(s.image("grow")).unwrap().len(), new_bytes);
    assert_eq!(device_bytes(&device), mb << 20, "the controller left it");

    s.driver()
        .expand_fs(&options, "", &dir, new_bytes, before)
        .unwrap();
    assert_eq!(device_bytes(&device), new_bytes);
    let after = fs_bytes(&dir);
    assert!(
        after > before + ((mb << 20) * 3 / 4),
        "{fs_type} grew from {before} to {after}"
    );
    assert_eq!(fs::read_to_string(dir.join("keep")).unwrap(), "data");
    // Never shrinks.
    assert_eq!(
        s.driver()
            .expand_volume(&options, &dir, mb << 20, after)
            .unwrap(),
        new_bytes
    );
    driver.unmount_device(&dir).unwrap();
    assert!(s.devices_of("grow").is_empty());
}

fn fs_bytes(dir: &Path) -> u64 {
    let st = rustix::fs::statvfs(dir).unwrap();
    st.f_blocks * st.f_frsize
}

/// The size the kernel gives a loop device, from sysfs (512-byte sectors).
fn device_bytes(device: &str) -> u64 {
    let name = Path::new(device).file_name().unwrap().to_str().unwrap();
    let sectors = fs::read_to_string(format!("/sys/block/{name}/size")).unwrap();
    sectors.trim().parse::<u64>().unwrap() * 512
}
