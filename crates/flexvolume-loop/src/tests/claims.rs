//! The loop driver as a shared-storage driver: two "nodes" (two node names) against one image
//! dir, claims, where loop devices are (and are not) made, and what whoever else writes the
//! shared dir can plant in it. Real images, real loop devices, real mkfs and mounts: what needs
//! root skips visibly without it, and the sandbox unmounts and frees every loop device backed by
//! its files, even when a test fails.

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

// ---- Names planted in the shared image dir (issue #48, finding 5) ----
//
// Whoever can write the image dir (another node's root, any client of the NFS export) can put a
// symlink, a FIFO or a device node where the driver expects an image or a file of its own.

/// Runs `call` on another thread; fails the test when it has not answered in 20 s (a FIFO's
/// open blocks forever).
fn within<T: Send + 'static>(what: &str, call: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(call());
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what} hung"))
}

/// The loop devices on this host whose backing file is `file` (by sysfs' path).
fn devices_backed_by(file: &Path) -> Vec<String> {
    test_support::loop_devices_below(Path::new("/"))
        .into_iter()
        .filter(|(_, backing)| backing == file)
        .map(|(device, _)| device)
        .collect()
}

/// A block device node at `path` for the same device as `device`.
fn block_node(path: &Path, device: &str) {
    use std::os::unix::fs::MetadataExt;
    let rdev = fs::metadata(device).unwrap().rdev();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::BlockDevice,
        rustix::fs::Mode::from_raw_mode(0o600),
        rdev,
    )
    .unwrap();
}

fn expect_refused(result: Result<impl std::fmt::Debug, DriverError>, says: &str, call: &str) {
    let error = result.expect_err(call);
    let text = message(&error);
    assert!(
        matches!(error, DriverError::Failure(_)),
        "{call}: a plain failure: {error:?}"
    );
    assert!(text.contains(says), "{call}: {text}");
}

/// A symlink at `<imageDir>/<volume>.img` to a file of the host: no call-out follows it. Nothing
/// is claimed, no loop device is set up on the file it points to, and one the host already has on
/// that file is neither answered nor mounted.
#[test]
fn a_symlink_in_place_of_an_image_is_never_followed_nor_its_target_attached() {
    test_support::require_root!("needs root (loop devices, mounts)");
    let s = SharedImages::new();
    let options = s.options("pv-1", "");
    let target = s.sandbox.path("host-disk");
    fs::File::create(&target)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    std::os::unix::fs::symlink(&target, s.image("pv-1")).unwrap();
    let image = s.image("pv-1").display().to_string();
    let says = "is a symlink (never followed), not a regular file";

    let driver = s.driver();
    let refused = driver.attach(&options, "node-a");
    expect_refused(refused, says, "attach");
    assert!(!s.claim("pv-1").exists(), "nothing claimed");
    let refused = driver.wait_for_attach("", &options).unwrap_err();
    assert!(message(&refused).contains(&image), "{refused}");
    expect_refused(Err::<(), _>(refused), says, "waitforattach");
    let dir = s.sandbox.target("device-mount");
    expect_refused(driver.mount_device(&dir, "", &options), says, "mountdevice");
    assert!(!test_support::is_mounted(&dir));
    assert!(
        devices_backed_by(&target).is_empty(),
        "a device on the target"
    );
    let listed = Command::new("losetup")
        .arg("--associated")
        .arg(&target)
        .output()
        .unwrap();
    assert!(listed.stdout.is_empty(), "{listed:?}");

    // A loop device the host has on that file is not the volume's.
    let out = Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&target)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let host = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    expect_refused(
        driver.wait_for_attach(&host, &options),
        says,
        "waitforattach",
    );
    expect_refused(
        driver.mount_device(&dir, &host, &options),
        says,
        "mountdevice",
    );
    assert!(!test_support::is_mounted(&dir));
    expect_refused(
        driver.expand_volume(&options, &dir, 32 << 20, 0),
        says,
        "expandvolume",
    );
    assert_eq!(fs::metadata(&target).unwrap().len(), 16 << 20);
    assert_eq!(devices_backed_by(&target), vec![host], "the host's only");
}

