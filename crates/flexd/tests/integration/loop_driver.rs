//! The builtin `loop` driver end to end: installed with `flexd install --builtin loop` (a copy
//! of the real flexd binary), driven through `flexd volume` and `flexd check` with real sparse
//! images, loop devices, mkfs and mounts. Needs root for everything that mounts; each test
//! skips with a message otherwise. The sandbox unmounts everything below it and releases every
//! loop device backed by its images when dropped, even when a test fails.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use test_support::{is_mounted, json_says, ok, Sandbox};

/// What `flexd install --builtin loop` finds beside flexd.
#[derive(Clone, Copy, Debug)]
enum Build {
    /// `cargo build -p flexd`: flexd and flexd-loop; the small flexd-loop is installed.
    Standalone,
    /// flexd alone (copied somewhere by itself): flexd installs itself, a multi-call binary.
    FlexdAlone,
}

/// A sandbox with the builtin loop driver installed in its plugin dir; the volumes' images
/// live in its `images` dir, so the sandbox releases their loop devices.
struct LoopSandbox(Sandbox);

impl Deref for LoopSandbox {
    type Target = Sandbox;
    fn deref(&self) -> &Sandbox {
        &self.0
    }
}

impl LoopSandbox {
    /// The standalone loop driver installed.
    fn new() -> Self {
        Self::installing(Build::Standalone)
    }

    fn installing(build: Build) -> Self {
        let s = Self(Sandbox::new());
        for d in ["images", "bin"] {
            std::fs::create_dir(s.path(d)).unwrap();
        }
        let (flexd, expected) = match build {
            Build::Standalone => (test_support::flexd_exe(), test_support::flexd_loop_exe()),
            Build::FlexdAlone => {
                let alone = s.path("bin/flexd");
                std::fs::copy(test_support::flexd_exe(), &alone).unwrap();
                (alone.clone(), alone)
            }
        };
        let out = test_support::output_of_new_executable(
            Command::new(&flexd)
                .arg("--plugin-dir")
                .arg(s.plugin())
                .args(["install", "--builtin", "loop", "--image-dir"])
                .arg(s.images()),
        );
        ok(&out);
        assert_eq!(
            std::fs::read(s.driver_exe()).unwrap(),
            std::fs::read(&expected).unwrap(),
            "{build:?} installs {}",
            expected.display()
        );
        s
    }
    fn images(&self) -> PathBuf {
        self.path("images")
    }
    fn image(&self, volume: &str) -> PathBuf {
        self.images().join(format!("{volume}.img"))
    }
    fn driver_exe(&self) -> PathBuf {
        self.plugin().join("flexd~loop/loop")
    }

    /// The volume's options: its image lives in this sandbox.
    fn options(&self, size: &str) -> String {
        serde_json::json!({"imageDir": self.images(), "size": size}).to_string()
    }

    /// The options flexd passes for volume (PV) `volume` of `size` (none: no size).
    fn volume_options(&self, volume: &str, size: Option<&str>) -> String {
        let mut options = serde_json::json!({
            "imageDir": self.images(),
            "kubernetes.io/pvOrVolumeName": volume,
        });
        if let Some(size) = size {
            options["size"] = size.into();
        }
        options.to_string()
    }

    /// `flexd volume mount` of loop volume `volume` on `target`; returns the JSON outcome.
    fn mount(&self, volume: &str, target: &Path, size: &str, fs_type: &str) -> Value {
        let options = self.options(size);
        let t = target.to_str().unwrap();
        let mut args = vec!["--output", "json", "mount", "--driver", "flexd/loop"];
        args.extend([
            "--target",
            t,
            "--volume-name",
            volume,
            "--options",
            &options,
        ]);
        if !fs_type.is_empty() {
            args.extend(["--fs-type", fs_type]);
        }
        let out = self.volume(&args);
        ok(&out);
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn unmount(&self, target: &Path) {
        ok(&self.volume_unmount(target));
    }

    /// Runs the installed driver itself, as kubelet would.
    fn call(&self, args: &[&str]) -> Output {
        Command::new(self.driver_exe()).args(args).output().unwrap()
    }

    fn loop_devices_of(&self, volume: &str) -> Vec<String> {
        let image = self.image(volume);
        self.loop_devices()
            .into_iter()
            .filter(|(_, file)| *file == image)
            .map(|(dev, _)| dev)
            .collect()
    }
}

/// The filesystem UUID on a device: it changes if the device is ever formatted again.
fn fs_uuid(device: &str) -> String {
    let out = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "UUID", device])
        .output()
        .unwrap();
    ok(&out);
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn fs_type(device: &str) -> String {
    let out = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE", device])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn fs_bytes(dir: &Path) -> u64 {
    let st = rustix::fs::statvfs(dir).unwrap();
    st.f_blocks * st.f_frsize
}