/// A FIFO at `<imageDir>/<volume>.img`: every call-out that opens the image fails at once, saying
/// what is there, rather than hang on the FIFO.
#[test]
fn a_fifo_in_place_of_an_image_fails_at_once() {
    let s = SharedImages::new();
    test_support::make_fifo(&s.image("pv-1"), 0o600);
    let says = "is a FIFO, not a regular file";
    let (driver, options) = (s.driver(), s.options("pv-1", ""));
    expect_refused(
        within("waitforattach", move || {
            driver.wait_for_attach("", &options)
        }),
        says,
        "waitforattach",
    );
    let (driver, options) = (s.driver(), s.options("pv-1", ""));
    let dir = s.sandbox.target("device-mount");
    let dir_ = dir.clone();
    expect_refused(
        within("mountdevice", move || {
            driver.mount_device(&dir_, "", &options)
        }),
        says,
        "mountdevice",
    );
    let (driver, options) = (s.driver(), s.options("pv-1", ""));
    expect_refused(
        within("expandvolume", move || {
            driver.expand_volume(&options, Path::new("/"), 32 << 20, 0)
        }),
        says,
        "expandvolume",
    );
    let (driver, options) = (s.driver(), s.options("pv-1", r#","size":"8Mi""#));
    expect_refused(
        within("attach", move || driver.attach(&options, "node-a")),
        says,
        "attach",
    );
    let image = s.image("pv-1");
    let read = within("image_holds_data", move || {
        crate::image_holds_data(&image).map_err(|e| e.to_string())
    });
    assert!(read.unwrap_err().contains(says));
    assert!(!test_support::is_mounted(&dir));
    assert!(s.devices_of("pv-1").is_empty());
}

/// A block device node at `<imageDir>/<volume>.img` (a node for one of the host's disks): refused;
/// no loop device is set up on it.
#[test]
fn a_block_device_in_place_of_an_image_is_refused() {
    test_support::require_root!("needs root (device nodes, loop devices)");
    let s = SharedImages::new();
    let disk = s.sandbox.loop_device(8);
    block_node(&s.image("pv-1"), &disk);
    let options = s.options("pv-1", "");
    let says = "is a block device, not a regular file";
    let driver = s.driver();
    expect_refused(driver.attach(&options, "node-a"), says, "attach");
    expect_refused(driver.wait_for_attach("", &options), says, "waitforattach");
    let dir = s.sandbox.target("device-mount");
    expect_refused(driver.mount_device(&dir, "", &options), says, "mountdevice");
    expect_refused(
        driver.expand_volume(&options, &dir, 32 << 20, 0),
        says,
        "expandvolume",
    );
    assert!(!test_support::is_mounted(&dir));
    assert!(s.devices_of("pv-1").is_empty(), "a device on the node");
    assert!(
        devices_backed_by(Path::new(&disk)).is_empty(),
        "a device on the disk"
    );
}

/// Symlinks (and FIFOs) planted where the driver writes its own files (the PV name's detach name,
/// the claim's temporary file, the provision marker and its temporary file): each is replaced,
/// the file it points to left untouched, and nothing blocks. A symlink or FIFO at a volume's lock
/// is refused, saying what it is.
#[test]
fn what_the_driver_writes_is_never_written_through_a_planted_name() {
    let s = SharedImages::new();
    let victim = |name: &str| s.sandbox.write(name, &format!("{name}: host data\n"));
    let untouched = |path: &Path| {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(
            fs::read_to_string(path).unwrap(),
            format!("{name}: host data\n"),
            "written through a planted symlink"
        );
    };
    let plant = |target: &Path, at: &str| {
        std::os::unix::fs::symlink(target, s.dir.join(at)).unwrap();
    };
    let regular = |at: &str| {
        let meta = fs::symlink_metadata(s.dir.join(at)).unwrap();
        assert!(meta.is_file(), "{at}: {meta:?}");
    };

    // attach: the PV name's detach name, the claim (through its temporary file).
    let alias_victim = victim("alias-victim");
    let alias_temp_victim = victim("alias-temp-victim");
    let claim_temp_victim = victim("claim-temp-victim");
    plant(&alias_victim, ".pv-of-image.detach");
    plant(&alias_temp_victim, ".pv-of-image.detach.tmp");
    plant(&claim_temp_victim, ".image-of-pv.claim.tmp");
    let options = s.options("pv-of-image", r#","volumeID":"image-of-pv","size":"8Mi""#);
    s.driver().attach(&options, "node-a").unwrap();
    untouched(&alias_victim);
    untouched(&alias_temp_victim);
    untouched(&claim_temp_victim);
    regular(".pv-of-image.detach");
    assert_eq!(
        fs::read_to_string(s.claim("image-of-pv")).unwrap(),
        "node-a\n"
    );
    s.driver().detach("pv-of-image", "node-a").unwrap();
    assert!(!s.claim("image-of-pv").exists(), "detached by the PV name");

    // A FIFO at the claim's temporary file would block a writer opening it.
    test_support::make_fifo(&s.dir.join(".image-of-pv.claim.tmp"), 0o600);
    let (driver, options_) = (s.driver(), options.clone());
    within("attach", move || driver.attach(&options_, "node-b")).unwrap();
    assert_eq!(
        fs::read_to_string(s.claim("image-of-pv")).unwrap(),
        "node-b\n"
    );

    // provision: the marker and its temporary file.
    let marker_victim = victim("marker-victim");
    let marker_temp_victim = victim("marker-temp-victim");
    plant(&marker_victim, ".pvc-1.provisioned");
    plant(&marker_temp_victim, ".pvc-1.provisioned.tmp");
    let provision = s.options("pvc-1", r#","requestBytes":"8388608""#);
    s.driver().provision(&provision).unwrap();
    untouched(&marker_victim);
    untouched(&marker_temp_victim);
    regular(".pvc-1.provisioned");
    // The marker written is the image's: provision again is a retry, and delete removes it.
    s.driver().provision(&provision).unwrap();
    if test_support::is_root() {
        s.driver()
            .delete(&s.options("pvc-1", r#","volumeID":"pvc-1""#))
            .unwrap();
        assert!(!s.image("pvc-1").exists());
    }

    // The lock is opened in place (it is what serialises the volume): a symlink or FIFO there is
    // refused, never followed or waited on.
    let lock_victim = victim("lock-victim");
    plant(&lock_victim, ".locked.lock");
    let locked = s.options("locked", r#","size":"8Mi""#);
    expect_refused(
        s.driver().attach(&locked, "node-a"),
        "is a symlink (never followed), not a regular file",
        "attach",
    );
    untouched(&lock_victim);
    fs::remove_file(s.dir.join(".locked.lock")).unwrap();
    test_support::make_fifo(&s.dir.join(".locked.lock"), 0o600);
    let (driver, locked_) = (s.driver(), locked.clone());
    expect_refused(
        within("attach", move || driver.attach(&locked_, "node-a")),
        "is a FIFO, not a regular file",
        "attach",
    );
    assert!(!s.image("locked").exists());
}

/// A block device node planted where the driver writes a file of its own (a disk of this host,
/// when the shared dir lets device nodes through): the node is replaced, and the disk keeps every
/// byte.
#[test]
fn a_device_node_planted_where_the_driver_writes_is_replaced_not_written() {
    test_support::require_root!("needs root (device nodes, loop devices)");
    let s = SharedImages::new();
    let disk = s.sandbox.loop_device(1);
    for at in [
        ".pvc-1.provisioned",
        ".pvc-1.provisioned.tmp",
        ".pv-of-image.detach",
        ".image-of-pv.claim.tmp",
    ] {
        block_node(&s.dir.join(at), &disk);
    }
    s.driver()
        .provision(&s.options("pvc-1", r#","requestBytes":"8388608""#))
        .unwrap();
    let options = s.options("pv-of-image", r#","volumeID":"image-of-pv","size":"8Mi""#);
    s.driver().attach(&options, "node-a").unwrap();
    let mut bytes = Vec::new();
    use std::io::Read as _;
    fs::File::open(&disk)
        .unwrap()
        .take(64 << 10)
        .read_to_end(&mut bytes)
        .unwrap();
    assert_eq!(bytes.len(), 64 << 10);
    assert!(bytes.iter().all(|b| *b == 0), "the disk was written");
    for at in [
        ".pvc-1.provisioned",
        ".pv-of-image.detach",
        ".image-of-pv.claim",
    ] {
        let meta = fs::symlink_metadata(s.dir.join(at)).unwrap();
        assert!(meta.is_file(), "{at}: {meta:?}");
    }
    assert_eq!(
        fs::read_to_string(s.claim("image-of-pv")).unwrap(),
        "node-a\n"
    );
    assert!(!s.dir.join(".pvc-1.provisioned.tmp").exists());
    assert!(!s.dir.join(".image-of-pv.claim.tmp").exists());
}

/// unmountdevice releases a loop device the driver set up even when the image's name no longer
/// says which volume it was (removed, or renamed, meanwhile), and leaves alone a loop device the
/// driver did not set up that happened to be mounted there.
#[test]
fn unmountdevice_releases_the_driver_s_device_and_only_it() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    let s = SharedImages::new();
    let driver = s.driver();
    for (volume, gone) in [("removed", None), ("renamed", Some("elsewhere.img"))] {
        let options = s.options(volume, r#","size":"16Mi""#);
        driver.attach(&options, "node-a").unwrap();
        let device = driver.wait_for_attach("", &options).unwrap();
        let dir = s.sandbox.target(volume);
        driver.mount_device(&dir, &device, &options).unwrap();
        match gone {
            None => fs::remove_file(s.image(volume)).unwrap(),
            Some(name) => fs::rename(s.image(volume), s.dir.join(name)).unwrap(),
        }
        driver.unmount_device(&dir).unwrap();
        assert!(!test_support::is_mounted(&dir));
        assert_eq!(
            crate::losetup::backing_file_text(&device),
            None,
            "{volume}: {device} still set up"
        );
    }
    // The host's own loop device, mounted on a device dir: unmounted, not released.
    let disk = s.sandbox.loop_device(16);
    let dir = s.sandbox.target("host");
    fs::create_dir_all(&dir).unwrap();
    flexvolume_os::mount::format_and_mount(Path::new(&disk), &dir, "ext4", false).unwrap();
    driver.unmount_device(&dir).unwrap();
    assert!(!test_support::is_mounted(&dir));
    assert!(
        crate::losetup::backing_file_text(&disk).is_some(),
        "released"
    );
}