#[test]
fn the_installed_builtin_answers_exact_json_and_nothing_else() {
    for build in [Build::Standalone, Build::FlexdAlone] {
        installed_builtin_answers_exact_json(build);
    }
}

fn installed_builtin_answers_exact_json(build: Build) {
    // No root needed: init and unknown call-outs touch nothing.
    let s = LoopSandbox::installing(build);
    let init = s.call(&["init"]);
    assert_eq!(init.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(init.stdout).unwrap(),
        "{\"status\":\"Success\",\"capabilities\":{\"attach\":true,\"selinuxRelabel\":true,\"supportsMetrics\":true,\"fsGroup\":true,\"requiresFSResize\":true,\"provision\":true}}\n"
    );
    assert!(init.stderr.is_empty(), "{:?}", init.stderr);
    let unknown = s.call(&["frobnicate", "x"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(unknown.stdout).unwrap(),
        "{\"status\":\"Not supported\",\"message\":\"unknown call-out \\\"frobnicate\\\"\"}\n"
    );
    assert!(unknown.stderr.is_empty());
    let bad = s.call(&["attach", r#"{"volumeID":"../../etc/x"}"#, "node-1"]);
    assert_eq!(bad.status.code(), Some(1));
    let reply: Value = serde_json::from_slice(&bad.stdout).unwrap();
    assert_eq!(reply["status"], "Failure");
    assert!(json_says(&reply["message"], "is not usable"));
    assert!(bad.stderr.is_empty());
    // The installed copy is listed as a driver like any other.
    let out = s.flexd(&["--output", "json", "drivers"]);
    ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("flexd/loop"));
}

/// issue 29: the image dirs are the operator's, given to `flexd install --builtin loop
/// --image-dir`, in a file beside the driver in its plugin dir; the driver, as installed by
/// either build, refuses any other `imageDir`, and a broken file fails its init.
#[test]
fn the_image_dirs_are_what_install_was_told_and_nothing_else() {
    for build in [Build::Standalone, Build::FlexdAlone] {
        // No root needed: getvolumename touches nothing.
        let s = LoopSandbox::installing(build);
        let config = s.plugin().join("flexd~loop/image-dirs");
        let volume_name = |dir: &Path| {
            let options = serde_json::json!({"imageDir": dir, "volumeID": "v"}).to_string();
            let out = s.call(&["getvolumename", &options]);
            let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
            (out.status.code(), reply)
        };
        let (code, reply) = volume_name(&s.images());
        assert_eq!(code, Some(0), "{build:?}: {reply}");
        for refused in [Path::new("/etc"), Path::new("/"), &s.path("elsewhere")] {
            let (code, reply) = volume_name(refused);
            assert_eq!(code, Some(1), "{build:?} {}: {reply}", refused.display());
            assert_eq!(reply["code"], "InvalidArgument", "{reply}");
            let message = reply["message"].as_str().unwrap();
            assert!(message.contains("not an image dir"), "{message}");
        }
        // Reinstalled with no flag: the default dir alone, said in the file.
        ok(&s.flexd(&["install", "--builtin", "loop"]));
        let text = std::fs::read_to_string(&config).unwrap();
        assert!(text.lines().any(|l| l == "/var/lib/flexd-loop"), "{text}");
        assert_eq!(volume_name(&s.images()).0, Some(1), "{build:?}");
        // A bad dir installs nothing.
        let out = s.flexd(&["install", "--builtin", "loop", "--image-dir", "relative"]);
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("relative"));
        assert_eq!(std::fs::read_to_string(&config).unwrap(), text);
        // A file that cannot be read right fails init, which `flexd drivers` shows.
        std::fs::write(&config, "images\n").unwrap();
        let out = s.flexd(&["--output", "json", "drivers"]);
        ok(&out);
        let drivers: Value = serde_json::from_slice(&out.stdout).unwrap();
        let status = &drivers[0];
        assert_eq!(status["status"], "failed", "{drivers}");
        assert!(
            json_says(&status["error"], "image-dirs line 1"),
            "{drivers}"
        );
    }
}

#[test]
fn data_survives_unmount_and_remount_and_is_never_reformatted() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    // flexd itself as the driver (multi-call): the whole flow works through that copy too.
    let s = LoopSandbox::installing(Build::FlexdAlone);
    let target = s.target("data");
    let first = s.mount("vol-a", &target, "64Mi", "");
    let device = first["device"].as_str().unwrap().to_owned();
    assert_eq!(s.loop_devices_of("vol-a"), vec![device.clone()]);
    assert_eq!(fs_type(&device), "ext4", "ext4 is the default");
    let uuid = fs_uuid(&device);
    // The image is sparse: 64 MiB long, far fewer blocks on disk.
    let meta = std::fs::metadata(s.image("vol-a")).unwrap();
    assert_eq!(meta.len(), 64 << 20);
    std::fs::write(target.join("precious"), "keep me").unwrap();

    s.unmount(&target);
    assert!(!target.exists(), "the target flexd created is removed");
    assert!(
        s.loop_devices_of("vol-a").is_empty(),
        "unmountdevice/detach released the loop device"
    );
    assert!(s.image("vol-a").exists(), "the image (the data) stays");

    // Asking for xfs now must not format a device that holds ext4.
    let again = s.mount("vol-a", &target, "64Mi", "xfs");
    let device = again["device"].as_str().unwrap().to_owned();
    assert_eq!(fs_type(&device), "ext4");
    assert_eq!(fs_uuid(&device), uuid, "the filesystem was never recreated");
    assert_eq!(
        std::fs::read_to_string(target.join("precious")).unwrap(),
        "keep me"
    );
    s.unmount(&target);
    assert!(s.loop_devices_of("vol-a").is_empty());
}

#[test]
fn a_second_target_shares_the_loop_device_and_detach_refuses_while_mounted() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    let s = LoopSandbox::new();
    let (a, b) = (s.target("a"), s.target("b"));
    let da = s.mount("shared", &a, "32Mi", "");
    let db = s.mount("shared", &b, "32Mi", "");
    assert_eq!(da["device"], db["device"]);
    assert_eq!(s.loop_devices_of("shared").len(), 1, "one loop device");
    std::fs::write(a.join("x"), "from a").unwrap();
    assert_eq!(std::fs::read_to_string(b.join("x")).unwrap(), "from a");

    // The driver refuses to release a device that is still mounted.
    let detach = s.call(&["detach", &detach_name(&s, "shared"), "node-1"]);
    let reply: Value = serde_json::from_slice(&detach.stdout).unwrap();
    assert_eq!(reply["status"], "Failure", "{reply}");
    assert!(json_says(&reply["message"], "still mounted"));
    assert_eq!(s.loop_devices_of("shared").len(), 1);

    s.unmount(&a);
    assert_eq!(std::fs::read_to_string(b.join("x")).unwrap(), "from a");
    assert_eq!(s.loop_devices_of("shared").len(), 1, "b still uses it");
    s.unmount(&b);
    assert!(s.loop_devices_of("shared").is_empty());
    // Detach again: nothing attached is success (idempotent).
    let detach = s.call(&["detach", &detach_name(&s, "shared"), "node-1"]);
    assert_eq!(detach.status.code(), Some(0), "{detach:?}");
}

/// kube-controller-manager's detach names the volume by its PV name, not by getvolumename's
/// answer (kubelet ignores it): with a `volumeID` and an `imageDir` that differ from the PV's
/// name and the default dir, detach by the PV name still releases the right image's claim, and
/// a second detach is a success. The e2e oracle scenario found this (docs/oracle.md).
#[test]
fn detach_by_the_pv_name_as_kubelet_gives_it_releases_the_volume() {
    // No root needed: attach and detach only claim and release, on files.
    let s = LoopSandbox::new();
    let options = serde_json::json!({
        "imageDir": s.images(),
        "volumeID": "image-of-pv",
        "kubernetes.io/pvOrVolumeName": "pv-of-image",
        "size": "16Mi",
    })
    .to_string();
    let claim = s.images().join(".image-of-pv.claim");
    let attach: Value =
        serde_json::from_slice(&s.call(&["attach", &options, "node-1"]).stdout).unwrap();
    assert_eq!(attach["status"], "Success", "{attach}");
    assert_eq!(std::fs::read_to_string(&claim).unwrap(), "node-1\n");
    let detach = s.call(&["detach", "pv-of-image", "node-1"]);
    ok(&detach);
    assert!(!claim.exists(), "released");
    ok(&s.call(&["detach", "pv-of-image", "node-1"]));
    // getvolumename's own name still detaches too (what flexd recorded before it followed kubelet).
    let attach: Value =
        serde_json::from_slice(&s.call(&["attach", &options, "node-1"]).stdout).unwrap();
    assert_eq!(attach["status"], "Success", "{attach}");
    let name: Value = serde_json::from_slice(&s.call(&["getvolumename", &options]).stdout).unwrap();
    ok(&s.call(&["detach", name["volumeName"].as_str().unwrap(), "node-1"]));
    assert!(!claim.exists(), "released");
}

/// The loop driver is a shared-storage driver: its image dir is the storage every node sees,
/// and attach (in the controller) claims a volume for one node. Two nodes' calls, each a new
/// driver process, against one image dir: the second node's attach is refused, naming the
/// first, until the first detaches; attach makes no loop device, and the node's waitforattach,
/// given attach's empty device as kubelet passes it, makes the one for the right image.
#[test]
fn two_nodes_sharing_the_image_dir_attach_a_volume_one_at_a_time() {
    let s = LoopSandbox::new();
    let options = s.volume_options("shared-pv", Some("16Mi"));
    let reply = |args: &[&str]| -> (Option<i32>, Value) {
        let out = s.call(args);
        assert!(out.stderr.is_empty(), "{out:?}");
        (
            out.status.code(),
            serde_json::from_slice(&out.stdout).unwrap(),
        )
    };
    let attached = |node: &str| reply(&["isattached", &options, node]).1["attached"].clone();

    let (code, attach) = reply(&["attach", &options, "node-a"]);
    assert_eq!(code, Some(0), "{attach}");
    assert_eq!(attach["device"], "", "attach knows no device: {attach}");
    let (code, refused) = reply(&["attach", &options, "node-b"]);
    assert_eq!(code, Some(1), "{refused}");
    assert_eq!(refused["status"], "Failure");
    assert!(
        json_says(&refused["message"], "attached to node node-a"),
        "{refused}"
    );
    assert_eq!(refused.get("code"), None, "no named code fits: {refused}");
    assert_eq!(attached("node-a"), true);
    assert_eq!(attached("node-b"), false);
    ok(&s.call(&["detach", "shared-pv", "node-b"]));
    assert_eq!(attached("node-a"), true, "node-b's detach released nothing");
    ok(&s.call(&["attach", &options, "node-a"]));

    if test_support::is_root() {
        assert!(
            s.loop_devices_of("shared-pv").is_empty(),
            "attach made none"
        );
        let (code, waited) = reply(&["waitforattach", "", &options]);
        assert_eq!(code, Some(0), "{waited}");
        let device = waited["device"].as_str().unwrap().to_owned();
        assert_eq!(s.loop_devices_of("shared-pv"), vec![device.clone()]);
        let (_, again) = reply(&["waitforattach", "/dev/not-a-device", &options]);
        assert_eq!(again["device"], device.as_str());
        let dir = s.target("device-mount");
        let dir = dir.to_str().unwrap();
        ok(&s.call(&["mountdevice", dir, "", &options]));
        ok(&s.call(&["unmountdevice", dir]));
        assert!(s.loop_devices_of("shared-pv").is_empty(), "released");
    } else {
        test_support::report_skip(
            test_support::test_name!(),
            "the loop device part needs root (loop devices, mkfs, mounts)",
        );
    }

    ok(&s.call(&["detach", "shared-pv", "node-a"]));
    assert_eq!(attached("node-a"), false);
    let (code, attach) = reply(&["attach", &options, "node-b"]);
    assert_eq!(code, Some(0), "{attach}");
    assert_eq!(attached("node-b"), true);
    assert_eq!(attached("node-a"), false);
    ok(&s.call(&["detach", "shared-pv", "node-b"]));
}

/// kubelet's flow for a second pod on the node while the volume stays attached (Kubernetes'
/// storage e2e suite found it): unmountdevice released the loop device, so waitforattach must
/// set one up again rather than answer "not attached"; the data is the same filesystem's.
#[test]
fn waitforattach_after_unmountdevice_finds_a_device_for_the_still_attached_volume() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    let s = LoopSandbox::new();
    let options = s.volume_options("again", Some("32Mi"));
    let reply = |out: Output| -> Value {
        let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(reply["status"], "Success", "{reply}");
        reply
    };
    let attached = reply(s.call(&["attach", &options, "node-1"]));
    let device = attached["device"].as_str().unwrap().to_owned();
    let dir = s.target("device-mount");
    let dir = dir.to_str().unwrap();
    reply(s.call(&["waitforattach", &device, &options]));
    reply(s.call(&["mountdevice", dir, &device, &options]));
    std::fs::write(Path::new(dir).join("kept"), "first pod").unwrap();
    reply(s.call(&["unmountdevice", dir]));
    assert!(
        s.loop_devices_of("again").is_empty(),
        "unmountdevice releases the device"
    );

    // The second pod: no attach (the volume is attached), straight to waitforattach.
    let waited = reply(s.call(&["waitforattach", &device, &options]));
    let device = waited["device"].as_str().unwrap().to_owned();
    assert_eq!(s.loop_devices_of("again"), vec![device.clone()]);
    reply(s.call(&["mountdevice", dir, &device, &options]));
    assert_eq!(
        std::fs::read_to_string(Path::new(dir).join("kept")).unwrap(),
        "first pod"
    );
    reply(s.call(&["unmountdevice", dir]));
    reply(s.call(&["detach", &detach_name(&s, "again"), "node-1"]));
    assert!(s.loop_devices_of("again").is_empty());

    // A volume whose image is gone is not brought back by waitforattach.
    std::fs::remove_file(s.image("again")).unwrap();
    let gone: Value =
        serde_json::from_slice(&s.call(&["waitforattach", &device, &options]).stdout).unwrap();
    assert_eq!(gone["status"], "Failure", "{gone}");
    assert!(s.loop_devices_of("again").is_empty());
}

/// The name getvolumename gives the volume (what detach receives).
fn detach_name(s: &LoopSandbox, volume: &str) -> String {
    let options = s.volume_options(volume, None);
    let out = s.call(&["getvolumename", &options]);
    ok(&out);
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    let name = reply["volumeName"].as_str().unwrap().to_owned();
    let again: Value =
        serde_json::from_slice(&s.call(&["getvolumename", &options]).stdout).unwrap();
    assert_eq!(again["volumeName"], name.as_str(), "stable");
    name
}

#[test]
fn concurrent_calls_on_one_volume_make_one_loop_device_and_one_filesystem() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    let s = LoopSandbox::new();
    let options = s.volume_options("race", Some("32Mi"));
    // Eight attaches at once, straight to the driver (flexd would serialise them itself): one
    // image, one claim, no loop device.
    let run_eight = |args: &[&str]| -> Vec<String> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8).map(|_| scope.spawn(|| s.call(args))).collect();
            handles
                .into_iter()
                .map(|h| {
                    let out = h.join().unwrap();
                    ok(&out);
                    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
                    reply["device"].as_str().unwrap().to_owned()
                })
                .collect()
        })
    };
    let attached = run_eight(&["attach", &options, "node-1"]);
    assert!(attached.iter().all(String::is_empty), "{attached:?}");
    assert!(s.loop_devices_of("race").is_empty());
    // Eight waitforattaches at once (the node's): one loop device.
    let devices = run_eight(&["waitforattach", "", &options]);
    assert!(devices.iter().all(|d| *d == devices[0]), "{devices:?}");
    assert_eq!(s.loop_devices_of("race"), vec![devices[0].clone()]);

    // Four mountdevices of the same dir at once: one mkfs, one mount.
    let dir = s.target("global");
    let d = dir.to_str().unwrap();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| s.call(&["mountdevice", d, &devices[0], &options])))
            .collect();
        for h in handles {
            ok(&h.join().unwrap());
        }
    });
    let mounts = flexvolume_os::mount::mount_table()
        .unwrap()
        .into_iter()
        .filter(|m| m.mount_point == dir)
        .count();
    assert_eq!(mounts, 1, "mounted exactly once");
    assert_eq!(fs_type(&devices[0]), "ext4");

    // And the way back, four at once each: idempotent and race-free.
    let name = detach_name(&s, "race");
    for args in [["unmountdevice", d, ""], ["detach", &name, "node-1"]] {
        let args: Vec<&str> = args.into_iter().filter(|a| !a.is_empty()).collect();
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4).map(|_| scope.spawn(|| s.call(&args))).collect();
            for h in handles {
                ok(&h.join().unwrap());
            }
        });
    }
    assert!(!is_mounted(&dir));
    assert!(s.loop_devices_of("race").is_empty());
    let attached = s.call(&["isattached", &options, "node-1"]);
    let reply: Value = serde_json::from_slice(&attached.stdout).unwrap();
    assert_eq!(reply["attached"], false);
}

#[test]
fn mountdevice_never_touches_a_device_that_is_not_the_volumes_own() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    let s = LoopSandbox::new();
    let options = s.volume_options("mine", Some("16Mi"));
    let attach = s.call(&["attach", &options, "node-1"]);
    ok(&attach);
    // Another volume's device passed in by mistake (or malice): refused, not formatted.
    let other = serde_json::json!({"imageDir": s.images(), "volumeID": "other", "size": "16Mi"})
        .to_string();
    ok(&s.call(&["attach", &other, "node-1"]));
    let other_wait: Value =
        serde_json::from_slice(&s.call(&["waitforattach", "", &other]).stdout).unwrap();
    let other_device = other_wait["device"].as_str().unwrap().to_owned();
    let dir = s.target("g");
    let out = s.call(&[
        "mountdevice",
        dir.to_str().unwrap(),
        &other_device,
        &options,
    ]);
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["status"], "Failure", "{reply}");
    assert!(json_says(&reply["message"], "does not back volume mine"));
    assert_eq!(
        fs_type(&other_device),
        "",
        "the other device was not formatted"
    );
    assert!(!is_mounted(&dir));
}

#[test]
fn an_image_holding_unrecognised_data_is_never_formatted() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    let s = LoopSandbox::new();
    // Bytes blkid cannot name (no filesystem signature), deep inside a sparse image.
    let image = s.image("dump");
    let f = std::fs::File::create(&image).unwrap();
    f.set_len(16 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"customer records, format unknown", 5 << 20)
        .unwrap();
    let before = std::fs::read(&image).unwrap();
    let options = s.options("16Mi");
    let target = s.target("dump");
    let out = s.volume_mount(
        "flexd/loop",
        &target,
        &["--volume-name", "dump", "--options", &options],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to format"), "{err}");
    assert!(
        std::fs::read(&image).unwrap() == before,
        "the image is untouched"
    );
    assert!(!is_mounted(&target));
    // The failed mountdevice released the loop device it set up, and the unmount detaches:
    // nothing stays attached, on the node or in the claim.
    assert!(
        s.loop_devices_of("dump").is_empty(),
        "{:?}",
        s.loop_devices()
    );
    ok(&s.volume_unmount(&target));
    assert!(!s.images().join(".dump.claim").exists());
}

/// Mounts a loop volume, writes data, grows it with `flexd volume expand` (the driver's
/// expandvolume and expandfs), and returns the outcome and the sizes before and after.
fn expand_loop_volume(fs: &str, mb: u64) -> Option<(Output, u64, u64)> {
    let s = LoopSandbox::new();
    let target = s.target("grow");
    s.mount("grow", &target, &format!("{mb}Mi"), fs);
    std::fs::write(target.join("keep"), "data").unwrap();
    let before = fs_bytes(&target);
    let size = format!("{}Mi", 2 * mb);
    let t = target.to_str().unwrap();
    let out = s.volume(&["--output", "json", "expand", "--target", t, "--size", &size]);
    let after = fs_bytes(&target);
    // Whatever happened to the filesystem, the volume itself grew and the data is there.
    assert_eq!(
        std::fs::metadata(s.image("grow")).unwrap().len(),
        (2 * mb) << 20
    );
    assert_eq!(
        std::fs::read_to_string(target.join("keep")).unwrap(),
        "data"
    );
    s.unmount(&target);
    Some((out, before, after))
}

#[test]
fn expand_grows_the_image_the_loop_device_and_an_xfs_filesystem() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    if !test_support::has_mkfs_xfs() {
        test_support::skip!("mkfs.xfs is not installed (.ci/run installs xfsprogs)");
    }
    // XFS needs 300 MB at least; the image is sparse.
    let (out, before, after) = expand_loop_volume("xfs", 320).unwrap();
    let json = test_support::assert_xfs_doubled(&out, before, after);
    assert_eq!(
        json["driver_expanded_fs"], true,
        "the loop driver's expandfs ran"
    );
}

#[test]
fn expand_of_ext4_grows_it_or_names_the_missing_capability() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    let (out, before, after) = expand_loop_volume("ext4", 64).unwrap();
    test_support::assert_ext4_grew_or_names_cap_sys_resource(&out, before, after, 48 << 20);
}

#[test]
fn flexd_check_passes_every_check_on_the_loop_driver() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    for build in [Build::Standalone, Build::FlexdAlone] {
        check_passes(build);
    }
}

/// `flexd check` with no options at all, as a driver author first runs it: the loop driver
/// provisions its own scratch volume (in its default image dir), mounts it, deletes it.
#[test]
fn flexd_check_passes_with_no_options_on_the_builtin_loop_driver() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    let s = LoopSandbox::installing(Build::Standalone);
    let out = s.flexd(&["--output", "json", "check", "--driver", "flexd/loop"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    for check in report["checks"].as_array().unwrap() {
        if check["required"] == true {
            assert_eq!(check["verdict"], "pass", "{report:#}");
        }
    }
    let provisioned = test_support::check_named(&report, "provision creates");
    assert_eq!(provisioned["verdict"], "pass");
    assert_eq!(report["passed"], true);
    assert_eq!(out.status.code(), Some(0));
    assert!(s.loop_devices().is_empty(), "check left a loop device");
}

fn check_passes(build: Build) {
    let s = LoopSandbox::installing(build);
    let options = s.options("32Mi");
    let out = s.flexd(&[
        "--output",
        "json",
        "check",
        "flexd/loop",
        "--options",
        &options,
    ]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    for check in report["checks"].as_array().unwrap() {
        assert_eq!(check["verdict"], "pass", "{check}");
    }
    assert_eq!(report["passed"], true);
    assert_eq!(out.status.code(), Some(0));
    assert!(s.loop_devices().is_empty(), "check left a loop device");
}

#[test]
fn the_readme_quick_start_runs_end_to_end() {
    test_support::require_root!("needs root (loop devices, mkfs, mounts)");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/quickstart.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("FLEXD", test_support::flexd_exe())
        .output()
        .unwrap();
    ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("contents: written through flexd"),
        "{stdout}"
    );
    assert!(stdout.contains("all required checks passed"), "{stdout}");
    assert!(stdout.contains("the data survived an unmount and a remount"));
    // It cleans up after itself: no scratch dir, no loop device backed by its images.
    let leftovers: Vec<_> = std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .filter(|f| f.starts_with("/tmp/flexd-quickstart."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
